"""``check --against``: the weight each fused node of the original dequantizes, compared bit
for bit with the weight the checked model multiplies (or gathers from) in its place.

The checked model's weight is found through the fused node's output name: the same fused
op (kept, or packed back), or the ``MatMul`` (under an ``Add`` of the bias) / ``Gather``
that produces it, whose weight input is evaluated from constants with dqtool's reference
evaluator (a folded weight is read as it is).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from dqtool import graph, storage
from dqtool.errors import KernelError
from dqtool.evaluator import reference_evaluator
from dqtool.families.fused import kernel, read
from dqtool.kernel.dequantize import dequantize
from dqtool.kernel.evaluator import dtype_of_code


@dataclass(frozen=True)
class WeightComparison:
    node: str
    op: str
    status: str  # "bit-identical", "kept" (the same node, its weight computed), "differ",
    # "not found", "error" (the kernel cannot compute a weight: an invalid node)
    detail: str = ""

    @property
    def passed(self) -> bool:
        return self.status not in ("differ", "error")

    @property
    def same(self) -> bool:
        """The checked model computes this weight as the original does."""
        return self.status in ("bit-identical", "kept")

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "op": self.op, "status": self.status,
                "detail": self.detail}


def fused_weight(node: ir.Node) -> np.ndarray | None:
    """The dequantized weight of a fused node with constant inputs (MatMulNBits: (K, N);
    GatherBlockQuantized: the table), None if not constant."""
    spec = read.read(node, {})
    if not spec.constant or spec.errors:
        return None
    a = {k: v.as_int() for k, v in node.attributes.items()
         if v.type == ir.AttributeType.INT}
    def arr(v: ir.Value | None) -> np.ndarray | None:
        return None if v is None else storage.stored_values(v)

    if node.op_type == "MatMulNBits":
        return kernel.dequantize_matmul_nbits(
            arr(node.inputs[1]), arr(node.inputs[2]), arr(graph.input_value(node, 3)),
            K=a["K"], N=a["N"], bits=a.get("bits", 4), block_size=a["block_size"],
            g_idx=arr(graph.input_value(node, 4)))
    return kernel.dequantize_gather_block_quantized(
        arr(node.inputs[0]), arr(node.inputs[2]), arr(graph.input_value(node, 3)),
        quantize_axis=a.get("quantize_axis", 1), block_size=a.get("block_size", 128),
        bits=a.get("bits", 4))


def _in_memory(tensor: ir.TensorProtocol) -> ir.TensorProtocol:
    """Its values read on their own map (``storage.tensor_array``): asked for them,
    onnx_ir's tensor in a file keeps them as long as the model lives (a 1 GB model's check held 2 GB
    more by its last weight)."""
    if isinstance(tensor, ir.Tensor):
        return tensor
    return ir.Tensor(storage.tensor_array(tensor), dtype=tensor.dtype, name=tensor.name)


# DequantizeLinear domains whose evaluator operator is ``dqtool.kernel.dequantize`` with
# these attributes (``dqtool.kernel.evaluator``: ``Dq`` and ``MsDq``)
_KERNEL_DQ = {"": frozenset({"axis", "block_size", "output_dtype"}),
              "com.microsoft": frozenset({"axis"})}


def _one_dequantize(value: ir.Value) -> np.ndarray | None:
    """``value`` made by one DequantizeLinear of constants, through the kernel the reference
    evaluator would call for it, without serializing the weight into a model for it
    (2026-11-28: 19 of 30 s of the bench model's weight comparison went to building,
    packing and evaluating those models; docs/benchmarks.md); None for anything else."""
    p = value.producer()
    allowed = _KERNEL_DQ.get(p.domain if p is not None else "-")
    if p is None or p.op_type != "DequantizeLinear" or allowed is None \
            or not set(p.attributes) <= allowed or not 2 <= len(p.inputs) <= 3:
        return None
    arrays = []
    for v in p.inputs:
        if v is None:
            arrays.append(None)
        elif v.producer() is None and graph.constant_tensor(v) is not None:
            arrays.append(storage.stored_values(v))
        else:
            return None
    ints = {k: a.as_int() for k, a in p.attributes.items()}
    return dequantize(arrays[0], arrays[1], arrays[2] if len(arrays) > 2 else None,
                      axis=ints.get("axis", 1), block_size=ints.get("block_size", 0),
                      output_dtype=dtype_of_code(ints.get("output_dtype", 0)))


def _evaluate(value: ir.Value) -> np.ndarray | None:
    """A value computed from constants only, evaluated; None if it needs a graph input."""
    const = graph.constant_array(value)
    if const is not None:
        return const
    direct = _one_dequantize(value)
    if direct is not None:
        return direct
    nodes: list[ir.Node] = []
    inits: dict[str, ir.Value] = {}
    todo, seen = [value], set()
    while todo:
        v = todo.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        if graph.constant_tensor(v) is not None and v.producer() is None:
            inits[v.name] = v
            continue
        p = v.producer()
        if p is None or len(nodes) > 64:
            return None
        nodes.append(p)
        todo.extend(i for i in p.inputs if i is not None)
    order = [n for n in value.graph if n in nodes] if value.graph is not None else nodes

    protos = [ir.serde.serialize_node(n) for n in order]
    # with their bytes: a tensor in external data would be a file reference onnx's
    # evaluator cannot follow (it is given a model, not a path)
    tensors = [ir.serde.serialize_tensor(_in_memory(graph.constant_tensor(v)))
               for v in inits.values()]
    for t, name in zip(tensors, inits, strict=True):
        t.name = name
    g = onnx.helper.make_graph(protos, "w", [], [onnx.helper.make_tensor_value_info(
        value.name, onnx.TensorProto.UNDEFINED, None)], initializer=tensors)
    opsets = [onnx.helper.make_opsetid(d, v) for d, v in
              (value.graph.opset_imports.items() if value.graph is not None else [])]
    m = onnx.helper.make_model(g, opset_imports=opsets or [onnx.helper.make_opsetid("", 21)])
    evaluator = reference_evaluator(m)
    try:
        return evaluator.run(None, {})[0]
    finally:
        # The evaluator's objects form cycles, freed only when the collector runs: its
        # arrays (a weight's codes, unpacked) are freed now (2026-11-28: 280 MB of them
        # were still held after the 4-layer bench model's comparison).
        evaluator.rt_inits_.clear()


def _counterpart(model_values: dict[str, ir.Value], node: ir.Node) -> np.ndarray | str | None:
    y = model_values.get(node.outputs[0].name)
    if y is None:
        # pack takes a bias Add into MatMulNBits: the packed node answers for the Add's
        # output, so follow the original's one consumer when it is that Add.
        uses = node.outputs[0].uses()
        if len(uses) == 1 and uses[0].node.op_type == "Add" and node.op_type == "MatMulNBits":
            y = model_values.get(uses[0].node.outputs[0].name)
    p = y.producer() if y is not None else None
    if p is None:
        return "not found"
    if read.is_fused(p) and p.op_type == node.op_type:
        return fused_weight(p)
    if node.op_type == "MatMulNBits":
        if p.op_type == "Add":
            p = next((i.producer() for i in p.inputs if i is not None and i.producer() is not
                      None and i.producer().op_type == "MatMul"), None)
        if p is None or p.op_type != "MatMul":
            return "not found"
        return _evaluate(p.inputs[1])
    if p.op_type != "Gather":
        return "not found"
    return _evaluate(p.inputs[0])


def _kept(values: dict[str, ir.Value], node: ir.Node) -> bool:
    """Whether the checked model has ``node`` itself: the same op on inputs of the same
    names, making the same output (a conversion leaves a node whose weight is computed)."""
    y = values.get(node.outputs[0].name)
    twin = y.producer() if y is not None else None
    return twin is not None and (twin.op_type, twin.domain) == (node.op_type, node.domain) \
        and [v.name if v is not None else None for v in twin.inputs] == \
        [v.name if v is not None else None for v in node.inputs]


def _scope(function: ir.Function | None) -> tuple[str, str, str] | None:
    """Value names are looked up within their scope: the graphs, or one function."""
    return None if function is None else function.identifier()


def compare_weights(model: ir.Model, original: ir.Model) -> list[WeightComparison]:
    scopes: dict[tuple[str, str, str] | None, dict[str, ir.Value]] = {}
    for site in graph.walk(model):
        values = scopes.setdefault(_scope(site.function), {})
        for o in site.node.outputs:
            values[o.name] = o
    out: list[WeightComparison] = []
    for site in graph.walk(original):
        node = site.node
        if not read.is_fused(node):
            continue
        values = scopes.get(_scope(site.function), {})
        name = node.name or node.outputs[0].name
        try:
            want = fused_weight(node)
        except KernelError as e:  # an invalid node (bool scales ...): a finding
            out.append(WeightComparison(name, node.op_type, "error", f"the original's: {e}"))
            continue
        if want is None:
            if _kept(values, node):
                out.append(WeightComparison(name, node.op_type, "kept", "the same node in "
                                            "both models (its weight is not constant)"))
            else:
                out.append(WeightComparison(name, node.op_type, "not found",
                                            "the original's weight is not constant"))
            continue
        try:
            got = _counterpart(values, node)
        except KernelError as e:
            out.append(WeightComparison(name, node.op_type, "error",
                                        f"the checked model's: {e}"))
            continue
        if isinstance(got, str) or got is None:
            out.append(WeightComparison(name, node.op_type, "not found",
                                        "no constant weight in the checked model's place"))
            continue
        if got.shape != want.shape or got.dtype != want.dtype:
            out.append(WeightComparison(name, node.op_type, "differ",
                                        f"{got.dtype}{got.shape} vs {want.dtype}{want.shape}"))
            continue
        view = np.uint32 if want.dtype.itemsize == 4 else np.uint16
        diff = int(np.count_nonzero(got.view(view) != want.view(view)))
        if diff:
            err = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64))))
            out.append(WeightComparison(name, node.op_type, "differ",
                                        f"{diff} of {want.size} elements, max abs {err:g}"))
        else:
            out.append(WeightComparison(name, node.op_type, "bit-identical",
                                        f"{want.dtype}{want.shape}"))
    return out
