"""``IntegerToQdqPass``: every integer operator with a faithful QDQ form becomes
DequantizeLinear on each quantized input → the float operator → QuantizeLinear on the
output — the form runtimes fuse back into integer kernels.

Rewritten:

* QLinearConv (ai.onnx, com.microsoft NCHW), QLinearMatMul, QGemm, QLinearAdd/Mul,
  QLinearSigmoid/LeakyRelu, QLinear(Global)AveragePool (NCHW), QLinearSoftmax,
  QLinearReduceMean, QLinearConcat, QLinearWhere: weights stay quantized initializers,
  per-channel weights stay per-channel (DequantizeLinear ``axis``); an int32 bias becomes a
  DequantizeLinear with scale ``x_scale·w_scale`` (float32, as onnxruntime's quantizer
  writes it) and no zero point;
* MatMulInteger / ConvInteger followed by ``Cast`` to float and ``Mul`` by
  ``a_scale·b_scale`` (onnxruntime's dynamic quantization): DequantizeLinear of the
  activation (with DynamicQuantizeLinear's scale and zero point) and of the weight →
  float MatMul / Conv, replacing the Mul's output;
* QAttention / QEmbedLayerNormalization → DequantizeLinear on each quantized input → the
  float com.microsoft Attention / EmbedLayerNormalization;
* MatMulIntegerToFloat → DequantizeLinear ×2 → MatMul (→ Add of the bias);
  DynamicQuantizeMatMul → DynamicQuantizeLinear → DequantizeLinear → MatMul (→ Add).

Refused by name with the reason: operators with no QDQ form (DynamicQuantizeLSTM,
MulInteger), a MatMulInteger/ConvInteger whose scales the graph does not
hold, NHWC (``channels_last``) layouts, a per-axis DequantizeLinear in a model below
ai.onnx opset 13, scales that are not constant where a bias scale must be computed.

The QDQ form is faithful, not exact: the float operator sums float products where the
integer kernel sums integers and rounds once, so outputs may differ by a quantization
step (measured by ``check --against``; ``docs/integer-ops.md``).

This module holds the pass and which rewrite each operator takes; the rewrites are in
``to_qdq_qlinear`` (operators whose scales are inputs) and ``to_qdq_integer``
(MatMulInteger / ConvInteger, their scales read from ``scaled_pattern``), their new nodes
made by ``to_qdq_build.QdqBuilder``.
"""

from __future__ import annotations

import onnx_ir as ir

from dqtool import graph
from dqtool.families.integer import describe, ops
from dqtool.families.integer.rewrite import (
    Change,
    IntegerRewrites,
    Refusal,
    Refused,
    node_label,
    prune_opset_imports,
)
from dqtool.integer.to_qdq_integer import rewrite_integer, rewrite_integer_exact
from dqtool.integer.to_qdq_qlinear import rewrite_dynamic, rewrite_qlinear
from dqtool.names import Names


class IntegerToQdqPass(ir.passes.InPlacePass):
    """Rewrites every integer operator into QDQ; ``outcome`` lists changes and refusals.

    ``exact_dynamic``: MatMulInteger / ConvInteger (with their ``Cast → Mul``) become the
    exact form (``to_qdq_integer.rewrite_integer_exact``) instead of DequantizeLinear with
    their scales."""

    def __init__(self, exact_dynamic: bool = False) -> None:
        """Nothing rewritten yet: ``outcome`` is empty."""
        super().__init__()
        self.outcome = IntegerRewrites()
        self.exact_dynamic = exact_dynamic

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        """Rewrites every integer operator of every graph, subgraph and function it can,
        records each refusal, and drops the com.microsoft import when nothing uses it."""
        # the integer rewrites name a node and its output alike
        names = Names(model, avoid_node_names=True)
        for site in list(graph.walk(model)):
            node = site.node
            opdef = ops.lookup(graph.domain_name(node.domain), node.op_type)
            if opdef is None or opdef.op == "DynamicQuantizeLinear" or node.graph is None:
                continue
            op, label = f"{opdef.domain}:{opdef.op}", node_label(node)
            try:
                into = _try_rewrite(node, opdef, site.opsets, names, self.exact_dynamic)
            except Refused as e:
                self.outcome.refusals.append(Refusal(label, site.graph, op, str(e)))
                if e.needs_opset is not None:
                    self.outcome.needs_opset = max(self.outcome.needs_opset or 0,
                                                   e.needs_opset)
                continue
            self.outcome.changes.append(Change(label, site.graph, op, into))
        if self.outcome.changes:
            prune_opset_imports(model, "com.microsoft")
        return ir.passes.PassResult(model, bool(self.outcome.changes))


def _try_rewrite(node: ir.Node, opdef: ops.OpDef, opsets: dict[str, int], names: Names,
                 exact_dynamic: bool = False) -> str:
    """Rewrites one node with the rewrite its kind takes and says into what; ``Refused``
    (with the reason) when it has no faithful QDQ form or is broken."""
    if opdef.no_qdq:
        raise Refused(f"no QDQ form: {opdef.no_qdq}")
    spec = describe.read(node, opsets)
    errors = [] if spec is None else [p for p in spec.errors if p.code != describe.P_NO_IMPORT]
    if errors:  # a broken node has no faithful rewrite: say what is wrong with it
        raise Refused(f"{errors[0].code}: {errors[0].message}")
    attr = node.attributes.get("channels_last")
    if attr is not None and attr.value:
        raise Refused("channels_last=1 (NHWC): the float operator is NCHW; a faithful QDQ "
                      "form would need Transposes around it")
    if opdef.kind == "integer":
        if exact_dynamic:
            return rewrite_integer_exact(node, opdef, opsets, names)
        return rewrite_integer(node, opdef, opsets, names)
    if opdef.kind == "dynamic" and opdef.float_domain == "":
        return rewrite_dynamic(node, opdef, opsets, names)
    return rewrite_qlinear(node, opdef, opsets, names)
