"""DQ110: lint targets that lack integer operators report them with the fix."""

from __future__ import annotations

import onnx_ir as ir
import pytest
from test_integer_to_qdq import DYNAMIC, QCONV

import dqtool


@pytest.fixture()
def models(tmp_path):
    paths = {}
    for name, text in (("qop", QCONV), ("dyn", DYNAMIC)):
        paths[name] = tmp_path / f"{name}.onnx"
        ir.save(ir.from_onnx_text(text), paths[name])
    return paths


def _dq109(path, target) -> dict[str, str]:
    report = dqtool.lint(path, target=target, select="DQ110")
    return {f.op.split(":")[1]: f.message for f in report.findings}


def test_onnx_opset_flags_com_microsoft_and_new_ops(models):
    found = _dq109(models["qop"], "onnx-opset-21")
    assert list(found) == ["QLinearGlobalAveragePool"]
    assert "com.microsoft operators are not in ai.onnx" in found["QLinearGlobalAveragePool"]
    assert "fix: `dqtool qdq`" in found["QLinearGlobalAveragePool"]
    assert _dq109(models["dyn"], "onnx-opset-21") == {}
    assert list(_dq109(models["dyn"], "onnx-opset-10")) == ["DynamicQuantizeLinear"]


def test_onnxruntime_runs_them_all(models):
    assert _dq109(models["qop"], "onnxruntime") == {}
    assert _dq109(models["dyn"], "onnxruntime") == {}


def test_directml_by_feature_level(models):
    assert sorted(_dq109(models["qop"], "directml-fl1.0")) == [
        "QLinearConv", "QLinearGlobalAveragePool"]
    assert sorted(_dq109(models["qop"], "directml-fl6.2")) == []
    assert sorted(_dq109(models["dyn"], "directml-fl3.0")) == ["DynamicQuantizeLinear"]
    assert sorted(_dq109(models["dyn"], "directml-fl6.0")) == []


def test_onednn_graph_has_no_integer_operators(models):
    found = _dq109(models["dyn"], "onednn-graph")
    assert sorted(found) == ["DynamicQuantizeLinear", "MatMulInteger"]
    assert "fix: `dqtool qdq` (DequantizeLinear → MatMul)" in found["MatMulInteger"]
    assert "fix: none in dqtool" in found["DynamicQuantizeLinear"]


def test_rule_is_registered():
    from dqtool.linting import registry

    assert registry.load()["DQ110"].name == "target-integer-operator"
