"""dqtool upgrade / downgrade: exactness on models/, refusals, preservation, CLI."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from click.testing import CliRunner

import dqtool
from dqtool.checking import conversion
from dqtool.cli import cli
from dqtool.codecs import onnx_std
from dqtool.convert import ConversionRefused, default_registry
from dqtool.convert.registry import Outcome, Registry

MODELS = Path(__file__).resolve().parent.parent / "models"
ENV = {"NO_COLOR": "1", "COLUMNS": "80"}

# (model, target, direction): conversions that must succeed bit-identically
EXACT = [
    ("dq10_uint8_per_tensor.onnx", 21, "upgrade"),
    ("dq13_int8_per_axis.onnx", 25, "upgrade"),
    ("ort_qdq_per_channel.onnx", 21, "upgrade"),
    ("ort_qdq_contrib.onnx", 21, "upgrade"),
    ("ort_qdq_contrib.onnx", 13, "upgrade"),
    ("ms_qdq_contrib.onnx", 25, "upgrade"),
    ("ms_qdq_contrib.onnx", 13, "downgrade"),
    ("invalid_ort_axis_opset11.onnx", 13, "upgrade"),
    ("invalid_nncf_uint4_opset17.onnx", 21, "upgrade"),
    ("dq21_int4_blocked_ragged.onnx", 13, "downgrade"),
    ("dq21_int8_blocked_fp16.onnx", 13, "downgrade"),
    ("dq21_uint16_per_axis.onnx", 13, "downgrade"),
    ("dq21_uint4_blocked_axis1.onnx", 19, "downgrade"),
    ("dq23_float4e2m1_output_dtype.onnx", 19, "downgrade"),
    ("dq24_float8e8m0_scale.onnx", 19, "downgrade"),
    ("dq25_int2_blocked.onnx", 13, "downgrade"),
    ("dq28_float6e2m3.onnx", 19, "downgrade"),
    ("dq19_uint8_bfloat16_scale.onnx", 13, "downgrade"),
    ("ort_int4_blocked_qdq.onnx", 19, "downgrade"),
    ("ort_uint4_blocked_ragged_qdq.onnx", 13, "downgrade"),
    ("dq_in_if_subgraph.onnx", 13, "downgrade"),
    ("dq_in_loop_body.onnx", 13, "downgrade"),
    ("opmx_int4_packed.onnx", 21, "upgrade"),
    ("opmx_int4_zp.onnx", 13, "upgrade"),
    ("opmx_int8.onnx", 13, "upgrade"),
    ("pmx_int4_legacy.onnx", 21, "upgrade"),
    ("external_data/model.onnx", 19, "downgrade"),
]


def _convert(path: Path, target: int, direction: str, **kw):
    fn = dqtool.upgrade if direction == "upgrade" else dqtool.downgrade
    return fn(path, target, **kw)


@pytest.mark.parametrize(("name", "target", "direction"), EXACT)
def test_models_convert_exactly(name, target, direction):
    report = _convert(MODELS / name, target, direction, check=True)
    assert report.check.ok, report.check
    assert all(v == "identical" or v.startswith(("skipped", "Q/DQ results identical"))
               for v in report.check.runtimes.values()), report.check
    assert report.model.opset_imports[""] == target


def test_a_float16_output_lowered_through_float32_is_judged_as_onnxruntime_runs_it(tmp_path):
    # Below opset 19 a float16 DequantizeLinear becomes float32 then Cast to float16: the
    # model's arithmetic is the original's (the reference runtime: identical). Where
    # onnxruntime's CPU provider reads the float32 value past that Cast (a float16 MatMul
    # it runs in float32: 1.31 and 1.32 do), its outputs differ; --check then said
    # "downstream op rounding on identical inputs" and passed while check --against
    # failed. Whatever the release does, the two now agree, and a difference names the
    # value onnxruntime never rounds.
    src = MODELS / "dq23_int4_output_dtype.onnx"
    out = tmp_path / "d13.onnx"
    try:
        report = dqtool.downgrade(src, 13, out, check=True)
        verdict = report.check.runtimes[conversion.ORT]
    except dqtool.convert.report.CheckFailed as e:
        verdict = str(e)
        assert "onnxruntime never rounds" in verdict and "to float16" in verdict
        assert "nothing written" in verdict and not out.exists()
        dqtool.downgrade(src, 13, out)
    assert verdict == "identical" or "DIFFERENT" in verdict
    against = dqtool.check(out, against=src)
    assert against.passed == (verdict == "identical")


def test_no_contrib_qdq_left_and_import_dropped():
    report = dqtool.upgrade(MODELS / "ort_qdq_contrib.onnx", 21)
    m = report.model
    assert "com.microsoft" not in m.opset_imports
    assert all(n.domain in ("", "ai.onnx") for n in m.graph)
    assert m.ir_version == 10


@pytest.mark.parametrize(("name", "target", "direction", "needle"), [
    ("dq19_float8e4m3fn_fp16_scale.onnx", 13, "downgrade", "float8e4m3fn"),
    ("ort_qdq_int16.onnx", 19, "downgrade", "int16"),
    ("invalid_dq13_axis_out_of_range.onnx", 21, "upgrade", "axis 2 is out of range"),
    ("invalid_nncf_uint4_opset17.onnx", 19, "upgrade", "uint4"),
    ("opmx_int4_float_zp.onnx", 21, "upgrade", "float zero point"),
    ("dq13_int8_per_axis.onnx", 10, "downgrade", "per-axis"),
])
def test_refused_with_reason(name, target, direction, needle):
    with pytest.raises(ConversionRefused) as info:
        _convert(MODELS / name, target, direction)
    reasons = " ".join(r.reason for r in info.value.report.refusals)
    assert needle in reasons
    assert info.value.exit_code == 1


def test_op_missing_at_target_is_refused_by_name():
    m = ir.from_onnx_text("""<ir_version: 8, opset_import: ["" : 17]>
        g (float[2,4] x, float[4] s, float[4] b) => (float[2,4] y) {
            y = LayerNormalization(x, s, b)
        }""")
    with pytest.raises(ConversionRefused) as info:
        dqtool.downgrade(m, 13)
    assert "LayerNormalization does not exist at opset 13" in info.value.report.refusals[0].reason


def test_decompose_per_axis_at_10():
    report = dqtool.downgrade(MODELS / "dq13_int8_per_axis.onnx", 10, allow_decompose=True,
                              check=True)
    assert report.check.ok
    assert report.warnings
    ops = {n.op_type for n in report.model.graph}
    assert "Mul" in ops and "Sub" in ops


def test_per_axis_option_removes_blocks():
    report = dqtool.upgrade(MODELS / "ort_int4_blocked_qdq.onnx", 21, per_axis=True,
                            check=True)
    assert report.check.ok
    assert not any("block_size" in n.attributes for n in report.model.graph)


def test_round_trip_13_21_13(tmp_path):
    src = MODELS / "ort_qdq_per_channel.onnx"
    up = dqtool.upgrade(src, 21, tmp_path / "up.onnx")
    down = dqtool.downgrade(tmp_path / "up.onnx", 13, tmp_path / "down.onnx")
    assert up.ok and down.ok
    a, b = onnx.load(src), onnx.load(tmp_path / "down.onnx")
    res = conversion.compare(a, b)
    assert res.ok, res


def test_same_command_twice_is_byte_identical(tmp_path):
    for i in (1, 2):
        dqtool.downgrade(MODELS / "dq21_int4_blocked_ragged.onnx", 13, tmp_path / f"{i}.onnx")
    assert (tmp_path / "1.onnx").read_bytes() == (tmp_path / "2.onnx").read_bytes()


def test_preserves_names_metadata_and_other_nodes(tmp_path):
    m = ir.load(MODELS / "ort_qdq_per_channel.onnx")
    m.metadata_props["k"] = "v"
    m.graph.doc_string = "doc"
    path = tmp_path / "m.onnx"
    ir.save(m, path)
    report = dqtool.upgrade(path, 21, tmp_path / "o.onnx")
    out = onnx.load(tmp_path / "o.onnx")
    orig = onnx.load(path)
    assert [n.name for n in out.graph.node] == [n.name for n in orig.graph.node]
    assert {p.key: p.value for p in out.metadata_props}["k"] == "v"
    assert out.graph.doc_string == "doc"
    assert report.files


def test_external_data_next_to_output_and_input_untouched(tmp_path):
    src = tmp_path / "in"
    shutil.copytree(MODELS / "external_data", src)
    before = {p.name: p.read_bytes() for p in src.iterdir()}
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    dqtool.downgrade(src / "model.onnx", 19, out_dir / "m.onnx")
    assert (out_dir / "m.onnx.data").exists()
    assert before == {p.name: p.read_bytes() for p in src.iterdir()}
    proto = onnx.load(out_dir / "m.onnx", load_external_data=False)
    locations = {e.value for t in proto.graph.initializer for e in t.external_data
                 if e.key == "location"}
    assert locations <= {"m.onnx.data"}


def test_registry_covers_every_qdq_version_and_is_private():
    reg = default_registry()
    for s in onnx.defs.get_all_schemas_with_history():
        if s.domain == "" and s.name in ("DequantizeLinear", "QuantizeLinear") and \
                s.since_version != onnx_std.versions(s.name)[0]:
            for d in ("up", "down"):
                assert ("ai.onnx", s.name, s.since_version, d) in reg
    assert default_registry() is not reg
    private = Registry()
    private.register("x", "Op", 1, "up")(lambda node, step: None)
    assert ("x", "Op", 1, "up") not in default_registry()


def test_outcome_merge():
    assert Outcome.merge([]) == Outcome.unchanged()
    assert Outcome.merge([Outcome.unchanged(), Outcome.unchanged()]) == Outcome.unchanged()
    a, b = Outcome("changed", "a", "why"), Outcome("changed", "b", "why")
    assert Outcome.merge([a, Outcome.unchanged(), b]) == Outcome("changed", "a; b", "why")
    repaired = Outcome("repaired", "valid at DequantizeLinear-13", "axis")
    assert Outcome.merge([repaired]) == repaired
    assert Outcome.merge([repaired, a]) == Outcome("changed", "valid at DequantizeLinear-13; a",
                                                    "axis; why")


def test_cli_exit_codes_and_json(tmp_path):
    shutil.copy(MODELS / "dq19_float8e4m3fn_fp16_scale.onnx", tmp_path / "f8.onnx")
    shutil.copy(MODELS / "dq13_int8_per_axis.onnx", tmp_path / "a.onnx")
    runner = CliRunner()
    r = runner.invoke(cli, ["downgrade", str(tmp_path / "f8.onnx"), "--opset", "13", "--json"],
                      env=ENV)
    assert r.exit_code == 1
    doc = json.loads(r.stdout)
    assert doc["refused"] and not doc["ok"]
    assert not (tmp_path / "f8.opset13.onnx").exists()
    r = runner.invoke(cli, ["upgrade", str(tmp_path / "a.onnx"), "--opset", "21", "--json"],
                      env=ENV)
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["ok"]
    assert (tmp_path / "a.opset21.onnx").exists()
    r = runner.invoke(cli, ["upgrade", str(tmp_path / "nope.onnx"), "--opset", "21"], env=ENV)
    assert r.exit_code == 2
    r = runner.invoke(cli, ["upgrade", str(tmp_path / "a.onnx"), "--opset", "10"], env=ENV)
    assert r.exit_code == 2
    r = runner.invoke(cli, ["upgrade", str(tmp_path / "a.onnx"), "--opset", "21", "-o",
                            str(tmp_path / "a.onnx")], env=ENV)
    assert r.exit_code == 2


def test_in_place(tmp_path):
    shutil.copy(MODELS / "dq13_int8_per_axis.onnx", tmp_path / "a.onnx")
    dqtool.upgrade(tmp_path / "a.onnx", 21, in_place=True)
    assert onnx.load(tmp_path / "a.onnx").opset_import[0].version == 21


def test_check_on_a_path_loads_the_model_once(tmp_path, monkeypatch):
    from dqtool.storage import driver

    loads = []
    real_load = driver.load
    monkeypatch.setattr(driver, "load", lambda *a, **k: loads.append(a[0]) or real_load(*a, **k))
    report = dqtool.upgrade(MODELS / "ort_qdq_contrib.onnx", 21, tmp_path / "out.onnx",
                            check=True)
    assert report.check.ok
    assert report.input == str(MODELS / "ort_qdq_contrib.onnx")
    assert loads == [MODELS / "ort_qdq_contrib.onnx"]


def test_check_of_an_external_data_model_runs_from_its_files(tmp_path, monkeypatch):
    """A model with external data is checked from its files, the converted one as written
    (before it is renamed into place). Past the Q/DQ budget only the final outputs are
    compared, strictly, and both runtimes run it streamed (never skipped for size)."""
    from dqtool.checking import models as check_models
    from dqtool.checking import runners

    folder = tmp_path / "in"
    shutil.copytree(MODELS / "external_data", folder)
    monkeypatch.setattr(conversion, "QDQ_MAX_BYTES", 1)
    monkeypatch.setattr(runners, "STREAM_BYTES", 0)  # streamed on both runtimes
    seen = []
    real_load = check_models.load
    monkeypatch.setattr(check_models, "load", lambda m, in_files=False: seen.append(
        real_load(m, in_files)) or seen[-1])
    out = tmp_path / "out" / "m.onnx"
    out.parent.mkdir()
    report = dqtool.upgrade(folder / "model.onnx", 21, out, check=True)
    check = report.check
    assert check.ok, check
    assert check.runtimes[conversion.ORT] == "identical"
    assert check.runtimes[conversion.REFERENCE] == "identical"
    assert any(n.startswith("Q/DQ results not compared one by one") for n in check.notes)
    # both models ran from files: the input's folder, then the output's temporary folder
    dirs = [entry.external_dir for entry in seen]
    assert dirs[0] == folder and dirs[1].parent == out.parent and dirs[1] != out.parent
    assert sorted(p.name for p in out.parent.iterdir()) == ["m.onnx", "m.onnx.data"]


def test_check_past_the_qdq_budget_compares_final_outputs_strictly(monkeypatch):
    # Y = MatMul(Relu(MatMul(X, W1)), W2) with W2's scale changed: Y differs.
    original = onnx.load(MODELS / "external_data" / "model.onnx")
    tampered = onnx.load(MODELS / "external_data" / "model.onnx")
    scale = next(t for t in tampered.graph.initializer if t.name == "W2_scale")
    values = onnx.numpy_helper.to_array(scale).copy()
    values.flat[0] *= 2
    scale.CopyFrom(onnx.numpy_helper.from_array(values, scale.name))
    assert conversion.compare(original, tampered).runtimes[conversion.ORT].startswith(
        "DIFFERENT Q/DQ result: W2:")
    monkeypatch.setattr(conversion, "QDQ_MAX_BYTES", 1)
    result = conversion.compare(original, tampered)
    assert not result.ok
    for runtime in (conversion.REFERENCE, conversion.ORT):
        assert result.runtimes[runtime].startswith("DIFFERENT: Y:"), result


def test_past_the_qdq_budget_a_q_dq_final_output_excuses_nothing(monkeypatch):
    """A final output that is itself a DQ result (a bias) does not make the check lenient
    when the other Q/DQ results were not compared: a changed weight scale must fail."""
    from onnx import TensorProto, helper

    def model(scale: float) -> onnx.ModelProto:
        inits = [onnx.numpy_helper.from_array(np.arange(-8, 8, dtype=np.int8).reshape(4, 4),
                                              "w"),
                 onnx.numpy_helper.from_array(np.array(scale, np.float32), "s"),
                 onnx.numpy_helper.from_array(np.arange(4, dtype=np.int8), "b"),
                 onnx.numpy_helper.from_array(np.array(0.25, np.float32), "bs")]
        g = helper.make_graph(
            [helper.make_node("DequantizeLinear", ["w", "s"], ["wf"]),
             helper.make_node("MatMul", ["x", "wf"], ["y"]),
             helper.make_node("DequantizeLinear", ["b", "bs"], ["bias"])], "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4]),
             helper.make_tensor_value_info("bias", TensorProto.FLOAT, [4])], inits)
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)],
                                 ir_version=10)

    monkeypatch.setattr(conversion, "QDQ_MAX_BYTES", 0)
    result = conversion.compare(model(0.5), model(0.75))
    assert not result.ok
    for runtime in (conversion.REFERENCE, conversion.ORT):
        assert result.runtimes[runtime].startswith("DIFFERENT: y:"), result


def _weight(name: str, rng: np.random.Generator) -> tuple[list, onnx.NodeProto]:
    from onnx import helper

    inits = [onnx.numpy_helper.from_array(rng.integers(-128, 127, (64, 64)).astype(np.int8),
                                          name),
             onnx.numpy_helper.from_array(np.array(0.01, np.float32), f"{name}_s"),
             onnx.numpy_helper.from_array(np.array(3, np.int8), f"{name}_z")]
    return inits, helper.make_node("DequantizeLinear", [name, f"{name}_s", f"{name}_z"],
                                   [f"{name}_f"], name=f"{name}_dq")


def test_check_of_external_data_inside_an_if_branch(tmp_path):
    """Initializers inside a branch in external data: the reference evaluator maps only
    main-graph ones, so the check reads the branch's in; both runtimes compare."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    main_inits, main_dq = _weight("wm", rng)
    branch_inits, branch_dq = _weight("ws", rng)
    then_g = helper.make_graph(
        [branch_dq, helper.make_node("MatMul", ["h", "ws_f"], ["t"])], "then", [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, [1, 64])], branch_inits)
    else_g = helper.make_graph([helper.make_node("Identity", ["h"], ["e"])], "else", [],
                               [helper.make_tensor_value_info("e", TensorProto.FLOAT, [1, 64])])
    g = helper.make_graph(
        [main_dq, helper.make_node("MatMul", ["x", "wm_f"], ["h"]),
         helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g,
                          name="if0")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64]),
         helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], main_inits)
    src = tmp_path / "in" / "model.onnx"
    src.parent.mkdir()
    onnx.save_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)],
                                      ir_version=7), src, save_as_external_data=True,
                    location="model.onnx.data", size_threshold=256)
    branch = next(a.g for a in onnx.load(src, load_external_data=False).graph.node[2].attribute
                  if a.name == "then_branch")
    assert branch.initializer[0].data_location == TensorProto.EXTERNAL
    report = dqtool.upgrade(src, 21, tmp_path / "up.onnx", check=True)
    assert report.check.runtimes == {conversion.REFERENCE: "identical", conversion.ORT: "identical"}


