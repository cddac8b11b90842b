"""``np.matmul`` of float16 arrays, bit for bit, without NumPy's scalar loop.

NumPy has no BLAS for float16: its matmul loop (``HALF_matmul_inner_noblas``) converts
each pair to float32, adds their product to a float32 sum in the order of the reduced
axis, and converts the sum to float16 once. A product of two float16 values is exact in
float32 (11 + 11 significant bits, exponents well inside float32's), so the same sums
made a row of the reduced axis at a time over whole arrays are the same bits (a NaN's
sign may differ where two NaNs meet: NaN payloads mean nothing, and
``compare.bit_identical`` ignores them).

Here the rows of the reduced axis go a chunk at a time: the chunk's products ``P`` in one
broadcast multiply, the running sum added into ``P``'s first row, then
``np.add.reduce(P, axis=0)``. NumPy reduces a C-contiguous array along its first axis
row after row, one elementwise add per row (its pairwise summation only applies when the
reduced axis is the inner loop, which it is not while the output has two elements or
more; a one-element output takes ``np.add.accumulate``, sequential by definition), so the
adds are the ones a row at a time makes, in the same order. B is widened to float32 a
chunk at a time (``half.widen_into``: onnxruntime's Cast where its probe proved it
NumPy's). ``tests/test_half_matmul_speedpaths.py`` compares it with ``np.matmul`` on
random shapes and non-finite, overflowing and subnormal values.

Measured 2026-11-28 on (1, 1, 3072) @ (3072, 8192): NumPy's loop 0.19-0.24 s, a vectorised
add per row 37-38 ms, this way 18-19 ms (8192 × 3072: 47-54 → 22-26 ms; docs/benchmarks.md,
"2026-11-28, evening"). It runs on the calling thread:
the output's columns split between two threads ran slower (29 against 19 ms) on the
shared machine, and in ``check --against`` at that size onnxruntime runs on the other
core meanwhile. The reference evaluator multiplies every float16 weight of an LLM-shaped
model this way.
"""

from __future__ import annotations

import numpy as np

from dqtool.kernel import half

HALF = np.dtype(np.float16)
# float32 products one reduce holds (P): with B's widened chunk it stays in L2 (best of
# 64-256 Ki, measured 2026-11-28).
CHUNK_ELEMENTS = 1 << 17


def applies(a: np.ndarray, b: np.ndarray) -> bool:
    """Both float16 with at least one dimension: what NumPy would send to its loop."""
    return a.dtype == HALF and b.dtype == HALF and a.ndim >= 1 and b.ndim >= 1


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``np.matmul(a, b)`` for float16 ``a`` and ``b``, the same bits (``applies``; NaN
    payloads aside)."""
    a2 = a[np.newaxis, :] if a.ndim == 1 else a
    b2 = b[:, np.newaxis] if b.ndim == 1 else b
    if a2.shape[-1] != b2.shape[-2]:
        return np.matmul(a, b)  # NumPy's own error
    k = a2.shape[-1]
    batch = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    m, n = a2.shape[-2], b2.shape[-1]
    acc = np.zeros((*batch, m, n), np.float32)
    if acc.size and k:
        # A as (K, …, M, 1) and B as (K, …, N), a row of the reduced axis first, both with
        # every batch axis (length 1 where they broadcast)
        a2 = a2.reshape((1,) * (len(batch) + 2 - a2.ndim) + a2.shape)
        b2 = b2.reshape((1,) * (len(batch) + 2 - b2.ndim) + b2.shape)
        a_k = np.moveaxis(a2.astype(np.float32), -1, 0)[..., np.newaxis]
        b_k = np.moveaxis(b2, -2, 0)
        _sum_rows(a_k, b_k, acc, acc.size == 1)
    out = acc.astype(HALF)
    if a.ndim == 1:
        out = out[..., 0, :]
    if b.ndim == 1:
        out = out[..., 0]
    return out


def _sum_rows(a_k: np.ndarray, b_k: np.ndarray, acc: np.ndarray, single: bool) -> None:
    """``acc += a_k[i] * b_k[i]`` for every row i of the reduced axis, in order (float32,
    each add rounded once). ``single``: acc has one element (added by accumulate)."""
    k = a_k.shape[0]
    per_row = acc.size
    rows = max(1, CHUNK_ELEMENTS // max(per_row, 1))
    wide = np.empty((rows, *b_k.shape[1:]), np.float32)
    # M = 1 and B has every batch axis: the products replace B's widened values
    in_place = (*wide.shape[1:-1], 1, wide.shape[-1]) == acc.shape
    buf = None if in_place else np.empty((rows, *acc.shape), np.float32)
    for k0 in range(0, k, rows):
        k1 = min(k, k0 + rows)
        w = wide[: k1 - k0]
        half.widen_into(w, b_k[k0:k1])
        w = w[..., np.newaxis, :]  # (rows, …, 1, N)
        p = w if buf is None else buf[: k1 - k0]
        # (rows, …, M, 1) · (rows, …, 1, N): every product exact in float32
        np.multiply(a_k[k0:k1], w, out=p)
        if k1 - k0 == 1:  # one row a chunk (a large output): added as it is
            acc += p[0]
            continue
        p[0] += acc
        if single:
            np.add.accumulate(p, axis=0, out=p)
            acc[...] = p[-1]
        else:
            np.add.reduce(p, axis=0, out=acc)
