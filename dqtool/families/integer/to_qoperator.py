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
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from dqtool import graph
from dqtool.families.integer.describe import value_shape, value_type
from dqtool.families.integer.rewrite import (
    Change,
    Names,
    Outcome,
    drop_if_unused,
    make_constant,
)

MS = "com.microsoft"
_ELEMENTWISE = {"Add": "QLinearAdd", "Mul": "QLinearMul", "Sigmoid": "QLinearSigmoid",
                "LeakyRelu": "QLinearLeakyRelu", "AveragePool": "QLinearAveragePool",
                "GlobalAveragePool": "QLinearGlobalAveragePool", "Softmax": "QLinearSoftmax",
                "ReduceMean": "QLinearReduceMean", "Concat": "QLinearConcat",
                "Where": "QLinearWhere"}
_FUSED = {"Conv", "MatMul", "Gemm", *_ELEMENTWISE}


@dataclass
class _Dq:
    """A DequantizeLinear input: its quantized value, scale, zero point and axis."""

    node: ir.Node
    x: ir.Value
    scale: ir.Value
    zp: ir.Value | None
    axis: int | None  # None when per-tensor

    @property
    def const(self) -> bool:
        return graph.constant_tensor(self.x) is not None and \
            graph.constant_tensor(self.scale) is not None and \
            (self.zp is None or graph.constant_tensor(self.zp) is not None)


class QdqToIntegerPass(ir.passes.InPlacePass):
    """Fuses DQ → op → Q into integer operators; ``outcome.changes`` lists each fusion."""

    def __init__(self) -> None:
        super().__init__()
        self.outcome = Outcome()

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        names = Names(model)
        used_ms = False
        for site in list(graph.walk(model)):
            node = site.node
            if node.graph is None:
                continue
            if node.domain == MS and node.op_type in _BLOCKS:
                fused = _fuse_block(node, names)
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


# The Q/DQ domains whose nodes fuse (onnxruntime's selectors take both), and the types the
# integer operators take (8-bit; an int32 bias is checked on its own).
_QDQ_DOMAINS = frozenset({*graph.DEFAULT_DOMAINS, MS})
_EIGHT_BIT = frozenset({"int8", "uint8"})


def _dq(value: ir.Value | None, types: frozenset[str] = _EIGHT_BIT) -> _Dq | None:
    p = value.producer() if value is not None else None
    if p is None or p.op_type != "DequantizeLinear" or p.domain not in _QDQ_DOMAINS:
        return None
    known = value_type(p.inputs[0]) or value_type(graph.input_value(p, 2))
    if known is not None and known not in types:  # unknown: the zero point would say
        return None
    if len(p.inputs) < 2 or p.inputs[1] is None or "block_size" in p.attributes:
        return None
    shape = value_shape(p.inputs[1])
    if shape is None:
        return None
    axis = None
    if graph.num_elements(shape) != 1:
        if len(shape) != 1:
            return None
        rank = graph.shape_of(p.inputs[0])
        a = p.attributes.get("axis")
        axis = a.value if a is not None else 1
        if axis < 0 and rank is not None:
            axis += len(rank)
    zp = graph.input_value(p, 2)
    return _Dq(p, p.inputs[0], p.inputs[1], zp, axis)


def _q_after(node: ir.Node) -> ir.Node | None:
    out = node.outputs[0]
    uses = list(out.uses())
    if len(uses) != 1 or out.is_graph_output():
        return None
    q = uses[0].node
    if q.op_type != "QuantizeLinear" or q.domain not in _QDQ_DOMAINS:
        return None
    if value_type(graph.input_value(q, 2)) not in (None, *_EIGHT_BIT):
        return None
    if len(q.inputs) < 2 or graph.num_elements(graph.shape_of(q.inputs[1])) != 1:
        return None
    if "output_dtype" in q.attributes or "block_size" in q.attributes:
        return None
    return q


