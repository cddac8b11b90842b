"""What a model file must be before any command reads it: checked once, where it is loaded.

Malformed models reach dqtool from byte flips, truncations and broken exporters. Each rule
here stops one that would otherwise fail deep inside onnx_ir, NumPy or a runtime with a
traceback, print several lines, or — worse — pass: names that are not UTF-8, tensors whose
bytes disagree with their dims and type, unknown element types, negative dims, values
defined twice or never, cycles (in any order of the nodes), opsets out of range, functions
that call themselves. Every check is linear in the size of the protobuf and none reads
external data (``loading`` checks its references) or recurses per node.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import onnx
import onnx_ir as ir
from google.protobuf.descriptor import FieldDescriptor

from dqtool.errors import InputError
from dqtool.storage import validation_nodes
from dqtool.storage.invalid import Invalid

MAX_OPSET = onnx.defs.onnx_opset_version()


def validate(path: Path, proto: onnx.ModelProto,
             in_file: Mapping[bytes, tuple[int, int]] | None = None) -> None:
    """Raise ``InputError`` naming ``path`` and the first rule the model breaks.
    ``in_file``: raw data left in the model's file (``inline_read``), mark → (offset,
    length); such a tensor's length is checked, not its bytes."""
    try:
        _text(proto)
        _versions(proto)
        for t, where in _tensors(proto):
            _tensor(t, where, in_file or {})
        _attributes(proto)
        _sparse(proto)
        _value_types(proto)
        _graphs(proto)
        _functions(proto)
        validation_nodes.check(proto)
    except Invalid as e:
        raise InputError(f"{path}: {e}") from None


# -- text ------------------------------------------------------------------------------------
def _text(proto: onnx.ModelProto) -> None:
    """Every string field is UTF-8 text (protobuf hands back ``bytes`` when it is not, and
    every consumer of names then fails differently). Iterative: depth is the file's."""
    stack: list[tuple[object, str]] = [(proto, "model")]
    while stack:
        msg, where = stack.pop()
        for field, value in msg.ListFields():  # type: ignore[attr-defined]
            if field.type == FieldDescriptor.TYPE_STRING:
                values = value if _repeated(field) else [value]
                if any(not isinstance(v, str) for v in values):
                    raise Invalid(f"{_describe(msg, where)}: field '{field.name}' is not valid "
                                  "UTF-8 text")
            elif field.type == FieldDescriptor.TYPE_MESSAGE:
                label = f"{where}.{field.name}"
                if _repeated(field):
                    stack.extend((m, label) for m in value)
                else:
                    stack.append((value, label))


def _repeated(field: FieldDescriptor) -> bool:
    return field.is_repeated


def _describe(msg: object, where: str) -> str:
    name = getattr(msg, "name", None)
    kind = type(msg).__name__.removesuffix("Proto").lower()
    if isinstance(name, str) and name:
        return f"{kind} '{name}'"
    return f"a {kind} ({where})"


# -- versions --------------------------------------------------------------------------------
def _versions(proto: onnx.ModelProto) -> None:
    if proto.ir_version > onnx.IR_VERSION:
        raise Invalid(f"IR version {proto.ir_version} is newer than dqtool knows (up to "
                      f"{onnx.IR_VERSION})")
    for imports, owner in [(proto.opset_import, ""),
                           *((f.opset_import, f"function {f.name} ") for f in proto.functions)]:
        seen: dict[str, int] = {}
        for op in imports:
            domain = "" if op.domain == "ai.onnx" else op.domain
            label = op.domain or "ai.onnx"
            if op.version <= 0:
                raise Invalid(f"{owner}declares {label} opset {op.version}, which does not "
                              "exist (opsets start at 1)")
            if not domain and op.version > MAX_OPSET:
                raise Invalid(f"{owner}imports ai.onnx opset {op.version}, newer than dqtool "
                              f"knows (up to {MAX_OPSET})")
            if seen.get(domain, op.version) != op.version:
                raise Invalid(f"{owner}imports {label} twice, as opsets {seen[domain]} and "
                              f"{op.version}")
            seen[domain] = op.version


