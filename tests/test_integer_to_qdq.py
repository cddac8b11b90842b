"""Integer operators → QDQ: structure, tensors kept, refusals, numerics within one step."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from click.testing import CliRunner
from helpers.integer import run_ort

from dqtool.cli import cli
from dqtool.integer import api

QCONV = """<ir_version: 8, opset_import: ["" : 13, "com.microsoft" : 1]>
g (uint8[1,3,6,6] x) => (uint8[1,4,1,1] p) <
    float xs = {0.02}, uint8 xz = {128},
    int8[4,3,1,1] w = {1, -2, 3, 4, 5, -6, 7, 8, -9, 10, 11, 12},
    float[4] ws = {0.01, 0.02, 0.03, 0.04}, int8[4] wz = {0, 0, 0, 0}, float ys = {0.1},
    uint8 yz = {120}, int32[4] b = {100, -200, 300, 400}, float ps = {0.05}, uint8 pz = {128}>
{
    y = QLinearConv <kernel_shape = [1, 1]> (x, xs, xz, w, ws, wz, ys, yz, b)
    p = com.microsoft.QLinearGlobalAveragePool <channels_last = 0> (y, ys, yz, ps, pz)
}
"""

DYNAMIC = """<ir_version: 8, opset_import: ["" : 13]>
g (float[2,4] x) => (float[2,3] y) <
    int8[4,3] w = {1,2,3,4,5,6,7,8,9,10,11,-12}, float[3] wscale = {0.1, 0.2, 0.3},
    int8[3] wzp = {0, 1, -1}, float[3] bias = {0.5, -0.5, 1}>
{
    xq, xs, xz = DynamicQuantizeLinear (x)
    s = Mul (xs, wscale)
    acc = MatMulInteger (xq, w, xz, wzp)
    accf = Cast <to = 1> (acc)
    m = Mul (accf, s)
    y = Add (m, bias)
}
"""


def _ops(model: ir.Model) -> list[str]:
    return [n.op_type for n in model.graph]


def test_qlinear_conv_becomes_dq_conv_q_with_tensors_kept():
    report = api.to_qdq(ir.from_onnx_text(QCONV))
    m = report.model
    assert [c.op for c in report.changes] == ["ai.onnx:QLinearConv",
                                              "com.microsoft:QLinearGlobalAveragePool"]
    assert _ops(m).count("DequantizeLinear") == 4 and "QLinearConv" not in _ops(m)
    assert sorted(set(_ops(m))) == ["Conv", "DequantizeLinear", "GlobalAveragePool",
                                    "QuantizeLinear"]
    assert "com.microsoft" not in m.opset_imports
    conv = next(n for n in m.graph if n.op_type == "Conv")
    x_dq, w_dq, b_dq = (v.producer() for v in conv.inputs)
    assert x_dq.inputs[0].name == "x"
    assert w_dq.inputs[0].name == "w" and w_dq.attributes["axis"].value == 0
    assert w_dq.inputs[0].const_value.numpy().dtype == np.int8  # weight kept quantized
    # int32 bias, per-channel scale x_scale·w_scale (float32), no zero point
    assert b_dq.inputs[0].name == "b" and len(b_dq.inputs) == 2
    want = np.float32(0.02) * np.array([0.01, 0.02, 0.03, 0.04], np.float32)
    assert np.array_equal(b_dq.inputs[1].const_value.numpy(), want)
    assert b_dq.attributes["axis"].value == 0
    assert conv.name  # the float op keeps the integer op's name
    onnx.checker.check_model(ir.to_proto(m), full_check=True)


def test_qdq_form_runs_in_onnxruntime_within_one_step():
    original = ir.to_proto(ir.from_onnx_text(QCONV))
    converted = ir.to_proto(api.to_qdq(ir.from_onnx_text(QCONV)).model)
    x = np.random.default_rng(0).integers(0, 256, (1, 3, 6, 6)).astype(np.uint8)
    want, got = run_ort(original, {"x": x})[0], run_ort(converted, {"x": x})[0]
    assert got.dtype == np.uint8
    assert np.abs(got.astype(int) - want.astype(int)).max() <= 1


def test_dynamic_pattern_becomes_dq_matmul():
    report = api.to_qdq(ir.from_onnx_text(DYNAMIC))
    m = report.model
    assert _ops(m) == ["DynamicQuantizeLinear", "DequantizeLinear", "DequantizeLinear",
                       "MatMul", "Add"]
    w_dq = m.graph.node(2)
    assert [v.name for v in w_dq.inputs] == ["w", "wscale", "wzp"]
    assert w_dq.attributes["axis"].value == 1  # per-column stays per-column
    a_dq = m.graph.node(1)
    dql = m.graph.node(0)
    assert list(a_dq.inputs) == list(dql.outputs)
    assert m.graph.node(4).inputs[0].producer().op_type == "MatMul"
    x = np.random.default_rng(1).standard_normal((2, 4)).astype(np.float32)
    want = run_ort(ir.to_proto(ir.from_onnx_text(DYNAMIC)), {"x": x})[0]
    got = run_ort(ir.to_proto(m), {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_refusals_name_the_node_and_write_nothing(tmp_path):
    text = """<ir_version: 8, opset_import: ["" : 13]>
    g (uint8[2,4] a) => (int32[2,3] y) <int8[4,3] w = {1,2,3,4,5,6,7,8,9,10,11,12}>
    {
        y = MatMulInteger (a, w)
    }
    """
    model = ir.from_onnx_text(text)
    with pytest.raises(api.IntegerConversionRefused) as e:
        api.to_qdq(model)
    (refusal,) = e.value.report.refusals
    assert refusal.op == "ai.onnx:MatMulInteger" and "no scales" in refusal.reason
    assert _ops(model) == ["MatMulInteger"]  # the caller's model is untouched
    path, out = tmp_path / "m.onnx", tmp_path / "m.qdq.onnx"
    ir.save(model, path)
    res = CliRunner().invoke(cli, ["qdq", str(path), "-o", str(out)])
    assert res.exit_code == 1 and not out.exists()
    assert "REFUSED" in res.output and "no scales to dequantize with" in res.output
    res = CliRunner().invoke(cli, ["qdq", str(path), "-o", str(out), "--keep-unconvertible"])
    assert res.exit_code == 0 and out.exists()


def test_lstm_has_no_qdq_form():
    text = """<ir_version: 8, opset_import: ["" : 13, "com.microsoft" : 1]>
    g (float[2,1,4] x) => (float[2,1,1,3] y) <int8[1,4,12] w = {0}, int8[1,3,12] r = {0},
        float[1] ws = {0.1}, int8[1] wz = {0}, float[1] rs = {0.1}, int8[1] rz = {0}>
    {
        y = com.microsoft.DynamicQuantizeLSTM <hidden_size = 3>
            (x, w, r, , , , , , ws, wz, rs, rz)
    }
    """
    with pytest.raises(api.IntegerConversionRefused) as e:
        api.to_qdq(ir.from_onnx_text(text))
    assert "DynamicQuantizeLSTM" in str(e.value) and "LSTM takes float weights" in str(e.value)


def test_cli_writes_and_checks(tmp_path):
    path, out = tmp_path / "m.onnx", tmp_path / "out.onnx"
    ir.save(ir.from_onnx_text(QCONV), path)
    before = path.read_bytes()
    res = CliRunner().invoke(cli, ["qdq", str(path), "-o", str(out), "--check", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["ok"] and len(doc["changed"]) == 2 and doc["files"] == [str(out)]
    assert doc["check"]["ok"] and doc["check"]["fused"]["error"] is None
    assert {o["runtime"] for o in doc["check"]["outputs"]} == {"onnxruntime", "reference"}
    assert all(o["max_steps"] <= 1 for o in doc["check"]["outputs"])
    assert path.read_bytes() == before
    converted = onnx.load(str(out))
    assert {n.op_type for n in converted.graph.node} == {
        "DequantizeLinear", "Conv", "QuantizeLinear", "GlobalAveragePool"}


def test_upgrade_to_qdq_rewrites_then_upgrades(tmp_path):
    path, out = tmp_path / "m.onnx", tmp_path / "m21.onnx"
    ir.save(ir.from_onnx_text(QCONV), path)
    res = CliRunner().invoke(cli, ["upgrade", str(path), "--opset", "21", "--to-qdq", "-o",
                                   str(out)])
    assert res.exit_code == 0, res.output
    assert "DequantizeLinear ×3 → Conv → QuantizeLinear" in res.output
    m = onnx.load(str(out))
    assert [o.version for o in m.opset_import if o.domain == ""] == [21]
    assert not any(n.op_type.startswith("QLinear") for n in m.graph.node)


@pytest.mark.parametrize(("text", "reason"), [
    ("""<ir_version: 8, opset_import: ["" : 13]>
     g (uint8[1,3,4,4] x) => (uint8[1,4,4,4] y) <float xs = {0.1}, uint8 xz = {1}>
     { y = QLinearConv (x, xs, xz) }""", "input 'w' is missing"),
    ("""<ir_version: 8, opset_import: ["" : 13, "com.microsoft" : 1]>
     g (uint8[2,4] a) => (uint8[2,4] y) <float s = {0.1}, uint8 z = {1}>
     { y = com.microsoft.QLinearConcat <axis = 0> (s, z) }""", "got 2 inputs"),
    ("""<ir_version: 8, opset_import: ["" : 13, "com.microsoft" : 1]>
     g (uint8[2,4] a) => (float[2,3] y) <uint8 az = {1},
         int8[4,3] b = {1,2,3,4,5,6,7,8,9,10,11,12}, int8 bz = {0}>
     { y = com.microsoft.QGemm (a, , az, b, , bz) }""", "the scale of 'a' is missing"),
], ids=["missing-weight", "concat-without-inputs", "missing-scale"])
def test_broken_nodes_are_refused_with_what_is_wrong(text, reason):
    with pytest.raises(api.IntegerConversionRefused) as e:
        api.to_qdq(ir.from_onnx_text(text))
    (refusal,) = e.value.report.refusals
    assert refusal.reason.startswith("DQ018: ") and reason in refusal.reason


def test_check_that_compared_nothing_does_not_claim_an_output_moved(tmp_path):
    # Neither runtime can run this model (axis 2 of a rank-2 tensor): --check compared no
    # output, so its refusal must say that rather than report a step difference.
    src = tmp_path / "m.onnx"
    onnx.save(onnx.parser.parse_model("""<ir_version: 8, opset_import: ["" : 13]>
