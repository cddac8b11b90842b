"""``QdqToIntegerPass``: the QDQ patterns onnxruntime's QDQ transformers fuse become
integer operators again, for integer-only accelerators.

Fused (every DequantizeLinear input per-tensor, except a weight per-tensor or per output
channel; the QuantizeLinear after the float op per-tensor):

* DQ → Conv → Q ⇒ QLinearConv (an int32 bias DequantizeLinear with scale x_scale·w_scale
  and no zero point becomes its bias); DQ → MatMul → Q ⇒ QLinearMatMul;
  DQ → Gemm (→ Q) ⇒ com.microsoft QGemm;
* DQ → Add / Mul → Q ⇒ QLinearAdd / QLinearMul; DQ → Sigmoid / LeakyRelu / AveragePool /
  GlobalAveragePool / Softmax / ReduceMean / Concat / Where → Q ⇒ the com.microsoft QLinear
  operator;
* DynamicQuantizeLinear → DQ → MatMul / Conv with a constant DQ weight and no Q after ⇒
  MatMulInteger / ConvInteger → Cast → Mul by ``a_scale·w_scale``, as onnxruntime's dynamic
  quantization writes them; followed by an Add of an int32 bias DQ whose scale is that
  product, the bias is added to the accumulator before the Cast (the older quantizers'
  form, which ``dqtool qdq`` turns into that Add).

Anything else stays as it is (a fusion is an optimization, never required): a float op
whose inputs are not all dequantized, a per-axis activation, a bias whose scale is not
x_scale·w_scale, an output read by more than the QuantizeLinear.

This module holds the pass and which fusion each float op tries; what it reads of the QDQ
side is in ``to_qoperator_match``, the fusions in ``to_qoperator_fuse``, their new nodes
made by ``to_qoperator_emit.FusionBuilder``.
"""

from __future__ import annotations

import onnx_ir as ir

from dqtool import graph
from dqtool.families.integer.rewrite import Change, IntegerRewrites
from dqtool.integer.to_qoperator_fuse import (
    BLOCKS,
    ELEMENTWISE,
    fuse_block,
    fuse_dynamic,
    fuse_elementwise,
    fuse_exact,
    fuse_gemm,
    fuse_static,
)
from dqtool.integer.to_qoperator_match import (
    MS,
    Dq,
    dq,
    dynamic_source,
    gathered,
    q_after,
    unit,
)
from dqtool.names import Names

_FUSED = {"Conv", "MatMul", "Gemm", *ELEMENTWISE}


class QdqToIntegerPass(ir.passes.InPlacePass):
    """Fuses DQ → op → Q into integer operators; ``outcome.changes`` lists each fusion."""

    def __init__(self) -> None:
        """Nothing fused yet: ``outcome`` is empty."""
        super().__init__()
        self.outcome = IntegerRewrites()

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        """Fuses every pattern it finds in every graph, subgraph and function, and imports
        com.microsoft when a fused op needs it."""
        # the integer rewrites name a node and its output alike
        names = Names(model, avoid_node_names=True)
        used_ms = False
        for site in list(graph.walk(model)):
            node = site.node
            if node.graph is None:
                continue
            if node.domain == MS and node.op_type in BLOCKS:
                fused = fuse_block(node, names)
            elif node.op_type in _FUSED and node.domain in graph.DEFAULT_DOMAINS:
                fused = _try_fuse(node, site.opsets, names)
            else:
                continue
            label = node.name or f"<unnamed {node.op_type}>"
            if fused is None:
                continue
            used_ms |= fused[0] == MS
            domain = "com.microsoft" if node.domain == MS else "ai.onnx"
            self.outcome.changes.append(Change(label, site.graph, f"{domain}:{node.op_type}",
                                               fused[1]))
        if used_ms and MS not in model.opset_imports:
            model.opset_imports[MS] = 1
        return ir.passes.PassResult(model, bool(self.outcome.changes))


def _try_fuse(node: ir.Node, opsets: dict[str, int], names: Names
              ) -> tuple[str, str] | None:
    """(domain of the new op, what was done), or None when the node is not fusable."""
    ins = list(node.inputs)
    if node.op_type in ("MatMul", "Conv"):
        if len(ins) < 2:
            return None
        a, w = dq(ins[0]), dq(ins[1])
        if a is None or w is None or a.axis is not None:
            return None
        # A second activation (QKᵀ, attention · V) fuses into QLinearMatMul when it is
        # per-tensor; a weight may be per output channel.
        second_activation = not w.const and node.op_type == "MatMul" and w.axis is None
        if not w.const and not second_activation:
            return None
        if w.axis is not None and w.axis != _weight_axis(node, w):
            return None
        q = q_after(node)
        if q is not None:
            return fuse_static(node, a, w, q, names)
        if len(ins) != 2:
            return None
        if unit(a) and unit(w) and (dynamic_source(a, codes_only=True) or gathered(a)) \
                and (w.const or dynamic_source(w, codes_only=True)):
            exact = fuse_exact(node, a, w, names)
            if exact is not None:
                return exact
        if (dynamic_source(a) or gathered(a)) and (w.const or dynamic_source(w)):
            return fuse_dynamic(node, a, w, names)
        return None
    if node.op_type == "Gemm":
        return fuse_gemm(node, names)
    q = q_after(node)
    if q is None:
        return None
    return fuse_elementwise(node, q, opsets, names)


def _weight_axis(node: ir.Node, w: Dq) -> int | None:
    """The axis of a weight's output channels: 0 for Conv, the last for MatMul; None
    when the rank is unknown."""
    if node.op_type == "Conv":
        return 0
    shape = graph.shape_of(w.x)
    return None if shape is None else len(shape) - 1
