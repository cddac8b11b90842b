"""com.microsoft QEmbedLayerNormalization as onnxruntime's CPU kernel computes it.

For each token: the word row ``input_ids[b, s]``, the position row ``s`` and (with
segment_ids) the segment row, each dequantized per tensor (``float32(q - zp) · scale``)
and added in that order; then layer normalisation in float32 exactly as the kernel orders
it: the sum accumulated left to right, ``mean = sum / hidden``, ``a = x - mean``,
``var = (Σ a·a) / hidden`` left to right, ``e = sqrt(var + epsilon)``,
``y = a / e · gamma + beta`` (gamma and beta dequantized the same way). No transcendental
function is involved, so the result is bit-identical to onnxruntime's. ``mask_index`` is,
per batch row, the number of mask entries equal to 1 (zeros without a mask).
"""

from __future__ import annotations

import numpy as np

F32 = np.float32


def _dq(q: np.ndarray, scale: np.ndarray, zp: np.ndarray | None) -> np.ndarray:
    z = 0 if zp is None else int(np.asarray(zp).reshape(-1)[0])
    return ((np.asarray(q).astype(np.int32) - z).astype(F32)
            * F32(np.asarray(scale, F32).reshape(-1)[0])).astype(F32)


def _row_sum(x: np.ndarray) -> np.ndarray:
    """Σ over the last axis, left to right in float32 (NumPy's own sum is pairwise)."""
    total = np.zeros(x.shape[:-1], F32)
    for i in range(x.shape[-1]):
        total = (total + x[..., i]).astype(F32)
    return total


def qembed_layer_norm(input_ids, segment_ids, word, position, segment, gamma, beta, mask,
                      word_scale, position_scale, segment_scale, gamma_scale, beta_scale,
                      word_zp=None, position_zp=None, segment_zp=None, gamma_zp=None,
                      beta_zp=None, *, epsilon: float = 1e-12
                      ) -> tuple[np.ndarray, np.ndarray]:
    ids = np.asarray(input_ids).astype(np.int64)
    batch, seq = ids.shape
    hidden = np.asarray(word).shape[1]
    if ids.min(initial=0) < 0 or ids.max(initial=0) >= np.asarray(word).shape[0]:
        raise ValueError("QEmbedLayerNormalization: input_ids out of range")
    if seq > np.asarray(position).shape[0]:
        raise ValueError("QEmbedLayerNormalization: sequence longer than position_embedding")
    x = (_dq(word, word_scale, word_zp)[ids]
         + _dq(position, position_scale, position_zp)[np.arange(seq)][None]).astype(F32)
    if segment_ids is not None:
        seg = np.asarray(segment_ids).astype(np.int64)
        if seg.min(initial=0) < 0 or seg.max(initial=0) >= np.asarray(segment).shape[0]:
            raise ValueError("QEmbedLayerNormalization: segment_ids out of range")
        x = (x + _dq(segment, segment_scale, segment_zp)[seg]).astype(F32)
    n = F32(hidden)
    mean = (_row_sum(x) / n).astype(F32)
    a = (x - mean[..., None]).astype(F32)
    var = (_row_sum((a * a).astype(F32)) / n).astype(F32)
    e = np.sqrt((var + F32(epsilon)).astype(F32)).astype(F32)
    g = _dq(gamma, gamma_scale, gamma_zp)
    b = _dq(beta, beta_scale, beta_zp)
    y = (((a / e[..., None]).astype(F32) * g).astype(F32) + b).astype(F32)
    if mask is None:
        index = np.zeros(batch, np.int32)
    else:
        index = (np.asarray(mask) == 1).sum(axis=1).astype(np.int32)
    return y, index
