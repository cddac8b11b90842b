"""``np.matmul`` of float16 arrays, bit for bit, without NumPy's scalar loop.

NumPy has no BLAS for float16: its matmul loop (``HALF_matmul_inner_noblas``) converts
each pair to float32, adds their product to a float32 sum in the order of the reduced
axis, and converts the sum to float16 once. A product of two float16 values is exact in
float32 (11 + 11 significant bits, exponents well inside float32's), so the same sums
made a row of the reduced axis at a time over whole arrays are the same bits: here, one
vectorised float32 add per row (a NaN's sign may differ where two NaNs meet: NaN
payloads mean nothing, and ``compare.bit_identical`` ignores them). Measured 2026-11-28
on (1, 3072) @ (3072, 8192): 0.19-0.24 s through NumPy's loop, 0.035 s this way
(docs/benchmarks.md, "Check at LLM size"); the reference evaluator multiplies every
float16 weight of an LLM-shaped model this way.
"""

from __future__ import annotations

import numpy as np

HALF = np.dtype(np.float16)


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
    acc = np.zeros((*batch, a2.shape[-2], b2.shape[-1]), np.float32)
    a32 = a2.astype(np.float32)
    for i in range(k):
        # (…, M, 1) · (…, 1, N): each product exact in float32, the add rounded once
        acc += a32[..., :, i:i + 1] * b2[..., i:i + 1, :].astype(np.float32)
    out = acc.astype(HALF)
    if a.ndim == 1:
        out = out[..., 0, :]
    if b.ndim == 1:
        out = out[..., 0]
    return out
