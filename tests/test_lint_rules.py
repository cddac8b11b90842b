"""Every lint rule (DQ0xx, FU0xx): a model that triggers it and one that does not."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from helpers import dq_model, save
from onnx import helper, numpy_helper

from dqtool.linting import all_rules, lint

F32 = np.float32
I8 = np.arange(-4, 4, dtype=np.int8).reshape(2, 4)


def _pair(q_scale: float, dq_scale: float) -> onnx.ModelProto:
    inits = [numpy_helper.from_array(np.array(q_scale, F32), "qs"),
             numpy_helper.from_array(np.array(dq_scale, F32), "ds"),
             numpy_helper.from_array(np.array(128, np.uint8), "zp")]
    nodes = [helper.make_node("QuantizeLinear", ["X", "qs", "zp"], ["Xq"], name="q"),
             helper.make_node("DequantizeLinear", ["Xq", "ds", "zp"], ["Y"], name="dq")]
    g = helper.make_graph(nodes, "pair", [helper.make_tensor_value_info("X", 1, [4])],
                          [helper.make_tensor_value_info("Y", 1, [4])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 7
    return m


def _matmulnbits(imported: bool) -> onnx.ModelProto:
    node = helper.make_node("MatMulNBits", ["X", "B", "S"], ["Y"], name="mmnb",
                            domain="com.microsoft", K=32, N=8, bits=4, block_size=32)
    inits = [numpy_helper.from_array(np.zeros((8, 1, 16), np.uint8), "B"),
             numpy_helper.from_array(np.ones((8,), F32), "S")]
    g = helper.make_graph([node], "nbits", [helper.make_tensor_value_info("X", 1, [1, 32])],
                          [helper.make_tensor_value_info("Y", 1, [1, 8])], inits)
    ops = [helper.make_opsetid("", 17)] + (
        [helper.make_opsetid("com.microsoft", 1)] if imported else [])
    m = helper.make_model(g, opset_imports=ops)
    m.ir_version = 8
    return m


def _broken_nbits(how: str) -> onnx.ModelProto:
    """_matmulnbits(True) with one thing wrong, as FU001-FU006 find it."""
    m = _matmulnbits(True)
    node = m.graph.node[0]
    attr = {a.name: a for a in node.attribute}
    if how == "FU001":
        node.attribute.remove(attr["K"])
    elif how == "FU002":
        attr["bits"].i = 3
    elif how == "FU003":
        m.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.zeros((8, 1, 16), np.int8),
                                                                "B"))
    elif how == "FU004":
        m.graph.initializer[1].CopyFrom(numpy_helper.from_array(np.ones((4,), F32), "S"))
    elif how == "FU005":  # a trivial g_idx, no zero points: onnxruntime's own path
        m.graph.initializer.append(numpy_helper.from_array(np.zeros(32, np.int32), "g"))
        node.input.extend(["", "g"])
    elif how == "FU006":
        node.attribute.append(helper.make_attribute("accuracy_level", 4))
    return m


def _non_constant_dq() -> onnx.ModelProto:
    node = helper.make_node("DequantizeLinear", ["X", "s"], ["Y"], name="act_dq")
    g = helper.make_graph([node], "act", [helper.make_tensor_value_info("X", 3, [4])],
                          [helper.make_tensor_value_info("Y", 1, [4])],
                          [numpy_helper.from_array(np.array(0.5, F32), "s")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 7
    return m


def _ms_dq(scale_type=F32) -> onnx.ModelProto:
    return dq_model(I8, np.array(0.1, scale_type), domain="com.microsoft", opset=17,
                    extra_opsets={"com.microsoft": 1}, ir_version=8)


def _one_input_dq() -> onnx.ModelProto:
    m = dq_model(I8, np.array(1, F32))
    del m.graph.node[0].input[1:]
    return m


f8 = ml_dtypes.float8_e4m3fn
# code -> (model that triggers it, model that does not)
CASES = {
    "DQ001": (dq_model(I8, np.array([0.1, 0, 0.2, 0.1], F32), axis=1),
              dq_model(I8, np.array([0.1, 0.3, 0.2, 0.1], F32), axis=1)),
    "DQ002": (dq_model(np.zeros(4, f8), np.array(1, F32), np.array(1.0, f8)),
              dq_model(np.zeros(4, f8), np.array(1, F32), np.array(0.0, f8))),
    "DQ010": ("models/invalid_nncf_uint4_opset17.onnx",
              dq_model(np.zeros(4, ml_dtypes.uint4), np.array(1, F32), opset=21)),
    "DQ011": ("models/invalid_ort_axis_opset11.onnx", dq_model(I8, np.ones(4, F32), axis=1)),
    "DQ012": (dq_model(I8, np.ones((3,), F32), axis=1),
              dq_model(I8, np.ones((4,), F32), axis=1)),
    "DQ013": ("models/invalid_dq13_axis_out_of_range.onnx",
              dq_model(I8, np.ones(4, F32), axis=-1)),
    "DQ014": ("models/invalid_dq21_block_scale_shape.onnx",
              dq_model(I8, np.ones((1, 4), F32), axis=0, block_size=2)),
    "DQ015": (dq_model(I8, np.array(1, F32), np.array(3, np.uint8)),
              dq_model(I8, np.array(1, F32), np.array(3, np.int8))),
    "DQ016": (dq_model(np.arange(4, dtype=np.int32), np.array(1, F32), np.array(2, np.int32)),
              dq_model(np.arange(4, dtype=np.int32), np.array(1, F32), np.array(0, np.int32))),
    "DQ017": (dq_model(I8, np.array(1, F32), opset=9, ir_version=4),
              dq_model(I8, np.array(1, F32), opset=10, ir_version=5)),
    "DQ018": (_one_input_dq(), dq_model(I8, np.array(1, F32))),
    "DQ019": (dq_model(I8, np.array(1, np.float16), opset=23, ir_version=10, output_dtype=1),
              dq_model(I8, np.array(1, F32), opset=23, ir_version=10)),
    "DQ020": (_matmulnbits(False), _matmulnbits(True)),
    "DQ021": (_pair(0.02, 0.04), _pair(0.02, 0.02)),
    "DQ030": (dq_model(I8, np.array(1, F32)), _non_constant_dq()),
    "DQ031": (_ms_dq(), dq_model(I8, np.array(1, F32))),
    **{code: (_broken_nbits(code), _matmulnbits(True))
       for code in ("FU001", "FU002", "FU003", "FU004", "FU005", "FU006")},
}


def _path(model, tmp_path, name):
    return model if isinstance(model, str) else save(model, tmp_path / f"{name}.onnx")


@pytest.mark.parametrize("code", sorted(CASES))
def test_rule_positive_and_negative(code, tmp_path):
    bad, good = CASES[code]
    found = lint(_path(bad, tmp_path, "bad"), select=code)
    assert [f.code for f in found.findings] and all(f.code == code for f in found.findings)
    f = found.findings[0]
    assert "\n" not in f.message and f.input in f.message
    assert f.node and f.node in f.message
    assert not lint(_path(good, tmp_path, "good"), select=code).findings


def test_every_model_rule_has_a_case():
    model_rules = {c for c in all_rules() if not c.startswith("DQ1")}
    assert model_rules == set(CASES)


def test_scale_negative_and_subnormal_are_warnings(tmp_path):
    m = dq_model(I8, np.array([0.1, -0.1, 1e-45, 0.2], F32), axis=1)
    found = lint(save(m, tmp_path / "m.onnx"), select="DQ001")
    assert sorted(f.severity for f in found.findings) == ["warning", "warning"]
    assert found.exit_code == 0


def test_float8_zero_point_is_dq002_not_dq015():
    codes = {f.code for f in lint("models/invalid_dq19_float8_nonzero_zp.onnx").findings}
    assert "DQ002" in codes and "DQ015" not in codes


def test_invalid_real_models_exit_1_and_healthy_exits_0():
    assert lint("models/invalid_ort_axis_opset11.onnx").exit_code == 1
    assert lint("models/invalid_nncf_uint4_opset17.onnx").exit_code == 1
    for name in ("ort_qdq_per_channel", "ort_qdq_per_tensor"):
        healthy = lint(f"models/{name}.onnx")
        assert healthy.exit_code == 0 and {f.code for f in healthy.findings} <= {"DQ030"}


def test_select_and_ignore_prefixes():
    path = "models/invalid_ort_axis_opset11.onnx"
    assert {f.code for f in lint(path, select="DQ011").findings} == {"DQ011"}
    assert "DQ011" not in {f.code for f in lint(path, ignore=["DQ011"]).findings}
    assert lint(path, ignore="DQ01").exit_code == 0
