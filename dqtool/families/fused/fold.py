"""Folding MatMulNBits / GatherBlockQuantized: each is first rewritten exactly into its
ai.onnx form (``to_onnx``), then the fold pass folds the new DequantizeLinear like any
other (streamed in row chunks, ``--dtype`` applied), so the weights become float
initializers of a MatMul / Gather.

The new DequantizeLinear nodes carry the opset that defines them (``node.version``), so
they are read correctly in a model whose ai.onnx import is older; the fold removes them.
A float-zero-point weight keeps its small ``Add(-(zp·s))`` chain, computed at run time.

The fold's selection (``--op-types``, ``--include``/``--exclude``, ``--x-types``,
``--min-elements``) picks fused nodes too: a node it leaves is not rewritten at all. A fused
node "feeds" the float op it becomes (``MatMul`` / ``Gather``) and also answers to its own
op type; the new DequantizeLinear nodes of a selected node are folded whatever their names.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import onnx_ir as ir

from dqtool import cleanup, graph, types
from dqtool.families.fused import kernel, read, to_onnx
from dqtool.families.fused.surgery import FusedBuilder
from dqtool.folding.report import FoldedNode, rounding
from dqtool.names import Names
from dqtool.registry.family import FoldPrepared
from dqtool.spec import op_id

# The float op each fused op becomes once folded: what ``--op-types`` matches it by.
_BECOMES = {"MatMulNBits": "MatMul", "GatherBlockQuantized": "Gather"}


def why_not(selection: Any, node: ir.Node, spec: object) -> str | None:
    """None if the fold's ``selection`` (``dqtool.folding.selection.Selection``) picks this
    fused node, else the rule that leaves it (the fold's own wording)."""
    if selection is None:
        return None
    if selection.op_types:
        becomes = _BECOMES[node.op_type]
        if not {becomes, node.op_type} & set(selection.op_types):
            return (f"not selected: becomes {becomes}, not --op-types "
                    f"{','.join(selection.op_types)}")
    return replace(selection, op_types=()).why_not(node, spec)


def unfuse(model: ir.Model, selection: Any = None, store: np.dtype | None = None
           ) -> FoldPrepared:
    """Rewrite every fused node with a constant weight that ``selection`` picks; returns
    the names rewritten, (name, reason) of those left, the output names of the
    DequantizeLinear nodes made, which the fold must fold, and the nodes folded here (a
    ``FoldPrepared``). ``store``: the type of
    ``--dtype`` (None: keep). A MatMulNBits with float zero points is rewritten into its
    ai.onnx form (a DequantizeLinear of ``q·s`` and an Add chain of the offsets, computed
    in float32), whose DequantizeLinear the fold streams; only a ``--dtype`` narrower than
    float32 folds it here instead, into one weight of that type (rounding ``q·s`` to it
    before the offsets were added put weights near zero off by up to a quarter)."""
    fresh = Names(model)
    done: list[str] = []
    left: list[tuple[str, str]] = []
    made: list[str] = []
    folded: list[FoldedNode] = []
    shared: dict = {}  # weights two nodes share are folded once (to_onnx.rewrite)
    for site in list(graph.walk(model)):
        node = site.node
        if node.graph is None or not read.is_fused(node):
            continue
        spec = read.read(node, site.opsets)
        name = node.name or f"<unnamed {node.op_type}>"
        why = why_not(selection, node, spec)
        if why is not None:
            left.append((name, why))
            continue
        if spec.op == "MatMulNBits" and spec.zero_point == "float" and store is not None \
                and np.dtype(store) != np.float32:
            try:
                to_onnx.check(spec, 21)
            except to_onnx.NoExactForm as e:
                left.append((name, str(e)))
                continue
            old, weight = _fold_float_zero_points(node, spec, fresh, store,
                                                  site.function is not None)
            _drop(old)
            done.append(name)
            folded.append(_record(name, site.graph, spec, weight))
            continue
        version = max(to_onnx.needed_opset(spec), 21)
        try:
            # x unpacked: the fold reads codes, and x itself is never written
            old, _, _, new = to_onnx.rewrite(node, site.opsets, version, fresh,
                                             site.function is not None, unpacked=True,
                                             shared=shared)
        except to_onnx.NoExactForm as e:
            left.append((name, str(e)))
            continue
        for n in new:
            if n.op_type == "DequantizeLinear":
                n.version = version
                made.append(n.outputs[0].name)  # unique, unlike node names
        _drop(old)
        done.append(name)
    if not any(graph.domain_name(s.node.domain) == "com.microsoft" for s in graph.walk(model)):
        for holder in (model, *model.functions.values()):
            holder.opset_imports.pop("com.microsoft", None)
    return FoldPrepared(done, left, made, folded)


def _record(name: str, where: str, spec: Any, weight: ir.Value) -> FoldedNode:
    """The fold report's line for a node folded here (as the fold pass records its own)."""
    out = types.by_name(spec.float_type)
    store = types.from_ir(weight.dtype)
    assert store is not None
    n = 1
    for d in spec.x_shape:
        n *= int(d)
    return FoldedNode(
        name=name, graph=where, output=weight.name or "",
        op=op_id(spec.domain, spec.op, spec.version),
        quant_type=spec.quant_type, output_type=out.name, stored_type=store.name,
        shape=tuple(int(d) for d in spec.x_shape),
        bytes_quantized=graph.stored_bytes("uint8", spec.stored_shape),  # B, as the pass
        bytes_folded=(n * store.bits + 7) // 8,
        rounding=rounding(out, store))


def _fold_float_zero_points(node: ir.Node, spec: Any, fresh: Any, store: np.dtype | None,
                            in_function: bool) -> tuple[list[ir.Value], ir.Value]:
    """MatMulNBits with float zero points (HQQ) → Cast of one weight of ``store`` →
    MatMul (+ Add of the bias): the weight onnxruntime multiplies, ``q·s + (-(zp·s))`` in
    float32 (the kernel's, bit for bit: the ai.onnx form's Add chain computes the same),
    in A's type, cast once to ``store``. Computed whole when saved (not streamed: a weight
    of K x N takes ~13 bytes an element at its peak); behind its Cast or an Identity
    onnxruntime does not prepack it. Returns (the inputs the node no longer uses, the
    weight)."""
    a = graph.input_value(node, 0)
    bias = graph.input_value(node, 5)
    k, n = (int(d) for d in spec.x_shape)
    a_type = types.by_name(spec.float_type).ir_type
    out = a_type if store is None else types.from_dtype(store).ir_type
    attrs = {key: node.attributes[key].as_int() for key in ("bits", "block_size")}
    values = [graph.input_value(node, i) for i in (1, 2, 3)]

    def weight() -> np.ndarray:
        b_arr, s_arr, z_arr = (graph.constant_array(v) for v in values)
        w = kernel.dequantize_matmul_nbits(b_arr, s_arr, z_arr, K=k, N=n, **attrs)
        return w.astype(types.from_ir(out).dtype, copy=False)

    b = FusedBuilder(node, fresh, in_function, home=graph.input_value(node, 1))
    w = stored = b.constant("weight", out, (k, n), weight)
    if out != a_type:  # --dtype: stored narrower, A's type at run time
        w = b.op("Cast", [w], "cast", {"to": ir.AttrInt64("to", int(a_type))}, a_type, (k, n))
    else:  # a constant B onnxruntime would prepack, summing in another order (the fold
        # pass's prepack guard, as for the weights it folds itself)
        w = b.op("Identity", [w], "noprepack", dtype=a_type, shape=(k, n))
    y = b.op("MatMul", [a, w], "matmul", dtype=a.dtype)
    if bias is not None:
        y = b.op("Add", [y, bias], "bias", dtype=a.dtype)
    old = [v for v in node.inputs if v is not None]
    b.finish(y)
    return old, stored


def _drop(values: list[ir.Value]) -> None:
    """The replaced node's constants nothing uses now: initializers, and the Constant
    nodes that hold them in a function (they stayed there, unused)."""
    cleanup.remove_unused(values, producers=frozenset({"Constant"}))
