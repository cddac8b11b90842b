"""onnxruntime's CPU float routines (MLAS) that the integer family's operators use, in
float32 NumPy.

onnxruntime's LSTM and attention kernels do not call libm: sigmoid and tanh are MLAS's
rational polynomials (Eigen's coefficients) and exp a polynomial with range reduction,
evaluated in float32 with fused multiply-adds on x86-64; its softmax sums in vector lanes.
They are reproduced here step by step, so the float stages follow onnxruntime's
arithmetic bit for bit (measured against onnxruntime's own Sigmoid, Tanh and Softmax).

The ``neon_*`` functions at the end are onnxruntime's ARM64 arithmetic where it differs
from its x86-64 one: emulations for the deviation entries keyed to the arm64 paths, used
only to explain a difference (the kernel never computes them).
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


# ---- ARM64 (NEON), measured under qemu-aarch64 -cpu neoverse-n1 ---------------------------
# onnxruntime's aarch64 build computes some of the integer family's float stages otherwise
# than its x86-64 build, which the kernel follows: its compiler fuses a multiply and the
# add after it (FMA), QLinearAdd runs in fixed point, and Softmax sums four lanes. These
# emulations reproduce it bit for bit (docs/semantics.md, "CPU code paths"); they explain
# the entries keyed to the arm64 paths (``dqtool.runtimes.code_paths``) and never decide a
# verdict.

def neon_scale_bias(acc: np.ndarray, scale: np.ndarray, bias: np.ndarray | None
                    ) -> np.ndarray:
    """An int32 accumulator to float as MLAS's NEON output stage does:
    ``fma(float32(acc), scale, bias)``, one rounding (x86-64: the product, then the sum)."""
    a = np.asarray(acc).astype(F32)
    s = np.broadcast_to(np.asarray(scale, F32), a.shape)
    if bias is None:
        return (a * s).astype(F32)
    return fma(a, s, np.broadcast_to(np.asarray(bias, F32), a.shape))


def _saturate(v: np.ndarray, dtype: np.dtype) -> np.ndarray:
    info = np.iinfo(dtype)
    return np.clip(v, info.min, info.max).astype(dtype)


def _add_parameters(ra: np.float32, rb: np.float32) -> tuple[int, int, int] | None:
    """MlasCalcQLinearAddParameters: (shift, multiplier of a, of b) for scale ratios in
    [2**-14, 256) whose multipliers fit 22 bits, else None (its float loop then)."""
    if not (F32(2.0**-14) <= min(ra, rb) and max(ra, rb) < F32(256)):
        return None
    shift = 21 - (int(np.asarray(max(ra, rb), F32).view(np.int32) >> 23) - 127)
    if not 13 <= shift <= 31:
        return None
    power = F32(2.0**shift)  # a power of two: the products below are exact
    ma, mb = (int(np.rint(F32(r * power))) for r in (ra, rb))  # lrintf, half to even
    if ma < 1 << 22 and mb < 1 << 22 and (ma >= 1 << 21 or mb >= 1 << 21):
        return shift, ma, mb
    return None


def neon_qlinear_add(a: np.ndarray, a_scale: float, a_zp: int, b: np.ndarray,
                     b_scale: float, b_zp: int, c_scale: float, c_zp: int) -> np.ndarray:
    """com.microsoft QLinearAdd as MLAS's NEON kernel computes it: in fixed point,
    ``(a - a_zp)·M_a + (b - b_zp)·M_b`` with 22-bit multipliers of ``a_scale/c_scale`` and
    ``b_scale/c_scale``, shifted right rounding half away from zero, plus ``c_zp``,
    saturated. Ratios out of its range take its float loop: ``a_scale·(a - a_zp) +
    b_scale·(b - b_zp)``, divided by ``c_scale``, clamped, plus ``c_zp``, rounded half to
    even."""
    a, b = np.asarray(a), np.asarray(b)
    ra, rb = F32(F32(a_scale) / F32(c_scale)), F32(F32(b_scale) / F32(c_scale))
    da = a.astype(np.int64) - int(a_zp)
    db = b.astype(np.int64) - int(b_zp)
    params = _add_parameters(ra, rb)
    if params is None:
        info = np.iinfo(a.dtype)
        v = ((F32(a_scale) * da.astype(F32)).astype(F32)
             + (F32(b_scale) * db.astype(F32)).astype(F32)).astype(F32)
        v = np.clip((v / F32(c_scale)).astype(F32), F32(info.min - int(c_zp)),
                    F32(info.max - int(c_zp)))
        return _saturate(np.rint((v + F32(c_zp)).astype(F32)), a.dtype)
    shift, ma, mb = params
    acc = da * ma + db * mb  # within int32: |a - a_zp| < 2**9, multipliers < 2**22
    acc = acc + (acc >> 31)  # one less where negative, so ties round away from zero
    return _saturate(((acc + (1 << (shift - 1))) >> shift) + int(c_zp), a.dtype)


def neon_qlinear_mul(a: np.ndarray, a_scale: float, a_zp: int, b: np.ndarray,
                     b_scale: float, b_zp: int, c_scale: float, c_zp: int) -> np.ndarray:
    """com.microsoft QLinearMul as MLAS's NEON kernel computes it: ``fma(float32((a -
    a_zp)(b - b_zp)), a_scale·b_scale/c_scale, c_zp)``, one rounding, then rounded half to
    even and saturated (x86-64 rounds the product before adding ``c_zp``)."""
    a, b = np.asarray(a), np.asarray(b)
    ratio = F32(F32(F32(a_scale) * F32(b_scale)) / F32(c_scale))
    prod = ((a.astype(np.int64) - int(a_zp)) * (b.astype(np.int64) - int(b_zp))).astype(F32)
    v = fma(prod, np.broadcast_to(ratio, prod.shape), np.broadcast_to(F32(c_zp), prod.shape))
    return _saturate(np.rint(v).astype(np.int64), a.dtype)


def neon_softmax(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis as MLAS's generic kernel computes it on ARM64: the same
    exp terms as ``softmax``, summed as 4-lane vectors into one accumulator in order, its
    lanes reduced as (0+1)+(2+3), the last (fewer than four) terms then added one by one;
    each term times ``1 / sum``."""
    x = np.asarray(x, F32)
    d = x.shape[-1]
    e = sum_exp_terms(x, (-x.max(axis=-1, keepdims=True)).astype(F32))
    whole = d // 4 * 4
    total = np.zeros(e.shape[:-1], F32)
    if whole:
        acc = np.zeros((*e.shape[:-1], 4), F32)
        for j in range(0, whole, 4):
            acc = (acc + e[..., j:j + 4]).astype(F32)
        total = ((acc[..., 0] + acc[..., 1]).astype(F32)
                 + (acc[..., 2] + acc[..., 3]).astype(F32)).astype(F32)
    for j in range(whole, d):
        total = (total + e[..., j]).astype(F32)
    return (e * (F32(1) / total[..., None]).astype(F32)).astype(F32)
