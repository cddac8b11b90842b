"""Reading MatMulNBits / GatherBlockQuantized: FusedSpec, inspect's table and JSON."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx_ir as ir
import pytest
from click.testing import CliRunner
from helpers.fused import gbq_model, nbits_inputs, nbits_model
from onnx_ir import from_onnx_text as model

import dqtool
from dqtool.cli import cli
from dqtool.families.fused import packing, read
from dqtool.families.fused.spec import (
    P_FUSED_ACCURACY,
    P_FUSED_ATTR,
    P_FUSED_G_IDX,
    P_FUSED_SHAPE,
)


def _node(proto, op):
    m = ir.serde.deserialize_model(proto)
    return next(n for n in m.graph if n.op_type == op)


def test_matmul_nbits_spec_reads_every_fact():
    rng = np.random.default_rng(0)
    proto = nbits_model(100, 24, 4, 32, nbits_inputs(rng, 100, 24, 4, 32), m=3,
                        bias=np.zeros(24, np.float32), accuracy_level=4)
    spec = read.read(_node(proto, "MatMulNBits"), {"com.microsoft": 1})
    assert (spec.quant_type, spec.scale_type, spec.float_type) == ("uint4", "float", "float")
    assert (spec.granularity, spec.axis, spec.block_size, spec.k_blocks) == ("blocked", 0, 32, 4)
    assert spec.x_shape == (100, 24) and spec.stored_shape == (24, 4, 16)
    assert spec.scale_shape == (4, 24)
    assert (spec.zero_point, spec.zero_point_packed, spec.default_zero_point) == \
        ("integer", True, None)
    assert spec.has_bias and spec.accuracy_level == 4 and spec.constant
    assert [p.code for p in spec.problems] == [P_FUSED_ACCURACY]
    assert spec.valid  # accuracy_level is information, not an error


def test_matmul_nbits_default_zero_point_and_per_axis():
    rng = np.random.default_rng(1)
    inputs = nbits_inputs(rng, 20, 8, 8, 32, zp="none")  # one block spans K
    spec = read.read(_node(nbits_model(20, 8, 8, 32, inputs), "MatMulNBits"), {})
    assert (spec.quant_type, spec.granularity, spec.axis) == ("uint8", "per-axis", 1)
    assert (spec.zero_point, spec.default_zero_point) == ("none", 128)


def test_matmul_nbits_problems_have_codes():
    rng = np.random.default_rng(2)
    inputs = nbits_inputs(rng, 64, 8, 4, 32)
    proto = nbits_model(64, 8, 4, 32, inputs)
    node = _node(proto, "MatMulNBits")
    node.attributes["bits"] = ir.AttrInt64("bits", 3)
    node.attributes["N"] = ir.AttrInt64("N", 9)
    codes = {p.code for p in read.read(node, {}).problems}
    assert P_FUSED_ATTR in codes
    node.attributes["bits"] = ir.AttrInt64("bits", 4)
    problems = read.read(node, {}).problems
    assert [p.code for p in problems] == [P_FUSED_SHAPE, P_FUSED_SHAPE, P_FUSED_SHAPE]
    assert "expected (N, k_blocks, blob) = (9, 2, 16)" in problems[0].message


@pytest.mark.parametrize("zp", ["packed", "float"])
def test_matmul_nbits_g_idx_trivial_or_act_order(zp):
    # Flagged unless upgrade converts it: a trivial g_idx only with float zero points
    # (onnxruntime computes the others by its own path: ort_facts).
    rng = np.random.default_rng(3)
    proto = nbits_model(64, 8, 4, 32, nbits_inputs(rng, 64, 8, 4, 32, zp=zp))
    m = ir.serde.deserialize_model(proto)
    node = next(iter(m.graph))
    for g, kind in ((np.arange(64) // 32, "trivial"), (np.arange(64) % 2, "act-order")):
        v = ir.Value(name=f"g_{kind}", const_value=ir.tensor(g.astype(np.int32)))
        m.graph.register_initializer(v)
        node.resize_inputs(5)
        node.replace_input_with(4, v)
        spec = read.read(node, {})
        assert spec.g_idx == kind
        flagged = kind == "act-order" or zp == "packed"
        assert (P_FUSED_G_IDX in {p.code for p in spec.problems}) == flagged


def test_gather_block_quantized_uint8_packed_geometry():
    rng = np.random.default_rng(4)
    table = rng.integers(0, 256, size=(10, 40), dtype=np.uint8)  # 80 codes per row
    scales = np.ones((10, 3), np.float32)
    spec = read.read(_node(gbq_model(table, scales, None, block=32), "GatherBlockQuantized"),
                     {})
    assert (spec.quant_type, spec.x_shape, spec.scale_shape) == ("uint4", (10, 80), (10, 3))
    assert spec.default_zero_point == 8 and spec.gather_axis == 0 and spec.axis == 1
    assert spec.valid
    bad = read.read(_node(gbq_model(table, np.ones((10, 2), np.float32), None, block=32),
                          "GatherBlockQuantized"), {})
    assert [p.code for p in bad.problems] == [P_FUSED_SHAPE]


def test_inspect_counts_fused_nodes_and_bytes(tmp_path):
    rng = np.random.default_rng(5)
    path = tmp_path / "m.onnx"
    import onnx

    onnx.save(nbits_model(64, 16, 4, 32, nbits_inputs(rng, 64, 16, 4, 32)), path)
    report = dqtool.inspect(path)
    assert report.summary["fused_nodes"] == 1
    assert report.summary["by_fused_op"] == {"MatMulNBits:uint4": 1}
    assert report.summary["dequantize_nodes"] == 0
    # B 16*2*16 + scales 16*2*4 + packed zero points 16*1
    assert report.summary["bytes_stored"] == 512 + 128 + 16
    assert report.summary["bytes_folded"] == 64 * 16 * 4
    doc = report.to_json()["nodes"][0]
    assert doc["kind"] == "fused" and doc["op_type"] == "MatMulNBits"
    assert doc["x_type"] == "uint4" and doc["lowest_onnx_opset"] == 13  # widened below 21
    result = CliRunner().invoke(cli, ["inspect", str(path)], env={"COLUMNS": "150",
                                                                   "NO_COLOR": "1"})
    assert result.exit_code == 0
    assert "0 Q/DQ nodes, 1 fused" in result.output
    assert "ms:MatMulNBits-1" in result.output
    assert "MatMulNBits:uint4 ×1" in result.output


def test_dequantize_of_a_gathered_table_gets_its_type_from_upstream():
    m = model("""
        <ir_version: 10, opset_import: ["" : 21]>
        g (int64[2] idx) => (float[2, 4] y) <uint8[4, 4] t = {1,2,3,4,5,6,7,8,9,10,11,12,13,
            14,15,16}, float s = {0.5}>
        { rows = Gather(t, idx)
          y = DequantizeLinear(rows, s) }
    """)
    report = dqtool.inspect(m)
    assert report.nodes[0].spec.quant_type == "uint8"
    assert report.summary["types_unknown"] == []


def test_dequantize_of_a_computed_x_gets_its_type_from_the_zero_point():
    m = model("""
        <ir_version: 10, opset_import: ["" : 21, "custom" : 1]>
        g (float[4] a) => (float[4] y) <int8 z = {3}, float s = {0.5}>
        { q = custom.MakeCodes(a)
          y = DequantizeLinear(q, s, z) }
    """)
    assert dqtool.inspect(m).nodes[0].spec.quant_type == "int8"


def test_gbq_int4_shapes_in_json():
    rng = np.random.default_rng(6)
    t = rng.integers(-8, 8, size=(50, 64)).astype(ml_dtypes.int4)
    m = ir.serde.deserialize_model(gbq_model(t, np.ones((50, 2), np.float32), None))
    doc = dqtool.inspect(m).to_json()
    node = doc["nodes"][0]
    assert node["kind"] == "fused" and node["x_type"] == "int4"
    assert node["bytes_stored"] == 50 * 64 // 2 + 50 * 2 * 4
    assert doc["summary"]["fused_nodes"] == 1


@pytest.mark.parametrize(("k", "bits"), [(96, 4), (160, 2), (64, 4), (96, 8)])
def test_bytes_stored_counts_each_padded_row_of_zero_points(k, bits):
    # 3 blocks of 4-bit zero points take 2 bytes a row, not 1.5: the sum undercounted.
    rng = np.random.default_rng(4)
    inputs = nbits_inputs(rng, k, 8, bits, 32)
    proto = nbits_model(k, 8, bits, 32, inputs)
    [report] = dqtool.inspect(ir.serde.deserialize_model(proto)).nodes
    assert report.bytes_stored == sum(a.nbytes for a in inputs.values() if a is not None)


def test_bytes_stored_of_a_uint8_packed_table_with_padded_zero_points():
    rng = np.random.default_rng(5)
    table = packing.pack(rng.integers(0, 16, size=(6, 48), dtype=np.uint8), 4)
    scales = (rng.random((6, 3)) + 0.5).astype(np.float32)
    zps = packing.pack(rng.integers(0, 16, size=(6, 3), dtype=np.uint8), 4)
    assert zps.shape == (6, 2)
    proto = gbq_model(table, scales, zps, block=16, bits=4)
    [report] = dqtool.inspect(ir.serde.deserialize_model(proto)).nodes
    assert report.bytes_stored == table.nbytes + scales.nbytes + zps.nbytes
