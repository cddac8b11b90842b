"""QLinearAveragePool / QLinearGlobalAveragePool: the kernel against onnxruntime, bit for
bit, where the float order and onnxruntime's own window rules decide the code."""

from __future__ import annotations

import itertools

import numpy as np
import onnx_ir as ir
import pytest
from helpers.integer import one_node, run_ort
from onnx import TensorProto as TP

from dqtool.families.integer import pool
from dqtool.integer import api

MS = "com.microsoft"
# (x_scale, x_zp, y_scale, y_zp): round ratios put many means on a tie (x.5)
SCALES = [(0.05, -66, 0.2, -19), (0.043481674, 43, 0.039894015, 43), (0.1, 3, 0.3, -7),
          (0.25, 0, 0.5, 1)]
WINDOWS = [  # (spatial shape, attributes)
    ((7,), {"kernel_shape": [3]}),
    ((5, 4), {"kernel_shape": [2, 1], "strides": [2, 2], "ceil_mode": 1,
              "count_include_pad": 1}),
    ((5, 4), {"kernel_shape": [2, 1], "strides": [2, 2], "ceil_mode": 1}),
    ((6, 7), {"kernel_shape": [3, 3], "pads": [1, 0, 1, 2], "strides": [2, 2],
              "count_include_pad": 1}),
    ((6, 7), {"kernel_shape": [3, 3], "pads": [1, 0, 1, 2], "strides": [2, 2]}),
    ((6, 6), {"kernel_shape": [2, 2], "auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ((4, 5, 3), {"kernel_shape": [2, 2, 2], "ceil_mode": 1, "strides": [2, 2, 2],
                 "count_include_pad": 1}),
    ((4, 4), {"kernel_shape": [4, 4]}),  # the whole image: onnxruntime's global pool
    # a kernel shorter than the stride: onnxruntime keeps SAME's negative padding
    ((6, 7), {"kernel_shape": [1, 1], "auto_pad": "SAME_UPPER", "strides": [3, 4]}),
    ((10,), {"kernel_shape": [1], "auto_pad": "SAME_LOWER", "strides": [6]}),
    # VALID is pads of 0: ceil_mode still runs the last window past the input
    ((5, 9), {"kernel_shape": [2, 2], "strides": [2, 2], "auto_pad": "VALID", "ceil_mode": 1,
              "count_include_pad": 1}),
]


def _case(dtype, scales):
    xs, xz, ys, yz = scales
    shift = 128 if dtype == np.uint8 else 0
    return (np.array(xs, np.float32), np.array(xz + shift, dtype), np.array(ys, np.float32),
            np.array(yz + shift, dtype))


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("last", [0, 1])
def test_average_pool_matches_onnxruntime(dtype, last):
    info = np.iinfo(dtype)
    rng = np.random.default_rng(3)
    for (spatial, attrs), scales in itertools.product(WINDOWS, SCALES):
        shape = (2, 3, *spatial)
        x = rng.integers(info.min, info.max + 1, shape).astype(dtype)
        if last:
            x = np.ascontiguousarray(np.moveaxis(x, 1, -1))
        xs, xz, ys, yz = _case(dtype, scales)
        model = one_node("QLinearAveragePool", [("in_x", x), ("xs", xs), ("xz", xz),
                                                ("ys", ys), ("yz", yz)],
                         TP.INT8 if info.min else TP.UINT8, domain=MS, channels_last=last,
                         **attrs)
        want = run_ort(model, {"in_x": x})[0]
        nchw = np.moveaxis(x, -1, 1) if last else x
        got = pool.average_pool(nchw, xs, xz, ys, yz, attrs)
        if last:
            got = np.moveaxis(got, 1, -1)
        assert got.shape == want.shape and np.array_equal(got, want), (spatial, attrs, scales)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_global_average_pool_matches_onnxruntime(dtype):
    info = np.iinfo(dtype)
    rng = np.random.default_rng(4)
    for spatial, scales in itertools.product([(7, 5), (3,), (2, 3, 4)], SCALES):
        x = rng.integers(info.min, info.max + 1, (2, 9, *spatial)).astype(dtype)
        xs, xz, ys, yz = _case(dtype, scales)
        model = one_node("QLinearGlobalAveragePool", [("in_x", x), ("xs", xs), ("xz", xz),
                                                      ("ys", ys), ("yz", yz)],
                         TP.INT8 if info.min else TP.UINT8, domain=MS, channels_last=0)
        want = run_ort(model, {"in_x": x})[0]
        assert np.array_equal(pool.global_average_pool(x, xs, xz, ys, yz), want), spatial


