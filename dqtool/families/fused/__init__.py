"""The fused family: onnxruntime's com.microsoft MatMulNBits and GatherBlockQuantized, whose
dequantization lives inside the operator.

Everything about them is in this folder: reading them into a ``FusedSpec`` (``read``), the
kernel (``kernel``, ``packing``), the exact rewrite to ai.onnx DequantizeLinear + MatMul /
Gather (``to_onnx``, the family's "onnx" converter, with ``matmul_to_onnx`` and
``gather_to_onnx``; what it notes for the way back in ``upgrade_notes``) and back
(the ``pack`` application, in ``dqtool/fused/``, builds on them), folding
(``fold``), the weights ``check --against`` compares (``weights``) and the lint facts
(``lint``). See ``docs/fused.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dqtool.registry.family import CheckSupport, Family, FoldSupport, InspectSupport

if TYPE_CHECKING:
    import onnx_ir as ir

    from dqtool.convert.registry import Registry

# Each hook imports what it needs when it is called: the registry is read by the codecs and
# the evaluator, below every family, so a family's top level imports none of the engines
# (dqtool/registry/family.py).

DOMAIN = "com.microsoft"
OPS = ("MatMulNBits", "GatherBlockQuantized")


def _evaluator_ops() -> list[type[Any]]:
    from dqtool.families.fused import evaluator_ops

    return list(evaluator_ops.OPS)


def _fold() -> FoldSupport:
    from dqtool.families.fused import fold

    return FoldSupport(prepare=fold.unfuse)


def _converters(reg: Registry) -> None:
    from dqtool.families.fused import to_onnx

    for op in OPS:
        reg.register(DOMAIN, op, 1, "onnx", optional=True, replaces=_replaces)(to_onnx.convert)


def _replaces(node: ir.Node, options: Any, target: int) -> int:
    from dqtool.families.fused import reporting

    # With --per-axis, or below opset 21 (no blocked DequantizeLinear), a blocked weight
    # is laid out as per-axis rows: B's own bytes, which the save copies from the input's
    # data file (its copy made ahead, then, is kept).
    if options.per_axis or target < 21:
        return 0
    return reporting.weight_bytes(node)


def _inspect() -> InspectSupport:
    from dqtool.families.fused.inspect import SUPPORT

    return SUPPORT


def _check() -> CheckSupport:
    from dqtool.families.fused import bound, selfcheck, weights

    return CheckSupport(
        bounds=bound.node_bounds,
        bound_values=bound.bound_values,
        numeric=selfcheck.numeric,
        holds_weights=_holds_fused,
        kind="fused",
        weights=weights.compare_weights,
        weights_label="fused weight(s) (MatMulNBits / GatherBlockQuantized)",
        tolerated="onnxruntime's MatMulNBits sums in its own order and, for float16, with "
        "the float32 weight",
        notes={"MatMulNBits": "note: onnxruntime's MatMulNBits sums in its own order, with "
               "float16/bfloat16 A multiplies by the float32 weight before its rounding, and "
               "with accuracy_level > 0 may round A: its output differences are judged against "
               "a bound on that rounding, node by node (docs/fused.md)"})


def _holds_fused(proto: Any) -> bool:
    """Whether a ModelProto has a fused node anywhere: main graph, subgraphs, functions."""
    def graph_has(nodes: Any) -> bool:
        for n in nodes:
            if n.domain == DOMAIN and n.op_type in OPS:
                return True
            for a in n.attribute:
                subs = ([a.g] if a.HasField("g") else []) + list(a.graphs)
                if any(graph_has(g.node) for g in subs):
                    return True
        return False

    return graph_has(proto.graph.node) or any(graph_has(f.node) for f in proto.functions)


FAMILY = Family(
    name="fused",
    keys=tuple((DOMAIN, op, 1) for op in OPS),
    evaluator_ops=_evaluator_ops,
    fold=_fold,
    converters=_converters,
    prunable=frozenset({DOMAIN}),
    lint_modules=("dqtool.families.fused.lint",),
    inspect=_inspect,
    check=_check,
    # onnxruntime's schemas (onnxruntime/core/graph/contrib_ops/contrib_defs.cc)
    gathers={"GatherBlockQuantized": "gather_axis"},
    attribute_types={
        "MatMulNBits": dict.fromkeys(("K", "N", "bits", "block_size", "accuracy_level",
                                      "weight_prepacked"), "INT"),
        "GatherBlockQuantized": dict.fromkeys(("gather_axis", "quantize_axis", "block_size",
                                               "bits"), "INT")},
)
