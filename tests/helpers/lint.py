"""Tiny DQ models for the check and lint tests."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .build import node_model


def dq_model(
    x: np.ndarray,
    scale: np.ndarray,
    zp: np.ndarray | None = None,
    *,
    opset: int = 21,
    domain: str = "",
    extra_opsets: dict[str, int] | None = None,
    ir_version: int = 10,
    out_type: int = TensorProto.FLOAT,
    **attrs,
) -> onnx.ModelProto:
    """One DequantizeLinear ``W_dq`` of constant inputs; its output is the graph output
    ``y``. ``domain`` is imported only through ``extra_opsets``."""
    return node_model("DequantizeLinear", {"x": np.asarray(x), "s": np.asarray(scale),
                                           "zp": None if zp is None else np.asarray(zp)},
                      out_type, opset=opset, domain=domain, ir_version=ir_version,
                      name="W_dq", out_shape=list(np.shape(x)), extra_opsets=extra_opsets,
                      import_domain=False, **attrs)


def matmul_model(w: np.ndarray, scale: np.ndarray, zp: np.ndarray | None = None, *,
                 opset: int = 13, axis: int = 1) -> onnx.ModelProto:
    """X(1, K) @ DQ(W (K, N), per-axis scale on N) -> Y(1, N)."""
    inits = [numpy_helper.from_array(w, "W_q"), numpy_helper.from_array(scale, "W_s")]
    ins = ["W_q", "W_s"]
    if zp is not None:
        inits.append(numpy_helper.from_array(zp, "W_zp"))
        ins.append("W_zp")
    nodes = [helper.make_node("DequantizeLinear", ins, ["W"], name="W_dq", axis=axis),
             helper.make_node("MatMul", ["X", "W"], ["Y"], name="mm")]
    k, n = w.shape
    g = helper.make_graph(nodes, "mm", [helper.make_tensor_value_info("X", 1, ["batch", k])],
                          [helper.make_tensor_value_info("Y", 1, ["batch", n])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 7 if opset < 19 else 9
    return m

