"""fold: MatMulNBits / GatherBlockQuantized become float MatMul / Gather weights."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
import pytest
from click.testing import CliRunner
from helpers.fused import bits_of, gbq_model, nbits_inputs, nbits_model, run_ort

import dqtool
from dqtool.cli import cli


def _fold(proto, **kw) -> tuple[onnx.ModelProto, object]:
    report = dqtool.fold(ir.serde.deserialize_model(proto), **kw)
    out = ir.serde.serialize_model(report.model)
    onnx.checker.check_model(out)
    return out, report


def _quantized_inits(proto) -> list[str]:
    return [t.name for t in proto.graph.initializer if t.data_type in (
        onnx.TensorProto.UINT4, onnx.TensorProto.INT4, onnx.TensorProto.UINT8,
        onnx.TensorProto.UINT2)]


@pytest.mark.parametrize(("bits", "zp", "dtype"), [(4, "packed", np.float32),
                                                   (8, "none", np.float16),
                                                   (4, "float", np.float32)])
def test_fold_matmul_nbits_into_float_matmul(bits, zp, dtype):
    rng = np.random.default_rng(bits)
    inputs = nbits_inputs(rng, 100, 8, bits, 32, dtype, zp)
    original = nbits_model(100, 8, bits, 32, inputs, dtype=dtype, opset=17)
    folded, report = _fold(original)
    ops = [n.op_type for n in folded.graph.node]
    assert "MatMulNBits" not in ops and "DequantizeLinear" not in ops and "MatMul" in ops
    assert _quantized_inits(folded) == []
    assert report.fused == ["mm"] and len(report.folded) == 1
    assert {o.domain for o in folded.opset_import} == {""}
    eye = {"A": np.eye(100, dtype=dtype)}
    assert np.array_equal(bits_of(run_ort(original, eye)[0]), bits_of(run_ort(folded, eye)[0]))


def test_fold_to_float16_checkpoint():
    rng = np.random.default_rng(1)
    inputs = nbits_inputs(rng, 64, 8, 4, 32)
    folded, report = _fold(nbits_model(64, 8, 4, 32, inputs), dtype="float16")
    w = next(t for t in folded.graph.initializer if t.data_type == onnx.TensorProto.FLOAT16)
    ref = dqtool.dequantize_matmul_nbits(inputs["B"], inputs["scales"], inputs["zero_points"],
                                         K=64, N=8, bits=4, block_size=32)
    assert np.array_equal(onnx.numpy_helper.to_array(w), ref.astype(np.float16))
    assert report.folded[0].rounding is not None


def test_fold_gather_block_quantized():
    rng = np.random.default_rng(2)
    table = rng.integers(-8, 8, size=(10, 64)).astype(ml_dtypes.int4)
    original = gbq_model(table, (rng.random((10, 2)) + 0.1).astype(np.float32), None)
    folded, _ = _fold(original)
    assert [n.op_type for n in folded.graph.node] == ["Gather"]
    idx = {"indices": np.array([0, 9, 3, 3, 1], np.int64)}
    assert np.array_equal(run_ort(original, idx)[0], run_ort(folded, idx)[0])


def test_fold_leaves_act_order_with_the_reason(tmp_path):
    rng = np.random.default_rng(3)
    proto = nbits_model(64, 5, 4, 32, nbits_inputs(rng, 64, 5, 4, 32))
    proto.graph.initializer.append(onnx.numpy_helper.from_array(
        (np.arange(64) % 2).astype(np.int32), "g"))
    proto.graph.node[0].input.append("g")
    path = tmp_path / "m.onnx"
    onnx.save(proto, path)
    r = CliRunner().invoke(cli, ["fold", str(path)], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "left fused mm: g_idx reorders rows" in r.output
