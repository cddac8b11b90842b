"""com.microsoft QAttention as onnxruntime's CPU kernel computes it.

1. ``QKV = float32(acc) · (weight_scale · input_scale) + bias``: ``acc`` the exact int32
   product of ``input - input_zp`` (uint8) with ``weight - weight_zp`` (per tensor or per
   column), one multiply and one add in float32. This stage is exact; ``present`` (past K/V
   followed by this step's K/V) is made of its values only, so it is bit-identical.
2. ``scores = scale · (Q·Kᵀ) + mask`` per batch and head, with ``scale = 1/sqrt(head_size)``
   unless given; the products accumulated in order with fused multiply-adds (as MLAS's SGEMM
   kernel does), the mask added by one more fused multiply-add (see 4 for its other
   kernels). The mask is ``mask_filter_value``
   (default -10000) where a position may not be attended: past its end (1-D mask_index of
   end positions), before its start (the second half of a ``2·batch`` mask_index), a 0 in a
   2-D ``(batch, total)`` or 3-D ``(batch, seq, total)`` mask; with ``unidirectional``
   (and more than one query) every key after the query's own position is set to float32's
   lowest value instead (measured: a query whose other keys are all padded still attends
   them, not the future).
3. Softmax over the keys as MLAS computes it (``mlas.softmax``: its exp polynomial, its
   lane order of summation), bit-identical to onnxruntime's.
4. ``probs · V`` accumulated in order with fused multiply-adds, heads laid back side by
   side. MLAS's SGEMM takes other kernels for a single row or column with alpha 1 (one
   query; head_size 1; ``scale`` 1), each with its own order of summation, reproduced in
   ``_row_matmul`` and ``_dot_rows``. Every case measured is bit-identical.
"""

from __future__ import annotations

import numpy as np

from dqtool.families.integer import kernel
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


def _add(*xs: np.ndarray) -> np.ndarray:
    out = xs[0]
    for x in xs[1:]:
        out = (out + x).astype(F32)
    return out


def _dot_rows(v: np.ndarray, rows: np.ndarray, c: np.ndarray | None) -> np.ndarray:
    """``rows @ v`` (…, R, K) · (…, K) → (…, R) plus ``c`` (or +0), as MLAS's AVX kernel
    for one transposed row computes it: 8 lanes, lane j summing the products k ≡ j mod 8 in
    order (multiply, then add; the last block zero-padded), then the lanes reduced in the
    order its shuffles give, which depends on whether the row is in a group of 4, 2 or 1
    (rows are taken four at a time, then two, then one)."""
    k = v.shape[-1]
    pad = (-k) % 8
    vp = np.concatenate([v, np.zeros((*v.shape[:-1], pad), F32)], axis=-1)
    rp = np.concatenate([rows, np.zeros((*rows.shape[:-1], pad), F32)], axis=-1)
    acc = np.zeros((*rows.shape[:-1], 8), F32)
    for j in range(0, k + pad, 8):
        acc = (acc + (rp[..., j:j + 8] * vp[..., None, j:j + 8]).astype(F32)).astype(F32)
    a = [acc[..., i] for i in range(8)]
    by4 = _add(_add(a[0], a[1], a[2], a[3]), _add(a[4], a[5], a[6], a[7]))
    by2 = _add(_add(_add(a[0], a[2]), _add(a[4], a[6])), _add(_add(a[1], a[3]),
                                                               _add(a[5], a[7])))
    by1 = _add(_add(_add(a[0], a[1]), _add(a[2], a[3])), _add(_add(a[4], a[5]),
                                                               _add(a[6], a[7])))
    r = rows.shape[-2]
    four = r // 4 * 4
    idx = np.arange(r)
    out = np.where(idx < four, by4, np.where((idx < four + 2) & (r - four >= 2), by2, by1))
    return (out.astype(F32) + (F32(0) if c is None else c)).astype(F32)


def qkv(x, w, bias, x_scale, w_scale, x_zp=None, w_zp=None) -> np.ndarray:
    """Stage 1: ``float32(acc) · (w_scale · x_scale) + bias``, shape (batch, seq, 3·hidden)."""
    xz = np.asarray(0 if x_zp is None else int(np.asarray(x_zp).reshape(-1)[0]))
    wz = np.zeros((), np.int64) if w_zp is None else np.asarray(w_zp).astype(np.int64)
    if wz.size == 1:
        wz = wz.reshape(())
    acc32 = kernel.integer_matmul(x, xz, w, wz).astype(np.int32)
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
    m = _mask(mask_index, batch, seq, p_len, bool(unidirectional) and seq > 1,
              mask_filter_value)
    mb = None if m is None else np.broadcast_to(m[:, None], (batch, num_heads, seq,
                                                             p_len + seq))
    # MLAS's SGEMM: with alpha 1, one query (M = 1) or a one-wide result of a one-wide
    # K (N = 1) take its single-row kernels; otherwise fused multiply-adds in order.
    if alpha == 1 and seq == 1:
        scores = _dot_rows(q[..., 0, :], k, None if mb is None else mb[..., 0, :])[
            ..., None, :]
    elif alpha == 1 and p_len + seq == 1 and hs == 1:
        scores = _dot_rows(k[..., 0, :], q, None if mb is None else mb[..., 0])[..., None]
    else:
        acc = _fma_matmul(q, np.swapaxes(k, -1, -2))
        scores = (acc * alpha).astype(F32) if mb is None else fma(acc, alpha, mb)
    probs = softmax(scores)
    if seq == 1:
        out = _row_matmul(probs, v)
    elif hs == 1:
        out = _dot_rows(v[..., 0], probs, None)[..., None]
    else:
        out = _fma_matmul(probs, v)  # (batch, heads, seq, head)
    return np.ascontiguousarray(out.transpose(0, 2, 1, 3).reshape(batch, seq, hidden)), present
