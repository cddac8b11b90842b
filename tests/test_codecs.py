"""Reading every encoding into a QuantSpec, and the rules each reading enforces."""

from __future__ import annotations

import onnx
import onnx_ir as ir
import pytest

from dqtool import codecs, versions
from dqtool.codecs import onnx_std
from dqtool.spec import (
    P_ATTR,
    P_AXIS,
    P_BLOCK,
    P_INT32_ZP,
    P_NO_IMPORT,
    P_SHAPE,
    P_TYPE,
    P_VERSION,
    P_ZP,
    P_ZP_VALUE,
)


def read(text: str, op_index: int = 0):
    """Read the op_index-th Q/DQ node of an inline model."""
    m = ir.from_onnx_text(text)
    nodes = [n for n in m.graph if codecs.is_quant_node(n)]
    return codecs.read_node(nodes[op_index], dict(m.opset_imports))


def dq_model(opset: int, x: str, scale: str, attrs: str = "", zp: str | None = None,
             inits: str = "", domain: str = "", extra_opsets: str = "") -> str:
    """A one-DQ model: x and scale (and zp) as typed graph inputs."""
    zp_in = f", {zp} zp" if zp else ""
    zp_arg = ", zp" if zp else ""
    dom = f"{domain}." if domain else ""
    opsets = f'"" : {opset}' + extra_opsets
    return f"""<ir_version: 10, opset_import: [{opsets}]>
g ({x} x, {scale} s{zp_in}) => (y) {inits} {{
  y = {dom}DequantizeLinear {attrs} (x, s{zp_arg})
}}"""


def codes(spec) -> set[str]:
    return {p.code for p in spec.problems}


def test_registry_covers_every_onnx_schema_version():
    want = {
        (s.name, s.since_version)
        for s in onnx.defs.get_all_schemas_with_history()
        if s.domain == "" and s.name in ("DequantizeLinear", "QuantizeLinear")
    }
    have = {(op, v) for d, op, v in codecs.REGISTRY if d == "ai.onnx"}
    assert want == have
    assert ("DequantizeLinear", 28) in have and ("QuantizeLinear", 10) in have
    for dom, op in [("com.microsoft", "DequantizeLinear"), ("com.microsoft", "QuantizeLinear"),
                    ("opmx", "DequantizeLinear"), ("pmx", "DequantizeLinear")]:
        assert codecs.lookup(dom, op, 1) is not None


@pytest.mark.parametrize(("version", "since"), [(10, 10), (12, 10), (13, 13), (18, 13),
                                                (19, 19), (22, 21), (23, 23), (27, 25),
                                                (28, 28)])
def test_lookup_resolves_version_in_force(version, since):
    assert codecs.lookup("", "DequantizeLinear", version).since_version == since


def test_per_axis_int8_at_13():
    s = read(dq_model(13, "int8[4,6]", "float[6]", "<axis=-1>", "int8[6]"))
    assert (s.granularity, s.axis, s.quant_type, s.float_type) == ("per-axis", 1, "int8", "float")
    assert s.zero_point == "integer" and s.valid
    assert versions.lowest_version(s) == 13


def test_blocked_int4_ragged_at_21():
    s = read(dq_model(21, "int4[10,3]", "float[3,3]", "<axis=0, block_size=4>"))
    assert (s.granularity, s.axis, s.block_size) == ("blocked", 0, 4)
    assert s.valid and versions.lowest_version(s) == 21


def test_blocked_bad_block_size_names_the_accepted_range():
    s = read(dq_model(21, "int4[10,3]", "float[2,3]", "<axis=0, block_size=4>"))
    assert P_BLOCK in codes(s)
    assert "[5, 9]" in str(s.errors[0])


def test_blocked_scale_must_match_other_axes():
    s = read(dq_model(21, "int4[8,3]", "float[2,4]", "<axis=0, block_size=4>"))
    assert P_SHAPE in codes(s)


def test_blocked_needs_21_and_positive_block():
    assert P_SHAPE in codes(read(dq_model(19, "int8[8,3]", "float[2,3]", "<axis=0>")))
    s = read(dq_model(21, "int8[8,3]", "float[2,3]", "<axis=0>"))
    assert P_BLOCK in codes(s)


