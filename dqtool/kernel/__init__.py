"""dqtool's NumPy kernel: DequantizeLinear/QuantizeLinear of every dialect, exact and fast.

* ``dequantize`` / ``quantize``: ai.onnx DequantizeLinear/QuantizeLinear (every version),
  bit-identical to onnxruntime where it has a kernel;
* ``dequantize_ms`` / ``quantize_ms``: com.microsoft (no block_size, missing axis = 1);
* ``dequantize_opmx``, ``unpack_opmx_int4``, ``pack_opmx_int4``: OpenPPL opmx/pmx;
* ``evaluator``: the ReferenceEvaluator operators running these kernels (the evaluator
  itself, ``dqtool.reference_evaluator``, is built from every family's operators in
  ``dqtool.reference_evaluator``).
"""

from __future__ import annotations

import numpy as np

from .dequantize import dequantize
from .float8 import to_float8
from .opmx import dequantize_opmx, pack_opmx_int4, unpack_opmx_int4
from .quantize import quantize


def dequantize_ms(
    x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None = None, *, axis: int = 1
) -> np.ndarray:
    """com.microsoft DequantizeLinear: scalar or 1-D scale; a missing axis means 1."""
    return dequantize(x, scale, zero_point, axis=axis, block_size=0)


def quantize_ms(
    x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None = None, *, axis: int = 1
) -> np.ndarray:
    """com.microsoft QuantizeLinear: scalar or 1-D scale; a missing axis means 1."""
    return quantize(x, scale, zero_point, axis=axis, block_size=0)


__all__ = [
    "dequantize",
    "dequantize_ms",
    "dequantize_opmx",
    "pack_opmx_int4",
    "quantize",
    "quantize_ms",
    "to_float8",
    "unpack_opmx_int4",
]
