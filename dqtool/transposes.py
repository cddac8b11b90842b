"""Transposing a matrix of packed 2/4/8-bit codes on 64-bit words, never unpacking them: in
C where ``dqtool.native`` is built, else on NumPy (the same bytes). The fused family repacks
MatMulNBits' ``(N, K)`` codes into ai.onnx's ``(K, N)`` with it; a blocked DequantizeLinear
lowered to rows (``convert.blocked``) lays its int8 codes out with it.
"""

from __future__ import annotations

import numpy as np

from dqtool.kernel import parallel
from dqtool.native import transpose_fn


def _swap_stages(bits: int) -> list[tuple[np.uint64, np.uint64, int]]:
    """(shift, mask, row distance) of each stage of the in-word transpose (below)."""
    stages = []
    d = 32
    while d >= bits:
        group = (1 << d) - 1
        mask = sum(group << (2 * d * i) for i in range(64 // (2 * d)))
        stages.append((np.uint64(d), np.uint64(mask), d // bits))
        d //= 2
    return stages


# Input bytes one slab of rows may hold: its words and a half-size temporary stay in L2
# while the stages run over them (docs/decisions.md, "Sizes the code holds").
SLAB_BYTES = 1 << 21


def _whole_squares(p: np.ndarray, rows: int, width: int) -> np.ndarray:
    """``p`` as the C kernel reads it: ``rows`` rows of at least ``width`` bytes, bytes
    contiguous within a row; a zero-padded copy where it is not."""
    if p.shape[0] == rows and p.shape[1] >= width and p.strides[1] == 1:
        return p
    q = np.zeros((rows, width), np.uint8)
    q[: p.shape[0], : min(width, p.shape[1])] = p[:, :width]
    return q


def _in_slabs(work, out: np.ndarray, squares: int, per_slab: int, rows: int, cols: int,
              bits: int) -> np.ndarray:
    """Run ``work`` on slabs of ``per_slab`` squares down, on the kernel's thread pool; the
    output ``(cols, rows·bits/8)`` of ``out`` (whole squares)."""
    chunks = [(s, min(s + per_slab, squares), 0, 0, 0, 0)
              for s in range(0, squares, per_slab)]
    parallel.run(work, chunks, total=out.nbytes)
    if out.shape != (cols, rows * bits // 8):
        out = np.ascontiguousarray(out[:cols, : rows * bits // 8])
    return out


def transpose_codes(p: np.ndarray, rows: int, cols: int, bits: int, flip: int = 0
                    ) -> np.ndarray:
    """The ``bits``-bit matrix ``(rows, cols)`` packed row by row in ``p`` (``rows`` rows of
    at least ``cols·bits/8`` bytes, lowest bits first), transposed and packed the same way:
    ``(cols, rows·bits/8)`` bytes. ``bits`` 2, 4 or 8; ``rows·bits`` a multiple of 8.
    ``flip``: a byte every source byte is xor-ed with first (e.g. 0x88: each signed int4
    code offset by 8, i.e. made unsigned).

    In C where ``dqtool.native`` is built (the same words, in registers), else on NumPy
    (``transpose_codes_numpy``); the bytes are the same."""
    assert bits in (2, 4, 8) and rows * bits % 8 == 0, (rows, bits)
    if rows == 0 or cols == 0:  # no squares to take turns over (a weight of zero columns)
        return np.zeros((cols, rows * bits // 8), np.uint8)
    fn = transpose_fn()
    if fn is None:
        p = np.asarray(p, dtype=np.uint8).reshape(rows, -1)
        return transpose_codes_numpy(p ^ np.uint8(flip) if flip else p, rows, cols, bits)
    e = 64 // bits
    wide, squares = -(-cols // e), -(-rows // e)
    p = _whole_squares(np.asarray(p, dtype=np.uint8).reshape(rows, -1), squares * e,
                       wide * 8)
    out = np.empty((wide * e, squares * 8), np.uint8)
    per_slab = max(1, SLAB_BYTES // (e * wide * 8))

    def work(chunk: tuple[int, ...]) -> None:
        # ctypes releases the GIL for the call: slabs run on the pool's threads at once.
        fn(p.ctypes.data, p.strides[0], out.ctypes.data, out.strides[0], wide, chunk[0],
           chunk[1], bits, flip)

    return _in_slabs(work, out, squares, per_slab, rows, cols, bits)


def transpose_codes_numpy(p: np.ndarray, rows: int, cols: int, bits: int) -> np.ndarray:
    """``transpose_codes`` on NumPy (no flip).

    Works on 64-bit words, never on single codes. A word holds ``E = 64 / bits`` codes of a
    row, so an ``E × E`` square of codes is ``E`` words of ``E`` consecutive rows. Within
    the square the classic recursive transpose swaps the off-diagonal halves, then
    quarters, ... down to single codes: ``log2(E)`` stages of shifts, masks and xors over
    all squares of a slab of rows at once. The squares then change places as whole words
    (one strided copy). Slabs of rows run on the kernel's thread pool (NumPy releases the
    GIL in every one of these calls).
    """

    assert bits in (2, 4, 8) and rows * bits % 8 == 0, (rows, bits)
    if rows == 0 or cols == 0:
        return np.zeros((cols, rows * bits // 8), np.uint8)
    e = 64 // bits
    wide = -(-cols // e)  # words per row (cols padded to whole squares)
    squares = -(-rows // e)  # squares down (rows padded to whole squares)
    p = np.asarray(p, dtype=np.uint8).reshape(rows, -1)
    need = wide * 8
    padded_rows = squares * e
    if p.shape[1] < need or rows != padded_rows or p.strides[1] != 1 or p.strides[0] % 8 \
            or p.ctypes.data % 8:
        q = np.zeros((padded_rows, need), np.uint8)
        width = min(need, p.shape[1])
        q[:rows, :width] = p[:, :width]
        p = q
    words = p[:, :need].view(np.uint64).reshape(squares, e, wide)
    out = np.empty((wide * e, squares * 8), np.uint8)
    o = out.view(np.uint64).reshape(wide, e, squares)
    stages = _swap_stages(bits)
    per_slab = max(1, SLAB_BYTES // (e * need))

    def work(chunk: tuple[int, ...]) -> None:
        s0, s1 = chunk[0], chunk[1]
        m = (s1 - s0) * wide
        a = np.empty((e, s1 - s0, wide), np.uint64)
        np.copyto(a, words[s0:s1].transpose(1, 0, 2))  # a[i] = row i of every square
        t = np.empty((e // 2) * m, np.uint64)
        for shift, mask, dist in stages:
            v = a.reshape(e // (2 * dist), 2, dist, m)
            lo, hi = v[:, 0], v[:, 1]  # row i and row i + dist of each pair
            tv = t.reshape(e // (2 * dist), dist, m)
            np.right_shift(lo, shift, out=tv)
            tv ^= hi
            tv &= mask
            hi ^= tv
            tv <<= shift
            lo ^= tv
        o[:, :, s0:s1] = a.transpose(2, 0, 1)  # square (s, c) → square (c, s)

    return _in_slabs(work, out, squares, per_slab, rows, cols, bits)
