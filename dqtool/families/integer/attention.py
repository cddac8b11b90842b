"""com.microsoft QAttention as onnxruntime's CPU kernel computes it.

1. ``QKV = float32(acc) · (weight_scale · input_scale) + bias``: ``acc`` the exact int32
   product of ``input - input_zp`` (uint8) with ``weight - weight_zp`` (per tensor or per
   column), one multiply and one add in float32. This stage is exact; ``present`` (past K/V
   followed by this step's K/V) is made of its values only, so it is bit-identical.
2. ``scores = scale · (Q·Kᵀ) + mask`` per batch and head, with ``scale = 1/sqrt(head_size)``
   unless given; the products accumulated in order with fused multiply-adds (as MLAS's SGEMM
   does), the mask added by one more fused multiply-add. The mask is ``mask_filter_value``
   (default -10000) where a position may not be attended: past its end (1-D mask_index of
   end positions), before its start (the second half of a ``2·batch`` mask_index), a 0 in a
   2-D ``(batch, total)`` or 3-D ``(batch, seq, total)`` mask; with ``unidirectional``
   (and more than one query) every key after the query's own position is set to float32's
   lowest value instead (measured: a query whose other keys are all padded still attends
   them, not the future).
3. Softmax over the keys as MLAS computes it (``mlas.softmax``: its exp polynomial, its
   lane order of summation), bit-identical to onnxruntime's.
4. ``probs · V`` accumulated in order with fused multiply-adds (with one query, MLAS's
   single-row kernel: see ``_row_matmul``), heads laid back side by side. With head_size 1
   MLAS takes a single-column kernel whose order dqtool does not reproduce: that case is
   within the tolerance ``ort_facts.py`` states; every other case measured bit-identical.
"""

from __future__ import annotations

import numpy as np

from dqtool.families.integer.mlas import fma, softmax

F32 = np.float32
CAUSAL = np.finfo(F32).min


def _mask(mask_index: np.ndarray | None, batch: int, seq: int, past: int, causal: bool,
          filter_value: float) -> np.ndarray | None:
    total = past + seq
    if mask_index is None and not causal:
        return None
    m = np.zeros((batch, seq, total), F32)
    fv = F32(filter_value)
    if mask_index is not None:
        mi = np.asarray(mask_index).astype(np.int64)
        if mi.ndim == 1 and mi.size in (batch, 2 * batch):
            for b in range(batch):
                m[b, :, max(int(mi[b]), 0):] = fv
                if mi.size == 2 * batch:
                    m[b, :, :max(int(mi[batch + b]), 0)] = fv
        elif mi.ndim == 2 and mi.shape == (batch, total):
            m[:] = np.where(mi[:, None, :] > 0, F32(0), fv)
        elif mi.ndim == 3 and mi.shape == (batch, seq, total):
            m[:] = np.where(mi > 0, F32(0), fv)
        else:
            raise NotImplementedError(f"QAttention mask_index of shape {mi.shape}: dqtool's "
                                      "kernel takes (batch), (2*batch), (batch, total) and "
                                      "(batch, seq, total)")
    if causal:
        later = np.arange(total)[None, :] > past + np.arange(seq)[:, None]
        m[:, later] = CAUSAL
    return m


def _fma_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` (…, M, K) × (…, K, N) as MLAS's SGEMM kernel computes it: each element
    accumulated over K in order with one rounding per fused multiply-add."""
    acc = np.zeros(a.shape[:-1] + b.shape[-1:], F32)
    for k in range(a.shape[-1]):
        acc = fma(a[..., :, k:k + 1], b[..., k:k + 1, :], acc)
    return acc


def _row_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` for one row of ``a`` (M = 1, alpha 1) as MLAS's single-row kernel computes
    it: products rounded, summed four at a time in order, each four added to the result,
    then a pair and a single for the rest."""
    def term(k: int) -> np.ndarray:
        return (a[..., :, k:k + 1] * b[..., k:k + 1, :]).astype(F32)

    acc = np.zeros(a.shape[:-1] + b.shape[-1:], F32)
    k, n = 0, a.shape[-1]
    for width in (4, 2, 1):
        while n - k >= width:
            t = term(k)
            for j in range(k + 1, k + width):
                t = (t + term(j)).astype(F32)
            acc = (acc + t).astype(F32)
            k += width
            if width < 4:
                break
    return acc


def qkv(x, w, bias, x_scale, w_scale, x_zp=None, w_zp=None) -> np.ndarray:
    """Stage 1: ``float32(acc) · (w_scale · x_scale) + bias``, shape (batch, seq, 3·hidden)."""
    xz = 0 if x_zp is None else int(np.asarray(x_zp).reshape(-1)[0])
    wz = np.zeros((), np.int64) if w_zp is None else np.asarray(w_zp).astype(np.int64)
    if wz.size == 1:
        wz = wz.reshape(())
    acc = (np.asarray(x).astype(np.float64) - xz) @ (np.asarray(w).astype(np.int64) - wz
                                                      ).astype(np.float64)
    acc32 = np.rint(acc).astype(np.int64).astype(np.int32)
    ws = np.asarray(w_scale, F32)
    scale = (ws.reshape(-1) if ws.size > 1 else ws.reshape(())) * F32(
        np.asarray(x_scale, F32).reshape(-1)[0])
    return ((acc32.astype(F32) * scale.astype(F32)).astype(F32)
            + np.asarray(bias, F32)).astype(F32)


def qattention(x, w, bias, x_scale, w_scale, mask_index=None, x_zp=None, w_zp=None,
               past=None, *, num_heads: int, unidirectional: int = 0,
               mask_filter_value: float = -10000.0, scale: float = 0.0
               ) -> tuple[np.ndarray, np.ndarray]:
    """(output (batch, seq, hidden), present (2, batch, heads, past + seq, head_size))."""
    x = np.asarray(x)
    batch, seq, _ = x.shape
    hidden = np.asarray(w).shape[1] // 3
    hs = hidden // num_heads
    q3 = qkv(x, w, bias, x_scale, w_scale, x_zp, w_zp)
    # (batch, seq, 3, heads, head) → three (batch, heads, seq, head)
    q, k, v = np.moveaxis(q3.reshape(batch, seq, 3, num_heads, hs), 2, 0).transpose(0, 1, 3,
                                                                                     2, 4)
    p_len = 0 if past is None else np.asarray(past).shape[3]
    if past is not None:
        k = np.concatenate([np.asarray(past, F32)[0], k], axis=2)
        v = np.concatenate([np.asarray(past, F32)[1], v], axis=2)
    present = np.stack([k, v]).astype(F32)
    alpha = F32(1) / np.sqrt(F32(hs)) if scale == 0.0 else F32(scale)
    alpha = F32(alpha)
    acc = _fma_matmul(q, np.swapaxes(k, -1, -2))
    m = _mask(mask_index, batch, seq, p_len, bool(unidirectional) and seq > 1,
              mask_filter_value)
    scores = (acc * alpha).astype(F32) if m is None else fma(acc, alpha, m[:, None])
    probs = softmax(scores)
    # (batch, heads, seq, head); MLAS takes its single-row path when there is one query
    out = _row_matmul(probs, v) if seq == 1 else _fma_matmul(probs, v)
    return np.ascontiguousarray(out.transpose(0, 2, 1, 3).reshape(batch, seq, hidden)), present
