"""The fusions of QDQ into integer operators: DQ → Conv / MatMul → Q into QLinearConv /
QLinearMatMul; DynamicQuantizeLinear → DQ → MatMul / Conv into MatMulInteger / ConvInteger →
Cast → Mul (and ``qdq --exact-dynamic``'s form back); DQ → Gemm (→ Q) into QGemm; DQ → an
elementwise, pooling or reducing op → Q into its com.microsoft QLinear operator; DQ →
com.microsoft Attention / EmbedLayerNormalization into QAttention / QEmbedLayerNormalization.
Each returns (domain of the new op, what was done), or None when the node does not fuse.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from dqtool import graph
from dqtool.families.integer.describe import value_type
from dqtool.integer.to_qoperator_emit import FusionBuilder, name_of, zp_or_zero
from dqtool.integer.to_qoperator_match import MS, QDQ_DOMAINS, Dq, dq, q_after, unit
from dqtool.names import Names

# The float ops that fuse with a DQ on each input and a Q after, and their QLinear twins.
ELEMENTWISE = {"Add": "QLinearAdd", "Mul": "QLinearMul", "Sigmoid": "QLinearSigmoid",
               "LeakyRelu": "QLinearLeakyRelu", "AveragePool": "QLinearAveragePool",
               "GlobalAveragePool": "QLinearGlobalAveragePool", "Softmax": "QLinearSoftmax",
               "ReduceMean": "QLinearReduceMean", "Concat": "QLinearConcat",
               "Where": "QLinearWhere"}

# com.microsoft float blocks with a quantized twin: input positions of the float op that
# take a DequantizeLinear, and where the twin puts (value, scale, zero point) of each.
BLOCKS = {
    "Attention": ("QAttention", {0: (0, 3, 6), 1: (1, 4, 7)}, 9),
    "EmbedLayerNormalization": ("QEmbedLayerNormalization",
                                {2: (2, 8, 13), 3: (3, 9, 14), 4: (4, 10, 15),
                                 5: (5, 11, 16), 6: (6, 12, 17)}, 18),
}


def _bias_ok(b: Dq, a: Dq, w: Dq) -> bool:
    """An int32 bias DequantizeLinear whose scale is x_scale·w_scale (float32), zero point
    absent or 0: the form the integer op's bias has."""
    if graph.elem_type(b.x) != "int32" or graph.constant_tensor(b.x) is None:
        return False
    zp = graph.constant_array(b.zp) if b.zp is not None else None
    if b.zp is not None and (zp is None or np.any(zp != 0)):
        return False
    bs, xs, ws = (graph.constant_array(v) for v in (b.scale, a.scale, w.scale))
    if bs is None or xs is None or ws is None:
        return False
    want = (np.asarray(xs, np.float32).reshape(()) * np.asarray(ws, np.float32)).astype(
        np.float32).reshape(-1)
    got = np.asarray(bs, np.float32).reshape(-1)
    return got.shape == want.shape and bool(np.array_equal(got, want))


def fuse_static(node: ir.Node, a: Dq, w: Dq, q: ir.Node, names: Names) -> tuple[str, str]:
    """DQ(a), DQ(w) [, DQ(int32 bias)] → Conv / MatMul → Q ⇒ QLinearConv / QLinearMatMul;
    None when the bias is not the integer op's form."""
    e = FusionBuilder(node, names)
    ins = list(node.inputs)
    bias = None
    if node.op_type == "Conv" and len(ins) > 2 and ins[2] is not None:
        b = dq(ins[2], frozenset({"int32"}))
        if b is None or not _bias_ok(b, a, w):
            return None  # type: ignore[return-value]
        bias = b.x
    op = "QLinearConv" if node.op_type == "Conv" else "QLinearMatMul"
    y_zp = graph.input_value(q, 2)
    inputs = [a.x, a.scale, zp_or_zero(e, a), w.x, w.scale, zp_or_zero(e, w), q.inputs[1],
              y_zp if y_zp is not None else e.zero(q.outputs[0])]
    if bias is not None:
        inputs.append(bias)
    attrs = list(node.attributes.values()) if node.op_type == "Conv" else []
    f = e.add("", op, inputs, attrs, name=name_of(node, names))
    e.replace(q.outputs[0], f.outputs[0], [q, node])
    return "", f"{op}"


