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

_F32 = np.dtype(np.float32)


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
    codes = packing.unpack(b.reshape(N, -1), bits)  # (N, k_blocks · block_size)
    if g_idx is None:
        # Block by block, each scale (and zero point) broadcast over its block's codes: the
        # same operations on the same values as a scale per code (below), without making
        # (N, K) arrays of them (docs/decisions.md, "Sizes the code holds").
        c = codes.reshape(N, kb, block_size)
        s_b = s[:, :, None]
        if float_zp:
            w = c.astype(np.float32) * s_b
            w += -(zp[:, :, None] * s_b)
        else:
            w = np.subtract(c, zp[:, :, None], dtype=np.float32)  # exact: small integers
            w *= s_b
        w = w.reshape(N, -1)[:, :K]
    else:
        rows = np.asarray(g_idx).reshape(-1).astype(np.int64)
        if rows.shape != (K,) or rows.min(initial=0) < 0 or rows.max(initial=0) >= kb:
            raise KernelError(f"g_idx must hold K={K} block indices in [0, {kb})")
        codes = codes[:, :K]
        s_rows = s[:, rows]
        if float_zp:
            w = codes.astype(np.float32) * s_rows + -(zp[:, rows] * s_rows)
        else:
            w = np.subtract(codes, zp[:, rows], dtype=np.float32) * s_rows
    # rounded to the output type before the transpose: the same values, half the bytes moved
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
    table = ((codes - zp_full).astype(np.float32) * s_full).astype(out_type)
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
