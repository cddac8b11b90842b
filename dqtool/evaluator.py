"""onnx's ReferenceEvaluator running every registered family's operators with dqtool's
kernel (every ai.onnx (De)QuantizeLinear version, com.microsoft's, opmx/pmx's, and whatever
later families add); other operators run as onnx's evaluator runs them.

The evaluator is a subclass of ``ReferenceEvaluator`` that always registers these operators:
onnx builds the evaluators of model-local functions with ``self.__class__`` and does not pass
``new_ops`` to them, so a plain ``new_ops=`` would miss nodes inside functions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx
from onnx.reference import ReferenceEvaluator

from dqtool import registry

_OPS: tuple[int, tuple[type[Any], ...]] = (-1, ())


def _ops() -> tuple[type[Any], ...]:
    """Every family's evaluator ops, built once per set of families."""
    global _OPS
    if _OPS[0] != registry.generation():
        _OPS = (registry.generation(), tuple(registry.evaluator_ops()))
    return _OPS[1]


class DqtoolReferenceEvaluator(ReferenceEvaluator):
    """ReferenceEvaluator that always runs the families' operators with dqtool's kernel,
    and the caller's ``new_ops`` in model-local functions too."""

    _carried: tuple[type[Any], ...] = ()  # the caller's new_ops, for functions' evaluators

    def __init__(self, proto: Any, *args: Any, new_ops: list | None = None, **kwargs: Any):
        if new_ops:
            # onnx builds each function's evaluator with ``self.__class__`` and no new_ops:
            # a class that carries them gives them to those too (a layout-free MatMul ran
            # in the main graph only, and a weight made through Transpose inside a function
            # gave outputs 1e-6 apart from the same weight stored whole).
            cls = type(self)
            self.__class__ = type(cls.__name__, (cls,),
                                  {"_carried": (*new_ops, *cls._carried)})
        # Caller's ops first: on a clash ReferenceEvaluator keeps the first one.
        super().__init__(proto, *args, new_ops=[*self._carried, *_ops()], **kwargs)


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
