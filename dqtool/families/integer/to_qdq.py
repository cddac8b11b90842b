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
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from dqtool import graph
from dqtool.families.integer import describe, ops, pool
from dqtool.families.integer.rewrite import (
    Change,
    Names,
    Outcome,
    Refusal,
    Refused,
    drop_if_unused,
    make_constant,
    node_label,
    prune_opset_imports,
)

FLOAT = ir.DataType.FLOAT


class IntegerToQdqPass(ir.passes.InPlacePass):
    """Rewrites every integer operator into QDQ; ``outcome`` lists changes and refusals.

    ``exact_dynamic``: MatMulInteger / ConvInteger (with their ``Cast → Mul``) become the
    exact form (``_rewrite_integer_exact``) instead of DequantizeLinear with their scales."""

    def __init__(self, exact_dynamic: bool = False) -> None:
        super().__init__()
        self.outcome = Outcome()
        self.exact_dynamic = exact_dynamic

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        names = Names(model)
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
                continue
            self.outcome.changes.append(Change(label, site.graph, op, into))
        if self.outcome.changes:
            prune_opset_imports(model, "com.microsoft")
        return ir.passes.PassResult(model, bool(self.outcome.changes))


def _try_rewrite(node: ir.Node, opdef: ops.OpDef, opsets: dict[str, int], names: Names,
                 exact_dynamic: bool = False) -> str:
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
            return _rewrite_integer_exact(node, opdef, opsets, names)
        return _rewrite_integer(node, opdef, opsets, names)
    if opdef.kind == "dynamic" and opdef.float_domain == "":
        return _rewrite_dynamic(node, opdef, opsets, names)
    return _rewrite_qlinear(node, opdef, opsets, names)


# ---- building blocks ---------------------------------------------------------------------

