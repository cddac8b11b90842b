"""ONNX DequantizeLinear (every version), exactly as onnxruntime computes it.

``y = round_to_output(float32(x - zero_point) * float32(scale))``:

* ``x - zero_point`` is exact for every type except int32 (it is formed in float32 from values
  of at most 17 bits, or it is a float8/4/6 value with a zero zero point, exact in float32);
* for int32 onnxruntime subtracts in int32 arithmetic (wrapping on overflow) and converts the
  difference to float32 (round to nearest even) — verified bit for bit, so we do the same;
* the multiply is one float32 operation (the scale converts to float32 exactly from float16,
  bfloat16 and float8e8m0); a float16/bfloat16 output is one more rounding from that float32
  product (onnxruntime does the same: it does *not* multiply in float16).

Speed: one-byte types go through 256-entry tables (``np.take``); per-tensor tables hold the
final outputs, per-axis/blocked tables hold ``float32(x)`` and the zero point and scale are
applied in cache-sized chunks on two threads. Exactness is unaffected: the table holds the
same float32 values the direct computation forms.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from ..errors import KernelError
from . import parallel
from .blocks import apply_blockwise
from .layout import Layout, resolve
from .tables import (
    E8M0,
    F32,
    FLOAT_QUANT_TYPES,
    OUTPUT_TYPES,
    QUANT_TYPES,
    SCALE_TYPES,
    code_values,
    is_byte_type,
    unsigned_view,
)

_I32 = np.dtype(np.int32)
# Types converted by a plain cast (faster than a gather for these).
_CAST_TYPES = frozenset(np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16))
# From this many elements a per-tensor gather uses pair tables (their setup costs ~0.3 ms).
PAIR_MIN = 1 << 20
# Sub-byte integers: (shift that moves the value to the top of the byte, signed).
_SUBBYTE_INT_SHIFT = {
    np.dtype(ml_dtypes.int4): (4, True),
    np.dtype(ml_dtypes.uint4): (4, False),
    np.dtype(ml_dtypes.int2): (6, True),
    np.dtype(ml_dtypes.uint2): (6, False),
}


def _names(dtypes: frozenset[np.dtype]) -> str:
    return ", ".join(sorted(str(t) for t in dtypes))


def check_types(
    x: np.ndarray, scale: np.ndarray, zp: np.ndarray | None, output_dtype: Any
) -> np.dtype:
    """Validate the element types; return the output dtype."""
    if x.dtype not in QUANT_TYPES:
        raise KernelError(f"x type must be one of {_names(QUANT_TYPES)}; got {x.dtype}")
    if scale.dtype not in SCALE_TYPES:
        raise KernelError(
            f"scale type must be one of {_names(SCALE_TYPES)}; got {scale.dtype} "
            f"(scale shape {scale.shape})"
        )
    if zp is not None and zp.dtype != x.dtype:
        raise KernelError(
            f"zero point type must equal x's type: x is {x.dtype}, zero point is {zp.dtype}"
        )
    if output_dtype is None:
        # float8e8m0 is not an output type; the spec then requires output_dtype, we default
        # to float32 (the type every scale converts to exactly).
        return F32 if scale.dtype == E8M0 else scale.dtype
    out = np.dtype(output_dtype)
    if out not in OUTPUT_TYPES:
        raise KernelError(f"output_dtype must be one of {_names(OUTPUT_TYPES)}; got {out}")
    return out


def effective_zero_point(x: np.ndarray, zp: np.ndarray | None) -> np.ndarray | None:
    """The zero point if it can change the result, else None; rejects float ones ≠ 0."""
    if zp is None:
        return None
    if x.dtype in FLOAT_QUANT_TYPES:
        z = zp.astype(np.float32)
        if np.any(z != 0):  # NaN counts as non-zero
            raise KernelError(
                f"a {x.dtype} zero point must be zero (both runtimes reject others); "
                f"got non-zero values (zero point shape {zp.shape})"
            )
        return None
    if not np.any(zp):
        return None
    return zp


def dequantize(
    x: np.ndarray,
    scale: np.ndarray,
    zero_point: np.ndarray | None = None,
    *,
    axis: int = 1,
    block_size: int = 0,
    output_dtype: Any = None,
) -> np.ndarray:
    """ONNX DequantizeLinear: ``(x - zero_point) * scale``; see the module docstring."""
    x, scale = np.asarray(x), np.asarray(scale)
    zp = None if zero_point is None else np.asarray(zero_point)
    out_dtype = check_types(x, scale, zp, output_dtype)
    lay = resolve(x, scale, zp, int(axis), int(block_size))
    zp = effective_zero_point(x, zp)
    out = np.empty(x.shape, out_dtype)
    if x.size == 0:
        return out
    x = np.ascontiguousarray(x)
    s32 = scale.astype(np.float32)
    if lay.kind == "per-tensor":
        _per_tensor(x, s32.reshape(()), None if zp is None else zp.reshape(()), out)
    else:
        _broadcast(x, lay, s32, zp, out)
    return out


# --- per-tensor ---------------------------------------------------------------------------


def output_table(x_dtype: np.dtype, s32: np.ndarray, zp: np.ndarray | None,
                 out_dtype: np.dtype) -> np.ndarray:
    """The 256 outputs of a one-byte type: each entry computed exactly as the direct path."""
    vals = code_values(x_dtype)
    if zp is not None:
        vals = vals - np.float32(zp.astype(np.float32))
    with np.errstate(invalid="ignore", over="ignore"):
        return (vals * s32).astype(out_dtype)


def pair_table(table: np.ndarray) -> np.ndarray:
    """65536 entries: the outputs of two adjacent codes at once (indexed by a uint16 view).

    Halves the number of indices ``np.take`` converts and gathers; 512 KiB for float32
    outputs, still L2-resident. Little-endian: the first code is the low byte.
    """
    u = unsigned_view(table)
    wide = {1: np.uint16, 2: np.uint32, 4: np.uint64}[u.dtype.itemsize]
    codes = np.arange(65536, dtype=np.uint32)
    lo = u[codes & 0xFF].astype(wide)
    hi = u[codes >> 8].astype(wide)
    return lo | (hi << wide(8 * u.dtype.itemsize))


def _per_tensor(x: np.ndarray, s32: np.ndarray, zp: np.ndarray | None, out: np.ndarray) -> None:
    n = x.size
    xf, of = x.reshape(-1), out.reshape(-1)
    if is_byte_type(x.dtype) and not (x.dtype in _CAST_TYPES and out.dtype == F32):
        table = output_table(x.dtype, s32, zp, out.dtype)
        if n >= PAIR_MIN:
            # Pairs of codes -> pairs of outputs; the odd last element (if any) separately.
            m = n & ~1
            pairs = pair_table(table)
            codes = unsigned_view(xf[:m]).view(np.uint16)
            dst = unsigned_view(of[:m]).view(pairs.dtype)
            chunks = parallel.plan(1, m // 2, 1)
            if m < n:
                of[m:] = table[unsigned_view(xf[m:])]
        else:
            pairs, codes, dst = unsigned_view(table), unsigned_view(xf), unsigned_view(of)
            chunks = parallel.plan(1, n, 1)

        def gather(c: parallel.Chunk) -> None:
            np.take(pairs, codes[c[2] : c[3]], out=dst[c[2] : c[3]], mode="wrap")

        parallel.run(gather, chunks, n)
        return
    chunks = parallel.plan(1, n, 1)
    zp32 = None if zp is None or x.dtype == _I32 else np.float32(zp)

    def compute(c: parallel.Chunk) -> None:
        a, b = c[2], c[3]
        tmp = of[a:b] if out.dtype == F32 else parallel.scratch(b - a, F32)
        _fill(tmp, xf[a:b], zp if x.dtype == _I32 else None)
        if zp32 is not None:
            np.subtract(tmp, zp32, out=tmp)
        np.multiply(tmp, s32, out=tmp)
        if tmp is not of[a:b]:
            np.copyto(of[a:b], tmp, casting="unsafe")

    with np.errstate(invalid="ignore", over="ignore"):
        parallel.run(compute, chunks, n)


def _fill(dst: np.ndarray, xs: np.ndarray, i32_zp: np.ndarray | None) -> None:
    """dst (float32, same shape) = float32(xs), int32 minus its zero point as onnxruntime."""
    if xs.dtype == _I32:
        if i32_zp is not None:
            diff = parallel.scratch(xs.size, _I32, slot=1).reshape(xs.shape)
            np.subtract(xs, i32_zp, out=diff)  # wraps like onnxruntime's int32 arithmetic
            xs = diff
        np.copyto(dst, xs, casting="unsafe")  # int32 -> float32 rounds to nearest even
    elif xs.dtype in _CAST_TYPES:
        np.copyto(dst, xs, casting="unsafe")
    elif xs.dtype in _SUBBYTE_INT_SHIFT:
        # int4/uint4/int2/uint2 sit in the low bits of a byte (ml_dtypes ignores the rest):
        # shifting them to the top and back (arithmetic for signed) is cheaper than a gather.
        shift, signed = _SUBBYTE_INT_SHIFT[xs.dtype]
        t = parallel.scratch(xs.size, np.dtype(np.uint8), slot=1).reshape(xs.shape)
        np.left_shift(unsigned_view(xs), shift, out=t)
        tv = t.view(np.int8) if signed else t
        np.right_shift(tv, shift, out=tv)
        np.copyto(dst, tv, casting="unsafe")
    else:
        np.take(code_values(xs.dtype), unsigned_view(xs), out=dst, mode="wrap")


# --- per-axis and blocked -------------------------------------------------------------------


def _broadcast(
    x: np.ndarray, lay: Layout, s32: np.ndarray, zp: np.ndarray | None, out: np.ndarray
) -> None:
    x3 = x.reshape(lay.p, lay.d, lay.q)
    o3 = out.reshape(lay.p, lay.d, lay.q)
    s3 = lay.scale3(s32)
    zp3 = None if zp is None else lay.scale3(zp)
    zpf3 = None if zp3 is None or x.dtype == _I32 else zp3.astype(np.float32)
    chunks = parallel.plan(lay.p, lay.d, lay.q, align=lay.bs)

    def compute(c: parallel.Chunk) -> None:
        p0, p1, d0, d1, q0, q1 = c
        xs = x3[p0:p1, d0:d1, q0:q1]
        dst = o3[p0:p1, d0:d1, q0:q1]
        tmp = dst if out.dtype == F32 else parallel.scratch(xs.size, F32).reshape(xs.shape)
        if x.dtype == _I32 and zp3 is not None:
            diff = parallel.scratch(xs.size, _I32, slot=1).reshape(xs.shape)
            np.copyto(diff, xs)
            apply_blockwise(np.subtract, diff, zp3, c, lay.bs)  # int32 wrap, as onnxruntime
            np.copyto(tmp, diff, casting="unsafe")
        else:
            _fill(tmp, xs, None)
            if zpf3 is not None:
                apply_blockwise(np.subtract, tmp, zpf3, c, lay.bs)
        apply_blockwise(np.multiply, tmp, s3, c, lay.bs)
        if tmp is not dst:
            np.copyto(dst, tmp, casting="unsafe")

    with np.errstate(invalid="ignore", over="ignore"):
        parallel.run(compute, chunks, x.size)
