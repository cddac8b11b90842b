"""pack's float-zero-point chain (the one ``upgrade`` writes for HQQ weights) → MatMulNBits
with float zero points."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from dqtool import cleanup, graph, types
from dqtool.families.fused import packing
from dqtool.families.fused.surgery import FusedBuilder
from dqtool.fused.pack_context import (
    NoMatch,
    PackContext,
    narrower,
    only_use,
    pow2_16,
    unsigned_codes,
)
from dqtool.fused.pack_matmul import bias_of, matmul_nbits_node, weight_facts
from dqtool.spec import QuantSpec


@dataclass
class _Chain:
    """The nodes and values of one matched chain, DequantizeLinear to MatMul."""

    x: ir.Value
    rows: int  # rows of x: whole blocks of K
    n: int
    k: int  # K: rows, or fewer after a Slice of the ragged tail
    add: ir.Node
    neg: ir.Node
    mul: ir.Node
    zc: ir.Value  # the stored zero points
    last: ir.Node  # the Reshape back to rows
    tail: ir.Node  # the last node before the MatMul: that Reshape, a Slice or a Cast
    mm: ir.Node
    out_type: str | None


def _one_use(v: ir.Value, op: str) -> ir.Node:
    """The node that is ``v``'s one use (as its input 0), an ``op``; else NoMatch."""
    use = only_use(v)
    if use is None or use[0].op_type != op or use[1] != 0:
        raise NoMatch("")
    return use[0]


def _match_chain(dq: ir.Node, spec: QuantSpec, reshape: ir.Node) -> _Chain:
    """DequantizeLinear → Reshape → Add(-(zp·s)) → Reshape (→ Slice) (→ Cast) → MatMul's B,
    or NoMatch("") (not this pattern)."""
    x = graph.input_value(dq, 0)
    rows_n = graph.shape_of(x)
    if spec.zero_point != "none" or spec.scale_type != "float" or rows_n is None:
        raise NoMatch("")
    add = next((u.node for u in reshape.outputs[0].uses() if u.node.op_type == "Add"),
               None)
    if add is None or len(reshape.outputs[0].uses()) != 1:
        raise NoMatch("")
    off = add.inputs[1] if add.inputs[0] is reshape.outputs[0] else add.inputs[0]
    neg = off.producer()
    mul = neg.inputs[0].producer() if neg is not None and neg.op_type == "Neg" else None
    if mul is None or mul.op_type != "Mul":
        raise NoMatch("")
    zc = mul.inputs[0]
    if zc.producer() is not None and zc.producer().op_type == "Cast":
        zc = zc.producer().inputs[0]
    if graph.constant_tensor(zc) is None:
        raise NoMatch("")
    last = _one_use(add.outputs[0], "Reshape")
    rows, n = rows_n
    k = rows
    tail = last
    nxt = only_use(tail.outputs[0])
    if nxt is not None and nxt[0].op_type == "Slice":
        ends = graph.constant_array(graph.input_value(nxt[0], 2))
        k = int(ends.reshape(-1)[0]) if ends is not None else k
        tail = nxt[0]
        nxt = only_use(tail.outputs[0])
    out_type = "float"
    if nxt is not None and nxt[0].op_type == "Cast":
        tail = nxt[0]
        out_type = graph.elem_type(tail.outputs[0])
        nxt = only_use(tail.outputs[0])
    if nxt is None or nxt[0].op_type != "MatMul" or nxt[1] != 1:
        raise NoMatch("")
    return _Chain(x, rows, n, k, add, neg, mul, zc, last, tail, nxt[0], out_type)


def _chain_bits_block(dq: ir.Node, spec: QuantSpec, c: _Chain) -> tuple[int, int, int]:
    """(bits, block, k_blocks) of the MatMulNBits the chain packs into, or NoMatch."""
    _, _, bits, block = weight_facts(spec, (c.rows, c.n))
    # 2-bit codes upgrade widened to 8 (int2 / uint2 are opset 25's) go back to 2 bits
    bits = narrower(dq, spec, bits) or bits
    if bits == 8:
        raise NoMatch("8-bit codes with float zero points: onnxruntime's CPU kernel "
                      "rejects such a MatMulNBits (FU007)")
    kb = c.rows // block if spec.granularity == "blocked" else 1
    if spec.granularity != "blocked":
        block = c.rows
        if not pow2_16(block):
            raise NoMatch("")
    return bits, block, kb


def pack_float_zp_chain(ctx: PackContext, dq: ir.Node, spec: QuantSpec, reshape: ir.Node
                        ) -> tuple[str, list]:
    """The float-zero-point chain from ``dq`` (through ``reshape``) → MatMulNBits with
    float zero points; returns (how, the values it no longer uses), or raises NoMatch."""
    c = _match_chain(dq, spec, reshape)
    x, rows, n, k, zc, mm = c.x, c.rows, c.n, c.k, c.zc, c.mm
    bits, block, kb = _chain_bits_block(dq, spec, c)
    a = graph.input_value(mm, 0)
    if graph.elem_type(a) not in (None, c.out_type) or graph.elem_type(zc) != c.out_type:
        raise NoMatch("")
    bias, badd = bias_of(ctx, mm, n, c.out_type)
    b = FusedBuilder(mm if badd is None else badd, ctx.fresh, ctx.in_function,
                home=graph.input_value(dq, 0), early=ctx.early)
    b.base = mm.name or dq.name or "matmul"
    s_type = types.by_name(c.out_type)
    scale = graph.input_value(dq, 1)
    signed = types.by_name(spec.quant_type).signed

    def b_bytes() -> np.ndarray:
        codes = unsigned_codes(graph.constant_array(x), bits, signed)
        return packing.onnx_to_nbits(codes, rows, n, bits, block)

    bq = b.constant("B", ir.DataType.UINT8, (n, kb, block * bits // 8), b_bytes)
    # Flat (N·k_blocks), as onnxruntime's HQQ quantizer (the writer of float zero
    # points) stores scales and zero points.
    s = b.constant("scales", s_type.ir_type, (n * kb,),
                   lambda: np.ascontiguousarray(graph.constant_array(scale).reshape(kb, n).T)
                   .astype(s_type.dtype).reshape(-1))
    z = b.constant("zero_points", s_type.ir_type, (n * kb,),
                   lambda: np.ascontiguousarray(graph.constant_array(zc).reshape(kb, n).T)
                   .reshape(-1))
    inputs: list[ir.Value | None] = [a, bq, s, z]
    if bias is not None:
        inputs += [None, bias]
    y = matmul_nbits_node(ctx, b, inputs, k, n, bits, block, dq)
    b.nodes.append(y.producer())
    b.finish(y)
    ctx.note_names(y.producer(), dq, b)
    chain = [mm, c.tail, c.last, c.add, c.neg, c.mul, reshape, dq, c.mul.inputs[0].producer(),
             c.mul.inputs[1].producer(), *(u.node for u in c.last.outputs[0].uses())]
    old = cleanup.remove_unused_nodes([n for n in chain if n is not None])
    how = (f"float-zero-point chain ({spec.quant_type} ({k}, {n})) → MatMulNBits "
           f"bits={bits} block_size={block}, float zero points")
    return how, old
