"""MatMulNBits → ai.onnx DequantizeLinear (→ the float-zero-point offsets) → MatMul, exactly
(the cases are listed in ``to_onnx``'s docstring)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from dqtool import graph, types
from dqtool.families.fused import packing
from dqtool.families.fused.code_rows import CodeRows
from dqtool.families.fused.kernel import matmul_nbits_zero_points
from dqtool.families.fused.onnx_codes import IR_CODE, default_zero_points, stored_transpose
from dqtool.families.fused.spec import FusedSpec
from dqtool.families.fused.surgery import FusedBuilder


def shared_weight_key(node: ir.Node, spec: FusedSpec, target: int, unpacked: bool
                      ) -> tuple | None:
    """What two MatMulNBits must share for one dequantized weight to serve both: the same
    B, scales, zero points and g_idx values, attributes and accuracy level (noted on the
    DequantizeLinear); None for a node whose weight is not constant. (In two graphs, the
    branches of an If reading one stored weight, they share its constants: ``_weight_for``.)"""
    ins = [graph.input_value(node, i) for i in range(5)]
    if ins[1] is None or graph.constant_tensor(ins[1]) is None or node.graph is None:
        return None
    if spec.zero_point == "float":  # HQQ's chain ends in one Reshape pack takes whole
        return None
    return (target, unpacked, spec.x_shape, spec.bits, spec.block_size,
            spec.accuracy_level, *(None if v is None else id(v) for v in ins[1:]))


def _weight_for(mm: ir.Node, b: FusedBuilder) -> ir.Value | None:
    """The dequantized weight ``mm`` (made for another MatMulNBits with the same weight)
    multiplies by, as the node ``b`` builds for can read it: that value in the same graph;
    in another one (the other branch of an If, both reading one stored weight), a
    DequantizeLinear there of the same constants, when they are stored where both graphs
    see them (with the weight: ``FusedBuilder.home``); else None (this node makes its own)."""
    w = mm.inputs[1]
    if mm.graph is b.graph or w is None:
        return w
    dq = w.producer()
    if dq is None or dq.op_type != "DequantizeLinear" or dq.domain not in ("", "ai.onnx") \
            or not all(v is not None and v.is_initializer() and v.graph is b.home
                       for v in dq.inputs):
        return None
    return b.op("DequantizeLinear", list(dq.inputs), "dequantize", dict(dq.attributes),
                w.dtype, w.shape)


def matmul_nbits(node: ir.Node, spec: FusedSpec, b: FusedBuilder, unpacked: bool = False,
                 shared: tuple[ir.Node, str] | None = None) -> tuple[ir.Value, str]:
    """The new nodes of a MatMulNBits (in ``b``); returns (result, how). ``unpacked``: x
    holds one code a byte (for a fold, which reads codes and never writes x) instead of
    the packed bytes a saved model stores. ``shared``: (the MatMul made for another
    MatMulNBits with the same weight, that node's name): this one multiplies by the same
    dequantized weight (one weight stored, not two): the MatMul's B as it is now (a
    lowering below opset 21 may have put a Reshape after the DequantizeLinear)."""
    a, bq, scales, zp, _g, bias = (graph.input_value(node, i) for i in range(6))
    w = None if shared is None else _weight_for(shared[0], b)
    if w is not None:
        return _by_shared_weight(b, a, w, bias, shared[1])
    x = _codes(spec, b, bq, unpacked)
    if spec.zero_point != "float":
        w, how = _integer_zp_weight(spec, b, x, bq, scales, zp)
    else:
        w, how = _float_zp_weight(spec, b, x, scales, zp)
    how_parts = [how]
    y = b.op("MatMul", [a, w], "matmul", dtype=a.dtype)
    how_parts.append("MatMul")
    if bias is not None:
        y = b.op("Add", [y, bias], "bias", dtype=a.dtype)
        how_parts.append("Add (bias)")
    return y, " → ".join(how_parts)


def _by_shared_weight(b: FusedBuilder, a: ir.Value, w: ir.Value, bias: ir.Value | None,
                      other: str) -> tuple[ir.Value, str]:
    """MatMul of A by the dequantized weight ``w`` made for MatMulNBits ``other`` (→ bias)."""
    y = b.op("MatMul", [a, w], "matmul", dtype=a.dtype)
    how = f"MatMul by {other}'s dequantized weight (the same B, scales and zero points)"
    if w.producer() in b.nodes:  # its own DequantizeLinear, of the constants stored once
        how = (f"DequantizeLinear of {other}'s constants (the same B, scales and zero "
               "points, stored once) → MatMul")
    if bias is not None:
        y = b.op("Add", [y, bias], "bias", dtype=a.dtype)
        how += " → Add (bias)"
    return y, how


def _rows(spec: FusedSpec) -> int:
    """Rows of x: K, or whole blocks of K with float zero points (offsets added per block)."""
    k = spec.x_shape[0]
    return k if spec.zero_point != "float" else spec.k_blocks * spec.block_size


def _codes(spec: FusedSpec, b: FusedBuilder, bq: ir.Value, unpacked: bool) -> ir.Value:
    """x: B's codes transposed to (rows, N), as the DequantizeLinear reads them."""
    n, bits, rows = spec.x_shape[1], spec.bits, _rows(spec)
    code_t = IR_CODE[spec.quant_type]

    def x_bytes() -> ir.TensorProtocol:
        raw = packing.nbits_to_onnx(graph.constant_array(bq), rows, n, bits)
        if bits == 8:
            return ir.Tensor(raw.reshape(rows, n), dtype=code_t)
        return ir.PackedTensor(raw, code_t, shape=(rows, n))

    if unpacked:  # codes a band of rows at a time, as the fold streams them
        return b.existing(CodeRows(lambda: graph.constant_array(bq), rows, n, bits, code_t), "x")
    if n * bits % 8 == 0:  # rows of whole bytes: written a band of K rows at a time
        return b.streamed("x", code_t, (rows, n), x_bytes, lambda file: (
            packing.write_nbits_as_onnx(graph.constant_array(bq), rows, n, bits, file)))
    return b.constant("x", code_t, (rows, n), x_bytes)


