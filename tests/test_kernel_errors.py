"""Every invalid-argument rule raises KernelError naming the rule and the shapes."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from dqtool.errors import KernelError
from dqtool.kernel import dequantize, quantize

X = np.zeros((2, 6), np.int8)
F = np.float32


@pytest.mark.parametrize(
    ("args", "kwargs", "pattern"),
    [
        ((X.astype(np.float32), np.array(1, F)), {}, "x type"),
        ((X, np.array(1, np.float64)), {}, "scale type"),
        ((X, np.array(1, F), np.array(0, np.uint8)), {}, "zero point type"),
        ((X, np.array(1, F)), {"output_dtype": np.float64}, "output_dtype"),
        ((X, np.ones(3, F)), {"axis": 1}, r"per-axis.*length x.shape\[axis\]=6.*\(2, 6\)"),
        ((X, np.ones(6, F)), {"axis": 2}, r"axis must be in \[-r, r-1\]"),
        ((X, np.ones(2, F)), {"axis": -3}, "axis must be"),
        ((X, np.ones((2, 3), F)), {"axis": 1, "block_size": 4}, r"\(2, 2\).*ceil\(6/4\)"),
        ((X, np.ones((2, 3, 1), F)), {"axis": 1, "block_size": 2}, "x's rank"),
        ((X, np.ones((2, 3), F)), {"axis": 1}, "per-axis"),
        ((X, np.ones((2, 3), F)), {"axis": 1, "block_size": -1}, "block_size must be >= 0"),
        ((X, np.ones(6, F), np.zeros(3, np.int8)), {}, "zero point shape must equal"),
        ((X, np.array(1, F), np.zeros(2, np.int8)), {}, "per-tensor"),
        ((np.zeros((2, 6), ml_dtypes.float8_e4m3fn), np.array(1, F),
          np.array(1, ml_dtypes.float8_e4m3fn)), {}, "zero point must be zero"),
        ((np.zeros(4, ml_dtypes.float4_e2m1fn), np.array(1, F),
          np.array(0.5, ml_dtypes.float4_e2m1fn)), {}, "zero point must be zero"),
        ((np.zeros((), np.int8), np.ones(2, F)), {}, "scalar x"),
        ((X, np.ones(1, F)), {"block_size": 4}, "block_size=4 with a 1-element scale"),
    ],
)
def test_dequantize_rules(args, kwargs, pattern) -> None:
    with pytest.raises(KernelError, match=pattern):
        dequantize(*args, **kwargs)


def test_kernel_error_is_value_error() -> None:
    assert issubclass(KernelError, ValueError)


def test_per_tensor_ignores_axis() -> None:
    # opset-13 models: rank-1 x, default axis=1, scalar scale.
    y = dequantize(np.array([1, 2], np.uint8), np.array(0.5, F), np.array(1, np.uint8))
    assert y.tolist() == [0.0, 0.5]


def test_single_block_equals_per_tensor() -> None:
    x = np.arange(-3, 3, dtype=np.int8)
    assert np.array_equal(dequantize(x, np.ones(1, F), block_size=8, axis=0),
                          dequantize(x, np.ones(1, F)))


@pytest.mark.parametrize(
    ("args", "kwargs", "pattern"),
    [
        ((X, np.array(1, F)), {}, "x type"),
        ((X.astype(F), np.array(1, F), np.array(0, np.int8)), {"output_dtype": np.uint8},
         "must equal the zero point"),
        ((X.astype(F), np.array(1, F)), {"output_dtype": np.int32}, "quantized type"),
        ((X.astype(F), np.ones(3, F)), {}, "per-axis"),
    ],
)
def test_quantize_rules(args, kwargs, pattern) -> None:
    with pytest.raises(KernelError, match=pattern):
        quantize(*args, **kwargs)
