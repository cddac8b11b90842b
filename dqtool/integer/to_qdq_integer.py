"""The rewrite to QDQ of MatMulInteger / ConvInteger inside onnxruntime's dynamic pattern
(``scaled_pattern``): DequantizeLinear with the pattern's scales → the float MatMul / Conv in
place of the ``Mul`` by the scale product, or (``exact_dynamic``) DequantizeLinear with scale
1 → the float op → that ``Mul`` kept, with the bound that makes it exact.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from dqtool import graph
from dqtool.families.integer import ops
from dqtool.families.integer.rewrite import Refused, drop_if_unused
from dqtool.families.integer.scaled_pattern import scaled_pattern
from dqtool.integer.to_qdq_build import QdqBuilder
from dqtool.names import Names


def rewrite_integer(node: ir.Node, opdef: ops.OpDef, opsets: dict[str, int],
                    names: Names) -> str:
    """Only inside onnxruntime's pattern: int32 → [Add int32 bias →] Cast(float) →
    Mul(scale), where the scale is Mul(a_scale, w_scale) and a_scale is the activation's
    DynamicQuantizeLinear scale. An int32 bias (older quantizers quantize it at run time
    with the same scale) becomes DequantizeLinear(bias, scale) added after the float op."""
    pattern = scaled_pattern(node)
    a_slot, w_slot = opdef.inputs
    b = QdqBuilder(node, names, opsets)
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


def rewrite_integer_exact(node: ir.Node, opdef: ops.OpDef, opsets: dict[str, int],
                          names: Names) -> str:
    """The exact QDQ form of onnxruntime's dynamic pattern: DequantizeLinear with scale 1
    (the zero point subtracted, the codes as exact float integers) → the float op (sums of
    integer products, exact in float32 while every partial sum stays below 2**24) → the
    int32 bias as DequantizeLinear(bias, 1) added → the original's ``Mul`` by
    ``a_scale·w_scale``. The integer op and its ``Cast`` go; the ``Mul`` and the scale
    product stay as they were. Equal to ``Cast(acc) · scale`` bit for bit within that
    bound, which is reported (``docs/integer-ops.md``)."""
    pattern = scaled_pattern(node)
    a_slot, w_slot = opdef.inputs
    b = QdqBuilder(node, names, opsets)
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
