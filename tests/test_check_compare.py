"""Comparison statistics: abs OR rel, NaN handling, re-judging, JSON."""

from __future__ import annotations

import json
import math

import ml_dtypes
import numpy as np
import pytest

from dqtool.checking.compare import OutputComparison, bit_identical, compare


def test_identical_passes_at_zero_tolerance():
    a = np.array([1.0, -2.0, np.nan, np.inf], np.float32)
    c = compare("y", a, a.copy())
    assert c.passed and c.max_abs == 0 and c.mismatched == 0


def test_worst_index_values_and_min_tolerances():
    e = np.array([[1.0, 2.0], [4.0, 8.0]], np.float32)
    a = e.copy()
    a[1, 0] = 5.0
    c = compare("y", a, e)
    assert not c.passed and c.worst_index == (1, 0)
    assert (c.worst_actual, c.worst_expected) == (5.0, 4.0)
    assert c.min_atol == 1.0 and c.min_rtol == 0.25
    assert c.judge(atol=1.0).passed and c.judge(rtol=0.25).passed
    assert not c.judge(atol=0.99, rtol=0.24).passed


def test_nan_in_one_only_fails_whatever_the_tolerance():
    c = compare("y", np.array([np.nan, 1.0]), np.array([0.0, 1.0]))
    assert c.nan_mismatches == 1 and c.worst_index == (0,)
    assert not c.judge(rtol=1e9, atol=1e9).passed and math.isinf(c.min_atol)


def test_shape_and_dtype_differences_fail():
    assert compare("y", np.zeros(3), np.zeros(4)).failure
    assert not compare("y", np.zeros(3, np.float16), np.zeros(3, np.float32)).passed


def test_json_roundtrip_and_rejudge():
    c = compare("y", np.array([1.0, 3.0], np.float32), np.array([1.0, 2.0], np.float32))
    doc = json.loads(json.dumps(c.to_json()))
    back = OutputComparison.from_json(doc)
    assert back.max_abs == 1.0 and not back.passed
    assert back.judge(rtol=0.5).passed


def test_bit_identical_distinguishes_signed_zero_but_not_nan_payloads():
    assert not bit_identical(np.array([0.0], np.float32), np.array([-0.0], np.float32))
    nan2 = np.array([0x7FC00001], np.uint32).view(np.float32)
    assert bit_identical(np.array([np.nan], np.float32), nan2)


@pytest.mark.parametrize(("dtype", "nan_a", "nan_b"), [
    ("bfloat16", 0x7FC0, 0xFFC1),
    ("float8_e4m3fn", 0x7F, 0xFF),
    ("float8_e5m2", 0x7D, 0xFE),
    ("float8_e8m0fnu", 0xFF, 0xFF),
])
def test_bit_identical_any_nan_equals_any_nan_in_ml_dtypes_floats(dtype, nan_a, nan_b):
    dt = np.dtype(getattr(ml_dtypes, dtype))
    bits = np.dtype(f"u{dt.itemsize}")
    a = np.array([nan_a, 0], bits).view(dt)
    b = np.array([nan_b, 0], bits).view(dt)
    assert np.isnan(a[0].astype(np.float64)) and np.isnan(b[0].astype(np.float64))
    assert bit_identical(a, b)
    one = np.array([0, 0x40], bits).view(dt)
    assert not bit_identical(a, a.copy()[::-1]) and not bit_identical(b, one)


def test_bit_identical_integers_of_ml_dtypes_compare_bits():
    x = np.array([-8, 7, 0], ml_dtypes.int4)
    assert bit_identical(x, x.copy())
    assert not bit_identical(x, np.array([-8, 7, 1], ml_dtypes.int4))
