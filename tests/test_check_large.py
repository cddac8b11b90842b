"""dqtool check on models whose external data passes protobuf's 2 GB limit.

The tensor data stays in its files: onnxruntime reads it from the model's folder (a session
config entry), dqtool's reference evaluator memory-maps it, onnx's checker reads the path.
The big model here is a sparse file (no disk, no RAM): its weights are gathered a row at a
time, so every value a check computes is small.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from helpers import matmul_model
from onnx import TensorProto, helper, numpy_helper

from dqtool.checking import check, models, runners, selfcheck
from dqtool.cli import cli

ENV = {"NO_COLOR": "1", "COLUMNS": "80"}
ROWS = 9 << 23  # rows of 16 int8: 1.125 GiB per weight, 2.25 GiB in all
LIMIT_NOTE = "past protobuf's 2 GB limit"


def _external(name: str, shape: list[int], offset: int, length: int) -> TensorProto:
    t = TensorProto(name=name, data_type=TensorProto.INT8, dims=shape)
    t.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "w.bin"), ("offset", str(offset)),
                       ("length", str(length))):
        entry = t.external_data.add()
        entry.key, entry.value = key, value
    return t


def _big_model(folder, name: str, scale: float = 0.5):
    """Y = X + DQ(Gather(B0, idx)) + DQ(Gather(B1, idx)); B0, B1 in a sparse w.bin."""
    length = ROWS * 16
    data = folder / "w.bin"
    if not data.exists():
        with open(data, "wb") as f:
            f.truncate(2 * length)
            f.seek(length - 16)  # B0's last row: 0..15
            f.write(np.arange(16, dtype=np.int8).tobytes())
    inits = [_external("B0", [ROWS, 16], 0, length),
             _external("B1", [ROWS, 16], length, length),
             numpy_helper.from_array(np.array([0, ROWS - 1], np.int64), "idx"),
             numpy_helper.from_array(np.array(scale, np.float32), "s")]
    nodes = [helper.make_node("Gather", ["B0", "idx"], ["g0"]),
             helper.make_node("Gather", ["B1", "idx"], ["g1"]),
             helper.make_node("DequantizeLinear", ["g0", "s"], ["d0"], name="dq0"),
             helper.make_node("DequantizeLinear", ["g1", "s"], ["d1"], name="dq1"),
             helper.make_node("Add", ["d0", "d1"], ["y0"]),
             helper.make_node("Add", ["y0", "X"], ["Y"])]
    g = helper.make_graph(nodes, "big", [helper.make_tensor_value_info("X", 1, [2, 16])],
                          [helper.make_tensor_value_info("Y", 1, [2, 16])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    path = folder / name
    path.write_bytes(m.SerializeToString())  # the graph alone: a few hundred bytes
    return path


def test_model_past_the_protobuf_limit_is_checked_alone_and_against(tmp_path):
    original = _big_model(tmp_path, "orig.onnx")
    assert models.external_size(onnx.load_model(str(original), load_external_data=False),
                                tmp_path) > onnx.checker.MAXIMUM_PROTOBUF
    report = check(original)
    assert report.passed, report.to_json()
    assert report.structure.onnx_checker is None
    assert [(n.name, n.status) for n in report.nodes] == [("dq0", "bit-exact"),
                                                          ("dq1", "bit-exact")]
    assert any(LIMIT_NOTE in n for n in report.notes)

    same = _big_model(tmp_path, "same.onnx")
    bad = _big_model(tmp_path, "bad.onnx", scale=0.75)
    runner = CliRunner(env=ENV)
    ok = runner.invoke(cli, ["check", str(same), "--against", str(original), "--json"])
    assert ok.exit_code == 0, ok.output
    doc = json.loads(ok.output)
    assert [(c["runtime"], c["skipped"]) for c in doc["comparisons"]] == [
        ("onnxruntime", None), ("reference", None)]
    result = runner.invoke(cli, ["check", str(bad), "--against", str(original), "--json"])
    assert result.exit_code == 1, result.output
    for comp in json.loads(result.output)["comparisons"]:
        (y,) = comp["outputs"]
        assert not y["passed"] and y["worst_index"] == [1, 15]  # B0's last row, 15 × s


@pytest.fixture
def small_external(tmp_path):
    """A small model with its weights in an external file, and the same with one scale
    value changed."""
    r = np.random.default_rng(3)
    w = r.integers(-127, 128, (16, 4)).astype(np.int8)
    s = r.uniform(0.01, 0.05, 4).astype(np.float32)
    s_bad = s.copy()
    s_bad[1] *= 1.5
    paths = []
    for name, scale in (("m.onnx", s), ("bad.onnx", s_bad)):
        path = tmp_path / name
        onnx.save_model(matmul_model(w, scale, opset=21), str(path),
                        save_as_external_data=True, location=f"{name}.data",
                        size_threshold=0)
        paths.append(path)
    return paths


def test_past_limit_path_on_a_small_model_matches_the_in_memory_path(small_external,
                                                                     monkeypatch):
    """Forcing the past-the-limit path: onnxruntime gets the folder, the checker the path,
    the reference evaluator mapped tensors, and every result is the in-memory one."""
    path, bad = small_external
    before = check(path).to_json()
    before_against = check(bad, against=path).to_json()
    assert not any(LIMIT_NOTE in n for n in before["notes"])

    monkeypatch.setattr(models, "MAX_IN_PROTO", 0)
    seen: dict[str, list] = {"ort": [], "ref": [], "checker": []}
    real_ort, real_ref = runners.run_ort, runners.run_reference
    real_checker = onnx.checker.check_model

    def spy_ort(*a, external_dir=None, **k):
        seen["ort"].append(external_dir)
        return real_ort(*a, external_dir=external_dir, **k)

    def spy_ref(*a, external_dir=None, **k):
        seen["ref"].append(external_dir)
        return real_ref(*a, external_dir=external_dir, **k)

    def spy_checker(model, *a, **k):
        seen["checker"].append(model)
        return real_checker(model, *a, **k)

    monkeypatch.setattr(runners, "run_ort", spy_ort)
    monkeypatch.setattr(runners, "run_reference", spy_ref)
    monkeypatch.setattr(selfcheck.onnx.checker, "check_model", spy_checker)
    sessions = []
    import onnxruntime as ort

    real_session = ort.InferenceSession

    def spy_session(model, so, *a, **k):
        try:
            folder = so.get_session_config_entry(models.EXTERNAL_FOLDER_KEY)
        except RuntimeError:  # not set
            folder = None
        sessions.append((model, folder))
        return real_session(model, so, *a, **k)

    monkeypatch.setattr(ort, "InferenceSession", spy_session)

    after = check(path).to_json()
    assert seen["checker"] == [str(path)]
    assert seen["ort"][0] == path.parent  # the whole-model run
    assert sessions[0][1] == str(path.parent)
    # Only the graph was serialized for onnxruntime: the weights stayed in the file.
    given = onnx.ModelProto.FromString(sessions[0][0])
    assert given.graph.initializer and all(
        onnx.external_data_helper.uses_external_data(t) and not t.raw_data
        for t in given.graph.initializer)
    assert any(LIMIT_NOTE in n for n in after["notes"])
    for key in ("passed", "structure", "nodes", "summary"):
        assert after[key] == before[key]

    seen["ref"].clear()
    after_against = check(bad, against=path).to_json()
    assert set(seen["ref"]) == {path.parent}
    assert after_against["comparisons"] == before_against["comparisons"]
    assert not after_against["passed"]
