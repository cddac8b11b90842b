"""The command that makes a fused node run on a target with limits of its own on
DequantizeLinear (DirectML, oneDNN Graph, opmx): found by trying, not guessed.

A target's limits are on the form of the DequantizeLinear a conversion makes (its codes'
type, blocked or per-axis, zero point or none, the opset) and on a few facts of its sizes
(a ragged last block, one block spanning the axis, a dimension's remainder by 4 or 8),
never on values. So a miniature of the node (its attributes and input types, small
shapes with those facts of the real ones) is converted by each candidate command in
turn, and the result linted against the target;
the first that leaves no error is the fix. Why: a fix worked out from the conversion's
rules said `upgrade --opset 21` for DirectML FL6.2, whose result still had the target's
errors (uint4 codes, blocks); a trial ran the suggested command and linted again.
Results are cached by the node's form: an LLM's hundreds of nodes are a few forms.
"""

from __future__ import annotations

import threading

import numpy as np
import onnx_ir as ir

from dqtool import graph, types
from dqtool.convert import ConversionRefused, downgrade, upgrade
from dqtool.errors import DqtoolError
from dqtool.families.fused import read
from dqtool.linting import targets
from dqtool.linting.context import ModelContext

_CACHE: dict[tuple, list[str]] = {}
_BUSY = threading.local()  # linting a miniature runs the fused hook again: not this


def clean_fixes(node: ir.Node, opsets: dict[str, int], model_opset: int, target: str
                ) -> list[str]:
    """Every one of ``upgrade --opset N``, the same with ``--per-axis``, and
    ``upgrade``/``downgrade --opset`` 20, 19, 17, 13 whose result lints without an error
    for ``target`` (as command lines, in backquotes), in that order."""
    if getattr(_BUSY, "on", False):
        return []
    key = (_form(node), _dims(node), model_opset, target)
    if key not in _CACHE:
        _BUSY.on = True
        try:
            _CACHE[key] = _search(node, opsets, model_opset, target)
        finally:
            _BUSY.on = False
    return _CACHE[key]


def common_fix(fixes: list[list[str]]) -> str | None:
    """The first command that makes every node of a model clean (each node's list from
    ``clean_fixes``): one command for the model, where the nodes' own first ones differ
    (a trial ran the first node's `upgrade --opset 21` and another still had the target's
    errors: it needed `--per-axis`). None when no command serves them all."""
    if not fixes:
        return None
    return next((c for c in fixes[0] if all(c in f for f in fixes[1:])), None)


def _form(node: ir.Node) -> tuple:
    attrs = tuple(sorted((k, str(a.value)) for k, a in node.attributes.items()
                         if k not in ("K", "N")))
    inputs = tuple((graph.elem_type(v), len(graph.shape_of(v) or ())) if v is not None
                   else None for v in node.inputs)
    return node.op_type, node.domain, attrs, inputs


