"""One Q/DQ node alone in a model, its inputs as initializers: how a check runs a node on
each runtime, whatever graph (subgraph, function) it came from."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
import onnx_ir as ir
from onnx import helper, numpy_helper

from dqtool.checking.models import ort_max_ir


def build(node: ir.Node, values: Sequence[np.ndarray | None], opsets: dict[str, int],
          ir_version: int) -> onnx.ModelProto:
    """``node`` with input i fixed to ``values[i]`` (None: absent); output ``y``."""
    proto = ir.serde.serialize_node(node)
    del proto.input[:]
    del proto.output[:]
    inits = []
    for i, v in enumerate(values):
        if v is None:
            proto.input.append("")
            continue
        name = f"in{i}"
        proto.input.append(name)
        inits.append(numpy_helper.from_array(np.asarray(v), name))
    while proto.input and proto.input[-1] == "":
        proto.input.pop()
    proto.output.append("y")
    proto.name = proto.name or "node"
    g = helper.make_graph([proto], "single_node", [], [onnx.ValueInfoProto(name="y")], inits)
    imports = [helper.make_opsetid(d if d != "ai.onnx" else "", v) for d, v in opsets.items()]
    if not any(op.domain == "" for op in imports):
        imports.append(helper.make_opsetid("", 21))
    model = helper.make_model(g, opset_imports=imports)
    top = ort_max_ir()
    model.ir_version = min(ir_version, top) if ir_version else top
    return model


def has_reference_attributes(node: ir.Node) -> bool:
    """A function's node whose attributes refer to the caller's cannot run alone."""
    return any(a.is_ref() for a in node.attributes.values())
