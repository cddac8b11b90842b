"""What validation checks of each node against its operator, when a model is loaded.

Two rules, for the operators whose definition dqtool knows (ai.onnx ones from onnx's
schemas; the com.microsoft and opmx ones a family owns from ``Family.attribute_types``):

- every attribute has the type the operator gives it: a ``group`` that is a STRING, an
  ``axis`` that is a FLOAT. Codecs, kernels and rewrites read attributes by their type;
  a wrong one failed deep inside them (``'<' not supported between 'str' and 'int'``) or,
  read as absent, silently meant the default;
- no string tensor (an initializer, a Constant, a graph input declared so) is an input
  where the operator takes numbers: a DequantizeLinear's scale, a MatMulInteger's zero
  point. NumPy holds strings as bytes, and every numeric step then failed differently.
  Other wrong element types (bool, complex) stay what they are, findings of the codecs.

Linear in the size of the protobuf and iterative, like ``validation`` (whose ``validate``
calls ``check`` last, so names, types and graphs are already known to be sound).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache

import onnx

from dqtool import registry
from dqtool.storage.invalid import Invalid

_ONNX_DOMAINS = ("", "ai.onnx")


@dataclass(frozen=True)
class _Rules:
    """What one operator (at one opset) allows."""

    attributes: Mapping[str, str]  # attribute name -> its ONNX attribute type name
    string_inputs: tuple[bool, ...]  # per formal input: may it be a string tensor
    variadic_strings: bool | None  # inputs past the formal ones (None: not variadic)

    def takes_strings(self, index: int) -> bool:
        if index < len(self.string_inputs):
            return self.string_inputs[index]
        # An input the operator does not define is not this rule's to judge.
        return True if self.variadic_strings is None else self.variadic_strings


@cache
def _rules(domain: str, op: str, version: int | None, generation: int) -> _Rules | None:
    """The rules of ``op`` of ``domain`` ("" for ai.onnx), None when dqtool does not know
    its definition (a custom operator may take strings and any attribute). ``generation``:
    the family registry's (``registry.generation``), so a family registered later counts."""
    if version is not None:
        try:
            schema = onnx.defs.get_schema(op, version, domain)
        except onnx.defs.SchemaError:
            schema = None
        if schema is not None:
            return _from_schema(schema)
    family = registry.owner(domain, op)
    if family is None or domain in _ONNX_DOMAINS:
        return None
    # dqtool's own operators of other domains read numbers through every input.
    return _Rules(family.attribute_types.get(op, {}), (), False)


def _from_schema(schema: onnx.defs.OpSchema) -> _Rules:
    constraints = {c.type_param_str: c.allowed_type_strs for c in schema.type_constraints}

    def strings(formal: onnx.defs.OpSchema.FormalParameter) -> bool:
        allowed = constraints.get(formal.type_str, [formal.type_str])
        return any("string" in t for t in allowed)

    inputs = tuple(strings(f) for f in schema.inputs)
    variadic = None
    if schema.inputs and schema.inputs[-1].option == \
            onnx.defs.OpSchema.FormalParameterOption.Variadic:
        variadic = inputs[-1]
    return _Rules({name: a.type.name for name, a in schema.attributes.items()}, inputs,
                  variadic)


def check(proto: onnx.ModelProto) -> None:
    """Raise ``Invalid`` for the first node that breaks a rule of its operator."""
    model_opsets = _opsets(proto.opset_import)
    # (nodes, opsets, names of string values in scope, where)
    todo: list[tuple[Iterable[onnx.NodeProto], dict[str, int], frozenset[str], str]] = [
        (proto.graph.node, model_opsets, _strings_of(proto.graph, frozenset()), "main graph")]
    todo += [(f.node, _opsets(f.opset_import), _strings_of(f, frozenset()),
              f"function '{f.name}'") for f in proto.functions]
    while todo:
        nodes, opsets, strings, where = todo.pop()
        for node in nodes:
            _node(node, opsets, strings, where)
            for a in node.attribute:
                for g in [a.g] if a.HasField("g") else a.graphs:
                    todo.append((g.node, opsets, _strings_of(g, strings),
                                 f"subgraph '{a.name}' of node '{_label(node)}' ({where})"))


def _opsets(imports: Iterable[onnx.OperatorSetIdProto]) -> dict[str, int]:
    return {"" if op.domain in _ONNX_DOMAINS else op.domain: op.version for op in imports}


def _label(node: onnx.NodeProto) -> str:
    return node.name or node.op_type


def _node(node: onnx.NodeProto, opsets: Mapping[str, int], strings: frozenset[str],
          where: str) -> None:
    domain = "" if node.domain in _ONNX_DOMAINS else node.domain
    rules = _rules(domain, node.op_type, opsets.get(domain), registry.generation())
    if rules is None:
        return
    op = node.op_type if not domain else f"{domain}:{node.op_type}"
    for a in node.attribute:
        want = rules.attributes.get(a.name)
        got = onnx.AttributeProto.AttributeType.Name(a.type)
        if want is not None and got != want:
            raise Invalid(f"{where}: node '{_label(node)}' ({op}): attribute '{a.name}' is "
                          f"{got}; {op} defines it as {want}")
    for i, name in enumerate(node.input):
        if name in strings and not rules.takes_strings(i):
            raise Invalid(f"{where}: node '{_label(node)}' ({op}) reads '{name}', a string "
                          f"tensor, as input {i}, where {op} takes numbers")


def _strings_of(holder: onnx.GraphProto | onnx.FunctionProto, outer: frozenset[str]
                ) -> frozenset[str]:
    """Names of the string tensors a graph (or function) defines, with those in scope."""
    names = set(outer)
    if isinstance(holder, onnx.GraphProto):
        names.update(t.name for t in holder.initializer
                     if t.data_type == onnx.TensorProto.STRING)
        names.update(vi.name for vi in holder.input
                     if vi.type.tensor_type.elem_type == onnx.TensorProto.STRING)
    for node in holder.node:
        if node.op_type == "Constant" and node.domain in _ONNX_DOMAINS and node.output \
                and any(a.name == "value_strings" or (
                    a.name == "value" and a.t.data_type == onnx.TensorProto.STRING)
                    for a in node.attribute):
            names.add(node.output[0])
    return frozenset(names)
