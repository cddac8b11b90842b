"""Blocked DequantizeLinear → per-axis (or per-tensor), exactly.

Cases rewritten:
- the scale varies along at most one axis (e.g. the blocked axis holds a single block):
  plain per-axis on that axis (or per-tensor), x untouched — the channel-wise form NPUs ask
  for;
- otherwise a layout rewrite of a constant x: the blocked axis is moved last, padded with
  the zero point up to whole blocks, and reshaped so that every block is one row; a
  per-axis DequantizeLinear (axis 0, one scale per row) dequantizes it, and
  Reshape / Slice / Transpose restore the original shape. Every element keeps its own
  scale and zero point, so the values are bit-identical.
Refused: a non-constant x, scale or zero point, or a shape that is not static.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from dqtool import graph, transposes, types
from dqtool.convert import params
from dqtool.convert.context import Step
from dqtool.convert.registry import Outcome
from dqtool.spec import QuantSpec
from dqtool.storage import same_bytes


def to_per_axis(step: Step, spec: QuantSpec, why: str) -> Outcome:
    node = step.node
    x, scale, zp = (graph.input_value(node, i) for i in range(3))
    x_shape = params.static_shape(spec.x_shape)
    s_shape = params.static_shape(spec.scale_shape)
    if x_shape is None or s_shape is None:
        return Outcome.refused("blocked x or scale has no static shape")
    if graph.constant_tensor(scale) is None or (zp is not None and
                                                graph.constant_tensor(zp) is None):
        return Outcome.refused("blocked scale or zero point is computed at run time")
    if 0 in s_shape and 0 not in (n for i, n in enumerate(x_shape) if i != spec.axis):
        # no block along the axis (x empty too), and a per-axis form needs a scale value
        # for each of the other elements
        return Outcome.refused(f"blocked scale of shape {s_shape} holds no value to keep "
                               "as a per-axis or per-tensor scale")
    varying = [d for d, n in enumerate(s_shape) if n > 1]
    if len(varying) <= 1 and all(s_shape[d] == x_shape[d] for d in varying):
        return _plain(step, spec, varying, why)
    if graph.constant_tensor(x) is None:
        return Outcome.refused("blocked x is computed at run time, and only a constant x can "
                               "be laid out offline as per-axis rows")
    return _layout(step, spec, x_shape, s_shape, why)


def _transposed(v: ir.Value | None):
    """``v``'s constant's ``transposed()`` (a tensor of its transpose's bytes, see
    ``fused.to_onnx``), or None."""
    t = graph.constant_tensor(v) if v is not None else None
    return getattr(t, "transposed", None)


def _dtype_of(v: ir.Value) -> ir.DataType:
    return types.by_name(graph.elem_type(v)).ir_type


def _plain(step: Step, spec: QuantSpec, varying: list[int], why: str) -> Outcome:
    node = step.node
    scale, zp = graph.input_value(node, 1), graph.input_value(node, 2)
    shape: tuple[int, ...] = (spec.scale_shape[varying[0]],) if varying else ()
    suffix = "per_axis" if varying else "scalar"
    step.set_input(1, step.reshaped(f"{scale.name}_{suffix}", scale, shape))
    if zp is not None:
        step.set_input(2, step.reshaped(f"{zp.name}_{suffix}", zp, shape))
    node.attributes.pop("block_size", None)
    if varying:
        node.attributes["axis"] = ir.AttrInt64("axis", varying[0])
        how = f"blocked (axis {spec.axis}, block {spec.block_size}) → per-axis axis {varying[0]}"
    else:
        node.attributes.pop("axis", None)
        how = "blocked with a single block → per-tensor"
    return Outcome("changed", how, why)


def _layout(step: Step, spec: QuantSpec, x_shape: tuple[int, ...], s_shape: tuple[int, ...],
            why: str) -> Outcome:
    node = step.node
    x, scale, zp = (graph.input_value(node, i) for i in range(3))
    a, b, rank = spec.axis, spec.block_size, len(x_shape)
    d, nb = x_shape[a], s_shape[a]
    others = tuple(n for i, n in enumerate(x_shape) if i != a)
    rows = int(np.prod(others, dtype=np.int64)) * nb
    pad = nb * b - d

    def rows_x() -> np.ndarray:
        xs = graph.constant_array(x)
        if a == 0 and rank == 2 and xs.dtype.itemsize == 1:
            # A (K, N) weight's columns as rows: a transpose of its bytes on 64-bit words
            # (in C where built), not NumPy's slow strided copy (docs/decisions.md,
            # "2026-11-28: sizes the code holds").
            xs = transposes.transpose_codes(xs.view(np.uint8), d, others[0], 8).view(xs.dtype)
        else:
            xs = np.moveaxis(xs, a, -1)
        if pad:
            if zp is not None:
                fill = np.moveaxis(graph.constant_array(zp), a, -1)[..., -1:]
            else:
                fill = np.zeros((*others, 1), xs.dtype)
            xs = np.concatenate([xs, np.broadcast_to(fill, (*others, pad)).astype(xs.dtype)],
                                axis=-1)
        return np.ascontiguousarray(xs).reshape(rows, b)

    def rows_of(v: ir.Value):
        return lambda: np.ascontiguousarray(
            np.moveaxis(graph.constant_array(v), a, -1)).reshape(rows)

    if a == rank - 1 and not pad:
        # The rows are x, its scale and its zero point as stored, reshaped: their bytes are
        # kept (a weight in a file is copied there by the save, never read into memory).
        def laid_out(v: ir.Value, shape: tuple[int, ...]) -> ir.Value:
            return step.reshaped(f"{v.name}_rows", v, shape)
    elif a == 0 and rank == 2 and not pad and _transposed(x) is not None:
        # x is another constant transposed (MatMulNBits' B as ai.onnx's (K, N)): the rows
        # are that constant's bytes, and the scale's and zero point's likewise where known.
        def laid_out(v: ir.Value, shape: tuple[int, ...]) -> ir.Value:
            source = _transposed(v)
            if source is None:
                return step.constant(f"{v.name}_rows", v.dtype or _dtype_of(v), shape,
                                     rows_x if v is x else rows_of(v))
            t = graph.constant_tensor(v)
            return step.holding(f"{v.name}_rows", same_bytes(source(), t.dtype, shape))
    else:
        def laid_out(v: ir.Value, shape: tuple[int, ...]) -> ir.Value:
            return step.constant(f"{v.name}_rows", v.dtype or _dtype_of(v), shape,
                                 rows_x if v is x else rows_of(v))

    step.set_input(0, laid_out(x, (rows, b)))
    step.set_input(1, laid_out(scale, (rows,)))
    if zp is not None:
        step.set_input(2, laid_out(zp, (rows,)))
    node.attributes.pop("block_size", None)
    node.attributes["axis"] = ir.AttrInt64("axis", 0)
    out_type = node.outputs[0].dtype or types.by_name(spec.float_type).ir_type
    chain: list = [("Reshape", [step.small_constant("shape", np.array([*others, nb * b],
                                                                       np.int64))], {},
                    "reshape")]
    if pad:
        chain.append(("Slice", [step.small_constant("starts", np.array([0], np.int64)),
                                step.small_constant("ends", np.array([d], np.int64)),
                                step.small_constant("axes", np.array([rank - 1], np.int64))],
                      {}, "slice"))
    if a != rank - 1:
        perm = [i if i < a else (rank - 1 if i == a else i - 1) for i in range(rank)]
        chain.append(("Transpose", [], {"perm": perm}, "transpose"))
    step.append(chain, out_type, shape=(rows, b))
    how = (f"blocked (axis {a}, block {b}) → per-axis rows ({rows}, {b}) of x"
           + (f", ragged last block padded by {pad}" if pad else "")
           + ", then " + "/".join(c[0] for c in chain))
    return Outcome("changed", how, why)
