"""onnxruntime's CPU activation approximations (MLAS), in float32 NumPy.

onnxruntime's LSTM and attention kernels do not call libm: sigmoid and tanh are MLAS's
rational polynomials (Eigen's coefficients) evaluated in float32, on x86-64 with fused
multiply-adds. They are reproduced here step by step so the float stages of
DynamicQuantizeLSTM follow onnxruntime's arithmetic rather than a libm's. A fused
multiply-add ``a*b + c`` is computed in float64 and rounded once to float32: the product of
two float32 is exact in float64, so only the sum is rounded twice (float64, then float32),
which can differ from a true fused multiply-add in the last bit on rare ties; the
tolerance table (``tolerances.py``) states what the tests measure.
"""

from __future__ import annotations

import numpy as np

F32 = np.float32


def fma(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """float32 ``a*b + c`` with (nearly) one rounding, as an FMA3 instruction."""
    return (np.asarray(a, np.float64) * np.asarray(b, np.float64)
            + np.asarray(c, np.float64)).astype(F32)


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