def _scale_kn(scales: ir.Value, n: int, kb: int, s_shape: tuple[int, ...],
              as_float32: bool = False) -> Callable[[], np.ndarray]:
    """A maker of the scales (N, k_blocks) transposed to ``s_shape`` (float32 if told)."""
    def make() -> np.ndarray:
        s = graph.constant_array(scales).reshape(n, kb).T
        return (s.astype(np.float32) if as_float32 else s).reshape(s_shape)
    return make


def _zero_point_codes(spec: FusedSpec, zp: ir.Value | None, s_shape: tuple[int, ...],
                      code_t: ir.DataType) -> Callable[[], ir.TensorProtocol]:
    """A maker of the zero-point codes in ``s_shape``: the packed ones transposed, or the
    default made explicit."""
    n, bits, kb = spec.x_shape[1], spec.bits, spec.k_blocks

    def zp_codes() -> ir.TensorProtocol:
        if zp is None and bits < 8:
            return default_zero_points(spec.default_zero_point, bits, s_shape, code_t)
        if zp is None:
            codes = np.full(s_shape, spec.default_zero_point, np.uint8)
        else:
            codes = matmul_nbits_zero_points(graph.constant_array(zp), n, kb, bits)[0].T \
                .reshape(s_shape)
        codes = np.ascontiguousarray(codes)
        if bits == 8:
            return ir.Tensor(codes, dtype=code_t)
        return ir.PackedTensor(packing.pack(codes.reshape(-1), bits), code_t, shape=s_shape)

    return zp_codes


def _integer_zp_weight(spec: FusedSpec, b: FusedBuilder, x: ir.Value, bq: ir.Value,
                       scales: ir.Value, zp: ir.Value | None) -> tuple[ir.Value, str]:
    """The weight with integer zero points: one DequantizeLinear of x; returns (it, how)."""
    k, n = spec.x_shape
    block, kb = spec.block_size, spec.k_blocks
    code_t = IR_CODE[spec.quant_type]
    s_type = types.by_name(spec.scale_type).ir_type
    per_axis = kb == 1
    s_shape = (n,) if per_axis else (kb, n)
    dq_attrs: dict = {"axis": 1} if per_axis else {"axis": 0, "block_size": block}
    # written transposed a band at a time, in C where it can
    s = b.streamed("scale", s_type, s_shape, _scale_kn(scales, n, kb, s_shape), lambda file: (
        packing.write_transposed(graph.constant_array(scales).reshape(n, kb), file)))
    if k == kb * block:  # x and the scale are B and the scales transposed, exactly
        stored_transpose(x, bq, (n, k))
        stored_transpose(s, scales, (n, kb))
    z = b.constant("zero_point", code_t, s_shape, _zero_point_codes(spec, zp, s_shape, code_t))
    w = b.op("DequantizeLinear", [x, s, z], "dequantize", dq_attrs, s_type, (k, n))
    how = (f"DequantizeLinear ({spec.quant_type} ({k}, {n}), "
           + ("per-axis axis 1" if per_axis else f"blocked axis 0, block {block}"
              + (", ragged last block" if k % block else ""))
           + (", default zero point made explicit" if zp is None else "") + ")")
    return w, how


