"""The integer-operator family: QLinear* (ai.onnx and com.microsoft), MatMulInteger /
ConvInteger, and dynamic quantization (DynamicQuantizeLinear, MatMulIntegerToFloat,
DynamicQuantizeMatMul, DynamicQuantizeLSTM).

Everything about these operators lives here: the operator table (``ops``), reading a node
into its meaning (``describe``), the exact integer kernels (``kernel``) and their
evaluator ops (``evaluator_ops``), what the rewrites to QDQ and back share (``rewrite``;
the rewrites themselves, the ``qdq`` and ``qoperator`` applications, are in
``dqtool/integer/``), and what lint targets lack (``lint``). See ``docs/integer-ops.md``.
"""

from __future__ import annotations

from typing import Any

from dqtool.families.integer import ops
from dqtool.registry.family import CheckSupport, Family, InspectSupport

# Each hook imports what it needs when it is called: the registry is read by the codecs and
# the evaluator, below every family, so a family's top level imports none of the engines
# (dqtool/registry/family.py).

def _evaluator_ops() -> list[type[Any]]:
    from dqtool.families.integer.evaluator_ops import EVALUATOR_OPS

    return list(EVALUATOR_OPS)


def _inspect() -> InspectSupport:
    from dqtool.families.integer.inspect import SUPPORT

    return SUPPORT


def _check() -> CheckSupport:
    from dqtool.families.integer import local_error, selfcheck

    return CheckSupport(numeric=selfcheck.numeric, per_op=local_error.for_check,
                        optimized_run=local_error.fused_for_check)


FAMILY = Family(
    name="integer",
    # The com.microsoft operators only: the ai.onnx ones (QLinearConv, MatMulInteger, ...)
    # move between opsets through the driver's generic schema conversion, which an owning
    # family would replace with adapters it does not need.
    keys=tuple((d.domain, d.op, d.since_version) for d in ops.OPS if d.domain == ops.MS),
    evaluator_ops=_evaluator_ops,
    prunable=frozenset({ops.MS}),
    lint_modules=("dqtool.families.integer.lint", "dqtool.families.integer.lint_saturation"),
    inspect=_inspect,
    check=_check,
    attribute_types=ops.ATTRIBUTE_TYPES,
)
