"""onnxruntime's CPU float routines (MLAS) that the integer family's operators use, in
float32 NumPy.

onnxruntime's LSTM and attention kernels do not call libm: sigmoid and tanh are MLAS's
rational polynomials (Eigen's coefficients) and exp a polynomial with range reduction,
evaluated in float32 with fused multiply-adds on x86-64; its softmax sums in vector lanes.
They are reproduced here step by step, so the float stages follow onnxruntime's
arithmetic bit for bit (measured against onnxruntime's own Sigmoid, Tanh and Softmax).
"""

from __future__ import annotations

import numpy as np

F32 = np.float32


def fma(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """float32 ``a*b + c`` with one rounding, as an FMA3 instruction.

    The product of two float32 is exact in float64; the sum is rounded to float64 "to odd"
    (an inexact result moved to its neighbour with an odd last bit, the error found by
    TwoSum), and a round-to-odd result with 29 bits to spare rounds to float32 exactly as
    the exact value would: no double rounding."""
    p = np.asarray(a, np.float64) * np.asarray(b, np.float64)
    q = np.asarray(c, np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        s = p + q
        bb = s - p
        err = (p - (s - bb)) + (q - bb)
        even = (s.view(np.int64) & 1) == 0 if s.ndim else (np.float64(s).view(np.int64) & 1) == 0
        fix = (err != 0) & even & np.isfinite(s)
        s = np.where(fix, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
    return np.asarray(s).astype(F32)


_LOGISTIC_P = [F32(v) for v in (4.37031012579801e-11, 1.15627324459942e-07,
                                6.08574864600143e-05, 8.51377133304701e-03,
                                2.48287947061529e-01)]
_LOGISTIC_Q = [F32(v) for v in (6.10247389755681e-13, 5.76102136993427e-09,
                                6.29106785017040e-06, 1.70198817374094e-03,
                                1.16817656904453e-01, 9.93151921023180e-01)]
_TANH_P = [F32(v) for v in (-2.76076847742355e-16, 2.00018790482477e-13,
                            -8.60467152213735e-11, 5.12229709037114e-08,
                            1.48572235717979e-05, 6.37261928875436e-04,
                            4.89352455891786e-03)]
_TANH_Q = [F32(v) for v in (1.19825839466702e-06, 1.18534705686654e-04,
                            2.26843463243900e-03, 4.89352518554385e-03)]


def _horner(x2: np.ndarray, coeffs: list[np.float32]) -> np.ndarray:
    acc = fma(x2, coeffs[0], coeffs[1])
    for c in coeffs[2:]:
        acc = fma(acc, x2, c)
    return acc


def logistic(x: np.ndarray) -> np.ndarray:
    """MLAS's logistic: clamp to [-18, 18], odd polynomial over even polynomial, + 0.5,
    clamped to [0, 1]."""
    v = np.clip(np.asarray(x, F32), F32(-18), F32(18)).astype(F32)
    v2 = (v * v).astype(F32)
    p = (_horner(v2, _LOGISTIC_P) * v).astype(F32)
    q = _horner(v2, _LOGISTIC_Q)
    return np.clip((p / q).astype(F32) + F32(0.5), F32(0), F32(1)).astype(F32)


def tanh(x: np.ndarray) -> np.ndarray:
    """MLAS's tanh: clamp to [-9, 9], odd polynomial over even polynomial."""
    v = np.clip(np.asarray(x, F32), F32(-9), F32(9)).astype(F32)
    v2 = (v * v).astype(F32)
    p = (_horner(v2, _TANH_P) * v).astype(F32)
    q = _horner(v2, _TANH_Q)
    return (p / q).astype(F32)


# exp as MLAS's softmax computes it (range reduction by powers of two, a degree-6
# polynomial, the scale rebuilt in the exponent bits)
_EXP_LOWER_SUMEXP = F32(-88.3762626647949)
_ROUNDING_BIAS = F32(12582912.0)  # 1.5 * 2**23: adding it rounds to an integer
_LOG2_RECIPROCAL = F32(1.44269504088896341)
_LOG2_HIGH = F32(-6.93145752e-1)
_LOG2_LOW = F32(-1.42860677e-6)
_EXP_POLY = [F32(float.fromhex(h)) for h in ("0x1.694000p-10", "0x1.125edcp-7",
                                             "0x1.555b5ap-5", "0x1.555450p-3",
                                             "0x1.fffff6p-2", "0x1.000000p+0")]


def sum_exp_terms(x: np.ndarray, negative_max: np.ndarray) -> np.ndarray:
    """``exp(x - max)`` element by element as MLAS's softmax kernel computes it."""
    v = (np.asarray(x, F32) + np.asarray(negative_max, F32)).astype(F32)
    v = np.maximum(_EXP_LOWER_SUMEXP, v).astype(F32)
    biased = fma(v, _LOG2_RECIPROCAL, _ROUNDING_BIAS)
    m = (biased - _ROUNDING_BIAS).astype(F32)
    v = fma(m, _LOG2_HIGH, v)
    v = fma(m, _LOG2_LOW, v)
    with np.errstate(over="ignore"):
        normal = ((biased.view(np.int32).astype(np.int64) << 23) + 0x3F800000)
    normal = (normal & 0xFFFFFFFF).astype(np.uint32).view(np.int32).view(F32)
    p = np.full(v.shape, _EXP_POLY[0], F32)
    for c in _EXP_POLY[1:]:
        p = fma(p, v, c)
    p = fma(p, v, _EXP_POLY[-1])
    return (p * normal).astype(F32)


def _pairwise(lanes: np.ndarray) -> np.ndarray:
    """A vector's lanes summed by adding neighbours: (0+1, 2+3, …), then again."""
    while lanes.shape[-1] > 1:
        lanes = (lanes[..., 0::2] + lanes[..., 1::2]).astype(F32)
    return lanes[..., 0]


def softmax(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis as MLAS computes it on x86-64 (its AVX2 kernel): the
    maximum, the exp terms, their sum over 8-lane vectors (the last one zero-padded) added
    alternately into two accumulators, the two added, the lanes reduced pairwise; then each
    term times ``1 / sum``. Measured bit for bit against onnxruntime's Softmax."""
    x = np.asarray(x, F32)
    d = x.shape[-1]
    neg = (-x.max(axis=-1, keepdims=True)).astype(F32)
    e = sum_exp_terms(x, neg)
    pad = (-d) % 8
    lanes = np.concatenate([e, np.zeros((*e.shape[:-1], pad), F32)], axis=-1)
    lanes = lanes.reshape((*e.shape[:-1], -1, 8))
    accs = [np.zeros((*e.shape[:-1], 8), F32) for _ in range(2)]
    for j in range(lanes.shape[-2]):
        accs[j % 2] = (accs[j % 2] + lanes[..., j, :]).astype(F32)
    total = _pairwise((accs[0] + accs[1]).astype(F32))[..., None]
    return (e * (F32(1) / total).astype(F32)).astype(F32)