def _small(d: int, block: int) -> int:
    """A length with ``d``'s facts along a quantized axis of ``block``-sized blocks: its
    remainder by the block (so by 4 and 8 too), one block or several, and the number of
    blocks modulo 8 (a blocked weight lowered to per-axis rows has blocks x the other axis
    rows, which a target may want a multiple of 4: two blocks stood for three, and the
    fix found for the miniature left the real model with 150 rows), in at most nine."""
    blocks = -(-d // block)
    small = blocks if blocks == 1 else 2 + (blocks - 2) % 8  # 9 blocks stay several
    return (small - 1) * block + (d % block or block)


def _dims(node: ir.Node) -> tuple[int, int] | None:
    """The miniature's (quantized axis, other axis) lengths, or None if unknown."""
    if node.op_type == "MatMulNBits":
        k, n, block = _attr(node, "K", 0), _attr(node, "N", 0), _attr(node, "block_size", 0)
        if k <= 0 or n <= 0 or block < 16:
            return None
        return _small(k, block), 8 + n % 8
    shape = graph.shape_of(graph.input_value(node, 0))
    if shape is None or len(shape) != 2 or not all(isinstance(d, int) for d in shape):
        return None
    qa = _attr(node, "quantize_axis", 1) % 2
    bits = _attr(node, "bits", 4)
    logical = list(shape)
    if graph.elem_type(node.inputs[0]) == "uint8" and bits in (2, 4):
        logical[-1] *= 8 // bits
    block = _attr(node, "block_size", 128)
    if block < 16:
        return None
    return _small(logical[qa], block), 8 + logical[1 - qa] % 8


def _candidates(model_opset: int) -> list[tuple[int, bool]]:
    need = max(21, model_opset)
    out = [(need, False), (need, True)]
    out += [(k, False) for k in (20, 19, 17, 13) if k != model_opset]
    return out


def _search(node: ir.Node, opsets: dict[str, int], model_opset: int, target: str
            ) -> list[str]:
    profile = targets.parse(target)
    clean = []
    for opset, per_axis in _candidates(model_opset):
        mini = _miniature(node, model_opset, opsets)
        if mini is None:
            return []
        verb = "upgrade" if opset >= model_opset else "downgrade"
        try:
            done = (upgrade if verb == "upgrade" else downgrade)(mini, opset,
                                                                per_axis=per_axis)
        except (ConversionRefused, DqtoolError, ValueError):
            continue
        if any(read.is_fused(n) for n in done.model.graph):
            continue  # kept as it is at this opset
        findings = targets.run(ModelContext("<fix>", done.model), profile)
        if not [f for f in findings if f.severity == "error"]:
            clean.append(f"`dqtool {verb} --opset {opset}{' --per-axis' if per_axis else ''}`")
    return clean


def _miniature(node: ir.Node, model_opset: int, opsets: dict[str, int]) -> ir.Model | None:
    """A model of one node of ``node``'s form: its attributes and input types, small
    shapes with the facts of the real ones (``_dims``), codes and scales that break no
    rule (None if the form is not one this knows)."""
    t = {i: graph.elem_type(v) for i, v in enumerate(node.inputs) if v is not None}
    dims = _dims(node)
    if dims is None:
        return None
    if node.op_type == "MatMulNBits":
        return _mini_matmul_nbits(node, t, dims, model_opset, opsets)
    return _mini_gather(node, t, dims, model_opset, opsets)


def _attr(node: ir.Node, name: str, default: int) -> int:
    a = node.attributes.get(name)
    return a.as_int() if a is not None else default


def _tensor(name: str, arr: np.ndarray, dtype: str | None) -> ir.Value:
    ir_type = types.by_name(dtype).ir_type if dtype else None
    t = ir.Tensor(arr, dtype=ir_type, name=name) if ir_type else ir.Tensor(arr, name=name)
    return ir.Value(name=name, const_value=t, type=ir.TensorType(t.dtype),
                    shape=ir.Shape(arr.shape))


def _np(dtype: str | None):
    return types.by_name(dtype or "float").dtype


def _model(node: ir.Node, inputs: list[ir.Value | None], graph_in: ir.Value,
           inits: list[ir.Value], out_type: str | None, model_opset: int,
           opsets: dict[str, int]) -> ir.Model:
    new = ir.Node(node.domain, node.op_type, inputs,
                  attributes=list(node.attributes.values()), name="n", version=node.version)
    new.outputs[0].name = "y"
    new.outputs[0].dtype = types.by_name(out_type or "float").ir_type
    g = ir.Graph([graph_in], [new.outputs[0]], nodes=[new], initializers=inits,
                 opset_imports={"": model_opset, node.domain: opsets.get(node.domain, 1)})
    return ir.Model(g, ir_version=10)


def _mini_matmul_nbits(node: ir.Node, t: dict, dims: tuple[int, int], model_opset: int,
                       opsets: dict[str, int]) -> ir.Model | None:
    bits, block = _attr(node, "bits", 4), _attr(node, "block_size", 0)
    if bits not in (2, 4, 8) or block & (block - 1) or 4 in t:
        return None  # a g_idx: fold is the way (said by the caller)
    k, n = dims
    kb = -(-k // block)
    a_type = t.get(0) or t.get(2) or "float"
    a = ir.Value(name="a", type=ir.TensorType(_ir_type(a_type)), shape=ir.Shape([1, k]))
    b = _tensor("b", np.ones((n, kb, block * bits // 8), np.uint8), "uint8")
    s_shape = (n * kb,) if len(graph.shape_of(node.inputs[2]) or (1,)) == 1 else (n, kb)
    s = _tensor("s", np.full(s_shape, 0.5, _np(t.get(2))), t.get(2))
    inputs: list[ir.Value | None] = [a, b, s]
    inits = [b, s]
    if 3 in t:
        if t[3] == "uint8":
            z = _tensor("z", np.ones((n, -(-kb * bits // 8)), np.uint8), "uint8")
        else:
            z = _tensor("z", np.full(s_shape, 1.0, _np(t[3])), t[3])
        inputs.append(z)
        inits.append(z)
    m = _model(node, inputs, a, inits, a_type, model_opset, opsets)
    only = next(iter(m.graph))
    only.attributes["K"], only.attributes["N"] = ir.AttrInt64("K", k), ir.AttrInt64("N", n)
    return m


def _mini_gather(node: ir.Node, t: dict, dims: tuple[int, int], model_opset: int,
                 opsets: dict[str, int]) -> ir.Model | None:
    bits, block = _attr(node, "bits", 4), _attr(node, "block_size", 128)
    if t.get(0) is None or t.get(2) is None:
        return None
    qa = _attr(node, "quantize_axis", 1) % 2
    q, other = dims
    rows, cols = (q, other) if qa == 0 else (other, q)
    s_shape = (-(-q // block), other) if qa == 0 else (other, -(-q // block))
    d_type = t[0]
    if d_type == "uint8":
        per = 8 // bits if bits in (2, 4, 8) else 1
        data = _tensor("d", np.full((rows, cols // per), 1, np.uint8), "uint8")
    else:
        data = _tensor("d", np.ones((rows, cols), _np(d_type)), d_type)
    s = _tensor("s", np.full(s_shape, 0.5, _np(t[2])), t[2])
    idx = ir.Value(name="i", type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([3]))
    inputs: list[ir.Value | None] = [data, idx, s]
    inits = [data, s]
    if 3 in t:
        if d_type == "uint8":
            per = 8 // bits if bits in (2, 4, 8) else 1
            z = _tensor("z", np.full((s_shape[0], -(-s_shape[1] // per)), 1, np.uint8),
                        "uint8")
        else:
            z = _tensor("z", np.ones(s_shape, _np(t[3])), t[3])
        inputs.append(z)
        inits.append(z)
    return _model(node, inputs, idx, inits, t[2], model_opset, opsets)


def _ir_type(name: str) -> ir.DataType:
    return types.by_name(name).ir_type