def _float_zp_weight(spec: FusedSpec, b: FusedBuilder, x: ir.Value, scales: ir.Value,
                     zp: ir.Value) -> tuple[ir.Value, str]:
    """The weight with float zero points: DequantizeLinear of x by float32 scales, plus the
    offsets -(zp·s) per block (→ Slice of a ragged tail) (→ Cast); returns (it, how)."""
    k, n = spec.x_shape
    block, kb, rows = spec.block_size, spec.k_blocks, _rows(spec)
    s_type = types.by_name(spec.scale_type).ir_type
    per_axis = kb == 1
    s_shape = (n,) if per_axis else (kb, n)
    s32 = b.constant("scale", ir.DataType.FLOAT, s_shape, _scale_kn(scales, n, kb, s_shape, True))
    dq_attrs = {"axis": 0, "block_size": block} if not per_axis else {"axis": 1}
    w0 = b.op("DequantizeLinear", [x, s32], "dequantize", dq_attrs, ir.DataType.FLOAT,
              (rows, n))

    def zp_blocks() -> np.ndarray:
        return np.ascontiguousarray(graph.constant_array(zp).reshape(n, kb).T).reshape(kb, 1, n)

    # The offsets -(zp·s) are computed by the graph, in float32 as onnxruntime does, so
    # the zero points stay stored as they were (and ``pack`` gives them back).
    z_type = types.by_name(spec.zero_point_type).ir_type
    zc = b.constant("zero_point", z_type, (kb, 1, n), zp_blocks)
    if z_type != ir.DataType.FLOAT:
        zc = b.op("Cast", [zc], "zero_point_float", {"to": ir.AttrInt64("to", 1)},
                  ir.DataType.FLOAT, (kb, 1, n))
    s_b = b.op("Reshape", [s32, b.small("scale_shape", np.array([kb, 1, n]))],
               "scale_blocks", dtype=ir.DataType.FLOAT, shape=(kb, 1, n))
    prod = b.op("Mul", [zc, s_b], "zero_point_times_scale", dtype=ir.DataType.FLOAT,
                shape=(kb, 1, n))
    off = b.op("Neg", [prod], "offset", dtype=ir.DataType.FLOAT, shape=(kb, 1, n))
    blocks = b.op("Reshape", [w0, b.small("blocks_shape", np.array([kb, block, n]))],
                  "blocks", dtype=ir.DataType.FLOAT, shape=(kb, block, n))
    added = b.op("Add", [blocks, off], "add_offset", dtype=ir.DataType.FLOAT,
                 shape=(kb, block, n))
    w = b.op("Reshape", [added, b.small("rows_shape", np.array([rows, n]))], "rows",
             dtype=ir.DataType.FLOAT, shape=(rows, n))
    if rows != k:
        w = b.op("Slice", [w, b.small("starts", np.array([0])),
                           b.small("ends", np.array([k])), b.small("axes", np.array([0]))],
                 "slice", dtype=ir.DataType.FLOAT, shape=(k, n))
    if s_type != ir.DataType.FLOAT:
        w = b.op("Cast", [w], "cast", {"to": ir.AttrInt64("to", int(s_type))}, s_type, (k, n))
    how = (f"DequantizeLinear ({spec.quant_type} ({rows}, {n}), float32 scale) "
           "→ Add of -(zp·s) per block (float zero points, two roundings as onnxruntime)"
           + (" → Slice of the ragged tail" if rows != k else "")
           + (f" → Cast to {spec.scale_type}" if s_type != ir.DataType.FLOAT else ""))
    return w, how