def _dynamic_source(d: _Dq, codes_only: bool = False) -> bool:
    """Codes, scale and zero point from one DynamicQuantizeLinear (``codes_only``: the
    codes and zero point, the scale being the exact form's 1)."""
    p = d.x.producer()
    return (p is not None and p.op_type == "DynamicQuantizeLinear" and d.axis is None
            and (codes_only or d.scale is p.outputs[1])
            and (d.zp is None or d.zp is p.outputs[2]))


def _gathered(d: _Dq) -> bool:
    """A per-tensor activation gathered from a constant quantized table (onnxruntime's
    dynamic quantizer quantizes an embedding statically and feeds the Gather's codes
    straight into MatMulInteger): its constant scale plays the run-time one's part."""
    p = d.x.producer()
    return (p is not None and p.op_type == "Gather" and d.axis is None and bool(p.inputs)
            and graph.constant_tensor(p.inputs[0]) is not None
            and graph.constant_tensor(d.scale) is not None)


def _try_fuse(node: ir.Node, opsets: dict[str, int], names: Names
              ) -> tuple[str, str] | None:
    """(domain of the new op, what was done), or None when the node is not fusable."""
    ins = list(node.inputs)
    if node.op_type in ("MatMul", "Conv"):
        if len(ins) < 2:
            return None
        a, w = _dq(ins[0]), _dq(ins[1])
        if a is None or w is None or a.axis is not None:
            return None
        # A second activation (QKᵀ, attention · V) fuses into QLinearMatMul when it is
        # per-tensor; a weight may be per output channel.
        second_activation = not w.const and node.op_type == "MatMul" and w.axis is None
        if not w.const and not second_activation:
            return None
        if w.axis is not None and w.axis != _weight_axis(node, w):
            return None
        q = _q_after(node)
        if q is not None:
            return _fuse_static(node, a, w, q, names)
        if len(ins) != 2:
            return None
        if _unit(a) and _unit(w) and (_dynamic_source(a, codes_only=True) or _gathered(a)) \
                and (w.const or _dynamic_source(w, codes_only=True)):
            exact = _fuse_exact(node, a, w, names)
            if exact is not None:
                return exact
        if (_dynamic_source(a) or _gathered(a)) and (w.const or _dynamic_source(w)):
            return _fuse_dynamic(node, a, w, names)
        return None
    if node.op_type == "Gemm":
        return _fuse_gemm(node, names)
    q = _q_after(node)
    if q is None:
        return None
    return _fuse_elementwise(node, q, opsets, names)


def _weight_axis(node: ir.Node, w: _Dq) -> int | None:
    if node.op_type == "Conv":
        return 0
    shape = graph.shape_of(w.x)
    return None if shape is None else len(shape) - 1


class _Emit:
    """New nodes for one fusion, inserted before the float op; nothing changes before
    ``replace``."""

    def __init__(self, node: ir.Node, names: Names) -> None:
        self.node, self.names, self.graph = node, names, node.graph
        self.base = node.name or node.op_type
        self.new: list[ir.Node] = []
        self.initializers: list[ir.Value] = []

    def add(self, domain: str, op: str, inputs: list[ir.Value | None], attrs=(),
            name: str | None = None, n_out: int = 1) -> ir.Node:
        n = ir.Node(domain, op, inputs, list(attrs), num_outputs=n_out,
                    name=name if name is not None else self.names.fresh(f"{self.base}/{op}"))
        for o in n.outputs:
            o.name = self.names.fresh(f"{self.base}/{op}_output")
        self.new.append(n)
        return n

    def zero(self, like: ir.Value) -> ir.Value:
        from dqtool import types

        t = graph.elem_type(like) or "uint8"
        value, cnode = make_constant(self.graph, self.names, f"{self.base}/zero_point",
                                     np.zeros((), types.by_name(t).dtype))
        if cnode is not None:
            self.new.append(cnode)
        else:
            self.initializers.append(value)
        return value

    def replace(self, old: ir.Value, new: ir.Value, removed: list[ir.Node]) -> None:
        for v in self.initializers:
            self.graph.register_initializer(v)
        self.graph.insert_before(self.node, self.new)
        new.type, new.shape = old.type, old.shape
        was_output, name = old.is_graph_output(), old.name
        old.replace_all_uses_with(new, replace_graph_outputs=True)
        if was_output:
            old.name = self.names.fresh(f"{name}_replaced")
            new.name = name
        detached: list[ir.Value | None] = []
        for n in removed:
            detached += list(n.inputs)
        for n in removed:
            self.graph.remove(n, safe=True)
        drop_if_unused(detached)