def test_per_axis_not_at_10_and_axis_attribute_unknown():
    s = read(dq_model(10, "int8[4,3]", "float[3]", "<axis=1>"))
    assert {P_SHAPE, P_ATTR} <= codes(s)
    # the stray axis still says what the writer meant
    assert s.granularity == "per-axis" and s.axis == 1


def test_axis_out_of_range():
    s = read(dq_model(13, "int8[4,3]", "float[3]", "<axis=2>"))
    assert P_AXIS in codes(s)
    assert "[-2, 1]" in str(s.errors[0])


def test_per_axis_length_mismatch():
    s = read(dq_model(13, "int8[4,3]", "float[4]", "<axis=1>"))
    assert P_SHAPE in codes(s)


def test_zero_point_shape_and_type_rules():
    s = read(dq_model(13, "int8[4,3]", "float[3]", "<axis=1>", "int8[4]"))
    assert P_SHAPE in codes(s)
    s = read(dq_model(13, "int8[4,3]", "float", "", "uint8"))
    assert P_ZP in codes(s)


def test_type_not_allowed_at_version():
    s = read(dq_model(13, "int4[4,3]", "float"))
    assert P_TYPE in codes(s) and "int4" in str(s.errors[0])
    s = read(dq_model(13, "int8[4,3]", "float16"))
    assert P_TYPE in codes(s)
    assert versions.lowest_version(s) == 19
    s = read(dq_model(21, "int8[4,3]", "float16"))
    assert s.valid and s.float_type == "float16"


def _float8_dq(zp_value: float):
    from onnx import TensorProto, helper

    zp = helper.make_tensor("zp", TensorProto.FLOAT8E4M3FN, [], [zp_value])
    s = helper.make_tensor("s", TensorProto.FLOAT, [], [0.5])
    node = helper.make_node("DequantizeLinear", ["x", "s", "zp"], ["y"])
    g = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT8E4M3FN, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])], [s, zp])
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])
    m = ir.serde.deserialize_model(proto)
    return codecs.read_node(next(iter(m.graph)), dict(m.opset_imports))


def test_float8_nonzero_zero_point_is_an_error_and_zero_is_fine():
    assert P_ZP_VALUE in codes(_float8_dq(1.0))
    assert _float8_dq(0.0).valid


def test_int32_zero_point_warns_but_is_valid():
    text = """<ir_version: 10, opset_import: ["" : 13]>
g (int32[3] x) => (y) <float s = {0.5}, int32 zp = {3}> { y = DequantizeLinear (x, s, zp) }"""
    s = read(text)
    assert P_INT32_ZP in codes(s) and s.valid
    assert [p.severity for p in s.problems] == ["warning"]


def test_output_dtype_and_e8m0_scale():
    s = read(dq_model(23, "int4[4,8]", "float[4,2]", "<axis=1, block_size=4, output_dtype=10>"))
    assert (s.float_type, s.output_dtype_attr) == ("float16", "float16")
    assert versions.lowest_version(s) == 23
    s = read(dq_model(24, "float4e2m1[4,32]", "float8e8m0[4,1]", "<axis=1, block_size=32>"))
    assert P_TYPE in codes(s)
    s = read(dq_model(24, "float4e2m1[4,32]", "float8e8m0[4,1]",
                      "<axis=1, block_size=32, output_dtype=1>"))
    assert s.valid and s.float_type == "float" and versions.lowest_version(s) == 24


def test_attribute_unknown_at_version():
    s = read(dq_model(21, "int8[4,3]", "float", "<output_dtype=1>"))
    assert P_ATTR in codes(s)


def test_op_missing_before_its_first_version():
    s = read(dq_model(9, "int8[4,3]", "float"))
    assert P_VERSION in codes(s)


def test_microsoft_missing_axis_means_1_and_int4():
    text = dq_model(13, "int4[4,6]", "float[6]", domain="com.microsoft",
                    extra_opsets=', "com.microsoft" : 1')
    s = read(text)
    assert (s.domain, s.granularity, s.axis, s.quant_type) == ("com.microsoft", "per-axis", 1,
                                                              "int4")
    assert s.valid and versions.lowest_version(s) == 21


def test_microsoft_rejects_bfloat16_scale():
    s = read(dq_model(13, "int8[4]", "bfloat16", domain="com.microsoft",
                      extra_opsets=', "com.microsoft" : 1'))
    assert P_TYPE in codes(s)