def _dynamic_bias(node: ir.Node, a: Dq, w: Dq) -> tuple[ir.Node, Dq, ir.Value] | None:
    """The float op's one use an ``Add`` of DQ(int32 bias, scale ``Mul(a_scale, w_scale)``,
    no zero point): ``dqtool qdq``'s form of a dynamic op whose int32 bias is added to the
    accumulator before the ``Cast`` (older onnxruntime quantizers write that). Returns the
    Add, the bias and the scale product."""
    out = node.outputs[0]
    uses = list(out.uses())
    if len(uses) != 1 or out.is_graph_output():
        return None
    add = uses[0].node
    other = [v for v in add.inputs if v is not out]
    if add.op_type != "Add" or add.domain != "" or len(add.inputs) != 2 or len(other) != 1:
        return None
    # Per-tensor activation and weight: the product is a scalar (its shape is rarely
    # inferred, so this is read from the Mul, not from the DequantizeLinear).
    dq = other[0].producer()
    if w.axis is not None or dq is None or dq.op_type != "DequantizeLinear" or \
            dq.domain not in QDQ_DOMAINS or len(dq.inputs) != 2 or dq.inputs[1] is None \
            or "block_size" in dq.attributes or \
            value_type(dq.inputs[0]) not in (None, "int32"):
        return None
    m = dq.inputs[1].producer()
    if m is None or m.op_type != "Mul" or m.domain != "" or len(m.inputs) != 2 or \
            {id(v) for v in m.inputs} != {id(a.scale), id(w.scale)}:
        return None
    return add, Dq(dq, dq.inputs[0], dq.inputs[1], None, None), dq.inputs[1]


def fuse_dynamic(node: ir.Node, a: Dq, w: Dq, names: Names) -> tuple[str, str]:
    """DynamicQuantizeLinear → DQ → MatMul / Conv [→ Add of an int32 bias DQ] ⇒
    MatMulInteger / ConvInteger [→ Add of the bias] → Cast → Mul by a_scale·w_scale."""
    e = FusionBuilder(node, names)
    op = "ConvInteger" if node.op_type == "Conv" else "MatMulInteger"
    attrs = list(node.attributes.values()) if node.op_type == "Conv" else []
    with_bias = _dynamic_bias(node, a, w)
    base = name_of(node, names)
    if with_bias is not None:  # the scale product the bias already uses
        scale = with_bias[2]
    else:
        scale = e.add("", "Mul", [a.scale, w.scale],
                      name=names.fresh(f"{base}_scales_mul")).outputs[0]
    integer = e.add("", op, [a.x, w.x, a.zp, w.zp], attrs, name=base)
    integer.outputs[0].dtype = ir.DataType.INT32
    acc = integer.outputs[0]
    if with_bias is not None:
        acc = e.add("", "Add", [acc, with_bias[1].x],
                    name=names.fresh(f"{base}_bias_add")).outputs[0]
        acc.dtype = ir.DataType.INT32
    cast = e.add("", "Cast", [acc], [ir.AttrInt64("to", ir.DataType.FLOAT)],
                 name=names.fresh(f"{base}_cast"))
    mul = e.add("", "Mul", [cast.outputs[0], scale], name=names.fresh(f"{base}_scaled"))
    if with_bias is None:
        e.replace(node.outputs[0], mul.outputs[0], [node])
        return "", f"{op} → Cast → Mul by a_scale·w_scale"
    e.replace(with_bias[0].outputs[0], mul.outputs[0], [with_bias[0], node])
    return "", f"{op} → Add of the int32 bias → Cast → Mul by a_scale·w_scale"