def _name_of(node: ir.Node, names: Names) -> str:
    """The fused op takes the float op's name (the integer op's, after a round trip)."""
    name = node.name or names.fresh(node.op_type)
    node.name = names.fresh(f"{name}_fused")
    return name


def _zp(e: _Emit, d: _Dq) -> ir.Value:
    return d.zp if d.zp is not None else e.zero(d.x)


def _bias_ok(b: _Dq, a: _Dq, w: _Dq) -> bool:
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


def _fuse_static(node: ir.Node, a: _Dq, w: _Dq, q: ir.Node, names: Names) -> tuple[str, str]:
    e = _Emit(node, names)
    ins = list(node.inputs)
    bias = None
    if node.op_type == "Conv" and len(ins) > 2 and ins[2] is not None:
        b = _dq(ins[2], frozenset({"int32"}))
        if b is None or not _bias_ok(b, a, w):
            return None  # type: ignore[return-value]
        bias = b.x
    op = "QLinearConv" if node.op_type == "Conv" else "QLinearMatMul"
    y_zp = graph.input_value(q, 2)
    inputs = [a.x, a.scale, _zp(e, a), w.x, w.scale, _zp(e, w), q.inputs[1],
              y_zp if y_zp is not None else e.zero(q.outputs[0])]
    if bias is not None:
        inputs.append(bias)
    attrs = list(node.attributes.values()) if node.op_type == "Conv" else []
    f = e.add("", op, inputs, attrs, name=_name_of(node, names))
    e.replace(q.outputs[0], f.outputs[0], [q, node])
    return "", f"{op}"


def _dynamic_bias(node: ir.Node, a: _Dq, w: _Dq) -> tuple[ir.Node, _Dq, ir.Value] | None:
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
            dq.domain not in _QDQ_DOMAINS or len(dq.inputs) != 2 or dq.inputs[1] is None \
            or "block_size" in dq.attributes or \
            value_type(dq.inputs[0]) not in (None, "int32"):
        return None
    m = dq.inputs[1].producer()
    if m is None or m.op_type != "Mul" or m.domain != "" or len(m.inputs) != 2 or \
            {id(v) for v in m.inputs} != {id(a.scale), id(w.scale)}:
        return None
    return add, _Dq(dq, dq.inputs[0], dq.inputs[1], None, None), dq.inputs[1]


def _fuse_dynamic(node: ir.Node, a: _Dq, w: _Dq, names: Names) -> tuple[str, str]:
    e = _Emit(node, names)
    op = "ConvInteger" if node.op_type == "Conv" else "MatMulInteger"
    attrs = list(node.attributes.values()) if node.op_type == "Conv" else []
    with_bias = _dynamic_bias(node, a, w)
    base = _name_of(node, names)
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


def _unit(d: _Dq) -> bool:
    scale = graph.constant_array(d.scale)
    return scale is not None and bool(np.all(np.asarray(scale) == 1))


def _fuse_exact(node: ir.Node, a: _Dq, w: _Dq, names: Names) -> tuple[str, str] | None:
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
        b = _dq(other[0], frozenset({"int32"})) if len(other) == 1 else None
        if b is None or not _unit(b) or b.axis is not None or \
                (b.zp is not None and np.any(graph.constant_array(b.zp) != 0)):
            return None
        add, bias = nxt, b
        uses = list(nxt.outputs[0].uses())
        if len(uses) != 1 or nxt.outputs[0].is_graph_output():
            return None
        nxt = uses[0].node
    if nxt.op_type != "Mul" or len(nxt.inputs) != 2:
        return None
    e = _Emit(node, names)
    op = "ConvInteger" if node.op_type == "Conv" else "MatMulInteger"
    attrs = list(node.attributes.values()) if node.op_type == "Conv" else []
    base = _name_of(node, names)
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


