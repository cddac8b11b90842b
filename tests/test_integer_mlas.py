"""``mlas.fma``: a float32 fused multiply-add with one rounding, checked against exact
rational arithmetic, and on a case built so that rounding through float64 lands on a
float32 tie."""

from __future__ import annotations

from fractions import Fraction

import numpy as np

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
