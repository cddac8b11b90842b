"""QDQ node units: a compute node with the DequantizeLinear nodes that feed it and the
QuantizeLinear nodes that read its outputs, as deployment runtimes group them.

onnxruntime's execution providers (the QNN EP among them), OpenVINO's low-precision
transformations and TensorRT all decide whether an operator runs quantized from this
group: the quantized types and granularities around one operator, not one Q/DQ node at a
time. A unit is made for every node that is not itself a Q/DQ node and that reads at least
one DequantizeLinear output: the nodes a model meant to quantize.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dqtool import codecs, graph
from dqtool.graph import Site
from dqtool.linting.context import ModelContext, QuantSite
from dqtool.spec import QuantSpec

# Operators whose input 1 is a weight (and input 2 a bias) when a constant feeds it.
WEIGHTED = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm"})
_SKIPPED = frozenset({"Constant", "Identity"})


@dataclass(frozen=True)
class Operand:
    """One input of a unit's node and the DequantizeLinear feeding it (None: a float input,
    or no input at that position)."""

    index: int
    role: str  # "activation", "weight" or "bias"
    dq: QuantSite | None

    @property
    def spec(self) -> QuantSpec | None:
        return None if self.dq is None else self.dq.spec


@dataclass(frozen=True)
class NodeUnit:
    site: Site
    operands: tuple[Operand, ...]
    outputs: tuple[QuantSite | None, ...]  # the QuantizeLinear reading each output, if any

    @property
    def name(self) -> str:
        return self.site.node.name or f"<unnamed {self.site.node.op_type}>"

    @property
    def op_type(self) -> str:
        return self.site.node.op_type

    @property
    def graph(self) -> str:
        return self.site.graph

    def role(self, role: str) -> list[Operand]:
        return [o for o in self.operands if o.role == role]

    @property
    def weight(self) -> Operand | None:
        found = self.role("weight")
        return found[0] if found else None

    @property
    def activations(self) -> list[Operand]:
        return self.role("activation")

    def activation_specs(self) -> list[QuantSpec]:
        """The quantized activations around the node: its DequantizeLinear-fed activation
        inputs and the QuantizeLinear nodes of its outputs."""
        ins = [o.spec for o in self.activations if o.spec is not None]
        return ins + [q.spec for q in self.outputs if q is not None]


def _role(op_type: str, index: int, spec: QuantSpec | None) -> str:
    if op_type not in WEIGHTED or index == 0:
        return "activation"
    constant = spec is not None and spec.constant
    if op_type == "MatMul" and not constant:
        return "activation"  # two activations (attention's Q·K), no weight
    return "weight" if index == 1 else "bias"


def units(ctx: ModelContext) -> list[NodeUnit]:
    """Every node fed by at least one DequantizeLinear, in graph order."""
    by_node = {id(q.node): q for q in ctx.quant}
    found = []
    for site in ctx.sites:
        node = site.node
        if codecs.is_quant_node(node) or node.op_type in _SKIPPED:
            continue
        operands = []
        for i, value in enumerate(node.inputs):
            producer = None if value is None else value.producer()
            q = None if producer is None else by_node.get(id(producer))
            if q is not None and not q.spec.is_dequantize:
                q = None
            operands.append(Operand(i, _role(node.op_type, i, q and q.spec), q))
        if not any(o.dq is not None for o in operands):
            continue
        outputs = []
        for value in node.outputs:
            readers = [by_node.get(id(user)) for user in value.consumers()]
            quantize = [q for q in readers if q is not None and not q.spec.is_dequantize]
            outputs.append(quantize[0] if quantize else None)
        found.append(NodeUnit(site, tuple(operands), tuple(outputs)))
    return found


def zero_points(q: QuantSite) -> set[float] | None:
    """The distinct zero-point values of a node ({0.0} when it has none; None when they are
    computed at run time)."""
    if q.spec.zero_point == "none":
        return {0.0}
    arr = graph.constant_array(graph.input_value(q.node, 2))
    if arr is None:
        return None
    return {float(z) for z in np.unique(arr.astype(np.float64))}


def weight_axes(unit: NodeUnit) -> tuple[int | None, int | None]:
    """(output-channel axis, reduction axis) of the unit's weight: Conv (M, C/g, k…) and
    ConvTranspose (C, M/g, k…) by their layouts, MatMul (…, K, N), Gemm by transB."""
    w = unit.weight
    rank = None if w is None or w.spec is None or w.spec.x_shape is None \
        else len(w.spec.x_shape)
    op = unit.op_type
    if op == "Conv":
        return 0, 1
    if op == "ConvTranspose":
        return 1, 0
    if op == "Gemm":
        trans = unit.site.node.attributes.get("transB")
        return (0, 1) if trans is not None and trans.as_int() else (1, 0)
    if op == "MatMul" and rank is not None and rank >= 2:
        return rank - 1, rank - 2
    return None, None