# com.microsoft float blocks with a quantized twin: input positions of the float op that
# take a DequantizeLinear, and where the twin puts (value, scale, zero point) of each.
_BLOCKS = {
    "Attention": ("QAttention", {0: (0, 3, 6), 1: (1, 4, 7)}, 9),
    "EmbedLayerNormalization": ("QEmbedLayerNormalization",
                                {2: (2, 8, 13), 3: (3, 9, 14), 4: (4, 10, 15),
                                 5: (5, 11, 16), 6: (6, 12, 17)}, 18),
}


def _fuse_block(node: ir.Node, names: Names) -> tuple[str, str] | None:
    """DequantizeLinear → com.microsoft Attention / EmbedLayerNormalization (float out)
    ⇒ QAttention / QEmbedLayerNormalization, the form ``dqtool qdq`` writes them in: every
    quantized input 8-bit and per-tensor (a QAttention weight may be per column)."""
    op, where, width = _BLOCKS[node.op_type]
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
        d = _dq(v)
        per_column = node.op_type == "Attention" and i == 1
        if d is None or (d.axis is not None and not (per_column and d.axis == 1)):
            return None
        vi, si, zi = where[i]
        inputs[vi], inputs[si], inputs[zi] = d.x, d.scale, d.zp
    e = _Emit(node, names)
    n_out = len(node.outputs)
    f = e.add(MS, op, _trim_inputs(inputs), list(node.attributes.values()),
              name=_name_of(node, names), n_out=n_out)
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
    out = list(inputs)
    while out and out[-1] is None:
        out.pop()
    return out


def _fuse_gemm(node: ir.Node, names: Names) -> tuple[str, str] | None:
    ins = list(node.inputs)
    a, b = _dq(ins[0]), _dq(ins[1]) if len(ins) > 1 else None
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
        cd = _dq(ins[2], frozenset({"int32"}))
        if cd is None or not _bias_ok(cd, a, b) or (1.0 if beta is None else beta.value) \
                != alpha_v:
            return None
        c = cd.x
    q = _q_after(node)
    e = _Emit(node, names)
    inputs = [a.x, a.scale, _zp(e, a), b.x, b.scale, _zp(e, b), c]
    if q is not None:
        y_zp = graph.input_value(q, 2)
        inputs += [q.inputs[1], y_zp if y_zp is not None else e.zero(q.outputs[0])]
    attrs = [v for k, v in node.attributes.items() if k != "beta"]
    f = e.add(MS, "QGemm", inputs, attrs, name=_name_of(node, names))
    if q is not None:
        e.replace(q.outputs[0], f.outputs[0], [q, node])
    else:
        e.replace(node.outputs[0], f.outputs[0], [node])
    return MS, "QGemm"


def _fuse_elementwise(node: ir.Node, q: ir.Node, opsets: dict[str, int], names: Names
                      ) -> tuple[str, str] | None:
    op = _ELEMENTWISE[node.op_type]
    opset = graph.opset_of(opsets, "") or 0
    if op == "QLinearReduceMean" and opset >= 18:
        return None
    ins = list(node.inputs)
    quantized = range(1, len(ins)) if op == "QLinearWhere" else range(len(ins))
    dqs = {i: _dq(ins[i]) for i in quantized}
    if any(d is None or d.axis is not None for d in dqs.values()):
        return None
    e = _Emit(node, names)
    y_zp = graph.input_value(q, 2)
    y = [q.inputs[1], y_zp if y_zp is not None else e.zero(q.outputs[0])]
    triples: list[ir.Value | None] = []
    for i in quantized:
        d = dqs[i]
        triples += [d.x, d.scale, _zp(e, d)]
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
    f = e.add(MS, op, inputs, attrs, name=_name_of(node, names))
    e.replace(q.outputs[0], f.outputs[0], [q, node])
    return MS, op