OVERHANG = """<ir_version: 8, opset_import: ["" : 13, "com.microsoft" : 1]>
g (uint8[1,1,5,4] x) => (uint8[1,1,3,2] y) <float xs = {0.043481674}, uint8 xz = {171},
                                             float ys = {0.039894015}, uint8 yz = {171}>
{
    y = com.microsoft.QLinearAveragePool <kernel_shape = [2, 1], strides = [2, 2],
        count_include_pad = 1, ceil_mode = 1> (x, xs, xz, ys, yz)
}
"""


def test_qdq_form_of_an_overhanging_window_grows_the_end_pad():
    # ceil_mode with count_include_pad: onnxruntime divides the last windows (past the
    # input) by the whole kernel; AveragePool with the end pads grown does the same.
    text = OVERHANG
    m = api.to_qdq(ir.from_onnx_text(text)).model
    (avg,) = [n for n in m.graph if n.op_type == "AveragePool"]
    assert "ceil_mode" not in avg.attributes
    assert list(avg.attributes["pads"].value) == [0, 0, 1, 0]
    original, converted = ir.to_proto(ir.from_onnx_text(text)), ir.to_proto(m)
    x = np.random.default_rng(0).integers(0, 256, (1, 1, 5, 4)).astype(np.uint8)
    want, got = run_ort(original, {"x": x})[0], run_ort(converted, {"x": x})[0]
    assert want.shape == got.shape == (1, 1, 3, 2)
    assert np.abs(got.astype(int) - want.astype(int)).max() <= 1


@pytest.mark.parametrize(("shape", "attrs", "grown"), [
    ("1,1,5,9", 'auto_pad = "VALID", ', [0, 0, 1, 1]),  # VALID: pads of 0, grown alike
    ("1,1,H,4", "", None),  # stride 1 along the unknown axis: no window can overhang
])
def test_qdq_grows_the_end_pads_where_a_window_can_overhang(shape, attrs, grown):
    strides = "[2, 2]" if grown else "[1, 2]"
    text = OVERHANG.replace("uint8[1,1,5,4] x", f"uint8[{shape}] x").replace(
        "uint8[1,1,3,2] y", "uint8[1,1,?,?] y").replace(
        "<kernel_shape = [2, 1], strides = [2, 2],",
        f"<{attrs}kernel_shape = [2, 2], strides = {strides},")
    m = api.to_qdq(ir.from_onnx_text(text)).model
    (avg,) = [n for n in m.graph if n.op_type == "AveragePool"]
    assert "ceil_mode" not in avg.attributes and "auto_pad" not in avg.attributes
    assert list(avg.attributes["pads"].value) == (grown or [0, 0, 0, 0])
    if grown:
        original, converted = ir.to_proto(ir.from_onnx_text(text)), ir.to_proto(m)
        x = np.random.default_rng(2).integers(0, 256, (1, 1, 5, 9)).astype(np.uint8)
        want, got = run_ort(original, {"x": x})[0], run_ort(converted, {"x": x})[0]
        assert want.shape == got.shape == (1, 1, 3, 5)
        assert np.abs(got.astype(int) - want.astype(int)).max() <= 1


def test_check_runs_the_pools_as_onnxruntime_does(tmp_path):
    # The reference evaluator runs them with this kernel: check of a valid model passes
    # (it failed, 82 steps off, where ceil_mode ran a window past the input).
    import dqtool

    path = tmp_path / "pool.onnx"
    ir.save(ir.from_onnx_text(OVERHANG), path)
    x = np.random.default_rng(1).integers(0, 256, (1, 1, 5, 4)).astype(np.uint8)
    report = dqtool.check(path, inputs={"x": x})
    assert report.passed, report