class _Builder:
    """New nodes for one rewritten node, inserted before it in its graph."""

    def __init__(self, node: ir.Node, names: Names, opsets: dict[str, int]) -> None:
        self.node, self.names, self.opsets = node, names, opsets
        self.graph = node.graph
        self.base = node.name or node.op_type
        self.new: list[ir.Node] = []
        self.initializers: list[ir.Value] = []  # registered by finish, not before

    def add(self, op: str, inputs: list[ir.Value | None], attrs: list[ir.Attr] | None = None,
            suffix: str = "", n_out: int = 1, out_type: ir.DataType | None = FLOAT,
            name: str | None = None, domain: str = "") -> ir.Node:
        n = ir.Node(domain, op, _trim(inputs), attrs or [], num_outputs=n_out,
                    name=name or self.names.fresh(f"{self.base}/{suffix or op}"))
        for i, o in enumerate(n.outputs):
            o.name = self.names.fresh(f"{self.base}/{suffix or op}_output_{i}")
        if out_type is not None:
            n.outputs[0].dtype = out_type
        self.new.append(n)
        return n

    def dequantize(self, value: ir.Value, scale: ir.Value | None, zp: ir.Value | None,
                   axis: int | None, role: str) -> ir.Value:
        if scale is None:
            raise Refused(f"input '{role}' has no scale")
        attrs = []
        if axis is not None:
            if (graph.opset_of(self.opsets, "") or 0) < 13:
                raise Refused(f"'{role}' is per-axis, which DequantizeLinear takes from "
                              "ai.onnx opset 13; run `dqtool upgrade --opset 13` first")
            attrs.append(ir.AttrInt64("axis", axis))
            scale, zp = self._matched(scale, zp, role)
        return self.add("DequantizeLinear", [value, scale, zp], attrs,
                        suffix=f"DequantizeLinear_{role}").outputs[0]

    def _matched(self, scale: ir.Value, zp: ir.Value | None, role: str
                 ) -> tuple[ir.Value, ir.Value | None]:
        """A per-axis scale and zero point of one length, as DequantizeLinear takes them:
        the single-element one of the two (a per-column zero point beside one scale, which
        onnxruntime's MatMulInteger takes) becomes a constant of the other's length, the
        same value in every place (so the same products)."""
        if zp is None:
            return scale, zp
        ns, nz = (graph.num_elements(graph.shape_of(v)) for v in (scale, zp))
        if ns is None or nz is None or ns == nz:
            return scale, zp
        if 1 not in (ns, nz):
            raise Refused(f"'{role}' has {ns} scales and {nz} zero points")
        one, n, what = (scale, nz, "scale") if ns == 1 else (zp, ns, "zero point")
        arr = graph.constant_array(one)
        if arr is None:
            raise Refused(f"'{role}' is per-axis in its {'zero point' if ns == 1 else 'scale'}"
                          f" but its one {what} is computed at run time: DequantizeLinear "
                          "takes a scale and a zero point of one shape")
        wide = self.constant(f"{what.replace(' ', '_')}_per_axis",
                             np.full((n,), arr.reshape(-1)[0], arr.dtype))
        return (wide, zp) if ns == 1 else (scale, wide)

    def constant(self, base: str, arr: np.ndarray) -> ir.Value:
        value, node = make_constant(self.graph, self.names, f"{self.base}/{base}", arr)
        if node is not None:
            self.new.append(node)
        else:
            self.initializers.append(value)
        return value

    def commit(self) -> None:
        """Insert the new nodes and constants (nothing is changed before this)."""
        for v in self.initializers:
            self.graph.register_initializer(v)
        self.graph.insert_before(self.node, self.new)
        self.new, self.initializers = [], []

    def finish(self, old: list[ir.Value], new: list[ir.Value],
               detached: list[ir.Value | None] = ()) -> None:
        """Put the new nodes in, move every use of ``old`` to ``new``, drop the node."""
        self.commit()
        for o, n in zip(old, new, strict=True):
            n.shape = o.shape if o.shape is not None else n.shape
            if o.type is not None:
                n.type = o.type
            was_output = o.is_graph_output()
            name = o.name
            o.replace_all_uses_with(n, replace_graph_outputs=True)
            if was_output:  # keep the model's output names
                o.name = self.names.fresh(f"{name}_replaced")
                n.name = name
        inputs = list(self.node.inputs)
        self.graph.remove(self.node, safe=True)
        drop_if_unused([*inputs, *detached])


def _trim(inputs: list[ir.Value | None]) -> list[ir.Value | None]:
    out = list(inputs)
    while out and out[-1] is None:
        out.pop()
    return out


def _axis_of(node: ir.Node, opdef: ops.OpDef, slot: ops.Slot) -> int | None:
    """The DequantizeLinear axis of a per-axis slot; None when per-tensor. Only a 1-D
    parameter can be expressed (QLinearMatMul's [M, 1] per-row form cannot)."""
    params = [graph.input_value(node, i) for i in (slot.scale, slot.zero_point)
              if i is not None]
    shapes = [describe.value_shape(p) for p in params if p is not None]
    # the longer of the two: a per-column zero point beside one scale is per-axis too
    shape = None if not shapes or None in shapes else \
        max(shapes, key=lambda s: graph.num_elements(s) or 0)
    if shape is None:
        raise Refused(f"the shape of '{slot.role}''s scale is unknown")
    n = graph.num_elements(shape)
    if n == 1:
        return None
    if len(shape) != 1:
        raise Refused(f"'{slot.role}' has a {list(shape)} scale (per-row/per-column of an "
                      "N-D input), which DequantizeLinear's 1-D per-axis scale cannot express")
    value = graph.input_value(node, slot.value) if slot.value is not None else None
    vshape = graph.shape_of(value)
    rank = None if vshape is None else len(vshape)
    fixed = (opdef.op in ("QLinearConv", "ConvInteger") and slot.role == "w") or \
        (opdef.op == "QGemm" and slot.role == "b")
    if rank is None and not fixed:
        raise Refused(f"the rank of '{slot.role}' is unknown, so its per-column axis is too")
    return describe.channel_axis(opdef.op, slot.role, node, rank)


