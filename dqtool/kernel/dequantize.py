"""ONNX DequantizeLinear (every version), exactly as onnxruntime computes it.

``y = round_to_output(float32(x - zero_point) * float32(scale))``:

* ``x - zero_point`` is exact for every type except int32 (it is formed in float32 from values
  of at most 17 bits, or it is a float8/4/6 value with a zero zero point, exact in float32);
* for int32 onnxruntime subtracts in int32 arithmetic (wrapping on overflow) and converts the
  difference to float32 (round to nearest even) — verified bit for bit, so we do the same;
* the multiply is one float32 operation (the scale converts to float32 exactly from float16,
  bfloat16 and float8e8m0); a float16/bfloat16 output is one more rounding from that float32
  product (onnxruntime does the same: it does *not* multiply in float16).

Speed (4096x4096 on 2 cores, see bench/bench_kernel.py): everything runs in cache-sized
chunks on two threads, so the output is written to memory once. ``np.take`` is a scalar loop
(~1 ns per element) while casts and ufuncs are vectorized (~0.15 ns), so integers are
*computed*: one cast, the zero point subtracted in the narrow integer type first (sub-byte
ones unpacked with uint8 ops for that), one multiply; sub-byte codes without a zero point
go through ml_dtypes' own cast in one pass (see ``_direct_cast``). Table gathers are kept
where no cheap conversion exists (float8/6/4 codes: 4-bit ones two per gather) and for
per-tensor float16/bfloat16 outputs (256 final values). Large outputs reuse a recycled buffer
(``outputs.py``): page faults cost as much as the writes. Exactness is unaffected: every
path forms the same float32 ``x - zp`` and rounds the product once.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from ..errors import KernelError
from . import half, parallel
from .blocks import apply_blockwise
from .layout import AxisView, resolve
from .outputs import new_array
from .tables import (
    E8M0,
    F16,
    F32,
    FLOAT_QUANT_TYPES,
    NIBBLE_PAIR_MASK,
    OUTPUT_TYPES,
    QUANT_TYPES,
    SCALE_TYPES,
    code_values,
    is_byte_type,
    nibble_pair_values,
    unsigned_view,
)

_I32 = np.dtype(np.int32)
_U8 = np.dtype(np.uint8)
_U16 = np.dtype(np.uint16)
# Float types of 4 bits: two codes fit one gather index (see nibble_pair_values).
_NIBBLE_FLOATS = frozenset({np.dtype(ml_dtypes.float4_e2m1fn)})
# From this many elements a per-tensor gather uses pair tables (their setup costs ~0.3 ms).
PAIR_MIN = 1 << 20
# Blocked layouts run in chunks of twice the usual budget (parallel.CHUNK): fewer GIL
# hand-offs between their short per-block NumPy loops (docs/decisions.md, "Sizes the code
# holds"); per-axis and per-tensor layouts gain nothing and keep one.
BLOCKED_CHUNK_FACTOR = 2
# Sub-byte integers: (shift that moves the value to the top of the byte, signed).
_SUBBYTE_INT_SHIFT = {
    np.dtype(ml_dtypes.int4): (4, True),
    np.dtype(ml_dtypes.uint4): (4, False),
    np.dtype(ml_dtypes.int2): (6, True),
    np.dtype(ml_dtypes.uint2): (6, False),
}
_NUMPY_SMALL_INTS = frozenset(np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16))
# The narrowest NumPy integer type that holds every ``x - zero_point`` of an integer type
# (int32 keeps int32: onnxruntime subtracts in int32 and wraps, and so do we).
_DIFF_TYPE = {
    **{t: np.dtype(np.int8) for t in _SUBBYTE_INT_SHIFT},
    np.dtype(np.int8): np.dtype(np.int16),
    np.dtype(np.uint8): np.dtype(np.int16),
    np.dtype(np.int16): _I32,
    np.dtype(np.uint16): _I32,
    _I32: _I32,
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
    out = new_array(x.shape, out_dtype)
    if x.size == 0:
        return out
    x = np.ascontiguousarray(x)
    s32 = scale.astype(np.float32, copy=False)  # read only: no copy of a float32 scale
    if lay.kind == "per-tensor" and _use_output_table(x.dtype, out_dtype):
        _per_tensor_table(x, s32.reshape(()), None if zp is None else zp.reshape(()), out)
    else:
        # float16 outputs: the final rounding through the fast cast where it is proven
        fast = out_dtype == F16 and half.covers(x.dtype, scale.dtype, s32)
        _broadcast(x, lay, s32, zp, out, fast)
    return out


def _use_output_table(x_dtype: np.dtype, out_dtype: np.dtype) -> bool:
    """Per-tensor: gather final outputs from a 256-entry table, or compute them?

    np.take costs ~1 ns per element (a scalar loop), while an integer cast plus a multiply
    are vectorized (~0.3 ns): integers to float32 are computed. The table wins for the float
    types (no cheap conversion) and for float16/bfloat16 outputs (NumPy's float32 -> float16
    cast is a scalar loop too, and the table skips it).
    """
    return is_byte_type(x_dtype) and not (x_dtype in _DIFF_TYPE and out_dtype == F32)


# --- per-tensor output tables ----------------------------------------------------------------


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


def _per_tensor_table(
    x: np.ndarray, s32: np.ndarray, zp: np.ndarray | None, out: np.ndarray
) -> None:
    n = x.size
    xf, of = x.reshape(-1), out.reshape(-1)
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


# --- computed: integers, and every per-axis/blocked layout ------------------------------------


def int_values(xs: np.ndarray, slot: int) -> np.ndarray:
    """The values of an integer chunk as a NumPy integer array: ``xs`` itself, or for the
    sub-byte types a per-thread scratch (int8 if signed, uint8 if not).

    ml_dtypes keeps a sub-byte value in the low bits of its byte and ignores the others, so
    do we: unsigned ones are masked; signed ones are moved to the top of the byte and shifted
    back arithmetically (sign extension). The move is a uint8 multiply, not ``left_shift``:
    NumPy's uint8 left_shift is a scalar loop, ~10x slower than the vectorized multiply.
    """
    spec = _SUBBYTE_INT_SHIFT.get(xs.dtype)
    if spec is None:
        return xs
    shift, signed = spec
    t = parallel.scratch(xs.size, _U8, slot).reshape(xs.shape)
    if not signed:
        np.bitwise_and(unsigned_view(xs), np.uint8(0xFF >> shift), out=t)
        return t
    np.multiply(unsigned_view(xs), np.uint8(1 << shift), out=t)
    ti = t.view(np.int8)
    np.right_shift(ti, shift, out=ti)
    return ti


def _direct_cast(x_dtype: np.dtype, zp: np.ndarray | None) -> bool:
    """Sub-byte integers without a zero point: convert with ml_dtypes' own cast.

    It reads the value from the low bits of each byte, ignoring the others (as
    ``int_values``; checked for all 256 bytes of every sub-byte type by the tests), so the
    float32 values are the same. It is a scalar loop, slower per element in cache than the
    two vectorized passes of ``int_values`` plus NumPy's cast, but it reads x and writes the
    output in one loop, so the two memory streams overlap instead of following each other:
    faster overall (docs/decisions.md, "2026-11-28: sizes the code holds"). With a zero point the
    subtraction stays in integers (``_minus_zero_point``), where it is cheapest.
    """
    return x_dtype in _SUBBYTE_INT_SHIFT and zp is None


def _minus_zero_point(
    vals: np.ndarray, zpi3: np.ndarray, c: parallel.Chunk, bs: int, in_place: bool
) -> np.ndarray:
    """``vals - zero point`` in the integer type ``zpi3`` has: exact (int32: wrapping, as
    onnxruntime). Integer operands are 1-2 bytes wide where float32 is 4, so the
    broadcasting subtract is 2-4x cheaper here than after the conversion."""
    if in_place and vals.dtype.itemsize == zpi3.dtype.itemsize:
        diff = vals.view(zpi3.dtype)  # sub-byte scratch: uint4/uint2 values fit in int8
    else:
        diff = parallel.scratch(vals.size, zpi3.dtype, slot=2).reshape(vals.shape)
        np.copyto(diff, vals, casting="unsafe")
    apply_blockwise(np.subtract, diff, zpi3, c, bs)
    return diff


def _flat(a: np.ndarray) -> np.ndarray:
    """A 1-D view of a contiguous chunk (raises rather than silently copying)."""
    v = a.view()
    v.shape = (a.size,)
    return v


def float_code_values(xs: np.ndarray, dst: np.ndarray) -> None:
    """dst (float32, contiguous) = the values of the float-typed codes xs, by table gathers.

    np.take costs about the same per index whatever the item size, so 4-bit codes are
    gathered two at a time (one masked uint16 pass builds the index): ~1.7x faster.
    """
    xf, df = _flat(xs), _flat(dst)
    if xs.dtype not in _NIBBLE_FLOATS or xf.size < 2:
        np.take(code_values(xs.dtype), unsigned_view(xf), out=df, mode="wrap")
        return
    # The uint64 output view must be 8-byte aligned: a misaligned first element goes alone,
    # and so does an odd last one.
    a = (df.ctypes.data // df.itemsize) % 2
    m = a + (xf.size - a) // 2 * 2
    idx = parallel.scratch((m - a) // 2, _U16, slot=1)
    np.bitwise_and(unsigned_view(xf[a:m]).view(np.uint16), np.uint16(NIBBLE_PAIR_MASK), out=idx)
    np.take(nibble_pair_values(xs.dtype), idx, out=df[a:m].view(np.uint64), mode="wrap")
    if a or m < xf.size:
        ends = np.r_[0:a, m : xf.size]
        df[ends] = code_values(xs.dtype)[unsigned_view(xf)[ends]]


def _tiled_rows(lay: AxisView, s3: np.ndarray, chunks: list[parallel.Chunk]) -> np.ndarray | None:
    """Per-axis on the last axis, chunks of whole rows: the scale repeated for a chunk's rows.

    Multiplying by it is a contiguous ufunc call (~0.15 ns per element) where broadcasting
    the scale row costs ~0.25 ns (NumPy's broadcast loop); one chunk-sized copy, shared.
    """
    if lay.kind != "per-axis" or lay.q != 1 or len(chunks) < 2:
        return None
    if any(c[2] != 0 or c[3] != lay.d for c in chunks):
        return None
    rows = max(c[1] - c[0] for c in chunks)
    return np.broadcast_to(s3, (rows, lay.d, 1)).copy()


def _broadcast(
    x: np.ndarray, lay: AxisView, s32: np.ndarray, zp: np.ndarray | None, out: np.ndarray,
    fast_half: bool = False,
) -> None:
    """Every layout (per-tensor is one block) in chunks: float32 values, minus the zero
    point, times the scale, each chunk in cache; the output is written once. ``fast_half``:
    the float16 rounding may use ``half.cast_into`` (the values are in its proven domain)."""
    x3 = x.reshape(lay.p, lay.d, lay.q)
    o3 = out.reshape(lay.p, lay.d, lay.q)
    s3 = lay.scale3(s32)
    is_int = x.dtype in _DIFF_TYPE
    # Float codes have a zero point only if it is zero (effective_zero_point drops it).
    # A scalar zero point of an 8/16-bit type is subtracted after the conversion (exact in
    # float32): that saves widening into a scratch. Otherwise it is subtracted in integers.
    zpf = None
    if zp is not None and lay.kind == "per-tensor" and x.dtype in _NUMPY_SMALL_INTS:
        zpf, zp = np.float32(zp.astype(np.float32)), None
    zpi3 = None if zp is None else lay.scale3(zp.astype(_DIFF_TYPE[x.dtype]))
    direct = _direct_cast(x.dtype, zp)
    factor = BLOCKED_CHUNK_FACTOR if lay.kind == "blocked" else 1
    chunks = parallel.plan(lay.p, lay.d, lay.q, align=lay.bs, factor=factor)
    tiled = _tiled_rows(lay, s3, chunks)
    # Operands broadcast along D: each NumPy inner loop is one row of Q elements.
    bufsize = parallel.ufunc_bufsize(lay.q) if lay.q > 1 else None

    def compute(c: parallel.Chunk) -> None:
        p0, p1, d0, d1, q0, q1 = c
        xs = x3[p0:p1, d0:d1, q0:q1]
        dst = o3[p0:p1, d0:d1, q0:q1]
        tmp = dst if out.dtype == F32 else parallel.scratch(xs.size, F32).reshape(xs.shape)
        if direct:
            np.copyto(tmp, xs, casting="unsafe")
        elif is_int:
            vals = int_values(xs, slot=1)
            if zpi3 is not None:
                vals = _minus_zero_point(vals, zpi3, c, lay.bs, in_place=vals is not xs)
            np.copyto(tmp, vals, casting="unsafe")  # exact, but int32 rounds to nearest even
            if zpf is not None:
                np.subtract(tmp, zpf, out=tmp)
        else:
            float_code_values(xs, tmp)
        if tiled is not None:
            np.multiply(tmp, tiled[: p1 - p0], out=tmp)
        else:
            apply_blockwise(np.multiply, tmp, s3, c, lay.bs)
        if tmp is dst:
            pass
        elif out.dtype == F16:
            half.cast_into(dst, tmp, fast_half)
        else:
            np.copyto(dst, tmp, casting="unsafe")

    with np.errstate(invalid="ignore", over="ignore"):
        parallel.run(compute, chunks, x.size, bufsize)
