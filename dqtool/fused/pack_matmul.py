"""pack's ``DequantizeLinear → MatMul`` → MatMulNBits, and the MatMulNBits facts its float
zero-point chain shares: the weight's geometry, A, the bias, the node."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from dqtool import cleanup, graph, types
from dqtool.codecs.base import output_dtype_attr
from dqtool.families.fused import packing
from dqtool.families.fused.surgery import FusedBuilder
from dqtool.families.fused.upgrade_notes import (
    ACCURACY_KEY,
    BIAS_KEY,
    BLOCK_KEY,
    TAIL_KEY,
    tail_place,
)
from dqtool.fused.pack_context import (
    BITS,
    NoMatch,
    PackContext,
    narrower,
    next_pow2_16,
    only_use,
    pow2_16,
    unsigned_codes,
)
from dqtool.spec import QuantSpec
from dqtool.storage import raw_bytes


def weight_facts(spec: QuantSpec, x_shape) -> tuple[int, int, int, int]:
    """(K, N, bits, block) of a (K, N) weight DequantizeLinear, or NoMatch."""
    if spec.errors or not spec.constant or spec.x_from_quantize:
        raise NoMatch("not a valid DequantizeLinear of constants")
    if spec.quant_type not in BITS:
        raise NoMatch(f"{spec.quant_type} codes: MatMulNBits takes 2, 4 or 8 bits")
    if x_shape is None or len(x_shape) != 2:
        raise NoMatch("the weight is not 2-D")
    k, n = x_shape
    if not k or not n:  # (a weight of no elements: nothing for MatMulNBits to hold)
        raise NoMatch(f"the weight is empty ({k}, {n})")
    if spec.granularity == "blocked":
        if spec.axis != 0:
            raise NoMatch("blocks run along N (axis 1); MatMulNBits blocks run along K")
        if not pow2_16(spec.block_size):
            raise NoMatch(f"block size {spec.block_size} is not a power of 2 ≥ 16")
        block = spec.block_size
    elif spec.granularity == "per-axis" and spec.axis != 1:
        raise NoMatch("per-axis along K (axis 0) is not blocks of K")
    else:
        block = next_pow2_16(k)  # one block spans K
    return k, n, BITS[spec.quant_type], block


def _scales_zps(dq: ir.Node, spec: QuantSpec, k: int, n: int, bits: int, block: int):
    """(scales (kb, N) as the DequantizeLinear holds them, unsigned zero-point codes
    (N, kb), the same codes (kb, N) as the DequantizeLinear holds them) as lazy
    makers."""
    kb = -(-k // block)
    scale, zp = graph.input_value(dq, 1), graph.input_value(dq, 2)
    signed = types.by_name(spec.quant_type).signed

    def kn(v: ir.Value) -> np.ndarray:
        a = graph.constant_array(v)
        if spec.granularity == "blocked":
            return a.reshape(kb, n)
        return np.broadcast_to(a.reshape(1, -1) if a.size > 1 else a.reshape(1, 1), (kb, n))

    def scales_kn() -> np.ndarray:
        return kn(scale)

    def zp_codes() -> np.ndarray:  # (kb, N), as the DequantizeLinear holds them
        if zp is None:
            return np.full((kb, n), (1 << (bits - 1)) if signed else 0, np.uint8)
        return unsigned_codes(kn(zp), bits, signed)

    def zps() -> np.ndarray:
        return np.ascontiguousarray(zp_codes().T)

    return scales_kn, zps, zp_codes, kb, signed


def pack_matmul(ctx: PackContext, dq: ir.Node, spec: QuantSpec, mm: ir.Node
                ) -> tuple[str, list]:
    """DequantizeLinear → MatMul (as its B) (→ Add of the bias) → MatMulNBits; returns
    (how, the values it no longer uses), or raises NoMatch."""
    x = graph.input_value(dq, 0)
    k, n, bits, block = weight_facts(spec, graph.shape_of(x))
    if spec.granularity == "per-axis":  # one block spans K: the original's, if noted
        block = _noted_block(dq, k) or block
    a = graph.input_value(mm, 0)
    check_a(a, spec, dq)
    narrowed = narrower(dq, spec, bits)
    bits = narrowed or bits
    kn_scales, zps, zp_codes, kb, signed = _scales_zps(dq, spec, k, n, bits, block)
    zp_present = graph.input_value(dq, 2) is not None
    omit_zp = ctx.zero_points == "auto" and _all_default(zp_codes, bits)
    bias, add = bias_of(ctx, mm, n, spec.scale_type)
    b = FusedBuilder(mm if add is None else add, ctx.fresh, ctx.in_function,
                home=graph.input_value(dq, 0), early=ctx.early)
    b.base = mm.name or dq.name or "matmul"
    made = ctx.made.get(id(dq))  # B, scales, zero points packed for another MatMul
    if made is not None:
        inputs: list[ir.Value | None] = [a, *made]
    else:
        geometry = (k, n, bits, block)
        b_bytes, on_bytes, flip = _b_bytes(dq, x, geometry, signed, narrowed is not None)
        s_type = types.by_name(spec.scale_type).ir_type
        inputs = [a, *_b_and_scales(b, x, geometry, (b_bytes, on_bytes, flip), kn_scales,
                                    s_type)]
        if not omit_zp:
            zl = -(-kb * bits // 8)
            # Unused slots of the last byte hold 2^(bits-1), as onnxruntime's quantizer
            # writes them.
            inputs.append(b.constant("zero_points", ir.DataType.UINT8, (n, zl),
                                     lambda: packing.pack(zps(), bits, 1 << (bits - 1))))
        ctx.made[id(dq)] = inputs[1:]
    if bias is not None:
        inputs += [None] * (5 - len(inputs)) + [bias]
    y = matmul_nbits_node(ctx, b, inputs, k, n, bits, block, dq)
    old = [v for v in dq.inputs if v is not None]
    b.nodes.append(y.producer())
    b.finish(y)
    ctx.note_names(y.producer(), dq, b, mm)
    cleanup.remove_unused_nodes([mm, dq])
    how = (f"{spec.quant_type} ({k}, {n}) {spec.granularity} → MatMulNBits bits={bits} "
           f"block_size={block}" + (" + bias" if bias is not None else "")
           + ("" if omit_zp else ", packed zero points")
           + ("" if zp_present or omit_zp else " (zero point 0 made explicit)"))
    return how, old


def _b_bytes(dq: ir.Node, x: ir.Value, geometry: tuple[int, int, int, int], signed: bool,
             narrowed: bool) -> tuple[Callable[[], np.ndarray], bool, int]:
    """(a maker of B's bytes (N, k_blocks, blob), whether it reads the stored bytes as they
    are, the flip of their signed codes' top bits)."""
    k, n, bits, block = geometry
    kb = -(-k // block)
    # On the stored bytes where it can: adding 2^(bits-1) to every signed code (mod
    # 2^bits) flips its top bit. A ragged last block is padded with code 0, as
    # onnxruntime's quantizer does.
    on_bytes = bits in (4, 8) and n % 2 == 0 and k % 2 == 0 and not narrowed
    flip = (0x88 if bits == 4 else 0x80) if signed else 0
    if graph.constant_tensor(x) is None:
        raise NoMatch("not a constant")

    def b_bytes() -> np.ndarray:
        if on_bytes:  # (the tensor as it is when saved: ``data_writer.PlacedTensor``)
            raw = raw_bytes(graph.constant_tensor(x))
            return packing.onnx_to_nbits(raw if bits == 4 else raw.reshape(k, n), k, n,
                                         bits, block, flip=flip)
        return packing.onnx_to_nbits(unsigned_codes(graph.constant_array(x), bits, signed), k,
                                     n, bits, block)

    tail = _noted_tail(dq, k, n, bits, block)
    if tail is None:
        return b_bytes, on_bytes, flip
    byte, shift, values = tail  # (K's codes end inside a byte: never the streamed path)

    def tailed() -> np.ndarray:
        rows = np.array(b_bytes(), np.uint8).reshape(n, -1)
        rows[:, byte] |= values << shift
        return rows.reshape(n, kb, block * bits // 8)

    return tailed, on_bytes, flip


def _b_and_scales(b: FusedBuilder, x: ir.Value, geometry: tuple[int, int, int, int],
                  b_made: tuple[Callable[[], np.ndarray], bool, int],
                  kn_scales: Callable[[], np.ndarray], s_type: ir.DataType
                  ) -> list[ir.Value]:
    """[B, scales] of the MatMulNBits, made in ``b`` (``b_made``: ``_b_bytes``'s)."""
    k, n, bits, block = geometry
    kb = -(-k // block)
    b_bytes, on_bytes, flip = b_made
    if on_bytes:  # saved to a data file: written a band of N rows at a time
        bq = b.streamed("B", ir.DataType.UINT8, (n, kb, block * bits // 8), b_bytes,
                        lambda file: packing.write_onnx_as_nbits(
                            raw_bytes(graph.constant_tensor(x)), k, n, bits,
                            block, file,
                            flip=flip))
    else:
        bq = b.constant("B", ir.DataType.UINT8, (n, kb, block * bits // 8), b_bytes)
    # written transposed a band at a time, in C where it can: NumPy's transpose of
    # (k_blocks, N) float16 is slow (docs/decisions.md, "2026-11-28: sizes the code holds")
    s = b.streamed("scales", s_type, (n, kb), lambda: np.ascontiguousarray(
        kn_scales().T), lambda file: (
        packing.write_transposed(kn_scales(), file)))
    return [bq, s]


def _all_default(zp_codes: Callable[[], np.ndarray], bits: int) -> bool:
    """Whether every zero-point code is 2^(bits-1), which MatMulNBits takes without them."""
    # on the codes as stored: the transpose the packed form needs costs more than the
    # test, and is made only if they are kept (docs/decisions.md,
    # "2026-11-28: sizes the code holds")
    return bool(np.all(zp_codes() == (1 << (bits - 1))))


def bias_of(ctx: PackContext, mm: ir.Node, n: int, s_type: str | None):
    """(bias, Add) when the MatMul's one use is an Add of a constant bias that goes
    into the node: the one upgrade made from a MatMulNBits' bias input, or, with
    ``fuse_bias``, any. Else (None, None): the Add stays (inside the node the bias is
    summed in onnxruntime's own order, which moved float16 outputs by an ulp)."""
    use = only_use(mm.outputs[0])
    if use is None or use[0].op_type != "Add":
        return None, None
    add = use[0]
    if not ctx.fuse_bias and add.metadata_props.get(BIAS_KEY) != "1":
        return None, None
    other = add.inputs[1 - use[1]]
    if other is None or graph.constant_tensor(other) is None or \
            graph.shape_of(other) != (n,) or graph.elem_type(other) != s_type:
        return None, None
    return other, add


def matmul_nbits_node(ctx: PackContext, b: FusedBuilder, inputs, k, n, bits, block, dq: ir.Node
                      ) -> ir.Value:
    """The MatMulNBits of ``inputs`` (not yet in a graph); returns its output."""
    attrs = {"K": k, "N": n, "bits": bits, "block_size": block}
    # Unless told, the level upgrade noted from the original MatMulNBits (dropping it
    # changed onnxruntime's outputs, and check took that for its own rounding).
    noted = dq.metadata_props.get(ACCURACY_KEY, "0")
    level = ctx.accuracy_level if ctx.accuracy_level is not None else \
        int(noted) if noted in ("1", "2", "3", "4") else 0
    if level:
        attrs["accuracy_level"] = level
    node = ir.node("MatMulNBits", inputs, attrs, domain="com.microsoft",
                   name=b.node_name(f"{b.base}/nbits"))
    out = node.outputs[0]
    out.name = ctx.fresh(f"{b.base}/nbits")
    return out


def check_a(a: ir.Value | None, spec: QuantSpec, dq: ir.Node) -> None:
    """NoMatch when a MatMul's A cannot be a MatMulNBits' A for this weight."""
    # MatMulNBits takes A, scales and Y of one type. MatMul's A and B share a type, so an
    # undeclared A has the dequantized weight's: the scale's, or ``output_dtype``'s.
    out = output_dtype_attr(dq)
    if out not in (None, spec.scale_type):
        raise NoMatch(f"the DequantizeLinear makes {out} from {spec.scale_type} scales "
                      "(output_dtype): MatMulNBits takes A, scales and Y of one type")
    if graph.elem_type(a) not in (None, spec.scale_type):
        raise NoMatch(f"A is {graph.elem_type(a)} and the scale {spec.scale_type}: "
                      "MatMulNBits needs them equal")
    a_shape = graph.shape_of(a)
    if a_shape is not None and len(a_shape) < 2:
        raise NoMatch("A is 1-D")


def _noted_block(dq: ir.Node, k: int) -> int | None:
    """The block size ``upgrade`` noted of a MatMulNBits whose one block spans K, if it
    still does (a power of two >= 16 and >= K); else None."""
    try:
        block = int(dq.metadata_props.get(BLOCK_KEY, ""), 10)
    except ValueError:  # no note, or not a number ("²" passed isdigit() and int() raised)
        return None
    return block if pow2_16(block) and block >= k else None


def _noted_tail(dq: ir.Node, k: int, n: int, bits: int, block: int
                ) -> tuple[int, int, np.ndarray] | None:
    """(byte, bit, values) of the bits past K's last code that ``upgrade`` noted, to put
    back in each row of B; None without a note, or one that does not fit this weight."""
    place = tail_place(k, bits, block)
    note = dq.metadata_props.get(TAIL_KEY)
    if place is None or not note:
        return None
    try:
        values = np.frombuffer(bytes.fromhex(note), np.uint8)
    except ValueError:
        return None
    if values.size != n or int(values.max(initial=0)) >= 1 << (8 - place[1]):
        return None
    return place[0], place[1], values
