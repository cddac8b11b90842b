"""ReferenceEvaluator operators that run (De)QuantizeLinear with dqtool's kernel.

onnx's evaluator has no implementation of DequantizeLinear-10/13 and does not check shapes.
The families (``dqtool.families``) name these classes, per domain, as their evaluator ops;
``dqtool.reference_evaluator`` builds the evaluator from every family's ops.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from onnx.reference.op_run import OpRun

from ..errors import KernelError
from .dequantize import dequantize
from .opmx import dequantize_opmx
from .quantize import quantize


def dtype_of_code(code: int | None) -> np.dtype | None:
    """The NumPy dtype of an ``output_dtype`` attribute (absent or 0: the default)."""
    if not code:
        return None
    # Imported here, not at the top: dqtool.types loads onnx_ir (and sympy), ~0.35 s that a
    # model without output_dtype attributes never needs.
    from ..types import from_onnx_int

    t = from_onnx_int(int(code))
    if t is None:  # string, uint64, complex or no type at all: no (De)QuantizeLinear takes it
        raise KernelError(f"output_dtype={code} is not an element type dqtool knows")
    return t.dtype


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class Dq(OpRun):
    op_schema = None  # only the node's own attributes reach _run; defaults are ours

    def _run(self, x, x_scale, x_zero_point=None, axis=1, block_size=0, output_dtype=0,
             **_ignored):
        return (
            dequantize(x, x_scale, x_zero_point, axis=axis, block_size=block_size,
                       output_dtype=dtype_of_code(output_dtype)),
        )


class Q(OpRun):
    op_schema = None

    def _run(self, x, y_scale, y_zero_point=None, axis=1, block_size=0, output_dtype=0,
             saturate=1, **_ignored):
        return (
            quantize(x, y_scale, y_zero_point, axis=axis, block_size=block_size,
                     output_dtype=dtype_of_code(output_dtype), saturate=bool(saturate)),
        )


class MsDq(OpRun):
    op_schema = None

    def _run(self, x, x_scale, x_zero_point=None, axis=1, **_ignored):
        return (dequantize(x, x_scale, x_zero_point, axis=axis),)


class MsQ(OpRun):
    op_schema = None

    def _run(self, x, y_scale, y_zero_point=None, axis=1, **_ignored):
        return (quantize(x, y_scale, y_zero_point, axis=axis),)


class OpmxDq(OpRun):
    op_schema = None

    def _run(self, x, scale, zero_point=None, quant_data_type="int8", quant_axis=1,
             group_size=128, has_zeropoint=0, float_zeropoint=0, **_ignored):
        return (
            dequantize_opmx(x, scale, zero_point, quant_data_type=_text(quant_data_type),
                            quant_axis=quant_axis, group_size=group_size,
                            has_zeropoint=bool(has_zeropoint),
                            float_zeropoint=bool(float_zeropoint)),
        )


def named(base: type[OpRun], name: str, domain: str) -> type[OpRun]:
    # ReferenceEvaluator keys new_ops by (op_domain, class name).
    return type(name, (base,), {"op_domain": domain})