def fuse_exact(node: ir.Node, a: Dq, w: Dq, names: Names) -> tuple[str, str] | None:
    """``qdq --exact-dynamic``'s form back: DQ(scale 1) → MatMul / Conv [→ Add of an int32
    bias DQ(scale 1)] → Mul by the scale product ⇒ MatMulInteger / ConvInteger [→ Add of the
    int32 bias] → Cast → that Mul."""
    out = node.outputs[0]
    uses = list(out.uses())
    if len(uses) != 1 or out.is_graph_output():
        return None
    add, bias = None, None
    nxt = uses[0].node
    if nxt.op_type == "Add" and len(nxt.inputs) == 2:
        other = [v for v in nxt.inputs if v is not out]
        b = dq(other[0], frozenset({"int32"})) if len(other) == 1 else None
        if b is None or not unit(b) or b.axis is not None or \
                (b.zp is not None and np.any(graph.constant_array(b.zp) != 0)):
            return None
        add, bias = nxt, b
        uses = list(nxt.outputs[0].uses())
        if len(uses) != 1 or nxt.outputs[0].is_graph_output():
            return None
        nxt = uses[0].node
    if nxt.op_type != "Mul" or len(nxt.inputs) != 2:
        return None
    e = FusionBuilder(node, names)
    op = "ConvInteger" if node.op_type == "Conv" else "MatMulInteger"
    attrs = list(node.attributes.values()) if node.op_type == "Conv" else []
    base = name_of(node, names)
    integer = e.add("", op, [a.x, w.x, a.zp, w.zp], attrs, name=base)
    integer.outputs[0].dtype = ir.DataType.INT32
    acc = integer.outputs[0]
    if bias is not None:
        acc = e.add("", "Add", [acc, bias.x], name=names.fresh(f"{base}_bias")).outputs[0]
        acc.dtype = ir.DataType.INT32
    cast = e.add("", "Cast", [acc], [ir.AttrInt64("to", ir.DataType.FLOAT)],
                 name=names.fresh(f"{base}_cast"))
    last = add if add is not None else node
    e.replace(last.outputs[0], cast.outputs[0], [n for n in (add, node) if n is not None])
    return "", f"{op} → Cast (exact form: the Mul by the scale product kept)"



def fuse_gemm(node: ir.Node, names: Names) -> tuple[str, str] | None:
    """DQ(a), DQ(constant b) [, DQ(int32 C)] → Gemm (→ Q) ⇒ com.microsoft QGemm (float
    output without the Q); None when a is per-axis, b per-axis along its input axis or C
    not the form QGemm adds."""
    ins = list(node.inputs)
    a, b = dq(ins[0]), dq(ins[1]) if len(ins) > 1 else None
    if a is None or b is None or a.axis is not None or not b.const:
        return None
    trans_b = node.attributes.get("transB")
    if b.axis is not None and b.axis != (0 if trans_b is not None and trans_b.value else 1):
        return None
    alpha = node.attributes.get("alpha")
    beta = node.attributes.get("beta")
    alpha_v = 1.0 if alpha is None else alpha.value
    c = None
    if len(ins) > 2 and ins[2] is not None:
        cd = dq(ins[2], frozenset({"int32"}))
        if cd is None or not _bias_ok(cd, a, b) or (1.0 if beta is None else beta.value) \
                != alpha_v:
            return None
        c = cd.x
    q = q_after(node)
    e = FusionBuilder(node, names)
    inputs = [a.x, a.scale, zp_or_zero(e, a), b.x, b.scale, zp_or_zero(e, b), c]
    if q is not None:
        y_zp = graph.input_value(q, 2)
        inputs += [q.inputs[1], y_zp if y_zp is not None else e.zero(q.outputs[0])]
    attrs = [v for k, v in node.attributes.items() if k != "beta"]
    f = e.add(MS, "QGemm", inputs, attrs, name=name_of(node, names))
    if q is not None:
        e.replace(q.outputs[0], f.outputs[0], [q, node])
    else:
        e.replace(node.outputs[0], f.outputs[0], [node])
    return MS, "QGemm"



