"""Building test models: one one-node model builder, a model from onnx.helper pieces, and
one ``save`` for every kind of model a test holds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
from onnx import helper, numpy_helper

from dqtool import types as dt

MODELS = Path(__file__).resolve().parents[2] / "models"

# The IR version each opset's tests write (onnxruntime loads these).
_IR_FOR_OPSET = {10: 5, 13: 7, 19: 9, 21: 10, 23: 11, 24: 11, 25: 12}


def onnx_type(dtype: np.dtype) -> int:
    return int(dt.from_dtype(dtype).ir_type)


def tensor(name: str, arr) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(arr), name)


def node_model(op: str, inputs: dict[str, np.ndarray | None] | list[onnx.TensorProto],
               out_dtype: np.dtype | int, *, opset: int = 23, domain: str = "",
               node: onnx.NodeProto | None = None, ir_version: int | None = None,
               name: str | None = None, out_shape: list | None = None,
               extra_opsets: dict[str, int] | None = None, import_domain: bool = True,
               **attrs: Any) -> onnx.ModelProto:
    """A model of one node ``op`` whose inputs are all initializers, output ``y``.

    ``inputs``: name → array (None = an omitted optional input), or initializers already
    made (then ``node`` is the node, built by the caller). ``out_dtype``: a NumPy dtype or
    an ONNX element type; ``out_shape`` the output's declared shape (None: none).
    ``domain`` is imported at version 1 unless ``import_domain`` is False (a model that
    forgets the import); ``extra_opsets`` adds imports. ``attrs`` are the node's
    attributes.
    """
    if isinstance(inputs, dict):
        names = [name if arr is not None else "" for name, arr in inputs.items()]
        while names and names[-1] == "":
            names.pop()
        inits = [tensor(n, a) for n, a in inputs.items() if a is not None]
    else:
        names, inits = [], list(inputs)
    if node is None:
        node = helper.make_node(op, names, ["y"], name=name, domain=domain, **attrs)
    elem = out_dtype if isinstance(out_dtype, int) else onnx_type(np.dtype(out_dtype))
    out = helper.make_tensor_value_info("y", elem, out_shape)
    graph = helper.make_graph([node], "g", [], [out], initializer=inits)
    opsets = [helper.make_opsetid("", opset)]
    if domain and import_domain:
        opsets.append(helper.make_opsetid(domain, 1))
    opsets += [helper.make_opsetid(d, v) for d, v in (extra_opsets or {}).items()]
    return helper.make_model(graph, opset_imports=opsets,
                             ir_version=ir_version or _IR_FOR_OPSET.get(opset, 10))


def make_model(nodes, inits, inputs, outputs, *, opset: int = 21, functions=(),
               extra_opsets: dict[str, int] | None = None) -> onnx.ModelProto:
    """A model from onnx.helper pieces; inputs/outputs are (name, elem_type, shape)."""
    g = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(*i) for i in inputs],
        [helper.make_tensor_value_info(*o) for o in outputs], inits)
    opsets = [helper.make_opsetid("", opset)]
    opsets += [helper.make_opsetid(d, v) for d, v in (extra_opsets or {}).items()]
    m = helper.make_model(g, opset_imports=opsets, functions=list(functions))
    m.ir_version = 10
    return m


def save(model: onnx.ModelProto | ir.Model | str, path: str | Path) -> Path:
    """Write ``model`` (a ModelProto, an onnx_ir Model, or ONNX text) to ``path``."""
    path = Path(path)
    if isinstance(model, str):
        model = ir.from_onnx_text(model)
    if isinstance(model, ir.Model):
        ir.save(model, path)
    else:
        onnx.save(model, str(path))
    return path
