"""One-node integer-operator models (graph inputs, several outputs) run on onnxruntime
(ORT_DISABLE_ALL), for the integer family's tests: ``from helpers.integer import one_node``."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper


def one_node(op: str, inputs: list[tuple[str, np.ndarray | None]], out_elem: int | list[int],
             *, domain: str = "", onnx_opset: int = 13, **attrs) -> onnx.ModelProto:
    """A model of one node; every input is an initializer except those named ``x*``/``a``
    given as graph inputs (the caller feeds them). ``None`` marks an absent optional input."""
    graph_inputs, inits, names = [], [], []
    for name, arr in inputs:
        if arr is None:
            names.append("")
            continue
        names.append(name)
        if name.startswith("in_"):
            graph_inputs.append(helper.make_tensor_value_info(
                name, helper.np_dtype_to_tensor_dtype(arr.dtype), list(arr.shape)))
        else:
            inits.append(numpy_helper.from_array(arr, name))
    elems = out_elem if isinstance(out_elem, list) else [out_elem]
    outs = [f"y{i}" for i in range(len(elems))]
    node = helper.make_node(op, names, outs, domain=domain, **attrs)
    g = helper.make_graph([node], "t", graph_inputs,
                          [helper.make_tensor_value_info(o, e, None)
                           for o, e in zip(outs, elems, strict=True)], inits)
    ops = [helper.make_opsetid("", onnx_opset)]
    if domain:
        ops.append(helper.make_opsetid(domain, 1))
    m = helper.make_model(g, opset_imports=ops)
    m.ir_version = 8
    return m


def run_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 4
    sess = ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)