def fuse_elementwise(node: ir.Node, q: ir.Node, opsets: dict[str, int], names: Names
                     ) -> tuple[str, str] | None:
    """DQ on each quantized input → an op of ``ELEMENTWISE`` → Q ⇒ its com.microsoft
    QLinear twin; None when an input is not a per-tensor DQ (or ReduceMean takes its axes
    as an input)."""
    op = ELEMENTWISE[node.op_type]
    opset = graph.opset_of(opsets, "") or 0
    if op == "QLinearReduceMean" and opset >= 18:
        return None
    ins = list(node.inputs)
    quantized = range(1, len(ins)) if op == "QLinearWhere" else range(len(ins))
    dqs = {i: dq(ins[i]) for i in quantized}
    if any(d is None or d.axis is not None for d in dqs.values()):
        return None
    e = FusionBuilder(node, names)
    y_zp = graph.input_value(q, 2)
    y = [q.inputs[1], y_zp if y_zp is not None else e.zero(q.outputs[0])]
    triples: list[ir.Value | None] = []
    for i in quantized:
        d = dqs[i]
        triples += [d.x, d.scale, zp_or_zero(e, d)]
    if op == "QLinearConcat":
        inputs = [*y, *triples]
    elif op == "QLinearWhere":
        inputs = [ins[0], *triples, *y]
    else:
        inputs = [*triples, *y]
    attrs = list(node.attributes.values())
    if op in ("QLinearAveragePool", "QLinearGlobalAveragePool"):
        attrs.append(ir.AttrInt64("channels_last", 0))
    if op == "QLinearSoftmax":
        attrs.append(ir.AttrInt64("opset", opset))
    f = e.add(MS, op, inputs, attrs, name=name_of(node, names))
    e.replace(q.outputs[0], f.outputs[0], [q, node])
    return MS, op


def fuse_block(node: ir.Node, names: Names) -> tuple[str, str] | None:
    """DequantizeLinear → com.microsoft Attention / EmbedLayerNormalization (float out)
    ⇒ QAttention / QEmbedLayerNormalization, the form ``dqtool qdq`` writes them in: every
    quantized input 8-bit and per-tensor (a QAttention weight may be per column)."""
    op, where, width = BLOCKS[node.op_type]
    ins = list(node.inputs)
    if node.op_type == "Attention" and len(ins) > 5:
        return None  # attention_bias, past_sequence_length: QAttention has no such input
    if node.op_type == "EmbedLayerNormalization" and (len(ins) > 8 or len(node.outputs) > 2):
        return None  # position_ids, embedding_sum
    inputs: list[ir.Value | None] = [None] * width
    for i, v in enumerate(ins):
        if i not in where:
            if node.op_type == "Attention":  # bias 2, mask_index 3, past 4
                inputs[{2: 2, 3: 5, 4: 8}[i]] = v
            else:  # ids 0, segment ids 1, mask 7
                inputs[i] = v
            continue
        if v is None:
            continue
        d = dq(v)
        per_column = node.op_type == "Attention" and i == 1
        if d is None or (d.axis is not None and not (per_column and d.axis == 1)):
            return None
        vi, si, zi = where[i]
        inputs[vi], inputs[si], inputs[zi] = d.x, d.scale, d.zp
    e = FusionBuilder(node, names)
    n_out = len(node.outputs)
    f = e.add(MS, op, _trim_inputs(inputs), list(node.attributes.values()),
              name=name_of(node, names), n_out=n_out)
    for o in node.outputs[1:]:
        i = o.index() or 0
        f.outputs[i].type, f.outputs[i].shape = o.type, o.shape
        was_output, name = o.is_graph_output(), o.name
        o.replace_all_uses_with(f.outputs[i], replace_graph_outputs=True)
        if was_output:
            o.name = names.fresh(f"{name}_replaced")
            f.outputs[i].name = name
    e.replace(node.outputs[0], f.outputs[0], [node])
    return MS, op


def _trim_inputs(inputs: list[ir.Value | None]) -> list[ir.Value | None]:
    """``inputs`` without its trailing absent ones (an ONNX node's optional inputs)."""
    out = list(inputs)
    while out and out[-1] is None:
        out.pop()
    return out
