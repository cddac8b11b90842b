"""onnxruntime's com.microsoft QuantizeLinear / DequantizeLinear (contrib ops, version 1).

Same inputs and ``axis`` as ai.onnx's; the driver turns them into ai.onnx where the target
opset expresses their types (``convert.py`` here).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dqtool.families import qdq
from dqtool.registry.family import Family

if TYPE_CHECKING:
    from dqtool.convert.registry import Registry

# Each hook imports what it needs when it is called: the registry is read by the codecs and
# the evaluator, below every family, so a family's top level imports none of the engines
# (dqtool/registry/family.py).

DOMAIN = "com.microsoft"


def _codecs() -> list[Any]:
    from dqtool.codecs import microsoft

    return microsoft.codecs()


def _evaluator_ops() -> list[type[Any]]:
    from dqtool.kernel import evaluator

    return [evaluator.named(evaluator.MsDq, "DequantizeLinear", DOMAIN),
            evaluator.named(evaluator.MsQ, "QuantizeLinear", DOMAIN)]


def _converters(reg: Registry) -> None:
    from dqtool.families.qdq_microsoft import convert

    convert.register(reg)


FAMILY = Family(
    name="qdq_microsoft",
    keys=((DOMAIN, "DequantizeLinear", 1), (DOMAIN, "QuantizeLinear", 1)),
    codecs=_codecs,
    evaluator_ops=_evaluator_ops,
    # The ai.onnx kernels: same inputs, axis defaults to 1 in both.
    fold=qdq.fold_support,
    converters=_converters,
    prunable=frozenset({DOMAIN}),
    lint_modules=("dqtool.families.qdq_microsoft.lint",),
    attribute_types={"DequantizeLinear": {"axis": "INT"}, "QuantizeLinear": {"axis": "INT"}},
)