def test_a_constant_held_in_external_data_is_written_with_the_output(tmp_path):
    from onnx import TensorProto, helper

    folder = tmp_path / "in"
    folder.mkdir()
    w = np.random.default_rng(0).integers(-128, 127, (64, 64)).astype(np.int8)
    (folder / "model.onnx.data").write_bytes(w.tobytes())
    t = onnx.TensorProto(name="wv", data_type=TensorProto.INT8, dims=[64, 64],
                         data_location=TensorProto.EXTERNAL)
    for key, value in (("location", "model.onnx.data"), ("offset", "0"),
                       ("length", str(w.nbytes))):
        t.external_data.add(key=key, value=value)
    g = helper.make_graph(
        [helper.make_node("Constant", [], ["w"], value=t),
         helper.make_node("DequantizeLinear", ["w", "s", "z"], ["wf"], name="dq"),
         helper.make_node("MatMul", ["x", "wf"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
        [onnx.numpy_helper.from_array(np.array(0.01, np.float32), "s"),
         onnx.numpy_helper.from_array(np.array(3, np.int8), "z")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)],
                                ir_version=7), folder / "model.onnx")
    out = tmp_path / "out" / "up.onnx"
    out.parent.mkdir()
    report = dqtool.upgrade(folder / "model.onnx", 21, out, check=True)
    assert report.check.ok, report.check
    written = onnx.load(out)  # loads with no data file beside it: the constant is inline
    (const,) = [n for n in written.graph.node if n.op_type == "Constant"]
    assert onnx.numpy_helper.to_array(const.attribute[0].t).tobytes() == w.tobytes()


def _external_copy(src: Path, folder: Path) -> Path:
    folder.mkdir()
    onnx.save_model(onnx.load(src), folder / "model.onnx", save_as_external_data=True,
                    location="model.onnx.data", size_threshold=0)
    return folder / "model.onnx"


def _values(path: Path) -> dict[str, bytes]:
    return {t.name: onnx.numpy_helper.to_array(t).tobytes()
            for t in onnx.load(path).graph.initializer}


def _chain(folder: Path, nodes: int = 4, k: int = 64) -> Path:
    """X @ DQ(W0) @ DQ(W1) ...: int8 per-axis weights in external data, as exporters
    write them (scales inline)."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    inits, graph_nodes, prev = [], [], "X"
    for i in range(nodes):
        inits += [onnx.numpy_helper.from_array(rng.integers(-128, 128, (k, k), np.int8),
                                               f"W{i}"),
                  onnx.numpy_helper.from_array(np.full(k, 0.01, np.float32), f"S{i}")]
        graph_nodes += [helper.make_node("DequantizeLinear", [f"W{i}", f"S{i}"], [f"D{i}"],
                                         name=f"dq{i}", axis=1),
                        helper.make_node("MatMul", [prev, f"D{i}"], [f"H{i}"], name=f"mm{i}")]
        prev = f"H{i}"
    g = helper.make_graph(graph_nodes, "chain",
                          [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, k])],
                          [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [1, k])],
                          inits)
    folder.mkdir()
    onnx.save_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)],
                                      ir_version=7), folder / "model.onnx",
                    save_as_external_data=True, location="model.onnx.data",
                    size_threshold=1024)
    return folder / "model.onnx"


def test_unchanged_data_keeps_its_offsets_and_the_copy_overlaps_the_conversion(tmp_path):
    src = _chain(tmp_path / "in")
    data = (src.parent / "model.onnx.data").read_bytes()
    out = tmp_path / "out" / "up.onnx"
    out.parent.mkdir()
    dqtool.upgrade(src, 21, out)
    written = (out.parent / "up.onnx.data").read_bytes()
    assert written[: len(data)] == data  # the input's file, then what it did not hold
    assert _values(out) == _values(src)
    inputs = {t.name: (dict((e.key, e.value) for e in t.external_data))
              for t in onnx.load(src, load_external_data=False).graph.initializer}
    for t in onnx.load(out, load_external_data=False).graph.initializer:
        if t.name in inputs and "offset" in inputs[t.name] and t.external_data:
            offset = dict((e.key, e.value) for e in t.external_data).get("offset", "0")
            assert offset == inputs[t.name]["offset"], t.name
    again = tmp_path / "out" / "again.onnx"
    dqtool.upgrade(src, 21, again)
    assert (out.parent / "again.onnx.data").read_bytes() == written
    assert sorted(p.name for p in out.parent.iterdir()) == [
        "again.onnx", "again.onnx.data", "up.onnx", "up.onnx.data"]


def _external_with_copy_log(g, tmp_path, monkeypatch):
    """Graph ``g`` saved at opset 21 with external data (tmp_path/in/model.onnx); the list
    each ``DataFileCopy.finish`` call appends its ``cancel`` to."""
    from onnx import helper

    from dqtool.storage import data_writer

    folder = tmp_path / "in"
    folder.mkdir()
    src = folder / "model.onnx"
    onnx.save_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)],
                                      ir_version=10), src, save_as_external_data=True,
                    location="model.onnx.data", size_threshold=1024)
    cancelled: list[bool] = []
    real_finish = data_writer.DataFileCopy.finish
    monkeypatch.setattr(data_writer.DataFileCopy, "finish", lambda self, cancel=False: (
        cancelled.append(cancel) or real_finish(self, cancel)))
    return src, cancelled


def test_when_most_data_changes_the_copy_is_dropped_and_the_output_packed(tmp_path,
                                                                            monkeypatch):
    import ml_dtypes
    from onnx import TensorProto, helper


    rng = np.random.default_rng(0)
    w = rng.integers(-8, 8, (64, 64)).astype(ml_dtypes.int4)  # 2 KiB packed
    g = helper.make_graph(
        [helper.make_node("DequantizeLinear", ["W", "S"], ["D"], name="dq", axis=1,
                          block_size=32),
         helper.make_node("MatMul", ["X", "D"], ["Y"], name="mm")], "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 64])],
        [onnx.numpy_helper.from_array(w, "W"),
         onnx.numpy_helper.from_array(np.full((64, 2), 0.01, np.float32), "S")])
    src, cancelled = _external_with_copy_log(g, tmp_path, monkeypatch)
    out = tmp_path / "out" / "down.onnx"
    out.parent.mkdir()
    report = dqtool.downgrade(src, 19, out)
    assert [c for c in report.changes if c.status != "kept"]
    assert cancelled and cancelled[0] is True  # the copy was started, then dropped
    # packed: the data file holds the rewritten weight (64 x 64 int8) and little else
    size = (out.parent / "down.onnx.data").stat().st_size
    assert 64 * 64 <= size < 64 * 64 + 2048
    result = conversion.compare(onnx.load(src), onnx.load(out))
    assert result.ok, result


def test_a_copy_that_would_keep_a_quarter_unused_is_dropped(tmp_path, monkeypatch):
    """Three quarters of the data kept, a quarter rewritten: the copy is dropped and the
    output laid out compactly. (Until 2026-11-27, `b9a228a`, the copy was kept where half
    was, the rewritten weight's old bytes left in the output unused.)"""
    import ml_dtypes
    from onnx import TensorProto, helper


    rng = np.random.default_rng(0)
    keep = rng.integers(-128, 128, (96, 64)).astype(np.int8)  # 6 KiB, per-axis: kept
    w = rng.integers(-8, 8, (64, 64)).astype(ml_dtypes.int4)  # 2 KiB, widened to int8
    g = helper.make_graph(
        [helper.make_node("DequantizeLinear", ["K", "KS"], ["KD"], name="kdq", axis=1),
         helper.make_node("DequantizeLinear", ["W", "S"], ["D"], name="dq", axis=1,
                          block_size=32),
         helper.make_node("MatMul", ["X", "D"], ["Y0"], name="mm"),
         helper.make_node("MatMul", ["X96", "KD"], ["Y1"], name="mk")], "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 64]),
         helper.make_tensor_value_info("X96", TensorProto.FLOAT, [1, 96])],
        [helper.make_tensor_value_info("Y0", TensorProto.FLOAT, [1, 64]),
         helper.make_tensor_value_info("Y1", TensorProto.FLOAT, [1, 64])],
        [onnx.numpy_helper.from_array(keep, "K"),
         onnx.numpy_helper.from_array(np.full(64, 0.01, np.float32), "KS"),
         onnx.numpy_helper.from_array(w, "W"),
         onnx.numpy_helper.from_array(np.full((64, 2), 0.01, np.float32), "S")])
    src, cancelled = _external_with_copy_log(g, tmp_path, monkeypatch)
    data = (src.parent / "model.onnx.data").stat().st_size
    out = tmp_path / "out" / "down.onnx"
    out.parent.mkdir()
    dqtool.downgrade(src, 19, out)
    assert cancelled and cancelled[0] is True
    # compact: the kept weight and the int8 one, not the int4 one's old bytes too
    size = (out.parent / "down.onnx.data").stat().st_size
    assert 96 * 64 + 64 * 64 <= size <= 96 * 64 + 64 * 64 + 1024 < data + 64 * 64
    result = conversion.compare(onnx.load(src), onnx.load(out))
    assert result.ok, result


def test_a_refused_conversion_leaves_no_copy_behind(tmp_path):
    src = _external_copy(MODELS / "dq19_float8e4m3fn_fp16_scale.onnx", tmp_path / "in")
    out = tmp_path / "out" / "down.onnx"
    out.parent.mkdir()
    with pytest.raises(ConversionRefused):
        dqtool.downgrade(src, 13, out)
    assert list(out.parent.iterdir()) == []


def test_in_place_with_external_data_keeps_the_values(tmp_path):
    src = _chain(tmp_path / "in")
    before = _values(src)
    dqtool.upgrade(src, 21, in_place=True)
    assert _values(src) == before
    assert onnx.load(src).opset_import[0].version == 21
    # the new data under a new name (the old model never saw it), the old data removed
    files = sorted(p.name for p in src.parent.iterdir())
    assert len(files) == 2 and files[0] == "model.onnx", files
    assert re.fullmatch(r"model\.onnx\.[0-9a-f]{8}\.data", files[1]), files
    locations = {e.value for t in onnx.load(src, load_external_data=False).graph.initializer
                 for e in t.external_data if e.key == "location"}
    assert locations == {files[1]}
    dqtool.upgrade(src, 23, in_place=True)  # and back to the plain name the next time
    assert sorted(p.name for p in src.parent.iterdir()) == ["model.onnx", "model.onnx.data"]
    assert _values(src) == before


def test_the_copy_falls_back_to_user_space_across_file_systems(tmp_path, monkeypatch):
    import errno
    import os

    src = _chain(tmp_path / "in")
    calls = []

    def no_cross_device(*args, **kwargs):
        calls.append(args)
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "copy_file_range", no_cross_device)
    out = tmp_path / "out" / "up.onnx"
    out.parent.mkdir()
    dqtool.upgrade(src, 21, out)
    assert calls  # the kernel copy was tried
    assert _values(out) == _values(src)
    data = (src.parent / "model.onnx.data").read_bytes()
    assert (out.parent / "up.onnx.data").read_bytes()[: len(data)] == data


def test_a_full_disk_is_one_line_and_nothing_written(tmp_path, monkeypatch):
    import errno

    from dqtool.storage import data_writer

    src = _chain(tmp_path / "in")

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(data_writer, "_copy_range", disk_full)  # the early copy
    out = tmp_path / "out" / "up.onnx"
    out.parent.mkdir()
    r = CliRunner().invoke(cli, ["upgrade", str(src), "--opset", "21", "-o", str(out)],
                           env={"NO_COLOR": "1"})
    assert r.exit_code == 2, r.output
    assert r.stderr == (f"dqtool: error: {out}: cannot write it (No space left on device); "
                        "nothing was written\n")
    assert list(out.parent.iterdir()) == []
