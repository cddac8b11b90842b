"""dqtool check on large inline models: the tensors stay in the model file (referenced as
external data of the file itself), weights are checked slice by slice, and the whole model
is not run when that would only dequantize every weight. Thresholds are lowered here so
tiny models take the large-model path."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx_ir as ir
import pytest

from dqtool.checking import check, models, runners, selfcheck


def _weight_model(path, kind: str, rows: int = 64, cols: int = 48):
    rng = np.random.default_rng(3)
    x = ir.Value(name="X", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([1, rows]))
    if kind == "int4-blocked":
        q = rng.integers(-8, 8, (rows, cols), dtype=np.int8).astype(ml_dtypes.int4)
        s = (rng.random((rows // 16, cols)) + 0.01).astype(np.float32)
        attrs = {"axis": 0, "block_size": 16}
    elif kind == "per-axis-0":
        q = rng.integers(-128, 128, (rows, cols), dtype=np.int8)
        s = (rng.random(rows) + 0.01).astype(np.float32)
        attrs = {"axis": 0}
    else:
        q = rng.integers(-128, 128, (rows, cols), dtype=np.int8)
        s = (rng.random(cols) + 0.01).astype(np.float32)
        attrs = {"axis": 1}
    qv = ir.Value(name="W_q", const_value=ir.tensor(q))
    sv = ir.Value(name="W_s", const_value=ir.tensor(s))
    dq = ir.node("DequantizeLinear", [qv, sv], attributes=attrs, name="dq")
    mm = ir.node("MatMul", [x, dq.outputs[0]], name="mm")
    y = mm.outputs[0]
    y.name, y.dtype, y.shape = "Y", ir.DataType.FLOAT, ir.Shape([1, cols])
    g = ir.Graph([x], [y], nodes=[dq, mm], initializers=[qv, sv], opset_imports={"": 21},
                 name="g")
    ir.save(ir.Model(g, ir_version=10), path)
    return path


@pytest.fixture
def large_paths(monkeypatch):
    from dqtool.storage import inline_read

    monkeypatch.setattr(models, "IN_FILE_BYTES", 1024)
    monkeypatch.setattr(inline_read, "MIN_FILE_BYTES", 0)
    monkeypatch.setattr(inline_read, "MIN_TENSOR_BYTES", 256)
    monkeypatch.setattr(selfcheck, "PIECE_BYTES", 2048)
    monkeypatch.setattr(selfcheck, "WHOLE_RUN_MAX_BYTES", 1024)


@pytest.mark.parametrize("kind", ["per-axis-1", "per-axis-0", "int4-blocked"])
def test_large_inline_model_is_checked_in_its_file_and_in_slices(tmp_path, kind,
                                                                  large_paths, monkeypatch):
    path = _weight_model(tmp_path / "m.onnx", kind)
    loaded = models.load(path)
    assert loaded.in_file and loaded.external_dir == tmp_path
    assert loaded.proto.ByteSize() < 1024  # the weight is not in the protobuf
    runs = []
    real = runners.run_ort
    monkeypatch.setattr(runners, "run_ort", lambda model, feeds, outputs=None, **k: (
        runs.append([list(t.dims) for t in model.graph.initializer]) or real(
            model, feeds, outputs, **k)))
    report = check(path)
    assert report.passed, report.to_json()
    assert [n.status for n in report.nodes] == ["bit-exact"]
    assert any("left in the model file" in n for n in report.notes)
    assert any("not run on onnxruntime" in n for n in report.notes)
    # every onnxruntime run is one slice of the weight: 2048 bytes of output at most
    assert len(runs) > 1
    for dims in runs:
        assert np.prod(dims[0]) * 4 <= 2048
    # Bands of rows (a run of bytes in the file), along the quantization axis too: the
    # scale is cut with them (whole blocks of 16 rows, each band cut along its columns
    # when 16 rows are still more than a slice). The slices tile the weight.
    assert sum(np.prod(x_dims) for x_dims, _ in runs) == 64 * 48, runs
    for x_dims, s_dims in runs:
        if kind == "per-axis-0":
            assert x_dims[1] == 48 and s_dims == [x_dims[0]]
        elif kind == "int4-blocked":
            assert x_dims[0] == 16 and s_dims == [1, x_dims[1]]
        else:
            assert x_dims[1] == 48 and s_dims == [48]


def test_a_mismatch_in_one_slice_is_reported(tmp_path, large_paths, monkeypatch):
    path = _weight_model(tmp_path / "m.onnx", "per-axis-1")
    real = runners.run_ort
    calls = []

    def wrong_second_slice(model, feeds, outputs=None, **k):
        out = real(model, feeds, outputs, **k)
        calls.append(1)
        if len(calls) == 2:
            out["y"] = out["y"].copy()
            out["y"].flat[3] += 1.0
        return out

    monkeypatch.setattr(runners, "run_ort", wrong_second_slice)
    report = check(path)
    assert not report.passed
    node = report.nodes[0]
    assert node.status == "mismatch"
    assert "differ in 1 of" in node.reason and "slice at axis 0 elements" in node.reason


def test_same_result_as_the_in_memory_path(tmp_path, monkeypatch):
    path = _weight_model(tmp_path / "m.onnx", "int4-blocked")
    whole = check(path).to_json()
    from dqtool.storage import inline_read

    monkeypatch.setattr(models, "IN_FILE_BYTES", 1024)
    monkeypatch.setattr(inline_read, "MIN_FILE_BYTES", 0)
    monkeypatch.setattr(inline_read, "MIN_TENSOR_BYTES", 256)
    monkeypatch.setattr(selfcheck, "PIECE_BYTES", 2048)
    sliced = check(path).to_json()
    assert [n["status"] for n in whole["nodes"]] == [n["status"] for n in sliced["nodes"]] \
        == ["bit-exact"]
    assert whole["structure"] == sliced["structure"]


def test_small_inline_models_load_as_before(tmp_path):
    path = _weight_model(tmp_path / "m.onnx", "per-axis-1")
    assert not models.load(path).in_file