def _zero_point(b: _Builder, zp: ir.Value | None, like: ir.Value | None) -> ir.Value | None:
    """An explicit zero point for QuantizeLinear when the op's is absent: QuantizeLinear
    without one produces uint8, and the op's output may be int8."""
    if zp is not None:
        return zp
    t = graph.elem_type(like)
    if t in (None, "uint8"):
        return None
    from dqtool import types

    return b.constant("zero_point", np.zeros((), types.by_name(t).dtype))


def _overhang_as_pads(node: ir.Node, attrs: list[ir.Attr]) -> list[ir.Attr]:
    """onnxruntime's QLinearAveragePool with ``ceil_mode`` and ``count_include_pad``
    divides a last window that runs past the input and its end pad by the whole kernel;
    AveragePool counts only the pads. The same windows with the end pads grown to cover
    them and ``ceil_mode`` 0 give the same output size and the same divisor. ``VALID``
    is pads of 0 here (its windows overhang alike); ``SAME_*`` windows never overhang.
    An axis of stride 1 cannot overhang (its ceiling is its floor), whatever its size."""
    at = {a.name: a.value for a in attrs}
    auto = at.get("auto_pad", "NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    if not at.get("ceil_mode") or not at.get("count_include_pad") or \
            auto not in ("NOTSET", "VALID"):
        return attrs
    kernel = [int(k) for k in at["kernel_shape"]]
    rank = len(kernel)
    strides = [int(s) for s in (at.get("strides") or [1] * rank)]
    pads = [0] * (2 * rank) if auto == "VALID" else \
        [int(p) for p in (at.get("pads") or [0] * (2 * rank))]
    shape = graph.shape_of(node.inputs[0])
    spatial = [None] * rank if shape is None or len(shape) != rank + 2 else \
        list(shape[1:-1] if at.get("channels_last") else shape[2:])
    grown = list(pads)
    for i, (size, k, s) in enumerate(zip(spatial, kernel, strides, strict=True)):
        if s == 1:
            continue
        if not isinstance(size, int):
            raise Refused("ceil_mode with count_include_pad: onnxruntime divides a window "
                          "that runs past the input by the whole kernel, and whether one "
                          f"does needs spatial axis {i}'s size, which is not known")
        out = pool.pooled_size(size, k, s, pads[i], pads[i + rank], ceil=True)
        grown[i + rank] = max(pads[i + rank], (out - 1) * s + k - size - pads[i])
    kept = [a for a in attrs if a.name not in ("ceil_mode", "pads", "auto_pad")]
    return [*kept, ir.AttrInt64s("pads", grown)]


def _float_attrs(node: ir.Node, opdef: ops.OpDef, opsets: dict[str, int]) -> list[ir.Attr]:
    attrs = [a for name, a in node.attributes.items() if name not in opdef.drop_attributes]
    if opdef.op == "QLinearSoftmax":
        sm = node.attributes.get("opset")
        model_opset = graph.opset_of(opsets, "") or 0
        if sm is not None and (sm.value >= 13) != (model_opset >= 13):
            raise Refused(f"its softmax follows opset {sm.value} semantics, which Softmax at "
                          f"the model's opset {model_opset} does not")
    if opdef.op == "QLinearAveragePool":
        attrs = _overhang_as_pads(node, attrs)
    if opdef.op == "QGemm":
        alpha = node.attributes.get("alpha")
        if alpha is not None and alpha.value != 1.0 and graph.input_value(node, 6) is not None:
            # acc + C is scaled by alpha·a_scale·b_scale: the float Gemm scales C by beta.
            attrs.append(ir.AttrFloat32("beta", float(alpha.value)))
    return attrs


# ---- qlinear -----------------------------------------------------------------------------

def _rewrite_qlinear(node: ir.Node, opdef: ops.OpDef, opsets: dict[str, int],
                     names: Names) -> str:
    b = _Builder(node, names, opsets)
    slots = ops.slots_of(opdef, len(node.inputs))
    out = opdef.output
    params = {i for s in (*slots, out) if s is not None for i in (s.scale, s.zero_point)
              if i is not None}
    by_value = {s.value: s for s in slots}
    float_inputs: list[ir.Value | None] = []
    for i, v in enumerate(node.inputs):
        if i in params:
            continue
        if i in by_value:
            s = by_value[i]
            if v is None and s.scale is not None and graph.input_value(node, s.scale) is None:
                float_inputs.append(None)  # an optional quantized input left out
                continue
            if v is None:
                raise Refused(f"input '{s.role}' is missing")
            float_inputs.append(b.dequantize(v, graph.input_value(node, s.scale),
                                             graph.input_value(node, s.zero_point),
                                             _axis_of(node, opdef, s), s.role))
        elif i == opdef.bias:
            float_inputs.append(None if v is None else _bias(b, node, opdef, slots, v))
        else:
            float_inputs.append(v)
    if opdef.op == "QLinearReduceMean" and (graph.opset_of(opsets, "") or 0) >= 18:
        float_inputs, attrs = _reduce_axes(b, node)
    else:
        attrs = _float_attrs(node, opdef, opsets)
    y_scale = graph.input_value(node, out.scale) if out else None
    n_out = len(node.outputs) if out is None else 1
    f = b.add(opdef.float_op or "", float_inputs, attrs, name=names.fresh(f"{b.base}/float")
              if node.name is None else node.name, domain=opdef.float_domain, n_out=n_out)
    if y_scale is None:  # QGemm without y_scale, the fused blocks: float outputs
        n_dq = sum(1 for n in b.new if n.op_type == "DequantizeLinear")
        node.name = names.fresh(f"{b.base}_replaced") if node.name else None
        b.finish(list(node.outputs), list(f.outputs))
        where = f"{opdef.float_domain} " if opdef.float_domain else ""
        return f"DequantizeLinear ×{n_dq} → {where}{f.op_type}"
    y_zp = _zero_point(b, graph.input_value(node, out.zero_point), node.outputs[0]) \
        if out.zero_point is not None else None
    q = b.add("QuantizeLinear", [f.outputs[0], y_scale, y_zp], suffix="QuantizeLinear",
              out_type=None)
    node.name = names.fresh(f"{b.base}_replaced") if node.name else None
    n_dq = sum(1 for n in b.new if n.op_type == "DequantizeLinear")
    b.finish([node.outputs[0]], [q.outputs[0]])
    return f"DequantizeLinear ×{n_dq} → {f.op_type} → QuantizeLinear"


def _reduce_axes(b: _Builder, node: ir.Node) -> tuple[list[ir.Value | None], list[ir.Attr]]:
    raise Refused("ReduceMean takes its axes as an input from opset 18; not rewritten")


def _bias(b: _Builder, node: ir.Node, opdef: ops.OpDef, slots: tuple[ops.Slot, ...],
          bias: ir.Value) -> ir.Value:
    """An int32 bias as DequantizeLinear(bias, x_scale·w_scale): the scale onnxruntime's
    quantizer quantized it with (float32 product)."""
    x, w = slots[0], slots[1]
    xs = graph.constant_array(graph.input_value(node, x.scale))
    ws = graph.constant_array(graph.input_value(node, w.scale))
    if xs is None or ws is None:
        raise Refused("the bias scale x_scale·w_scale needs both scales constant")
    if graph.elem_type(bias) != "int32":
        raise Refused(f"bias is {graph.elem_type(bias)}, not int32")
    scale = (np.asarray(xs, np.float32).reshape(()) if np.size(xs) == 1 else
             np.asarray(xs, np.float32)) * np.asarray(ws, np.float32)
    scale = scale.astype(np.float32)
    axis = None
    if np.size(scale) == 1:
        scale = scale.reshape(())
    else:
        scale, axis = scale.reshape(-1), 0
    sv = b.constant("bias_scale", scale)
    return b.dequantize(bias, sv, None, axis, "bias")


# ---- dynamic -----------------------------------------------------------------------------

def _rewrite_dynamic(node: ir.Node, opdef: ops.OpDef, opsets: dict[str, int],
                     names: Names) -> str:
    b = _Builder(node, names, opsets)
    if opdef.op == "DynamicQuantizeMatMul":
        dql = b.add("DynamicQuantizeLinear", [node.inputs[0]], n_out=3,
                    suffix="DynamicQuantizeLinear", out_type=ir.DataType.UINT8)
        dql.outputs[1].dtype, dql.outputs[2].dtype = FLOAT, ir.DataType.UINT8
        a = b.dequantize(dql.outputs[0], dql.outputs[1], dql.outputs[2], None, "a")
        slot_b = opdef.inputs[0]
        into = "DynamicQuantizeLinear → DequantizeLinear ×2 → MatMul"
    else:  # MatMulIntegerToFloat
        sa = opdef.inputs[0]
        if _axis_of(node, opdef, sa) is not None:
            raise Refused("per-row activation scales have no DequantizeLinear form")
        a = b.dequantize(node.inputs[0], graph.input_value(node, sa.scale),
                         graph.input_value(node, sa.zero_point), None, "a")
        slot_b = opdef.inputs[1]
        into = "DequantizeLinear ×2 → MatMul"
    w = b.dequantize(graph.input_value(node, slot_b.value), graph.input_value(node, slot_b.scale),
                     graph.input_value(node, slot_b.zero_point), _axis_of(node, opdef, slot_b),
                     slot_b.role)
    f = b.add("MatMul", [a, w], name=node.name or None)
    out = f.outputs[0]
    bias = graph.input_value(node, opdef.bias)
    if bias is not None:
        out = b.add("Add", [out, bias], suffix="bias").outputs[0]
        into += " → Add"
    node.name = names.fresh(f"{b.base}_replaced") if node.name else None
    b.finish([node.outputs[0]], [out])
    return into


# ---- MatMulInteger / ConvInteger ---------------------------------------------------------

def _rewrite_integer(node: ir.Node, opdef: ops.OpDef, opsets: dict[str, int],
                     names: Names) -> str:
    """Only inside onnxruntime's pattern: int32 → [Add int32 bias →] Cast(float) →
    Mul(scale), where the scale is Mul(a_scale, w_scale) and a_scale is the activation's
    DynamicQuantizeLinear scale. An int32 bias (older quantizers quantize it at run time
    with the same scale) becomes DequantizeLinear(bias, scale) added after the float op."""
    pattern = _scaled_pattern(node)
    a_slot, w_slot = opdef.inputs
    b = _Builder(node, names, opsets)
    a = b.dequantize(node.inputs[0], pattern.a_scale, graph.input_value(node, a_slot.zero_point),
                     None, a_slot.role)
    w_zp = graph.input_value(node, w_slot.zero_point)
    if pattern.bias is not None and _weight_axis(node, opdef, pattern.w_scale) is not None:
        raise Refused("an int32 bias added before the per-channel scale: its scale would be "
                      "per-channel along a broadcast axis")
    w = b.dequantize(node.inputs[1], pattern.w_scale, w_zp,
                     _weight_axis(node, opdef, pattern.w_scale, w_zp), w_slot.role)
    attrs = list(node.attributes.values())
    f = b.add(opdef.float_op or "", [a, w], attrs, name=node.name or None)
    out = f.outputs[0]
    into = f"DequantizeLinear ×2 → {f.op_type}"
    if pattern.bias is not None:
        bias = b.dequantize(pattern.bias, pattern.scale, None, None, "bias")
        out = b.add("Add", [out, bias], suffix="bias").outputs[0]
        into += " → Add(DequantizeLinear(int32 bias))"
    node.name = names.fresh(f"{b.base}_replaced") if node.name else None
    # Before the Mul: a run-time bias is computed after the integer op, and everything the
    # pattern reads exists by the Mul.
    b.node = pattern.mul
    b.commit()
    old = pattern.mul.outputs[0]
    was_output, oname = old.is_graph_output(), old.name
    old.replace_all_uses_with(out, replace_graph_outputs=True)
    out.shape, out.type = old.shape, old.type or out.type
    if was_output:
        old.name = names.fresh(f"{oname}_replaced")
        out.name = oname
    g = node.graph
    inputs = list(node.inputs)
    for n in (pattern.mul, pattern.cast, pattern.add, node):
        if n is not None:
            g.remove(n, safe=True)
    drop_if_unused([pattern.scale, *inputs])
    return into + " (Cast and Mul by the scale product removed)"


def _rewrite_integer_exact(node: ir.Node, opdef: ops.OpDef, opsets: dict[str, int],
                           names: Names) -> str:
    """The exact QDQ form of onnxruntime's dynamic pattern: DequantizeLinear with scale 1
    (the zero point subtracted, the codes as exact float integers) → the float op (sums of
    integer products, exact in float32 while every partial sum stays below 2**24) → the
    int32 bias as DequantizeLinear(bias, 1) added → the original's ``Mul`` by
    ``a_scale·w_scale``. The integer op and its ``Cast`` go; the ``Mul`` and the scale
    product stay as they were. Equal to ``Cast(acc) · scale`` bit for bit within that
    bound, which is reported (``docs/integer-ops.md``)."""
    pattern = _scaled_pattern(node)
    a_slot, w_slot = opdef.inputs
    b = _Builder(node, names, opsets)
    one = b.constant("unit_scale", np.ones((), np.float32))
    a_zp = graph.input_value(node, a_slot.zero_point)
    w_zp = graph.input_value(node, w_slot.zero_point)
    w_axis = _weight_axis(node, opdef, pattern.w_scale, w_zp)
    w_one = one
    if w_axis is not None:
        n = max(graph.num_elements(graph.shape_of(v)) or 1 for v in (pattern.w_scale, w_zp)
                if v is not None)
        w_one = b.constant("unit_scale_per_channel", np.ones((n,), np.float32))
    a = b.dequantize(node.inputs[0], one, a_zp, None, a_slot.role)
    w = b.dequantize(node.inputs[1], w_one, w_zp, w_axis, w_slot.role)
    f = b.add(opdef.float_op or "", [a, w], list(node.attributes.values()),
              name=node.name or None)
    out = f.outputs[0]
    into = f"DequantizeLinear(scale 1) ×2 → {f.op_type}"
    if pattern.bias is not None:
        bias = b.dequantize(pattern.bias, one, None, None, "bias")
        out = b.add("Add", [out, bias], suffix="bias").outputs[0]
        into += " → Add(DequantizeLinear(int32 bias, 1))"
    bound = _accumulator_bound(node, a_zp, w_zp, w_axis, pattern.bias)
    if bound is None and pattern.bias is not None:  # the products alone, then
        bound = _accumulator_bound(node, a_zp, w_zp, w_axis, None)
        bias_note = " plus a run-time bias"
    else:
        bias_note = ""
    node.name = names.fresh(f"{b.base}_replaced") if node.name else None
    b.node = pattern.cast
    b.commit()
    out.shape, out.type = pattern.cast.outputs[0].shape, pattern.cast.outputs[0].type
    pattern.cast.outputs[0].replace_all_uses_with(out)
    g = node.graph
    inputs = list(node.inputs)
    for n in (pattern.cast, pattern.add, node):
        if n is not None:
            g.remove(n, safe=True)
    drop_if_unused(inputs)
    if bound is not None and bound < 2**24 and not bias_note:
        exact = f"exact: every partial sum is at most {bound} < 2**24"
    else:
        exact = "exact while partial sums stay below 2**24" + (
            "" if bound is None else f" (products at most {bound}{bias_note})")
    return into + f" → the original Mul by the scale product ({exact})"


def _accumulator_bound(node: ir.Node, a_zp: ir.Value | None, w_zp: ir.Value | None,
                       w_axis: int | None, bias: ir.Value | None) -> int | None:
    """The largest |partial sum| any input can give: every activation code at its
    farthest from its zero point times the sum of |w - w_zp| of one output (plus |bias|);
    None when the weight or a zero point is not constant."""
    w = graph.constant_array(node.inputs[1])
    if w is None:
        return None
    azp = graph.constant_array(a_zp) if a_zp is not None else np.zeros((), np.int64)
    wzp = graph.constant_array(w_zp) if w_zp is not None else np.zeros((), np.int64)
    if wzp is None:
        return None
    a_type = graph.elem_type(node.inputs[0]) or "uint8"
    lo, hi = (-128, 127) if a_type == "int8" else (0, 255)
    # A run-time zero point (DynamicQuantizeLinear's) lies in the code range too.
    a_far = 255 if azp is None else \
        int(max(abs(lo - int(np.min(azp))), abs(hi - int(np.max(azp)))))
    w64 = np.asarray(w, np.int64)
    z = np.asarray(wzp, np.int64)
    if w_axis is not None and z.size > 1:
        shape = [1] * w64.ndim
        shape[w_axis] = z.size
        z = z.reshape(shape)
    diff = np.abs(w64 - z.reshape(-1)[0] if z.size == 1 else w64 - z)
    # Sum over everything but the output axis (Conv: axis 0; MatMul: the last one).
    out_axis = 0 if node.op_type == "ConvInteger" else w64.ndim - 1
    per_out = diff.sum(axis=tuple(i for i in range(w64.ndim) if i != out_axis))
    bound = a_far * int(per_out.max(initial=0))
    if bias is not None:
        barr = graph.constant_array(bias)
        if barr is None:  # quantized at run time: its size is not known here
            return None
        bound += int(np.abs(np.asarray(barr, np.int64)).max(initial=0))
    return bound


@dataclass
class _Scaled:
    cast: ir.Node
    mul: ir.Node
    scale: ir.Value  # the Mul's scale input: a_scale·w_scale
    a_scale: ir.Value
    w_scale: ir.Value
    add: ir.Node | None = None  # an int32 bias Add between the integer op and the Cast
    bias: ir.Value | None = None


def _is_int32(value: ir.Value, depth: int = 0) -> bool:
    """int32 by its declaration, or by the Cast that makes it through shape-only ops
    (quantizers write no value_info for their run-time bias)."""
    t = graph.elem_type(value)
    if t is not None or depth > 4:
        return t == "int32"
    p = value.producer()
    if p is None:
        return False
    if p.op_type == "Cast":
        to = p.attributes.get("to")
        return to is not None and to.value == ir.DataType.INT32
    if p.op_type in ("Reshape", "Unsqueeze", "Squeeze", "Identity", "Expand") and p.inputs:
        return p.inputs[0] is not None and _is_int32(p.inputs[0], depth + 1)
    return False


def _only_use(value: ir.Value) -> ir.Node | None:
    uses = list(value.uses())
    if len(uses) != 1 or value.is_graph_output():
        return None
    return uses[0].node


def scaled_output(node: ir.Node) -> ir.Value:
    """The float value a MatMulInteger / ConvInteger stands for in onnxruntime's dynamic
    pattern (the output of its ``Mul`` by the scale product); ``Refused`` outside it."""
    return _scaled_pattern(node).mul.outputs[0]


def _scaled_pattern(node: ir.Node) -> _Scaled:
    why = ("its int32 output is not Cast to float and multiplied by a_scale·w_scale (as "
           "onnxruntime's dynamic quantization writes it): no scales to dequantize with")
    nxt = _only_use(node.outputs[0])
    add = bias = None
    if nxt is not None and nxt.op_type == "Add" and len(nxt.inputs) == 2:
        other = [v for v in nxt.inputs if v is not node.outputs[0]]
        if len(other) == 1 and other[0] is not None and _is_int32(other[0]):
            add, bias = nxt, other[0]
            nxt = _only_use(nxt.outputs[0])
    cast = nxt
    to = cast.attributes.get("to") if cast is not None else None
    if cast is None or cast.op_type != "Cast" or to is None or to.value != ir.DataType.FLOAT:
        raise Refused(why)
    mul = _only_use(cast.outputs[0])
    if mul is None or mul.op_type != "Mul" or len(mul.inputs) != 2:
        raise Refused(why)
    scale = [v for v in mul.inputs if v is not cast.outputs[0]]
    prod = scale[0].producer() if scale and scale[0] is not None else None
    if prod is None or prod.op_type != "Mul" or len(prod.inputs) != 2:
        raise Refused(why)
    a_src = node.inputs[0].producer() if node.inputs[0] is not None else None
    s0, s1 = prod.inputs
    a_scale = a_src.outputs[1] if a_src is not None and \
        a_src.op_type == "DynamicQuantizeLinear" else None
    if a_scale is None:
        a_scale = _static_activation_scale(node, s0, s1)
    if a_scale is s0:
        return _Scaled(cast, mul, scale[0], s0, s1, add, bias)
    if a_scale is s1:
        return _Scaled(cast, mul, scale[0], s1, s0, add, bias)
    if graph.constant_tensor(s1) is not None and graph.constant_tensor(s0) is not None:
        raise Refused(why + " (both scales are constants: which is the activation's is "
                      "not known)")
    raise Refused(why)


def _static_activation_scale(node: ir.Node, s0: ir.Value | None, s1: ir.Value | None
                             ) -> ir.Value | None:
    """Which of two constant scales belongs to the activation when it was quantized
    statically (onnxruntime's dynamic quantizer feeds a quantized Gather of a quantized
    embedding straight into MatMulInteger): the scale a DequantizeLinear of the same
    activation (or of the same weight, for the other one) uses; else the per-channel one is
    the weight's. None when the graph does not tell."""
    pair = {id(s0): s0, id(s1): s1}
    for operand, own in ((node.inputs[0], True), (node.inputs[1], False)):
        if operand is None:
            continue
        for use in operand.uses():
            dq = use.node
            if dq.op_type != "DequantizeLinear" or use.idx != 0 or len(dq.inputs) < 2:
                continue
            hit = pair.get(id(dq.inputs[1]))
            if hit is not None:
                return hit if own else (s1 if hit is s0 else s0)
    sizes = [graph.num_elements(graph.shape_of(s)) for s in (s0, s1)]
    if sizes[0] == 1 and sizes[1] not in (None, 1):
        return s0
    if sizes[1] == 1 and sizes[0] not in (None, 1):
        return s1
    return None


def _weight_axis(node: ir.Node, opdef: ops.OpDef, w_scale: ir.Value,
                 w_zp: ir.Value | None = None) -> int | None:
    """The weight's DequantizeLinear axis: where its scale (or, with ``w_zp``, its zero
    point: onnxruntime's MatMulInteger takes a per-column one beside one scale) has one
    value per output channel; None when per-tensor."""
    p = w_scale.producer()
    if p is not None and p.op_type == "DynamicQuantizeLinear":
        return None  # a second activation (QKᵀ), quantized at run time: one scale
    shape = graph.shape_of(w_scale)
    if shape is None:
        raise Refused("the shape of the weight scale is unknown")
    zshape = graph.shape_of(w_zp) if w_zp is not None else None
    if graph.num_elements(shape) == 1 and zshape is not None and \
            (graph.num_elements(zshape) or 1) > 1:
        shape = zshape
    if graph.num_elements(shape) == 1:
        return None
    if len(shape) != 1:
        raise Refused(f"a {list(shape)} weight scale (or zero point) has no "
                      "DequantizeLinear axis")
    wshape = graph.shape_of(node.inputs[1])
    if opdef.op == "ConvInteger":
        return 0
    if wshape is None:
        raise Refused("the weight's rank is unknown")
    return len(wshape) - 1
