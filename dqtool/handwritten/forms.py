"""Whether a DequantizeLinear computes what a hand-written dequantization computes, bit for
bit on onnxruntime (ORT_DISABLE_ALL) and on the reference evaluator, and which one.

What was measured, and the rules it gave (``docs/handwritten.md#measured``):

- ``Cast → [Sub zp] → Mul`` in float32 with codes and ``codes - zp`` exact in float32 is the
  kernel's arithmetic: ``x - zp`` exact, one float32 multiply. Plain DequantizeLinear.
- In float16 / bfloat16 onnxruntime computes the Mul in float32 and, where the next
  operator has no float16 kernel either, drops the rounding to float16 (a Cast pair it
  removes); the ONNX definition rounds. Only ``DequantizeLinear(output_dtype=float) → Cast``
  reproduces both (23+), and only while the codes (and ``codes - zp``) are exact in the
  16-bit type.
- An integer Sub before the Cast wraps in its type on both runtimes: where it does not, it
  is the zero point; where it does, the codes are the wrapped differences.
- float64 has no DequantizeLinear.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dqtool import graph, types, versions
from dqtool.handwritten import layout as lay
from dqtool.handwritten.chains import Match
from dqtool.handwritten.integers import evaluate
from dqtool.spec import QuantSpec

# The largest integer magnitude below which every integer is exact in the type.
EXACT_INTS = {"float": 1 << 24, "float16": 1 << 11, "bfloat16": 1 << 8}
WIDE_OUTPUT = frozenset({"float16", "bfloat16"})  # multiplied through output_dtype=float
_CANDIDATES = ("int8", "uint8", "int16", "uint16", "int32")


@dataclass(frozen=True)
class Values:
    """The integers a DequantizeLinear would read, in the frame of the Mul (``x_shape``):
    codes and zero point (aligned, None when there is none), before any layout choice."""

    x: np.ndarray
    zp: np.ndarray | None
    scale: np.ndarray  # aligned to x_shape


@dataclass(frozen=True)
class Form:
    """The exact DequantizeLinear of a match."""

    layout: lay.ScaleLayout  # over the DequantizeLinear's output
    codes_type: str
    zero_point: bool
    float_type: str  # the Mul's
    wide_output: bool  # output_dtype=float, then a Cast to float_type
    absorbs_after: bool  # the Reshape after the Mul is part of it
    min_opset: int

    def describe(self) -> str:
        g = self.layout
        where = "" if g.granularity == "per-tensor" else f" axis {g.axis}"
        if g.granularity == "blocked":
            where += f" block {g.block_size}"
        tail = f", output_dtype float then Cast to {self.float_type}" if self.wide_output else ""
        return (f"DequantizeLinear-{self.min_opset}+ {self.codes_type} {g.granularity}{where}"
                f"{' with zero point' if self.zero_point else ''}{tail}")


@dataclass(frozen=True)
class Decision:
    """What a match means, and its exact form or why there is none."""

    codes_type: str | None  # the DequantizeLinear codes type (the stored type if none)
    layout: lay.ScaleLayout | None
    zero_point: str  # "none", "integer"
    zero_point_where: str | None  # "before-cast", "after-cast"
    form: Form | None
    reasons: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


def _shape(value: object) -> tuple[int, ...] | None:
    s = graph.shape_of(value)  # type: ignore[arg-type]
    return s if s is not None and all(isinstance(d, int) for d in s) else None  # type: ignore[return-value]


def frames(m: Match, c_shape: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(the shape at the Sub, the shape at the Mul) after the Reshapes between the Cast
    and the Mul; None when one cannot give its shape."""
    shape, at_sub = c_shape, c_shape
    for node in m.between:
        if node.op_type == "Reshape":
            target = graph.constant_array(graph.input_value(node, 1))
            allowzero = node.attributes.get("allowzero")
            got = lay.reshape_target(shape, [int(d) for d in np.asarray(target).reshape(-1)],
                                     bool(allowzero.value) if allowzero else False)
            if got is None:
                return None
            shape = got
        else:
            at_sub = shape
    return at_sub, shape


def _int_zero_point(m: Match, q: np.ndarray) -> tuple[np.ndarray, np.ndarray | None, str | None]:
    """(codes, zero point, note): an integer Sub/Add of a constant just before the Cast is
    the zero point where it does not wrap; where it wraps, the codes are its result."""
    node = m.codes.value.producer()
    if node is None or node not in m.codes.nodes or node.op_type not in ("Sub", "Add"):
        return q, None, None
    a, b = graph.input_value(node, 0), graph.input_value(node, 1)
    zc = graph.constant_array(b)
    if zc is None or a is None:
        return q, None, None
    x = evaluate(a, m.codes.nodes)
    z = -zc.astype(np.int64) if node.op_type == "Add" else zc.astype(np.int64)
    if x.shape != q.shape:
        return q, None, None
    exact = x.astype(np.int64) - z
    if exact.shape != q.shape or not np.array_equal(exact, q.astype(np.int64)):
        wrapped = int(np.count_nonzero(exact != q.astype(np.int64))) if exact.shape == q.shape \
            else -1
        return q, None, (f"the {q.dtype} {node.op_type} before the Cast wraps for {wrapped} "
                         "codes: the DequantizeLinear reads its results as codes, no zero point")
    return x, z, None


