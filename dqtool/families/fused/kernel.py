"""The weights MatMulNBits and GatherBlockQuantized dequantize, bit for bit as onnxruntime.

Measured on onnxruntime's CPU kernels (an identity A makes every MatMulNBits output one
weight; see tests/test_fused_kernel.py):
- integer zero points (packed uint8, or the default ``2^(bits-1)``):
  ``w = float32(q - zp) * float32(scale)``, one rounding, then rounded to the output type;
- float zero points (HQQ writes them): ``w = float32(q) * scale + (-(zp * scale))`` in
  float32, each product and the sum rounded on its own (no fused multiply-add);
- GatherBlockQuantized: ``float32(q - zp) * float32(scale)``, rounded to the scale's type.
A float16/bfloat16 result is the float32 value rounded once. That rounded weight is what
the operator's schema defines (the dequantized B has A's type) and what an identity A
reads back; onnxruntime's CPU MatMulNBits itself multiplies a float16 A by the float32
value before that rounding and rounds its sum once (measured on 1.32), which ``check
--against`` allows for in its bound (``bound``).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from dqtool.errors import KernelError
from dqtool.families.fused import packing
from dqtool.kernel import half, parallel
from dqtool.kernel.outputs import new_array
from dqtool.native import transpose_fn

_F32 = np.dtype(np.float32)
# float32 bytes one band of a MatMulNBits weight computes at a time on the NumPy path
# (8-bit codes, float zero points, no extension; at least one block of K): its
# temporaries and its transpose stay in L2. The integer path's bands: GROUP_BYTES.
BAND_BYTES = 1 << 21
TILE = 1024  # columns of N a tile of the codes' transpose
# float32 bytes of W a band of the integer path makes and rounds at once (at least one
# block of K; rows of a block of a larger N in groups of this size). Larger bands cost less:
# 2026-11-28, one thread, 4-bit blocks of 128, CPU ms for (N, K) = (3072, 8192),
# (3072, 3072), (8192, 3072): 2 MiB 44, 15, 34; 4 MiB 38, 13, 33; 8 MiB 33.5, 11.2, 29.6
# (each onnxruntime call and band costs more than the cache saves; docs/benchmarks.md,
# "2026-11-28, evening"). A thread keeps its float32 buffer of this size.
GROUP_BYTES = 1 << 23
# data bytes of a GatherBlockQuantized table dequantized at a time
GATHER_BAND_BYTES = 1 << 20


def _float_out(dtype: np.dtype) -> np.dtype:
    dtype = np.dtype(dtype)
    if dtype not in (np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)):
        raise KernelError(f"scales must be float32, float16 or bfloat16, got {dtype}")
    return dtype


def matmul_nbits_zero_points(zero_points: np.ndarray | None, n: int, kb: int, bits: int
                             ) -> tuple[np.ndarray, bool]:
    """Zero points as ``(N, k_blocks)``: (uint8 codes, False) or (float32 offsets, True)."""
    if zero_points is None:
        return np.full((n, kb), 1 << (bits - 1), np.uint8), False
    zp = np.asarray(zero_points)
    if zp.dtype == np.uint8:
        rows = zp.reshape(n, -1)
        return packing.unpack(rows, bits)[:, :kb], False
    return zp.reshape(n, kb).astype(np.float32), True


def dequantize_matmul_nbits(
    b: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None = None, *,
    K: int, N: int, bits: int = 4, block_size: int, g_idx: np.ndarray | None = None,
) -> np.ndarray:
    """The float weight ``W`` (shape ``(K, N)``, the scales' type) of a MatMulNBits node, so
    that its output is ``A @ W (+ bias)``.

    ``b``: uint8 ``(N, k_blocks, blob)``; ``scales``: ``(N·k_blocks)`` or ``(N, k_blocks)``;
    ``zero_points``: packed uint8 ``(N, ceil(k_blocks·bits/8))`` or float ``(N, k_blocks)``
    or None (``2^(bits-1)``); ``g_idx``: int32 ``(K,)`` block of each row of K.
    """
    if bits not in (2, 4, 8):
        raise KernelError(f"bits must be 2, 4 or 8, got {bits}")
    if block_size < 1:
        raise KernelError(f"block_size must be positive, got {block_size}")
    out_type = _float_out(np.asarray(scales).dtype)
    kb = -(-K // block_size)
    b = np.asarray(b, dtype=np.uint8)
    if b.size != N * kb * block_size * bits // 8:
        raise KernelError(f"B has {b.size} bytes; K={K}, N={N}, bits={bits}, "
                          f"block_size={block_size} need {N * kb * block_size * bits // 8}")
    s = np.asarray(scales).reshape(N, kb).astype(np.float32)
    zp, float_zp = matmul_nbits_zero_points(zero_points, N, kb, bits)
    if g_idx is not None:
        return _by_rows(b, s, zp, float_zp, K, N, bits, block_size, kb, g_idx, out_type)
    # A recycled buffer where one of this size is idle (``kernel.outputs``): fresh pages
    # cost as much as the writes.
    out = new_array((K, N), out_type)
    rows = b.reshape(N, -1)
    blob = rows.shape[1] // kb
    s_t = np.ascontiguousarray(s.T)  # (k_blocks, N): a block's scales along a row of W
    # float32(q - zp)·scale of uint8 codes and zero points: the fast cast's proven domain
    covered = not float_zp and half.covers(np.uint8, out_type, s)
    # Codes of at most 4 bits and their zero points are in [0, 15]: q - zp fits int8
    # exactly, and is subtracted there (a quarter of the bytes of float32).
    z_i8 = np.ascontiguousarray(zp.T).view(np.int8) if bits < 8 and not float_zp else None
    # The packed codes transposed in C (on the calling thread, no unpacked transpose):
    # where the extension is built and N fills its squares of codes.
    packed_t = z_i8 is not None and transpose_fn() is not None and N % (64 // bits) == 0
    z_t: np.ndarray | None = None  # the NumPy path's float32 zero points (or offsets)
    if not packed_t:
        z_t = np.ascontiguousarray((-(zp * s)).T if float_zp  # each block's offset
                                   else zp.T.astype(np.float32))
    band_bytes = GROUP_BYTES if packed_t else BAND_BYTES
    step = max(1, band_bytes // max(1, N * block_size * 4))  # blocks a band
    group = max(1, GROUP_BYTES // max(1, N * 4))  # rows of W a pass over float32 holds

    def band(chunk: parallel.Chunk) -> None:
        # Block by block, each scale (and zero point) broadcast over its block's codes: the
        # same operations on the same values as a scale per code (``_by_rows``), without
        # making (N, K) arrays of them (docs/decisions.md, "Sizes the code holds").
        j0, j1 = chunk[0], chunk[1]
        k0, k1 = j0 * block_size, min(K, j1 * block_size)
        if packed_t:
            c_t = _codes_kn(rows[:, j0 * blob:j1 * blob], N, (j1 - j0) * block_size, bits)
            _int_rows(c_t[:k1 - k0], z_i8, s_t, j0, block_size, group, out[k0:k1], covered)
            return
        c = packing.unpack(rows[:, j0 * blob:j1 * blob], bits)  # (N, codes of the band)
        # The codes are transposed, a band at a time in tiles that stay in cache: a whole
        # float weight's transpose took 0.17 s for (3072, 8192) float16
        # (docs/benchmarks.md).
        c_t = np.empty((c.shape[1], N), np.uint8)
        for n0 in range(0, N, TILE):
            c_t[:, n0:n0 + TILE] = c[n0:n0 + TILE].T
        w = c_t.astype(np.float32).reshape(j1 - j0, block_size, N)
        if float_zp:  # q·scale + (-(zp·scale)), each rounded
            w *= s_t[j0:j1, None, :]
            w += z_t[j0:j1, None, :]
        else:  # (q - zp) exact (small integers), then ·scale rounded once
            w -= z_t[j0:j1, None, :]
            w *= s_t[j0:j1, None, :]
        half.cast_into(out[k0:k1], w.reshape(-1, N)[:k1 - k0], covered)

    parallel.run(band, [(j, min(j + step, kb), 0, 0, 0, 0) for j in range(0, kb, step)],
                 total=out.nbytes)
    return out


def _codes_kn(p: np.ndarray, n: int, codes: int, bits: int) -> np.ndarray:
    """uint8 codes ``(codes, N)`` of the packed rows ``p`` (``(N, codes·bits/8)`` bytes):
    transposed packed (``packing.transpose_band``, in C on this thread), then unpacked.
    Measured 2026-11-28, (N, K) = (8192, 3072) 4-bit, one thread: 9.1 ms of CPU against
    25 ms for unpacking first and transposing uint8 tiles (docs/benchmarks.md, "2026-11-28,
    evening")."""
    e = 64 // bits
    buf = packing.band_scratch((-(-codes // e) * e) * (n * bits // 8))
    return packing.unpack(packing.transpose_band(p, n, codes, bits, 0, buf), bits)


def _int_rows(c_t: np.ndarray, z_i8: np.ndarray, s_t: np.ndarray, j0: int, block_size: int,
              group: int, dst: np.ndarray, covered: bool) -> None:
    """``dst = float32(c_t - zp) · scale`` rounded to dst's type, rows of K in groups of
    ``group`` (``GROUP_BYTES``): ``q - zp`` in int8 (exact), converted to float32 (exact),
    one float32 multiply rounded once, as the float path computes it."""
    n = c_t.shape[1]
    d = c_t.view(np.int8)  # codes of at most 4 bits: 0..15
    for r0 in range(0, c_t.shape[0], group):
        r1 = min(c_t.shape[0], r0 + group)
        w = dst[r0:r1] if dst.dtype == _F32 else \
            parallel.scratch((r1 - r0) * n, _F32, slot=6).reshape(-1, n)
        r = r0
        while r < r1:  # the rows of one block at a time: one zero point and scale row each
            b = j0 + r // block_size
            e = min(r1, (r // block_size + 1) * block_size)
            np.subtract(d[r:e], z_i8[b], out=d[r:e])
            np.copyto(w[r - r0:e - r0], d[r:e], casting="unsafe")
            np.multiply(w[r - r0:e - r0], s_t[b], out=w[r - r0:e - r0])
            r = e
        if dst.dtype != _F32:
            half.cast_into(dst[r0:r1], w, covered)


def _by_rows(b: np.ndarray, s: np.ndarray, zp: np.ndarray, float_zp: bool, K: int, N: int,
             bits: int, block_size: int, kb: int, g_idx: np.ndarray | None,
             out_type: np.dtype) -> np.ndarray:
    """The weight with a scale (and zero point) per code: rows of K from any block
    (``g_idx``; None: row k from block k // block_size)."""
    codes = packing.unpack(b.reshape(N, -1), bits)[:, :K]
    rows = np.arange(K) // block_size if g_idx is None else \
        np.asarray(g_idx).reshape(-1).astype(np.int64)
    if rows.shape != (K,) or rows.min(initial=0) < 0 or rows.max(initial=0) >= kb:
        raise KernelError(f"g_idx must hold K={K} block indices in [0, {kb})")
    s_rows = s[:, rows]
    if float_zp:
        w = codes.astype(np.float32) * s_rows + -(zp[:, rows] * s_rows)
    else:
        w = np.subtract(codes, zp[:, rows], dtype=np.float32) * s_rows
    return np.ascontiguousarray(w.astype(out_type, copy=False).T)


def gbq_codes(data: np.ndarray, bits: int) -> np.ndarray:
    """GatherBlockQuantized data as integer codes of its logical shape (int16)."""
    data = np.asarray(data)
    if data.dtype == np.uint8 and bits != 8:
        return packing.unpack(data, bits).astype(np.int16)
    if data.dtype in (np.dtype(ml_dtypes.int4), np.dtype(ml_dtypes.uint4), np.dtype(np.uint8)):
        return data.astype(np.int16)
    raise KernelError(f"GatherBlockQuantized data must be int4, uint4 or uint8, got "
                      f"{data.dtype}")


def dequantize_gather_block_quantized(
    data: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None = None, *,
    quantize_axis: int = 1, block_size: int = 128, bits: int = 4,
    indices: np.ndarray | None = None, gather_axis: int = 0,
) -> np.ndarray:
    """The dequantized table of a GatherBlockQuantized node (the scales' type), or, given
    ``indices``, the operator's output (rows gathered along ``gather_axis``; an index out
    of range gives zeros, as onnxruntime does).

    ``data``: int4/uint4 (logical shape) or uint8 (``8 / bits`` codes per byte along the
    last axis); ``zero_points``: data's type (uint8 packed like data); None means 0 for
    int4/uint4 and ``2^(bits-1)`` for uint8.
    """
    data = np.asarray(data)
    out_type = _float_out(np.asarray(scales).dtype)
    rank = data.ndim
    qa, ga = quantize_axis % max(rank, 1), gather_axis % max(rank, 1)
    # Each element is computed from its own code, zero point and scale alone, so gathering
    # first, or a band of rows at a time, gives the same bits without the whole table's
    # temporaries (~14 bytes an element: 1.4 GB for a 32000 x 3072 embedding).
    if indices is not None and rank >= 2 and ga != qa and ga != rank - 1:
        return _gathered_first(data, scales, zero_points, quantize_axis, block_size, bits,
                               np.asarray(indices).astype(np.int64), ga, out_type)
    if indices is None and rank >= 2 and qa != 0 and data.shape[0] > 1 and \
            data.nbytes > GATHER_BAND_BYTES:
        out = None
        step = max(1, GATHER_BAND_BYTES * data.shape[0] // data.nbytes)
        for r0 in range(0, data.shape[0], step):
            part = dequantize_gather_block_quantized(
                data[r0:r0 + step], np.asarray(scales)[r0:r0 + step],
                None if zero_points is None else np.asarray(zero_points)[r0:r0 + step],
                quantize_axis=quantize_axis, block_size=block_size, bits=bits)
            if out is None:
                out = np.empty((data.shape[0], *part.shape[1:]), part.dtype)
            out[r0:r0 + step] = part
        return out
    return _gather_table(data, scales, zero_points, quantize_axis, block_size, bits,
                         indices, gather_axis, out_type)


def _gathered_first(data: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None,
                    quantize_axis: int, block_size: int, bits: int, idx: np.ndarray,
                    ga: int, out_type: np.dtype) -> np.ndarray:
    """The operator's output, the rows gathered before they are dequantized (``ga`` is not
    the quantized axis, nor the axis uint8 data packs its codes along)."""
    scales = np.asarray(scales)
    if scales.ndim != data.ndim or scales.shape[ga] != data.shape[ga]:  # its own error
        return _gather_table(data, scales, zero_points, quantize_axis, block_size, bits, idx,
                             ga, out_type)
    dim = data.shape[ga]
    bad = (idx < -dim) | (idx >= dim)
    flat = np.where(bad, 0, idx).reshape(-1)
    rows = dequantize_gather_block_quantized(
        np.take(data, flat, axis=ga), np.take(np.asarray(scales), flat, axis=ga),
        None if zero_points is None else np.take(np.asarray(zero_points), flat, axis=ga),
        quantize_axis=quantize_axis, block_size=block_size, bits=bits)
    out = rows.reshape(*rows.shape[:ga], *idx.shape, *rows.shape[ga + 1:])
    if bad.any():
        mask_shape = (1,) * ga + bad.shape + (1,) * (data.ndim - ga - 1)
        out = np.where(bad.reshape(mask_shape), np.zeros((), out_type), out)
    return out


def _gather_table(data: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None,
                  quantize_axis: int, block_size: int, bits: int,
                  indices: np.ndarray | None, gather_axis: int, out_type: np.dtype
                  ) -> np.ndarray:
    """``dequantize_gather_block_quantized`` of the whole table at once, then the gather."""
    codes = gbq_codes(data, bits)
    rank = codes.ndim
    qa = quantize_axis % rank
    kb = -(-codes.shape[qa] // block_size)
    if zero_points is None:
        zp = np.full((1,) * rank, (1 << (bits - 1)) if data.dtype == np.uint8 else 0,
                     np.int16)
    else:
        zp = gbq_codes(zero_points, bits)
        zp = np.take(zp, np.arange(kb), axis=qa)
    s = np.asarray(scales).astype(np.float32)
    expected = list(codes.shape)
    expected[qa] = kb
    if list(s.shape) != expected:
        raise KernelError(f"scales are {s.shape}, expected {tuple(expected)}")
    take = np.arange(codes.shape[qa]) // block_size
    s_full = np.take(s, take, axis=qa)
    zp_full = np.take(zp, take, axis=qa) if zp.shape[qa] > 1 else zp
    products = (codes - zp_full).astype(np.float32) * s_full
    table = np.empty(products.shape, out_type)
    # (q - zp)·scale of codes of at most 8 bits: the fast cast's proven domain (half.covers)
    half.cast_into(table, products, half.covers(data.dtype, out_type, s))
    if indices is None:
        return table
    ga = gather_axis % rank
    idx = np.asarray(indices).astype(np.int64)
    dim = table.shape[ga]
    bad = (idx < -dim) | (idx >= dim)
    out = np.take(table, np.where(bad, 0, idx), axis=ga)
    if bad.any():
        mask_shape = (1,) * ga + bad.shape + (1,) * (rank - ga - 1)
        out = np.where(bad.reshape(mask_shape), np.zeros((), out_type), out)
    return out