def test_domain_without_opset_import():
    s = read(dq_model(13, "int8[4]", "float", domain="com.microsoft"))
    assert P_NO_IMPORT in codes(s)


def opmx_model(attrs: str, x: str = "int16[2,32]", scale: str = "float16[8,2]",
               zp: str | None = None, domain: str = "opmx") -> str:
    zp_in = f", {zp} zp" if zp else ""
    zp_arg = ", zp" if zp else ""
    return f"""<ir_version: 10, opset_import: ["" : 21, "{domain}" : 1]>
g ({x} x, {scale} s{zp_in}) => (y) {{
  y = {domain}.DequantizeLinear <{attrs}> (x, s{zp_arg})
}}"""


def test_opmx_int4_grouped_unpacks_logical_shape():
    s = read(opmx_model('quant_data_type="int4", quant_axis=1, group_size=16'))
    assert s.x_shape == (8, 32)
    assert (s.granularity, s.axis, s.block_size, s.quant_type) == ("blocked", 1, 16, "int4")
    assert s.packing == "int4x4-int16-dim0" and s.zero_point == "none" and s.valid


def test_opmx_zero_point_kinds():
    s = read(opmx_model('quant_data_type="int4", group_size=16, has_zeropoint=1',
                        zp="int8[8,2]"))
    assert (s.zero_point, s.quant_type) == ("integer", "uint4")
    s = read(opmx_model('quant_data_type="int4", group_size=16, has_zeropoint=1, '
                        'float_zeropoint=1', zp="float16[8,2]", domain="pmx"))
    assert (s.zero_point, s.domain) == ("float", "pmx")
    s = read(opmx_model('quant_data_type="int4", group_size=16, has_zeropoint=1, '
                        'float_zeropoint=1', zp="int8[8,2]"))
    assert P_ZP in codes(s)


def test_opmx_group_must_divide_exactly():
    s = read(opmx_model('quant_data_type="int4", quant_axis=1, group_size=12',
                        scale="float16[8,3]"))
    assert P_BLOCK in codes(s)


def test_opmx_per_channel():
    s = read(opmx_model('quant_data_type="int8", group_size=0', x="int8[8,32]",
                        scale="float16[8,1]"))
    assert (s.granularity, s.axis) == ("per-axis", 0)


def test_quantize_linear_types():
    text = """<ir_version: 10, opset_import: ["" : 21]>
g (float[4,3] x, float s) => (a, b, c) <uint8 z8 = {3}> {
  a = QuantizeLinear (x, s)
  b = QuantizeLinear (x, s, z8)
  c = QuantizeLinear <output_dtype=22, saturate=0> (x, s)
}"""
    a, b, c = (read(text, i) for i in range(3))
    assert (a.quant_type, a.float_type, a.op) == ("uint8", "float", "QuantizeLinear")
    assert b.quant_type == "uint8" and b.zero_point == "integer"
    assert c.quant_type == "int4" and c.saturate is None and c.valid


def test_quantize_float8_saturate():
    text = """<ir_version: 10, opset_import: ["" : 21]>
g (float[4] x, float s) => (a) { a = QuantizeLinear <output_dtype=17, saturate=0> (x, s) }"""
    s = read(text)
    assert s.quant_type == "float8e4m3fn" and s.saturate is False


def test_schema_facts_follow_onnx():
    assert "int2" in onnx_std.schema_facts("DequantizeLinear", 25).quant_types
    assert "int2" not in onnx_std.schema_facts("DequantizeLinear", 24).quant_types
    assert "float8e8m0" in onnx_std.schema_facts("DequantizeLinear", 24).scale_types
    assert onnx_std.schema_facts("DequantizeLinear", 10).attributes == frozenset()


def test_scalar_zero_point_beside_one_element_scale_is_per_tensor():
    # onnxruntime's quantizer writes int32 bias DQs with scale (1,) and a scalar zero point
    text = """<ir_version: 10, opset_import: ["" : 13]>
g (int32[8] x) => (y) <float[1] s = {0.5}, int32 zp = {0}> { y = DequantizeLinear (x, s, zp) }"""
    s = read(text)
    assert s.valid and s.granularity == "per-tensor"
    assert not s.problems


def test_two_element_zero_point_beside_one_element_scale_is_still_wrong():
    s = read(dq_model(13, "int8[4,2]", "float[1]", "", "int8[2]"))
    assert P_SHAPE in codes(s)
