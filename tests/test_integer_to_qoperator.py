"""QDQ → integer operators, and the round trip QOperator → QDQ → QOperator."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx_ir as ir
import pytest
from click.testing import CliRunner
from test_integer_to_qdq import DYNAMIC, QCONV

from dqtool.cli import cli
from dqtool.integer import api

QMLP = """<ir_version: 8, opset_import: ["" : 13, "com.microsoft" : 1]>
g (uint8[2,4] a) => (uint8[2,3] y) <
    float as = {0.02}, uint8 az = {128}, int8[4,3] w = {1,2,3,4,5,6,7,8,9,10,11,-12},
    float ws = {0.01}, int8 wz = {0}, float ms = {0.05}, uint8 mz = {100},
    uint8[3] c = {1, 2, 250}, float cs = {0.01}, uint8 cz = {3}, float ys = {0.08},
    uint8 yz = {90}, float ss = {0.0039}, uint8 sz = {0}>
{
    m = QLinearMatMul (a, as, az, w, ws, wz, ms, mz)
    s = com.microsoft.QLinearAdd (m, ms, mz, c, cs, cz, ys, yz)
    y = com.microsoft.QLinearSigmoid (s, ys, yz, ss, sz)
}
"""


def _census(model: ir.Model) -> Counter:
    return Counter((n.domain, n.op_type) for n in model.graph)


def _tensors(model: ir.Model) -> dict[str, np.ndarray]:
    return {k: v.const_value.numpy() for k, v in model.graph.initializers.items()}


@pytest.mark.parametrize("text", [QCONV, QMLP, DYNAMIC], ids=["conv", "mlp", "dynamic"])
def test_round_trip_restores_operators_and_tensors(text):
    original = ir.from_onnx_text(text)
    qdq = api.to_qdq(original).model
    assert not any(n.op_type.startswith("QLinear") or n.op_type.endswith("Integer")
                   for n in qdq.graph)
    back = api.to_qoperator(qdq).model
    assert _census(back) == _census(original)
    want, got = _tensors(original), _tensors(back)
    assert set(got) == set(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and np.array_equal(got[k], want[k]), k
    assert dict(back.opset_imports) == dict(original.opset_imports)


def test_static_round_trip_keeps_node_order_names_and_attributes():
    original = ir.from_onnx_text(QCONV)
    for i, n in enumerate(original.graph):
        n.name = f"node{i}"
    back = api.to_qoperator(api.to_qdq(original).model).model
    assert [(n.name, n.op_type, sorted(n.attributes)) for n in back.graph] == \
        [(n.name, n.op_type, sorted(n.attributes)) for n in original.graph]


def test_not_fused_when_the_pattern_is_incomplete():
    text = """<ir_version: 8, opset_import: ["" : 13]>
    g (uint8[2,4] a) => (float[2,3] y) <float as = {0.02}, uint8 az = {128},
        int8[4,3] w = {1,2,3,4,5,6,7,8,9,10,11,-12}, float ws = {0.01}, int8 wz = {0}>
    {
        ad = DequantizeLinear (a, as, az)
        wd = DequantizeLinear (w, ws, wz)
        y = MatMul (ad, wd)
    }
    """
    report = api.to_qoperator(ir.from_onnx_text(text))
    assert report.changes == [] and [n.op_type for n in report.model.graph] == [
        "DequantizeLinear", "DequantizeLinear", "MatMul"]


def test_bias_with_another_scale_is_not_fused():
    bad = QCONV.replace("int32[4] b = {100, -200, 300, 400}", "int32[4] b = {1, 2, 3, 4}")
    qdq = api.to_qdq(ir.from_onnx_text(bad)).model
    bias_scale = next(v for k, v in qdq.graph.initializers.items() if "bias_scale" in k)
    bias_scale.const_value = ir.tensor(np.full(4, 0.5, np.float32), name=bias_scale.name)
    back = api.to_qoperator(qdq).model
    assert "QLinearConv" not in {n.op_type for n in back.graph}
    assert "Conv" in {n.op_type for n in back.graph}


def test_cli_qoperator(tmp_path):
    path, out = tmp_path / "m.onnx", tmp_path / "m.qop.onnx"
    ir.save(api.to_qdq(ir.from_onnx_text(QMLP)).model, path)
    res = CliRunner().invoke(cli, ["qoperator", str(path), "--check"])
    assert res.exit_code == 0, res.output
    assert "3 rewritten" in res.output and out.exists()
    assert "ORT_ENABLE_ALL" not in res.output