def _fits(t: str, lo: int, hi: int) -> bool:
    e = types.by_name(t)
    return int(e.min) <= lo and hi <= int(e.max)


def codes_type(stored: str, unpacked: bool, lo: int, hi: int) -> str | None:
    """The DequantizeLinear codes type for values in [lo, hi]: the stored type where it
    holds them (unpacked nibbles: uint4/int4, as packed as the model kept them)."""
    order = (["uint4", "int4"] if unpacked else []) + [stored, *_CANDIDATES]
    return next((t for t in order if t in types.TYPES and _fits(t, lo, hi)), None)


def _exact_in(values: np.ndarray, float_type: str) -> bool:
    dt = {"float": np.float32, "float16": np.float16}.get(float_type)
    if dt is None:
        import ml_dtypes

        dt = ml_dtypes.bfloat16
    return bool(np.all(values.astype(dt).astype(np.int64) == values))


def min_opset(codes: str, float_type: str, granularity: str) -> int | None:
    spec = QuantSpec("DequantizeLinear", "ai.onnx", 0, 0, codes, float_type,
                     "float" if float_type in WIDE_OUTPUT else float_type,
                     granularity)  # type: ignore[arg-type]
    return versions.lowest_version(spec)


@dataclass
class _Read:
    """What ``decide`` and ``operands`` read of a match."""

    stored: str
    x_shape: tuple[int, ...]  # at the Mul
    scale: np.ndarray | None  # aligned to x_shape; None when not constant
    scale_shape: tuple[int, ...] | None  # aligned
    codes: np.ndarray | None  # the DequantizeLinear's codes in the Mul's frame, when read
    zp: np.ndarray | None  # aligned integer zero point
    zp_where: str | None
    reasons: list[str]
    notes: list[str]


def _float_zero_point(m: Match, r: _Read, at_sub: tuple[int, ...]) -> None:
    if m.zero_point is None:
        return
    r.zp_where = "after-cast"
    zc = graph.constant_array(m.zero_point)
    if zc is None:
        r.reasons.append(f"the zero point '{m.zero_point.name}' is computed at run time")
        return
    zc = np.asarray(zc, dtype=np.float64)
    if not (np.all(np.isfinite(zc)) and np.all(zc == np.round(zc))):
        r.reasons.append("the zero point is not an integer: DequantizeLinear subtracts an "
                         "integer of the codes' type")
        return
    z = np.round(-zc if m.zp_added else zc).astype(np.int64)
    if z.size == 1:
        r.zp = z.reshape((1,) * len(r.x_shape))
        return
    # Without a Reshape between the Sub and the Mul, the Sub's frame is the Mul's.
    al = None if m.zp_reshaped else lay.aligned(at_sub, tuple(z.shape))
    if al is None:
        r.reasons.append("the zero point is laid out in another shape than the scale (a "
                         "Reshape between the Sub and the Mul, or it grows the codes)")
        return
    r.zp = z.reshape(al)


def _read(m: Match, read_codes: bool) -> _Read | None:
    stored = graph.elem_type(m.codes.source)
    assert stored is not None
    try:
        q = m.codes.array() if (m.codes.nodes or read_codes) else None
    except (ValueError, TypeError, IndexError):
        # an integer computation the model itself could not run (a Reshape to the wrong
        # size, a shift by the type's width): not read as codes
        return None
    c_shape = tuple(q.shape) if q is not None else _shape(m.codes.source)
    assert c_shape is not None  # a constant's shape is known
    fr = frames(m, c_shape)
    if fr is None:
        return None
    at_sub, x_shape = fr
    s_arr = graph.constant_array(m.scale)
    s_shape = tuple(s_arr.shape) if s_arr is not None else _shape(m.scale)
    s_al = lay.aligned(x_shape, s_shape) if s_shape is not None else None
    if s_al is None:  # the scale grows the product, or its shape is unknown: not a DQ
        return None
    r = _Read(stored, x_shape, None if s_arr is None else s_arr.reshape(s_al), s_al,
              None, None, None, [], [])
    if s_arr is None:
        p = m.scale.producer()
        r.reasons.append(f"the scale '{m.scale.name}' is computed at run time"
                         + (f" (by {p.op_type})" if p is not None else " (a graph input)"))
    _float_zero_point(m, r, at_sub)
    if q is not None and m.zero_point is None:
        x, z, note = _int_zero_point(m, q)
        if z is not None:
            al = lay.aligned(c_shape, z.shape)
            if al is not None and (c_shape == x_shape or z.size == 1):
                r.zp, r.zp_where, q = z.reshape(al), "before-cast", x
                if z.size == 1:
                    r.zp = z.reshape((1,) * len(x_shape))
            else:
                r.notes.append("the integer zero point is laid out in another shape than "
                               "the scale: it stays in the codes")
        if note:
            r.notes.append(note)
    if q is not None:
        r.codes = q.reshape(x_shape)
    return r


