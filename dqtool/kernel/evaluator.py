"""onnx's ReferenceEvaluator with dqtool's kernels for every (De)QuantizeLinear dialect.

onnx's evaluator has no implementation of DequantizeLinear-10/13 and does not check shapes;
here every ``DequantizeLinear``/``QuantizeLinear`` of the default domain (all versions),
``com.microsoft``, and OPMX (``opmx``/``pmx`` DequantizeLinear) runs through
``dqtool.kernel``. Other operators run as onnx's evaluator runs them.

The evaluator is a subclass of ``ReferenceEvaluator`` that always registers these operators:
onnx builds the evaluators of model-local functions with ``self.__class__`` and does not pass
``new_ops`` to them, so a plain ``new_ops=`` would miss nodes inside functions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

from ..errors import KernelError
from .dequantize import dequantize
from .opmx import dequantize_opmx
from .quantize import quantize


def _np_dtype(code: int | None) -> np.dtype | None:
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


class _Dq(OpRun):
    op_schema = None  # only the node's own attributes reach _run; defaults are ours

    def _run(self, x, x_scale, x_zero_point=None, axis=1, block_size=0, output_dtype=0,
             **_ignored):
        return (
            dequantize(x, x_scale, x_zero_point, axis=axis, block_size=block_size,
                       output_dtype=_np_dtype(output_dtype)),
        )


class _Q(OpRun):
    op_schema = None

    def _run(self, x, y_scale, y_zero_point=None, axis=1, block_size=0, output_dtype=0,
             saturate=1, **_ignored):
        return (
            quantize(x, y_scale, y_zero_point, axis=axis, block_size=block_size,
                     output_dtype=_np_dtype(output_dtype), saturate=bool(saturate)),
        )


class _MsDq(OpRun):
    op_schema = None

    def _run(self, x, x_scale, x_zero_point=None, axis=1, **_ignored):
        return (dequantize(x, x_scale, x_zero_point, axis=axis),)


class _MsQ(OpRun):
    op_schema = None

    def _run(self, x, y_scale, y_zero_point=None, axis=1, **_ignored):
        return (quantize(x, y_scale, y_zero_point, axis=axis),)


class _OpmxDq(OpRun):
    op_schema = None

    def _run(self, x, scale, zero_point=None, quant_data_type="int8", quant_axis=1,
             group_size=128, has_zeropoint=0, float_zeropoint=0, **_ignored):
        return (
            dequantize_opmx(x, scale, zero_point, quant_data_type=_text(quant_data_type),
                            quant_axis=quant_axis, group_size=group_size,
                            has_zeropoint=bool(has_zeropoint),
                            float_zeropoint=bool(float_zeropoint)),
        )


def _named(base: type[OpRun], name: str, domain: str) -> type[OpRun]:
    # ReferenceEvaluator keys new_ops by (op_domain, class name).
    return type(name, (base,), {"op_domain": domain})


KERNEL_OPS: list[type[OpRun]] = [
    _named(_Dq, "DequantizeLinear", ""),
    _named(_Q, "QuantizeLinear", ""),
    _named(_MsDq, "DequantizeLinear", "com.microsoft"),
    _named(_MsQ, "QuantizeLinear", "com.microsoft"),
    _named(_OpmxDq, "DequantizeLinear", "opmx"),
    _named(_OpmxDq, "DequantizeLinear", "pmx"),
]


class DqtoolReferenceEvaluator(ReferenceEvaluator):
    """ReferenceEvaluator that always runs (De)QuantizeLinear with dqtool's kernel."""

    def __init__(self, proto: Any, *args: Any, new_ops: list | None = None, **kwargs: Any):
        # Caller's ops first: on a clash ReferenceEvaluator keeps the first one.
        super().__init__(proto, *args, new_ops=[*(new_ops or []), *KERNEL_OPS], **kwargs)


def reference_evaluator(model: Any, **kwargs: Any) -> ReferenceEvaluator:
    """An evaluator for ``model`` (ModelProto, path, or onnx_ir Model) with our kernels."""
    if isinstance(model, (str, Path)):
        model = onnx.load(str(model))
    elif not isinstance(model, (onnx.ModelProto, onnx.GraphProto, onnx.FunctionProto,
                                onnx.NodeProto)):
        import onnx_ir

        if isinstance(model, onnx_ir.Model):
            model = onnx_ir.to_proto(model)
    return DqtoolReferenceEvaluator(model, **kwargs)
