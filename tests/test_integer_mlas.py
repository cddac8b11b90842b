"""``mlas.fma``: a float32 fused multiply-add with one rounding, checked against exact
rational arithmetic, and on a case built so that rounding through float64 lands on a
float32 tie; and the arm64 emulations built on it (``mlas.neon_*``) against exact
arithmetic and hand-computed values, on every machine."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from dqtool.families.integer import kernel as K
from dqtool.families.integer import mlas
from dqtool.families.integer.mlas import fma


def _exact_f32(x: Fraction) -> np.float32:
    """The float32 nearest ``x`` (ties to even), by comparing neighbours exactly."""
    guess = np.float32(float(x))
    cands = [np.nextafter(guess, np.float32(-np.inf)), guess,
             np.nextafter(guess, np.float32(np.inf))]
    return min(cands, key=lambda v: (abs(Fraction(float(v)) - x),
                                     int(np.float32(v).view(np.int32)) & 1))


def test_fma_breaks_a_float64_tie_the_exact_way():
    # a*b + c = 1 + 2**-24 + 2**-60 exactly. Rounded to float64 first it becomes the
    # float32 tie 1 + 2**-24, which goes to even (1.0); the exact value is above the tie,
    # so one rounding gives 1 + 2**-23.
    a = np.float32(-(2.0**-24) * (1 + 2.0**-18))
    b = np.float32(1 - 2.0**-18)
    c = np.float32(1 + 2.0**-23)
    naive = np.float32(np.float64(a) * np.float64(b) + np.float64(c))
    assert naive == np.float32(1.0)
    assert fma(a, b, c) == np.nextafter(np.float32(1), np.float32(2))
    assert fma(-a, b, -c) == -np.nextafter(np.float32(1), np.float32(2))


def test_fma_matches_exact_arithmetic_on_random_values():
    r = np.random.default_rng(1)
    a, b, c = (r.standard_normal(2000).astype(np.float32) for _ in range(3))
    got = fma(a, b, c)
    want = [_exact_f32(Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z)))
            for x, y, z in zip(a, b, c, strict=True)]
    np.testing.assert_array_equal(got.view(np.int32), np.float32(want).view(np.int32))


# ---- the arm64 emulations (entries keyed to the arm64 paths; measured there) ----------

def test_neon_scale_bias_rounds_once():
    r = np.random.default_rng(2)
    acc = r.integers(-2**20, 2**20, 500).astype(np.int32)
    scale = r.uniform(1e-5, 1e-3, 500).astype(np.float32)
    bias = r.standard_normal(500).astype(np.float32)
    got = mlas.neon_scale_bias(acc, scale, bias)
    want = [_exact_f32(Fraction(int(a)) * Fraction(float(s)) + Fraction(float(b)))
            for a, s, b in zip(acc, scale, bias, strict=True)]
    np.testing.assert_array_equal(got.view(np.int32), np.float32(want).view(np.int32))
    twice = ((acc.astype(np.float32) * scale).astype(np.float32) + bias).astype(np.float32)
    assert (got != twice).any()  # the x86-64 order differs somewhere in 500 values


def test_neon_qlinear_add_rounds_ties_away_from_zero():
    # scale ratios 0.5 and 0.5: shift 22, multipliers 2**21; (a - a_zp) = ±1 gives ±0.5
    a = np.array([11, 9], np.uint8)
    b = np.array([10, 10], np.uint8)
    args = (a, np.float32(1), 10, b, np.float32(1), 10, np.float32(2), 100)
    assert mlas.neon_qlinear_add(*args).tolist() == [101, 99]
    # the kernel (onnxruntime on x86-64) rounds 100.5 and 99.5 half to even
    assert K.qlinear_binary("Add", a, np.float32(1), np.array(np.uint8(10)), b,
                            np.float32(1), np.array(np.uint8(10)), np.float32(2),
                            np.array(np.uint8(100))).tolist() == [100, 100]


def test_neon_qlinear_add_takes_the_float_loop_outside_its_ratios():
    # a_scale / c_scale = 1024 ≥ 256: MLAS's float loop, half to even and saturated
    a = np.array([0, 1, 2], np.int8)
    b = np.zeros(3, np.int8)
    got = mlas.neon_qlinear_add(a, np.float32(1), 0, b, np.float32(2.0**-12), 0,
                                np.float32(2.0**-10), 0)
    assert got.tolist() == [0, 127, 127]
    got = mlas.neon_qlinear_add(a, np.float32(2.0**-11), 0, b, np.float32(1), 0,
                                np.float32(2.0**-10), 0)  # 0.5 · a: ties to even
    assert got.tolist() == [0, 0, 1]


def test_neon_qlinear_mul_rounds_the_multiply_add_once():
    r = np.random.default_rng(4)
    a = r.integers(0, 256, 4000).astype(np.uint8)
    b = r.integers(0, 256, 4000).astype(np.uint8)
    sa, sb, sc = np.float32(0.05), np.float32(0.03), np.float32(0.7)
    got = mlas.neon_qlinear_mul(a, sa, 128, b, sb, 120, sc, 31)
    ratio = np.float32(np.float32(sa * sb) / sc)
    exact = [_exact_f32(Fraction((int(x) - 128) * (int(y) - 120)) * Fraction(float(ratio))
                        + 31) for x, y in zip(a, b, strict=True)]
    want = np.clip(np.rint(np.float32(exact)), 0, 255).astype(np.uint8)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("d", [3, 6, 9])
def test_neon_softmax_sums_four_lanes_then_the_rest(d):
    x = np.random.default_rng(d).standard_normal((3, d)).astype(np.float32)
    e = mlas.sum_exp_terms(x, (-x.max(axis=-1, keepdims=True)).astype(np.float32))
    f32 = np.float32
    for row, want_row in zip(e, mlas.neon_softmax(x), strict=True):
        lanes = [f32(0)] * 4
        for j in range(d // 4 * 4):
            lanes[j % 4] = f32(lanes[j % 4] + row[j])
        total = f32(f32(lanes[0] + lanes[1]) + f32(lanes[2] + lanes[3]))
        for j in range(d // 4 * 4, d):
            total = f32(total + row[j])
        np.testing.assert_array_equal(want_row, (row * f32(f32(1) / total)).astype(f32))
