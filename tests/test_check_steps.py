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