g (float[2,3] x) => (float[2,3] y) <int8[2,3] w = {1, 2, 3, 4, 5, 6}, float[3] s = {1, 2, 3}>
{
    d = DequantizeLinear <axis = 2> (w, s)
    y = Add (x, d)
}
"""), src)
    r = CliRunner().invoke(cli, ["qdq", str(src), "-o", str(tmp_path / "out.onnx"), "--check"])
    assert r.exit_code == 1
    last = r.output.strip().splitlines()[-1]
    assert "moved" not in last and "no runtime ran both models" in last, last
    assert not (tmp_path / "out.onnx").exists()


# onnxruntime's MatMulInteger takes a per-column weight zero point beside one scale;
# DequantizeLinear takes a scale and a zero point of one shape.
COLUMN_ZP = DYNAMIC.replace("float[3] wscale = {0.1, 0.2, 0.3}", "float wscale = {0.0123}")


@pytest.mark.parametrize("exact", [False, True])
def test_a_per_column_zero_point_beside_one_scale_makes_a_valid_per_axis_dequantize(exact):
    original = ir.to_proto(ir.from_onnx_text(COLUMN_ZP))
    m = api.to_qdq(ir.from_onnx_text(COLUMN_ZP), exact_dynamic=exact).model
    w_dq = next(n for n in m.graph if n.op_type == "DequantizeLinear"
                and n.inputs[0].name == "w")
    assert w_dq.attributes["axis"].value == 1
    scale = w_dq.inputs[1].const_value.numpy()
    assert w_dq.inputs[2].name == "wzp" and scale.shape == (3,)
    if not exact:  # the one scale in every column
        assert np.array_equal(scale, np.full(3, 0.0123, np.float32))
    proto = ir.to_proto(m)
    onnx.checker.check_model(proto, full_check=True)
    x = np.random.default_rng(2).standard_normal((2, 4)).astype(np.float32)
    want, got = run_ort(original, {"x": x})[0], run_ort(proto, {"x": x})[0]
    if exact:
        assert np.array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_per_column_zero_point_beside_a_run_time_scale_is_refused():
    text = COLUMN_ZP.replace("float wscale = {0.0123},", "").replace(
        "(float[2,4] x)", "(float[2,4] x, float wscale)")
    assert "0.0123" not in text
    with pytest.raises(api.IntegerConversionRefused, match="computed at run time"):
        api.to_qdq(ir.from_onnx_text(text))


FUNCTION_ZP = """<ir_version: 8, opset_import: ["" : 13, "local" : 1]>
g (float[2,4] x) => (float[2,3] y) {
    y = local.mlp (x)
}
<domain: "local", opset_import: ["" : 13]>
mlp (x) => (y) {
    w = Constant <value = int8[4,3] {1,2,3,4,5,6,7,8,9,10,11,-12}> ()
    wscale = Constant <value = float {0.0123}> ()
    wzp = Constant <value = int8[3] {0, 1, -1}> ()
    bias = Constant <value = float[3] {0.5, -0.5, 1}> ()
    xq, xs, xz = DynamicQuantizeLinear (x)
    s = Mul (xs, wscale)
    acc = MatMulInteger (xq, w, xz, wzp)
    accf = Cast <to = 1> (acc)
    m = Mul (accf, s)
    y = Add (m, bias)
}
"""


def test_a_rewrite_inside_a_function_makes_its_constants_constant_nodes(tmp_path):
    # A function has no initializers: the per-axis scale made for the column zero point
    # was registered as one and lost when the model was saved (onnx's checker refused it).
    src = tmp_path / "fn.onnx"
    onnx.save(onnx.parser.parse_model(FUNCTION_ZP), src)
    report = api.to_qdq(src, tmp_path / "q.onnx")
    assert [c.graph for c in report.changes] == ["function:local.mlp"]
    q = onnx.load(tmp_path / "q.onnx")
    onnx.checker.check_model(q, full_check=True)
    assert not q.graph.initializer
    x = np.random.default_rng(3).standard_normal((2, 4)).astype(np.float32)
    want, got = run_ort(onnx.load(src), {"x": x})[0], run_ort(q, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
