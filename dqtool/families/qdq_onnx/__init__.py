"""ai.onnx QuantizeLinear / DequantizeLinear, every since-version (10 through 25).

The driver moves these nodes one since-version at a time with the adapters of
``dqtool.convert.adapters_dq``; the fold computes them with ``dqtool.kernel``.
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

OPS = ("DequantizeLinear", "QuantizeLinear")


def _since_versions() -> list[tuple[str, str, int]]:
    """Every since-version the installed onnx has (read from onnx, not from the codecs:
    the codecs are built from this registry)."""
    from dqtool.schemas import since_versions

    return sorted(("ai.onnx", op, v) for op in OPS for v in since_versions(op))


def _codecs() -> list[Any]:
    from dqtool.codecs import onnx_std

    return onnx_std.codecs()


def _evaluator_ops() -> list[type[Any]]:
    from dqtool.kernel import evaluator

    return [evaluator.named(evaluator.Dq, "DequantizeLinear", ""),
            evaluator.named(evaluator.Q, "QuantizeLinear", "")]


def _converters(reg: Registry) -> None:
    from dqtool.convert import adapters_dq

    adapters_dq.register(reg)


FAMILY = Family(
    name="qdq_onnx",
    keys=tuple(_since_versions()),
    codecs=_codecs,
    evaluator_ops=_evaluator_ops,
    fold=qdq.fold_support,
    converters=_converters,
)
