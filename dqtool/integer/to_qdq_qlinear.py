"""The rewrite to QDQ of the integer operators that carry their scales as inputs: the
QLinear* operators (ai.onnx and com.microsoft, with QAttention and QEmbedLayerNormalization)
become DequantizeLinear on each quantized input → the float operator → QuantizeLinear;
MatMulIntegerToFloat and DynamicQuantizeMatMul become DequantizeLinear ×2 → MatMul (→ Add).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from dqtool import graph, types
from dqtool.families.integer import describe, ops, pool
from dqtool.families.integer.rewrite import Refused
from dqtool.integer.to_qdq_build import FLOAT, QdqBuilder
from dqtool.names import Names


def rewrite_qlinear(node: ir.Node, opdef: ops.OpDef, opsets: dict[str, int],
                    names: Names) -> str:
    """A QLinear* operator (or QAttention / QEmbedLayerNormalization) as DequantizeLinear
    on each quantized input → its float operator → QuantizeLinear on the output (none when
    the output is float); says into what."""
    b = QdqBuilder(node, names, opsets)
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
        n_dq = sum(1 for n in b.nodes if n.op_type == "DequantizeLinear")
        node.name = names.fresh(f"{b.base}_replaced") if node.name else None
        b.finish(list(node.outputs), list(f.outputs))
        where = f"{opdef.float_domain} " if opdef.float_domain else ""
        return f"DequantizeLinear ×{n_dq} → {where}{f.op_type}"
    y_zp = _zero_point(b, graph.input_value(node, out.zero_point), node.outputs[0]) \
        if out.zero_point is not None else None
    q = b.add("QuantizeLinear", [f.outputs[0], y_scale, y_zp], suffix="QuantizeLinear",
              out_type=None)
    node.name = names.fresh(f"{b.base}_replaced") if node.name else None
    n_dq = sum(1 for n in b.nodes if n.op_type == "DequantizeLinear")
    b.finish([node.outputs[0]], [q.outputs[0]])
    return f"DequantizeLinear ×{n_dq} → {f.op_type} → QuantizeLinear"


def _reduce_axes(b: QdqBuilder, node: ir.Node) -> tuple[list[ir.Value | None], list[ir.Attr]]:
    """QLinearReduceMean's ``axes`` as ReduceMean takes them from opset 18: refused."""
    raise Refused("ReduceMean takes its axes as an input from opset 18; not rewritten")


def _bias(b: QdqBuilder, node: ir.Node, opdef: ops.OpDef, slots: tuple[ops.Slot, ...],
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

def rewrite_dynamic(node: ir.Node, opdef: ops.OpDef, opsets: dict[str, int],
                    names: Names) -> str:
    """MatMulIntegerToFloat as DequantizeLinear ×2 → MatMul, DynamicQuantizeMatMul as
    DynamicQuantizeLinear → DequantizeLinear ×2 → MatMul (each → Add of its float bias);
    says into what."""
    b = QdqBuilder(node, names, opsets)
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


def _zero_point(b: QdqBuilder, zp: ir.Value | None, like: ir.Value | None) -> ir.Value | None:
    """An explicit zero point for QuantizeLinear when the op's is absent: QuantizeLinear
    without one produces uint8, and the op's output may be int8."""
    if zp is not None:
        return zp
    t = graph.elem_type(like)
    if t in (None, "uint8"):
        return None
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
    """The float operator's attributes: the integer operator's without those it alone
    has, adjusted where the two differ (Softmax's opset, the pool's overhang, QGemm's
    alpha on C); ``Refused`` where they cannot be made to agree."""
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
