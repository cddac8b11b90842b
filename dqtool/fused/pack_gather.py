"""pack's ``DequantizeLinear(table) → Gather`` → GatherBlockQuantized."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from dqtool import cleanup, graph, types
from dqtool.families.fused import packing
from dqtool.families.fused.surgery import FusedBuilder
from dqtool.fused.pack_context import (
    BITS,
    NoMatch,
    PackContext,
    narrower,
    next_pow2_16,
    noted,
    pow2_16,
)
from dqtool.spec import QuantSpec
from dqtool.storage import same_bytes


@dataclass
class _Table:
    """The table a DequantizeLinear holds, and the axes and block GatherBlockQuantized takes."""

    x: ir.Value
    scale: ir.Value
    zp: ir.Value | None
    shape: tuple[int, ...]
    gather_axis: int
    quantize_axis: int
    block: int

    @property
    def rank(self) -> int:
        """The table's rank."""
        return len(self.shape)

    @property
    def scale_shape(self) -> tuple[int, ...]:
        """The scales' shape: one a block along the quantize axis."""
        return tuple(-(-d // self.block) if i == self.quantize_axis else d
                     for i, d in enumerate(self.shape))


def _table(dq: ir.Node, spec: QuantSpec, gather: ir.Node) -> _Table:
    """The table of ``dq`` as GatherBlockQuantized would hold it, or NoMatch."""
    if spec.errors or not spec.constant or spec.x_from_quantize:
        raise NoMatch("not a valid DequantizeLinear of constants")
    x, scale, zp = (graph.input_value(dq, i) for i in range(3))
    shape = graph.shape_of(x)
    if shape is None or not all(isinstance(d, int) for d in shape):
        raise NoMatch("the table has no static shape")
    rank = len(shape)
    ga_attr = gather.attributes.get("axis")
    ga = (ga_attr.as_int() if ga_attr is not None else 0) % rank
    if spec.granularity == "blocked":
        qa, block = spec.axis, spec.block_size
        if not pow2_16(block):
            raise NoMatch(f"block size {block} is not a power of 2 ≥ 16")
    elif spec.granularity == "per-axis" and rank == 2:
        qa = 1 - spec.axis
        block = next_pow2_16(shape[qa])
    else:
        raise NoMatch(f"{spec.granularity} table: GatherBlockQuantized needs blocks")
    return _Table(x, scale, zp, tuple(shape), ga, qa, block)


def pack_gather(ctx: PackContext, dq: ir.Node, spec: QuantSpec, gather: ir.Node
                ) -> tuple[str, list]:
    """DequantizeLinear of a table → Gather (as its data) → GatherBlockQuantized; returns
    (how, the values it no longer uses), or raises NoMatch."""
    t = _table(dq, spec, gather)
    q = spec.quant_type
    b = FusedBuilder(gather, ctx.fresh, ctx.in_function, home=graph.input_value(dq, 0),
                early=ctx.early)
    b.base = gather.name or dq.name or "gather"
    s_shape = t.scale_shape
    s_type = types.by_name(spec.scale_type).ir_type
    reshaped = spec.granularity != "blocked"
    s_val = t.scale if not reshaped else b.constant(
        "scales", s_type, s_shape, lambda: graph.constant_array(t.scale).reshape(s_shape))
    if q == "uint4" and noted(dq).get("data_type") == "uint8" and t.gather_axis == 0 \
            and t.quantize_axis == t.rank - 1 and t.shape[-1] % 2 == 0 and not reshaped:
        bits, data, z = _as_uint8_packed(b, dq, t)
    elif q in ("int4", "uint4"):
        bits, data, z = _as_4bit(b, q, t, reshaped)
    elif q in ("uint8", "uint2"):
        bits, data, z = _as_uint8_codes(b, dq, spec, t)
    else:
        raise NoMatch(f"{q} tables: GatherBlockQuantized takes int4, uint4, uint8, uint2")
    inputs = [data, gather.inputs[1], s_val] + ([z] if z is not None else [])
    attrs = {"gather_axis": t.gather_axis, "quantize_axis": t.quantize_axis,
             "block_size": t.block}
    if bits != 4:  # 4 is the default; onnxruntime's quantizer leaves it out
        attrs["bits"] = bits
    node = ir.node("GatherBlockQuantized", inputs, attrs, domain="com.microsoft",
                   name=b.node_name(f"{b.base}/gbq"))
    out = node.outputs[0]
    out.name = ctx.fresh(f"{b.base}/gbq")
    old = [v for v in dq.inputs if v is not None]
    b.nodes.append(node)
    b.finish(out)
    ctx.note_names(node, dq, b)
    cleanup.remove_unused_nodes([dq])
    how = (f"{q} table {t.shape} blocked axis {t.quantize_axis} → GatherBlockQuantized "
           f"bits={bits} block_size={t.block} gather_axis={t.gather_axis}")
    return how, old


def _as_uint8_packed(b: FusedBuilder, dq: ir.Node, t: _Table
                     ) -> tuple[int, ir.Value, ir.Value | None]:
    """(bits, data, zero points) of a uint4 table upgrade read from uint8-packed codes."""
    # a table upgrade read from uint8-packed codes (its note): the same bytes as
    # uint8 again, zero points packed by row, left out if upgrade made them up
    shape, s_shape, zp = t.shape, t.scale_shape, t.zp
    stored = graph.constant_tensor(t.x)
    if stored is None:
        raise NoMatch("not a constant")
    data = b.existing(same_bytes(
        stored, ir.DataType.UINT8, (*shape[:-1], shape[-1] // 2)), "data")
    z = None
    if zp is not None:
        zcodes = graph.constant_array(zp).astype(np.uint8).reshape(s_shape)
        if "zero_points" in noted(dq) or not np.all(zcodes == 8):
            z = b.constant("zero_points", ir.DataType.UINT8,
                           (*s_shape[:-1], -(-s_shape[-1] // 2)),
                           lambda: packing.pack(zcodes, 4))
    return 4, data, z


def _as_4bit(b: FusedBuilder, q: str, t: _Table, reshaped: bool
             ) -> tuple[int, ir.Value, ir.Value | None]:
    """(bits, data, zero points) of an int4/uint4 table, taken as it is stored."""
    z = t.zp
    if t.zp is not None and reshaped:
        zp, s_shape = t.zp, t.scale_shape
        z = b.constant("zero_points", types.by_name(q).ir_type, s_shape,
                       lambda: graph.constant_array(zp).reshape(s_shape))
    return 4, t.x, z


def _as_uint8_codes(b: FusedBuilder, dq: ir.Node, spec: QuantSpec, t: _Table
                    ) -> tuple[int, ir.Value, ir.Value]:
    """(bits, data, zero points) of a uint8 or uint2 table: uint8 data, packed below 8 bits."""
    q, shape, s_shape, x, zp = spec.quant_type, t.shape, t.scale_shape, t.x, t.zp
    if t.gather_axis != 0 or t.quantize_axis != t.rank - 1:
        raise NoMatch(f"{q} tables need gather axis 0 and blocks along the last axis")
    bits = BITS[q]
    # Codes upgrade widened to 8 bits go back to their width (as for MatMulNBits),
    # where rows still fill whole bytes at it.
    narrow = narrower(dq, spec, bits)
    if narrow is not None and shape[-1] % (8 // narrow) == 0:
        bits = narrow
    per = 8 // bits
    if bits == 8:
        data = x
    else:
        if shape[-1] % per:
            raise NoMatch(f"rows of {shape[-1]} {q} codes do not fill whole bytes")
        packed_shape = (*shape[:-1], shape[-1] // per)
        data = b.constant("data", ir.DataType.UINT8, packed_shape, lambda: packing.pack(
            graph.constant_array(x).astype(np.uint8), bits))
    zl = (*s_shape[:-1], -(-s_shape[-1] // per))

    def zp_bytes() -> np.ndarray:
        codes = np.zeros(s_shape, np.uint8) if zp is None else \
            graph.constant_array(zp).astype(np.uint8).reshape(s_shape)
        return packing.pack(codes, bits)

    return bits, data, b.constant("zero_points", ir.DataType.UINT8, zl, zp_bytes)
