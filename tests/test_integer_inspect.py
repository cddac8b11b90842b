"""Integer operators are read into descriptions and listed by ``inspect``."""

from __future__ import annotations

import json

import onnx_ir as ir
from click.testing import CliRunner

import dqtool
from dqtool.cli import cli

QOP = """<ir_version: 8, opset_import: ["" : 13, "com.microsoft" : 1]>
g (uint8[1,3,8,8] x) => (uint8[1,4,8,8] y, uint8[1,4,1,1] p) <
    float xs = {0.02}, uint8 xz = {128}, int8[4,3,3,3] w = {W},
    float[4] ws = {0.01, 0.02, 0.03, 0.04}, int8[4] wz = {0, 0, 0, 0}, float ys = {0.1},
    uint8 yz = {120}, int32[4] b = {1, 2, 3, 4},
    float ps = {0.05}, uint8 pz = {128}>
{
    y = QLinearConv <kernel_shape = [3, 3], pads = [1, 1, 1, 1]> (x, xs, xz, w, ws, wz, ys, yz, b)
    p = com.microsoft.QLinearGlobalAveragePool <channels_last = 0> (y, ys, yz, ps, pz)
}
""".replace("{W}", "{" + ", ".join(["1"] * 108) + "}")  # a tensor holds all its values

DYNAMIC = """<ir_version: 8, opset_import: ["" : 13]>
g (float[2,4] x) => (float[2,3] y) <
    int8[4,3] w = {1,2,3,4,5,6,7,8,9,10,11,12}, float[3] wscale = {0.1, 0.2, 0.3},
    int8[3] wzp = {0, 0, 0}>
{
    xq, xs, xz = DynamicQuantizeLinear (x)
    s = Mul (xs, wscale)
    acc = MatMulInteger (xq, w, xz, wzp)
    accf = Cast <to = 1> (acc)
    y = Mul (accf, s)
}
"""


def _report(text: str):
    return dqtool.inspect(ir.from_onnx_text(text))


def test_qoperator_nodes_are_described():
    report = _report(QOP)
    assert report.nodes == ()
    conv, pool = report.integer_nodes
    s = conv.spec
    assert (s.domain, s.op, s.version, s.kind, s.bias_type) == (
        "ai.onnx", "QLinearConv", 13, "qlinear", "int32")
    x, w = s.inputs
    assert (x.type, x.granularity, x.constant, x.scale_constant) == ("uint8", "per-tensor",
                                                                     False, True)
    assert (w.type, w.granularity, w.axis, w.constant, w.scale_shape) == (
        "int8", "per-axis", 0, True, (4,))
    assert (s.output.type, s.output.granularity) == ("uint8", "per-tensor")
    assert s.weights_constant and s.qdq_form and not s.problems
    assert pool.spec.domain == "com.microsoft" and pool.spec.op == "QLinearGlobalAveragePool"
    assert report.summary["integer_nodes"] == 2
    assert report.summary["integer_by_op"] == {"ai.onnx:QLinearConv": 1,
                                               "com.microsoft:QLinearGlobalAveragePool": 1}


def test_dynamic_nodes_get_types_from_dynamic_quantize_linear():
    report = _report(DYNAMIC)
    dql, mmi = report.integer_nodes
    assert dql.spec.op == "DynamicQuantizeLinear" and dql.spec.output.type == "uint8"
    a, b = mmi.spec.inputs
    assert (a.type, a.zero_point_type, a.granularity) == ("uint8", "uint8", "per-tensor")
    assert (b.type, b.granularity, b.axis, b.constant) == ("int8", "per-axis", 1, True)
    assert mmi.spec.output is None and mmi.spec.output_type == "int32"
    assert report.summary["integer_by_kind"] == {"dynamic": 1, "integer": 1}


def test_no_qdq_form_and_zero_point_mismatch_are_problems():
    text = """<ir_version: 8, opset_import: ["" : 13, "com.microsoft" : 1]>
    g (uint8[2,4] a) => (int32[2,4] c)
        <uint8 az = {1}, uint8[2,4] b = {1,2,3,4,5,6,7,8}, int8 bz = {0}>
    {
        c = com.microsoft.MulInteger (a, az, b, bz)
    }
    """
    report = _report(text)
    (node,) = report.integer_nodes
    codes = sorted((p.code, p.severity) for p in node.spec.problems)
    assert codes == [("DQ015", "error"), ("DQ032", "info")]
    assert not node.spec.qdq_form and "no scale" in node.spec.no_qdq_reason
    # The node has no name: the summary still says which one, not "".
    assert report.summary["integer_without_qdq_form"] == ["<unnamed MulInteger>"]


def test_inspect_json_and_table(tmp_path):
    path = tmp_path / "m.onnx"
    ir.save(ir.from_onnx_text(QOP), path)
    res = CliRunner().invoke(cli, ["inspect", "--json", str(path)])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert [n["op_type"] for n in doc["integer_nodes"]] == ["QLinearConv",
                                                           "QLinearGlobalAveragePool"]
    assert doc["integer_nodes"][0]["inputs"][1]["granularity"] == "per-axis"
    assert doc["summary"]["integer_nodes"] == 2
    res = CliRunner(env={"NO_COLOR": "1", "COLUMNS": "140"}).invoke(cli, ["inspect", str(path)])
    assert res.exit_code == 0
    assert "2 integer operators" in res.output
    assert "w int8 axis 0 const" in res.output