# -- tensors ---------------------------------------------------------------------------------
def _bits(data_type: int) -> int | None:
    """Bits per element of an ONNX element type; None for strings; raises for unknown."""
    try:
        dtype = ir.DataType(data_type)
    except ValueError:
        raise Invalid(f"element type {data_type} is not an ONNX type") from None
    if dtype == ir.DataType.UNDEFINED:
        raise Invalid("element type 0 (UNDEFINED)")
    if dtype == ir.DataType.STRING:
        return None
    return dtype.bitwidth


def _tensors(proto: onnx.ModelProto) -> Iterator[tuple[onnx.TensorProto, str]]:
    """Every tensor the model holds, with where it is (iteratively: no recursion)."""
    graphs: list[tuple[onnx.GraphProto, str]] = [(proto.graph, "main graph")]
    node_lists = [(f.node, f"function '{f.name}'") for f in proto.functions]
    while graphs or node_lists:
        if graphs:
            g, where = graphs.pop()
            for t in g.initializer:
                yield t, f"initializer '{t.name}' ({where})"
            for st in g.sparse_initializer:
                yield st.values, f"sparse initializer '{st.values.name}' ({where})"
                yield st.indices, f"sparse initializer '{st.values.name}' indices ({where})"
            node_lists.append((g.node, where))
            continue
        nodes, where = node_lists.pop()
        for node in nodes:
            for a in node.attribute:
                at = f"attribute '{a.name}' of node '{node.name or node.op_type}' ({where})"
                if a.HasField("t"):
                    yield a.t, at
                for t in a.tensors:
                    yield t, at
                if a.HasField("sparse_tensor"):
                    yield a.sparse_tensor.values, at
                if a.HasField("g"):
                    graphs.append((a.g, f"subgraph '{a.name}' of node "
                                        f"'{node.name or node.op_type}'"))
                graphs.extend((g, f"subgraph '{a.name}' of node '{node.name or node.op_type}'")
                              for g in a.graphs)


# Which typed field holds each element type's values, and how many entries an element takes.
_TYPED = {
    onnx.TensorProto.FLOAT: ("float_data", 1), onnx.TensorProto.COMPLEX64: ("float_data", 2),
    onnx.TensorProto.DOUBLE: ("double_data", 1),
    onnx.TensorProto.COMPLEX128: ("double_data", 2),
    onnx.TensorProto.INT64: ("int64_data", 1), onnx.TensorProto.UINT32: ("uint64_data", 1),
    onnx.TensorProto.UINT64: ("uint64_data", 1), onnx.TensorProto.STRING: ("string_data", 1),
}


# The most elements dims may describe, counting only the dims that are not 0. A tensor with
# data is held to its bytes, but one with a 0 dim holds none whatever the others say, and
# NumPy refuses a shape whose product without its zeros, times the item size, passes 2^63
# ("array is too big"): [0, 2^63-1, 2^63-1] failed every command that made an array of it.
# 2^48 leaves room for every item size dqtool computes in (complex128: 16 bytes).
MAX_ELEMENTS = 1 << 48


def dims_problem(dims: Iterable[int]) -> str | None:
    """What is wrong with a shape's dims (negative, or too many elements), else None."""
    dims = list(dims)
    n = 1
    for d in dims:
        if d < 0:
            return f"has a negative dimension {d} (dims {dims})"
        n *= d or 1
    if n > MAX_ELEMENTS:
        return (f"has dims {dims}: more than 2^48 elements, leaving out the 0s (dqtool, "
                "and NumPy past its item size, take no more)")
    return None