def _ranges(r: _Read) -> tuple[int, int, int, int]:
    """(codes min, max, zero point min, max): the codes' values where read, else their
    stored type's range (a plain constant is not read to decide)."""
    if r.codes is not None and r.codes.size:
        lo, hi = int(r.codes.min()), int(r.codes.max())
    else:
        t = types.by_name(r.stored)
        lo, hi = int(t.min), int(t.max)
    zlo, zhi = (int(r.zp.min()), int(r.zp.max())) if r.zp is not None else (0, 0)
    return lo, hi, zlo, zhi


def _exactness(m: Match, r: _Read, ft: str) -> str | None:
    """Why the Cast (and the Sub) in ``ft`` are not exact, or None: both runtimes then
    compute ``(x - zp) * scale`` with one rounding, as the kernel does."""
    lo, hi, zlo, zhi = _ranges(r)
    limit = EXACT_INTS[ft]
    if max(abs(lo), abs(hi), abs(lo - zhi), abs(hi - zlo)) <= limit:
        return None
    codes = r.codes if r.codes is not None else m.codes.array().reshape(r.x_shape)
    d = codes.astype(np.int64) - (r.zp if r.zp is not None else 0)
    if _exact_in(codes.astype(np.int64), ft) and _exact_in(d, ft):
        return None
    if ft == "float":
        return ("codes (or codes - zero point) beyond 2^24 are rounded by the Cast to "
                "float; DequantizeLinear subtracts exactly and rounds once")
    return (f"codes (or codes - zero point) are not exact in {ft}: the ONNX definition rounds "
            f"them in the Cast, onnxruntime does not (it computes a {ft} Mul in float32); "
            "the model has two meanings and no DequantizeLinear equals both")


def _layout(m: Match, r: _Read) -> tuple[lay.ScaleLayout | str, bool]:
    """(the DequantizeLinear layout or why none, the Reshape after the Mul is part of it)."""
    params = [p for p in (r.scale_shape, None if r.zp is None else tuple(r.zp.shape)) if p]
    got = lay.infer(r.x_shape, lay.combine(r.x_shape, *params))
    if isinstance(got, str) or m.after is None:
        return got, False
    target = graph.constant_array(graph.input_value(m.after, 1))
    allowzero = m.after.attributes.get("allowzero")
    y = lay.reshape_target(r.x_shape, [int(d) for d in np.asarray(target).reshape(-1)],
                           bool(allowzero.value) if allowzero else False)
    joined = lay.merged(got, y) if y is not None else None
    return (joined, True) if joined is not None else (got, False)


def decide(m: Match) -> Decision | None:
    """The meaning of ``m`` and its exact DequantizeLinear, or why there is none; None
    when ``m`` is no dequantization after all (its scale grows the codes, or a shape is
    unknown)."""
    r = _read(m, read_codes=False)
    if r is None:
        return None
    ft = m.float_type
    zp_kind = "none" if m.zero_point is None and r.zp is None else "integer"
    got, absorbs = _layout(m, r)
    layout = None if isinstance(got, str) else got
    if isinstance(got, str):
        r.reasons.append(got)
    lo, hi, zlo, zhi = _ranges(r)
    ctype = codes_type(r.stored, m.codes.unpacked, min(lo, zlo), max(hi, zhi))
    if ft == "double":
        r.reasons.append("a float64 Mul: DequantizeLinear has no float64 output")
    elif ctype is None:
        r.reasons.append(f"codes and zero point span [{min(lo, zlo)}, {max(hi, zhi)}]: no "
                         "DequantizeLinear codes type holds them")
    elif not r.reasons:
        why = _exactness(m, r, ft)
        if why:
            r.reasons.append(why)
    form = None
    if not r.reasons and layout is not None and ctype is not None:
        v = min_opset(ctype, ft, layout.granularity)
        if v is None:
            r.reasons.append(f"no ai.onnx DequantizeLinear takes {ctype} codes with a {ft} "
                             f"scale {layout.granularity}")
        else:
            form = Form(layout, ctype, r.zp is not None, ft, ft in WIDE_OUTPUT, absorbs, v)
    return Decision(ctype or r.stored, layout, zp_kind, r.zp_where, form,
                    tuple(r.reasons), tuple(r.notes))


def operands(m: Match, form: Form) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The DequantizeLinear's (codes, scale, zero point) arrays for ``form`` (reads the
    codes)."""
    r = _read(m, read_codes=True)
    assert r is not None and r.codes is not None and r.scale is not None
    g = lay.combine(r.x_shape, r.scale.shape, *(() if r.zp is None else (r.zp.shape,)))
    shape = form.layout.param_shape
    t = types.by_name(form.codes_type)
    x = r.codes.reshape(form.layout.shape).astype(t.dtype)
    scale = np.ascontiguousarray(np.broadcast_to(r.scale, g).reshape(shape))
    zp = None if r.zp is None else \
        np.ascontiguousarray(np.broadcast_to(r.zp, g).reshape(shape)).astype(t.dtype)
    return x, scale, zp
