"""Family (b): structure-aware mutations of a model's protobuf, drawn by hypothesis.

Each mutation breaks one rule a well-formed model keeps (or stretches a size); hypothesis
draws which, where and how much, and shrinks a failing draw to a minimal one.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from tools.fuzz import commands
from tools.fuzz.case import Case

REPO = Path(__file__).resolve().parents[2]
MODEL = "in/model.onnx"
MARK = b"QQFUZZQQ"  # replaced by invalid UTF-8 of the same length once serialized
BAD_UTF8 = b"\xff\xfe\xc3\x28\xa0\xa1\xe2\x28"


def _base_weight() -> onnx.ModelProto:
    """A per-axis int8 weight dequantized into a MatMul: the smallest realistic case."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.integers(-128, 127, (8, 4), dtype=np.int8), "W_q")
    s = numpy_helper.from_array(np.full(4, 0.05, np.float32), "W_scale")
    z = numpy_helper.from_array(np.zeros(4, np.int8), "W_zp")
    g = helper.make_graph(
        [helper.make_node("DequantizeLinear", ["W_q", "W_scale", "W_zp"], ["W"], axis=1,
                          name="W_DequantizeLinear"),
         helper.make_node("MatMul", ["X", "W"], ["Y"], name="MatMul_0")],
        "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 4])], [w, s, z])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


@functools.cache
def bases() -> dict[str, bytes]:
    found = {"weight": _base_weight().SerializeToString()}
    for name in ("ort_qdq_per_tensor", "dq21_int4_blocked_ragged", "dq_in_function",
                 "dq_in_if_subgraph", "dq_in_loop_body", "dq21_constant_nodes",
                 "ms_qdq_contrib", "opmx_int4_zp", "dq19_float8e4m3fn_fp16_scale"):
        found[name] = (REPO / "models" / f"{name}.onnx").read_bytes()
    return found


# -- the mutations: each takes the proto and a `draw` and changes the proto ----------------
def _all_graphs(m: onnx.ModelProto) -> list[onnx.GraphProto]:
    out = []

    def walk(g: onnx.GraphProto) -> None:
        out.append(g)
        for n in g.node:
            for a in n.attribute:
                if a.HasField("g"):
                    walk(a.g)
                for sub in a.graphs:
                    walk(sub)

    walk(m.graph)
    return out


def _tensors(m: onnx.ModelProto) -> list[onnx.TensorProto]:
    ts = []
    for g in _all_graphs(m):
        ts.extend(g.initializer)
        for n in g.node:
            for a in n.attribute:
                if a.HasField("t"):
                    ts.append(a.t)
    for f in m.functions:
        for n in f.node:
            for a in n.attribute:
                if a.HasField("t"):
                    ts.append(a.t)
    return ts


def _nodes(m: onnx.ModelProto) -> list[onnx.NodeProto]:
    ns = [n for g in _all_graphs(m) for n in g.node]
    ns += [n for f in m.functions for n in f.node]
    return ns


def _array(t: onnx.TensorProto) -> np.ndarray | None:
    """The tensor's values, if it is small and still consistent (an earlier mutation may
    have broken it: then it is left alone)."""
    if t.data_type == TensorProto.STRING or t.data_location == TensorProto.EXTERNAL:
        return None
    if any(d < 0 for d in t.dims) or int(np.prod(t.dims, dtype=object)) > 1 << 16:
        return None
    try:
        return numpy_helper.to_array(t)
    except Exception:
        return None


def _pick(draw, items, label=None):
    if not items:
        return None
    return items[draw(st.integers(0, len(items) - 1), label=label)]


def bad_utf8(m, draw):
    """An invalid-UTF-8 string where a name, type or text goes."""
    where = draw(st.sampled_from(["value", "node-name", "op_type", "domain", "attr-string",
                                  "doc", "metadata", "producer", "graph-name", "tensor-name",
                                  "string-tensor", "opset-domain", "input-name"]))
    mark = MARK.decode()
    if where == "value":  # one value's name everywhere it is used
        node = _pick(draw, [n for n in _nodes(m) if n.output])
        if node is None:
            return
        old = node.output[0]
        for g in _all_graphs(m):
            for n in g.node:
                n.input[:] = [mark if x == old else x for x in n.input]
                n.output[:] = [mark if x == old else x for x in n.output]
            for vi in [*g.output, *g.value_info]:
                if vi.name == old:
                    vi.name = mark
    elif where == "node-name":
        node = _pick(draw, _nodes(m))
        if node is not None:
            node.name = mark
    elif where == "op_type":
        node = _pick(draw, _nodes(m))
        if node is not None:
            node.op_type = mark
    elif where == "domain":
        node = _pick(draw, _nodes(m))
        if node is not None:
            node.domain = mark
    elif where == "attr-string":
        node = _pick(draw, _nodes(m))
        if node is not None:
            node.attribute.append(helper.make_attribute("note", mark))
    elif where == "doc":
        m.graph.doc_string = mark
    elif where == "metadata":
        m.metadata_props.add(key="k", value=mark)
    elif where == "producer":
        m.producer_name = mark
    elif where == "graph-name":
        m.graph.name = mark
    elif where == "tensor-name":
        t = _pick(draw, list(m.graph.initializer))
        if t is not None:
            old = t.name
            t.name = mark
            for n in m.graph.node:
                n.input[:] = [mark if x == old else x for x in n.input]
    elif where == "string-tensor":
        m.graph.initializer.append(helper.make_tensor("s", TensorProto.STRING, [1], [MARK]))
        m.graph.node.append(helper.make_node("Identity", ["s"], ["s_out"]))
        m.graph.output.append(helper.make_tensor_value_info("s_out", TensorProto.STRING, [1]))
    elif where == "opset-domain":
        m.opset_import.add(domain=mark, version=1)
    elif where == "input-name" and m.graph.input:
        old = m.graph.input[0].name
        m.graph.input[0].name = mark
        for n in m.graph.node:
            n.input[:] = [mark if x == old else x for x in n.input]


def payload(m, draw):
    """A tensor whose bytes disagree with its dims and type."""
    t = _pick(draw, _tensors(m))
    if t is None:
        return
    how = draw(st.sampled_from(["raw-short", "raw-long", "raw-odd", "dims-grow", "dims-huge",
                                "dims-negative", "dims-extra", "typed-count", "dims-zero"]))
    if t.data_location == TensorProto.EXTERNAL:
        how = draw(st.sampled_from(["dims-grow", "dims-huge", "dims-negative", "dims-extra"]))
    if how.startswith("raw") and not t.HasField("raw_data"):
        arr = _array(t)
        if arr is None:
            return
        t.CopyFrom(numpy_helper.from_array(arr, t.name))
    if how == "raw-short":
        t.raw_data = t.raw_data[: draw(st.integers(0, max(0, len(t.raw_data) - 1)))]
    elif how == "raw-long":
        t.raw_data = t.raw_data + b"\x01" * draw(st.integers(1, 64))
    elif how == "raw-odd":
        t.raw_data = t.raw_data + b"\x01"
    elif how == "dims-grow":
        if t.dims:
            t.dims[draw(st.integers(0, len(t.dims) - 1))] *= draw(st.integers(2, 1000))
        else:
            t.dims.append(draw(st.integers(2, 1000)))
    elif how == "dims-huge":
        big = draw(st.sampled_from([2**31, 2**40, 2**62, 2**63 - 1]))
        if t.dims:
            t.dims[0] = big
        else:
            t.dims.append(big)
    elif how == "dims-negative":
        if t.dims:
            t.dims[0] = draw(st.sampled_from([-1, -2, -(2**40)]))
        else:
            t.dims.append(-1)
    elif how == "dims-extra":
        t.dims.append(draw(st.integers(2, 7)))
    elif how == "dims-zero":
        t.dims.append(0)
    elif how == "typed-count":
        arr = _array(t)
        if arr is None:
            return
        t.ClearField("raw_data")
        t.data_type = TensorProto.INT32 if arr.dtype.kind in "iub" else TensorProto.FLOAT
        field = t.int32_data if t.data_type == TensorProto.INT32 else t.float_data
        field.extend([1] * draw(st.integers(0, 3)))


def data_type(m, draw):
    """UNDEFINED, unknown, or another known element type than the bytes were written for."""
    t = _pick(draw, _tensors(m))
    value = draw(st.sampled_from([0, 9999, -1, 8, 16, 17, 21, 22, 23, 24, 25, 26, 27, 28, 11,
                                  2**31 - 1]))
    where = draw(st.sampled_from(["tensor", "input", "output", "value_info", "cast-to"]))
    if where == "tensor" and t is not None:
        t.data_type = value
    elif where == "input" and m.graph.input:
        m.graph.input[0].type.tensor_type.elem_type = value
    elif where == "output" and m.graph.output:
        m.graph.output[0].type.tensor_type.elem_type = value
    elif where == "value_info":
        node = _pick(draw, [n for n in m.graph.node if n.output])
        if node is not None:
            m.graph.value_info.append(helper.make_tensor_value_info(node.output[0], 1, None))
            m.graph.value_info[-1].type.tensor_type.elem_type = value
    elif where == "cast-to":
        for n in _nodes(m):
            if n.op_type in ("DequantizeLinear", "QuantizeLinear"):
                n.attribute.append(helper.make_attribute("output_dtype", value))
                break


def input_shape(m, draw):
    """A graph input declaring a huge or negative shape (what check generates inputs for)."""
    dims = draw(st.sampled_from([[2**30], [2**20, 2**20], [2**40], [-1], [-(2**40)],
                                 [2**62, 2**62], [1, 2**31], [0]]))
    dtype = draw(st.sampled_from([TensorProto.INT8, TensorProto.FLOAT, TensorProto.UINT8]))
    how = draw(st.sampled_from(["existing", "dq-input"]))
    if how == "existing" and m.graph.input:
        vi = m.graph.input[0]
        vi.type.tensor_type.ClearField("shape")
        for d in dims:
            vi.type.tensor_type.shape.dim.add().dim_value = d
        return
    # A DequantizeLinear of a big graph input: a scale broadcast to all of it.
    m.graph.input.append(helper.make_tensor_value_info("BIG", dtype if dtype != 1 else 3,
                                                       dims))
    m.graph.initializer.append(numpy_helper.from_array(np.float32(0.5), "BIG_scale"))
    m.graph.node.append(helper.make_node("DequantizeLinear", ["BIG", "BIG_scale"], ["BIG_f"]))
    m.graph.output.append(helper.make_tensor_value_info("BIG_f", TensorProto.FLOAT, None))


def dangling(m, draw):
    node = _pick(draw, [n for n in _nodes(m) if n.input])
    if node is not None:
        node.input[draw(st.integers(0, len(node.input) - 1))] = "nowhere_" + str(
            draw(st.integers(0, 9)))


def duplicate(m, draw):
    how = draw(st.sampled_from(["node-output", "graph-output", "initializer", "input",
                                "input-initializer-type", "node-name", "function"]))
    g = m.graph
    if how == "node-output" and len(g.node) >= 2:
        a, b = draw(st.integers(0, len(g.node) - 1)), draw(st.integers(0, len(g.node) - 1))
        if g.node[a].output and g.node[b].output:
            g.node[b].output[0] = g.node[a].output[0]
    elif how == "graph-output" and g.output:
        g.output.append(g.output[0])
    elif how == "initializer" and g.initializer:
        g.initializer.append(g.initializer[0])
    elif how == "input" and g.input:
        g.input.append(g.input[0])
    elif how == "input-initializer-type" and g.initializer:
        t = g.initializer[0]
        g.input.append(helper.make_tensor_value_info(t.name, TensorProto.DOUBLE, [3, 3, 3]))
    elif how == "node-name" and len(g.node) >= 2:
        g.node[1].name = g.node[0].name
    elif how == "function" and m.functions:
        m.functions.append(m.functions[0])


def cycle(m, draw):
    """Nodes that read each other's outputs, in whatever order they are listed."""
    g = _pick(draw, [x for x in _all_graphs(m) if x.node])
    if g is None:
        return
    n = len(g.node)
    how = draw(st.sampled_from(["self", "pair", "reorder", "self-dq"]))
    if how == "self":
        node = g.node[draw(st.integers(0, n - 1))]
        if node.input and node.output:
            node.input[0] = node.output[0]
    elif how == "self-dq":
        g.node.append(helper.make_node("DequantizeLinear", ["loop", "loop_s"], ["loop"]))
        g.initializer.append(numpy_helper.from_array(np.float32(1.0), "loop_s"))
    elif how == "pair" and n >= 2:
        i, j = sorted(draw(st.lists(st.integers(0, n - 1), min_size=2, max_size=2,
                                    unique=True)))
        if g.node[i].input and g.node[j].output:
            g.node[i].input[0] = g.node[j].output[0]  # i reads j, and j (later) needs i
    if how == "reorder" or draw(st.booleans()):
        order = draw(st.permutations(list(range(n))))
        nodes = [onnx.NodeProto() for _ in range(n)]
        for k, src in enumerate(order):
            nodes[k].CopyFrom(g.node[src])
        del g.node[:]
        g.node.extend(nodes)


def opset(m, draw):
    value = draw(st.sampled_from([0, -1, -(2**40), 29, 1000, 2**62, 1, 9, 10]))
    how = draw(st.sampled_from(["set", "remove", "duplicate", "function"]))
    default = [o for o in m.opset_import if o.domain in ("", "ai.onnx")]
    if how == "set" and default:
        default[0].version = value
    elif how == "remove" and default:
        m.opset_import.remove(default[0])
    elif how == "duplicate":
        m.opset_import.add(domain="", version=value)
    elif how == "function":
        if m.functions:
            for o in m.functions[0].opset_import:
                if o.domain in ("", "ai.onnx"):
                    o.version = value
        elif default:
            default[0].version = value


def ir_version(m, draw):
    m.ir_version = draw(st.sampled_from([0, -1, 1, 2, 3, 4, 13, 14, 15, 100, 2**62]))


def recursive_function(m, draw):
    depth = draw(st.integers(1, 3))  # F0 -> F1 -> ... -> F0
    names = [f"F{i}" for i in range(depth)]
    for i, name in enumerate(names):
        callee = names[(i + 1) % depth]
        m.functions.append(helper.make_function(
            "fz", name, ["a"], ["b"], [helper.make_node(callee, ["a"], ["b"], domain="fz")],
            [helper.make_opsetid("", 21), helper.make_opsetid("fz", 1)]))
    m.opset_import.add(domain="fz", version=1)
    if m.graph.input:
        m.graph.node.append(helper.make_node("F0", [m.graph.input[0].name], ["rec"],
                                             domain="fz"))
        m.graph.output.append(helper.make_tensor_value_info("rec", TensorProto.FLOAT, None))


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:  # a length-delimited protobuf field
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def deep_subgraph(m, draw):
    """If nodes nested ``depth`` deep, a DequantizeLinear at the bottom. Built as bytes:
    past ~30 levels protobuf itself will not build (or parse) the message."""
    depth = draw(st.sampled_from([2, 10, 30, 40, 200]))
    s = numpy_helper.from_array(np.float32(0.5), "deep_s")
    q = numpy_helper.from_array(np.arange(4, dtype=np.int8), "deep_q")
    leaf = helper.make_graph([helper.make_node("DequantizeLinear", ["deep_q", "deep_s"],
                                               ["deep_0"])], "leaf", [],
                             [helper.make_tensor_value_info("deep_0", TensorProto.FLOAT,
                                                            [4])], [q, s])
    graph = leaf.SerializeToString()
    node_bytes = b""
    for level in range(1, depth + 1):
        out = f"deep_{level}"
        # only one branch goes deeper: the model grows with the depth, not 2^depth
        node = helper.make_node("If", ["deep_c"], [out], else_branch=leaf)
        then = helper.make_attribute("then_branch", leaf)
        then.ClearField("g")
        attr = then.SerializeToString() + _field(6, graph)  # AttributeProto.g = 6
        node_bytes = node.SerializeToString() + _field(5, attr)  # NodeProto.attribute = 5
        shell = helper.make_graph([], f"level{level}", [],
                                  [helper.make_tensor_value_info(out, TensorProto.FLOAT, [4])])
        graph = _field(1, node_bytes) + shell.SerializeToString()  # GraphProto.node = 1
    m.graph.initializer.append(numpy_helper.from_array(np.array(True), "deep_c"))
    m.graph.output.append(helper.make_tensor_value_info(f"deep_{depth}", TensorProto.FLOAT,
                                                        [4]))
    # The outermost If joins the main graph as bytes appended to the model: protobuf
    # merges a repeated occurrence of ModelProto.graph (7) into the graph.
    return _field(7, _field(1, node_bytes))


# A 10,000-node chain takes a minute or two to check on a busy machine: long campaigns
# only (see ``campaign.Campaign``).
CHAIN_LENGTHS = [10, 1000, 3000]
LONG_CHAIN_LENGTHS = [10, 1000, 3000, 10000]


def deep_chain(m, draw):
    """QuantizeLinear/DequantizeLinear alternating ``length`` times: depth in the graph."""
    length = draw(st.sampled_from(CHAIN_LENGTHS))
    m.graph.initializer.append(numpy_helper.from_array(np.float32(0.25), "ch_s"))
    m.graph.input.append(helper.make_tensor_value_info("ch_0", TensorProto.FLOAT, [4]))
    prev = "ch_0"
    for i in range(length):
        op = "QuantizeLinear" if i % 2 == 0 else "DequantizeLinear"
        m.graph.node.append(helper.make_node(op, [prev, "ch_s"], [f"ch_{i + 1}"]))
        prev = f"ch_{i + 1}"
    m.graph.output.append(helper.make_tensor_value_info(prev, TensorProto.FLOAT
                                                        if length % 2 == 0 else
                                                        TensorProto.UINT8, None))


def huge_scale(m, draw):
    """A scale or zero point declaring a broadcast far beyond its bytes."""
    node = _pick(draw, [n for n in m.graph.node if n.op_type == "DequantizeLinear"
                        and len(n.input) >= 2])
    if node is None:
        return
    name = node.input[1]
    dims = draw(st.sampled_from([[2**20, 2**20], [2**40], [1, 2**31]]))
    for t in m.graph.initializer:
        if t.name == name:
            del t.dims[:]
            t.dims.extend(dims)


MUTATIONS: dict[str, Callable] = {
    "bad-utf8": bad_utf8, "payload": payload, "data-type": data_type,
    "input-shape": input_shape, "dangling": dangling, "duplicate": duplicate, "cycle": cycle,
    "opset": opset, "ir-version": ir_version, "recursive-function": recursive_function,
    "deep-subgraph": deep_subgraph, "deep-chain": deep_chain, "huge-scale": huge_scale,
}


def serialize(m: onnx.ModelProto) -> bytes:
    return m.SerializeToString().replace(MARK, BAD_UTF8)


@st.composite
def cases(draw, kinds: list[str] | None = None) -> Case:
    base_name = draw(st.sampled_from(sorted(bases())), label="base")
    m = onnx.ModelProto()
    m.ParseFromString(bases()[base_name])
    chosen, tail = [], b""
    for _ in range(draw(st.integers(1, 2), label="mutations")):
        kind = draw(st.sampled_from(kinds or sorted(MUTATIONS)), label="kind")
        # protobuf may refuse a value (a dim past int64): that mutation is then dropped
        with contextlib.suppress(ValueError):
            tail += MUTATIONS[kind](m, draw) or b""  # bytes a message too deep to build needs
        chosen.append(kind)
    argv = draw(st.sampled_from(commands.for_model(MODEL)), label="command")
    return Case("structure", "+".join(chosen) + f"@{base_name}", argv,
                {MODEL: serialize(m) + tail})