def expected_bytes(t: onnx.TensorProto) -> int | None:
    """The bytes a tensor's dims and type need (packed types packed); None for strings.
    Raises ``Invalid`` for an unknown type, a negative dim or absurd dims."""
    bits = _bits(t.data_type)
    problem = dims_problem(t.dims)
    if problem is not None:
        raise Invalid(problem)
    n = 1
    for d in t.dims:
        n *= d
    return None if bits is None else (n * bits + 7) // 8


def _tensor(t: onnx.TensorProto, where: str,
            in_file: Mapping[bytes, tuple[int, int]]) -> None:
    try:
        need = expected_bytes(t)
    except Invalid as e:
        raise Invalid(f"{where} {e}") from None
    n = 1
    for d in t.dims:
        n *= d
    if t.data_location == onnx.TensorProto.EXTERNAL:
        return  # io checks the reference and its length against `need`
    if t.HasField("raw_data"):
        if need is None:
            raise Invalid(f"{where} is a string tensor with raw data")
        left = in_file.get(t.raw_data) if len(t.raw_data) < 64 else None
        have = left[1] if left is not None else len(t.raw_data)
        if have != need:
            raise Invalid(f"{where} holds {have} bytes; its dims {list(t.dims)} "
                          f"and type {_type_name(t.data_type)} need {need}")
        if left is not None:
            return  # the bytes are in the file, not here: their length is what counts
        bits = _bits(t.data_type) or 8
        used = n * bits % 8  # bits of the last byte that hold data
        # onnx_ir refuses 6-bit data whose unused last bits are set (when it unpacks it).
        if bits == 6 and used and t.raw_data[-1] & (0xFF << used) & 0xFF:
            raise Invalid(f"{where} has nonzero padding bits after its last "
                          f"{_type_name(t.data_type)} element")
        return
    field, per = _TYPED.get(t.data_type, ("int32_data", 1))
    have = len(getattr(t, field))
    bits = _bits(t.data_type) or 8
    # Types below 8 bits pack two (four) elements per int32_data entry.
    expected = {n * per} if bits >= 8 else {(n * bits + 7) // 8, n}
    if have not in expected:
        raise Invalid(f"{where} holds {have} values in {field}; its dims {list(t.dims)} and "
                      f"type {_type_name(t.data_type)} need {min(expected)}")


def _type_name(data_type: int) -> str:
    try:
        return onnx.TensorProto.DataType.Name(data_type).lower()
    except ValueError:
        return str(data_type)


_ATTRIBUTE_TYPES = frozenset(onnx.AttributeProto.AttributeType.values()) - {
    onnx.AttributeProto.UNDEFINED}


def _attributes(proto: onnx.ModelProto) -> None:
    """Every attribute says which kind of value it holds (onnx_ir cannot write one that
    does not: a byte flip in ``type`` would fail the save, not the load)."""
    nodes = [*proto.graph.node, *(n for f in proto.functions for n in f.node)]
    while nodes:
        node = nodes.pop()
        for a in node.attribute:
            if a.type not in _ATTRIBUTE_TYPES:
                raise Invalid(f"node '{node.name or node.op_type}': attribute '{a.name}' has "
                              f"type {a.type}, not an ONNX attribute type")
            for g in [a.g] if a.HasField("g") else a.graphs:
                nodes.extend(g.node)


def _sparse(proto: onnx.ModelProto) -> None:
    """No sparse tensor: onnx_ir (dqtool's graph library) reads none, so a sparse
    initializer would be left out of every model written (onnxruntime then refuses the
    output) and a sparse Constant fails to load; refused up front, with the way out."""
    graphs = [("main graph", proto.graph)]
    nodes = [n for f in proto.functions for n in f.node]
    while graphs or nodes:
        if graphs:
            where, g = graphs.pop()
            if g.sparse_initializer:
                raise Invalid(f"{where}: sparse initializer '{g.sparse_initializer[0].values.name}'"
                              ": dqtool does not read sparse tensors (store it dense and "
                              "run dqtool on that)")
            nodes.extend(g.node)
            continue
        node = nodes.pop()
        for a in node.attribute:
            if a.HasField("sparse_tensor") or a.sparse_tensors:
                raise Invalid(f"node '{node.name or node.op_type}': attribute '{a.name}' is a "
                              "sparse tensor: dqtool does not read sparse tensors (store it "
                              "dense and run dqtool on that)")
            for g in [a.g] if a.HasField("g") else a.graphs:
                graphs.append((f"subgraph '{a.name}' of node '{node.name or node.op_type}'", g))


def _value_types(proto: onnx.ModelProto) -> None:
    """Declared element types are ONNX types and declared dims are not negative."""
    graphs = [proto.graph]
    while graphs:
        g = graphs.pop()
        for vi in [*g.input, *g.output, *g.value_info]:
            _type_proto(vi.type, f"value '{vi.name}'")
        for node in g.node:
            for a in node.attribute:
                if a.HasField("g"):
                    graphs.append(a.g)
                graphs.extend(a.graphs)


def _type_proto(tp: onnx.TypeProto, where: str) -> None:
    # Iterative over sequence/optional/map nesting.
    stack = [tp]
    while stack:
        t = stack.pop()
        kind = t.WhichOneof("value")
        if kind in ("tensor_type", "sparse_tensor_type"):
            tt = getattr(t, kind)
            if tt.elem_type:
                try:
                    ir.DataType(tt.elem_type)
                except ValueError:
                    raise Invalid(f"{where} has element type {tt.elem_type}, which is not an "
                                  "ONNX type") from None
            for d in tt.shape.dim:
                if d.HasField("dim_value") and d.dim_value < 0:
                    raise Invalid(f"{where} declares a negative dimension {d.dim_value}")
            problem = dims_problem(d.dim_value for d in tt.shape.dim)
            if problem is not None:  # check would generate it (an input), and NumPy fail
                raise Invalid(f"{where} {problem.replace('has', 'declares', 1)}")
        elif kind == "sequence_type":
            stack.append(t.sequence_type.elem_type)
        elif kind == "optional_type":
            stack.append(t.optional_type.elem_type)
        elif kind == "map_type":
            stack.append(t.map_type.value_type)


# -- graphs ----------------------------------------------------------------------------------
def _reads(node: onnx.NodeProto) -> Iterator[str]:
    """The names a node reads: its inputs and, for a node holding subgraphs, the values of
    enclosing scopes its subgraphs read (onnx's implicit inputs)."""
    yield from (x for x in node.input if x)
    subgraphs = [g for a in node.attribute for g in ([a.g] if a.HasField("g") else a.graphs)]
    while subgraphs:
        g = subgraphs.pop()
        local = {x.name for x in g.input} | {t.name for t in g.initializer}
        local.update(s.values.name for s in g.sparse_initializer)
        for n in g.node:
            local.update(o for o in n.output if o)
        for n in g.node:
            yield from (x for x in n.input if x and x not in local)
            subgraphs.extend(sub for a in n.attribute
                             for sub in ([a.g] if a.HasField("g") else a.graphs))
        yield from (o.name for o in g.output if o.name not in local)


def _graphs(proto: onnx.ModelProto) -> None:
    todo: list[tuple[onnx.GraphProto, str, frozenset[str]]] = [
        (proto.graph, "main graph", frozenset())]
    while todo:
        g, where, outer = todo.pop()
        defined = _check_graph(g, where, outer)
        for node in g.node:
            for a in node.attribute:
                for sub in [a.g] if a.HasField("g") else a.graphs:
                    todo.append((sub, f"subgraph '{a.name}' of node "
                                      f"'{node.name or node.op_type}' ({where})",
                                 outer | defined))
    for f in proto.functions:
        _check_nodes(f.node, f"function '{f.name}'", set(f.input), frozenset(),
                     [o for o in f.output])


def _check_graph(g: onnx.GraphProto, where: str, outer: frozenset[str]) -> frozenset[str]:
    """Check one graph; return the names it defines."""
    inputs = [x.name for x in g.input]
    inits = [t.name for t in g.initializer] + [s.values.name for s in g.sparse_initializer]
    for names, what in ((inputs, "graph input"), (inits, "initializer")):
        seen: set[str] = set()
        for name in names:
            if name in seen:
                raise Invalid(f"{where}: {what} '{name}' is declared twice")
            seen.add(name)
    outputs = [o.name for o in g.output]
    if len(set(outputs)) != len(outputs):
        twice = next(o for o in outputs if outputs.count(o) > 1)
        raise Invalid(f"{where}: graph output '{twice}' is listed twice")
    return _check_nodes(g.node, where, set(inputs) | set(inits), outer, outputs)


def _check_nodes(nodes, where: str, given: set[str], outer: frozenset[str],
                 outputs: list[str]) -> frozenset[str]:
    """Every value defined once and read after it is defined somewhere; no cycle."""
    producer: dict[str, int] = {}
    for i, node in enumerate(nodes):
        for o in node.output:
            if not o:
                continue
            if o in producer or o in given:
                raise Invalid(f"{where}: value '{o}' is defined twice (node "
                              f"'{node.name or node.op_type}' makes it again)")
            producer[o] = i
    known = given | outer
    # Kahn's algorithm over the nodes: a node is ready once every value it reads is.
    waiting: list[int] = []
    readers: dict[int, list[int]] = {}
    for i, node in enumerate(nodes):
        deps = set()
        for x in _reads(node):
            if x in producer:
                deps.add(producer[x])
            elif x not in known:
                raise Invalid(f"{where}: node '{node.name or node.op_type}' reads '{x}', which "
                              "no node, input or initializer defines")
        waiting.append(len(deps))
        for d in deps:
            readers.setdefault(d, []).append(i)
    ready = [i for i, w in enumerate(waiting) if w == 0]
    done = 0
    while ready:
        i = ready.pop()
        done += 1
        for r in readers.get(i, ()):
            waiting[r] -= 1
            if waiting[r] == 0:
                ready.append(r)
    if done != len(nodes):
        stuck = next(nodes[i] for i, w in enumerate(waiting) if w > 0)
        raise Invalid(f"{where}: the nodes form a cycle (node '{stuck.name or stuck.op_type}' "
                      "depends on its own output)")
    for o in outputs:
        if o not in producer and o not in known:
            raise Invalid(f"{where}: graph output '{o}' is not defined by any node, input or "
                          "initializer")
    return frozenset(producer) | frozenset(given)


# -- functions -------------------------------------------------------------------------------
def _functions(proto: onnx.ModelProto) -> None:
    """Model-local functions are unique and never call themselves, directly or not."""
    keys = [(f.domain, f.name, f.overload) for f in proto.functions]
    if len(set(keys)) != len(keys):
        twice = next(k for k in keys if keys.count(k) > 1)
        raise Invalid(f"function '{twice[1]}' (domain '{twice[0]}') is defined twice")
    calls = {k: {(n.domain, n.op_type, n.overload) for n in f.node} & set(keys)
             for k, f in zip(keys, proto.functions, strict=True)}
    # Depth-first with an explicit stack: white/grey/black.
    state: dict[tuple, int] = dict.fromkeys(keys, 0)
    for start in keys:
        if state[start]:
            continue
        stack = [(start, iter(sorted(calls[start])))]
        state[start] = 1
        while stack:
            key, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                state[key] = 2
                stack.pop()
            elif state[nxt] == 1:
                raise Invalid(f"function '{nxt[1]}' calls itself (through "
                              f"{' → '.join(k[1] for k, _ in stack)} → {nxt[1]})")
            elif state[nxt] == 0:
                state[nxt] = 1
                stack.append((nxt, iter(sorted(calls[nxt]))))
