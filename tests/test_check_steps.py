"""``check --against`` measures differences in quantization steps."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from dqtool.checking.against import output_steps
from dqtool.checking.compare import compare


def test_integer_output_counts_elements_one_and_more_steps_apart():
    want = np.array([10, 20, 30, 40, 250], np.uint8)
    got = np.array([10, 21, 29, 43, 250], np.uint8)
    o = compare("y", got, want, step=1.0)
    assert (o.max_steps, o.off_by_one, o.off_by_more, o.mismatched) == (3, 2, 1, 3)
    assert o.to_json()["off_by_more"] == 1


def test_float_output_in_steps_of_its_scale():
    step = np.float32(0.05)
    want = (np.arange(6, dtype=np.float32) * step).astype(np.float32)
    got = want.copy()
    got[2] = np.float32(3) * step
    o = compare("y", got, want, step=float(step))
    assert (o.max_steps, o.off_by_one, o.off_by_more) == (1, 1, 0)
    assert compare("y", got, want).max_steps is None  # no step: float terms only


def test_output_steps_from_integer_types_and_dequantize_scales():
    m = ir.to_proto(ir.from_onnx_text("""<ir_version: 8, opset_import: ["" : 13]>
    g (uint8[4] q) => (uint8[4] a, float[4] b, float[4] c) <float s = {0.25}, uint8 z = {3}>
    {
        a = Identity (q)
        b = DequantizeLinear (q, s, z)
        c = Cast <to = 1> (q)
    }
    """))
    assert output_steps(m) == {"a": 1.0, "b": 0.25}


def test_a_fractional_distance_is_reported_as_it_is():
    # A float output 1.47 steps away is more than one step: rounded to the nearest step it
    # read as 1 and passed. One 0.73 steps away is within one.
    step = 21.152
    want = np.array([100.0, 200.0, 300.0, 400.0], np.float32)
    got = (want + np.array([31.085, 15.44, 0.0, 0.0])).astype(np.float32)
    o = compare("y", got, want, step=step)
    assert (o.max_steps, o.off_by_one, o.off_by_more) == (1.47, 1, 1)
    assert o.to_json()["max_steps"] == 1.47


def test_float_rounding_of_large_values_adds_no_step():
    # 1000.0 and 1000.01 in float32 are 1 step of 0.01 apart give or take their own
    # rounding (a unit in the last place is 6.1e-5 there): one step, not a hair more.
    step = np.float32(0.01)
    want = np.array([np.float32(1000) + np.float32(k) * step for k in range(4)], np.float32)
    got = np.array([np.float32(1000) + np.float32(k + 1) * step for k in range(4)],
                   np.float32)
    assert (np.abs(got.astype(np.float64) - want) > float(step)).any()  # rounding shows
    o = compare("y", got, want, step=float(step))
    assert 1 <= o.max_steps < 1.01 and (o.off_by_one, o.off_by_more) == (4, 0)


def test_bfloat16_output_steps_allow_its_coarser_rounding():
    import ml_dtypes

    bf = ml_dtypes.bfloat16
    want = np.array([16, 16], dtype=bf)
    got = np.array([16.5, 17], dtype=bf)  # one step of 0.5, then two (its unit: 0.125)
    o = compare("y", got, want, step=0.5)
    assert o.max_steps <= 2 and o.max_steps > 1.5
    assert (o.off_by_one, o.off_by_more) == (1, 1)


def test_a_nan_against_a_number_is_infinitely_many_steps():
    o = compare("y", np.array([np.nan, 1.0], np.float32), np.array([0.0, 1.0], np.float32),
                step=0.5)
    assert o.max_steps == np.iinfo(np.int64).max and o.off_by_more == 1
