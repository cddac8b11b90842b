"""Models of many small nodes, for what must stay linear in nodes (inspect's growth test and
benchmark): a Q/DQ chain, and DequantizeLinear nodes side by side."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def chain(n: int) -> onnx.ModelProto:
    """QuantizeLinear and DequantizeLinear alternating, ``n`` nodes, one scale and zero
    point for all; no value_info, as quantizers write them."""
    inits = [numpy_helper.from_array(np.array(0.02, np.float32), "s"),
             numpy_helper.from_array(np.array(3, np.uint8), "z")]
    nodes, prev = [], "X"
    for i in range(n):
        op = "QuantizeLinear" if i % 2 == 0 else "DequantizeLinear"
        nodes.append(helper.make_node(op, [prev, "s", "z"], [f"v{i}"], name=f"n{i}"))
        prev = f"v{i}"
    out_type = TensorProto.UINT8 if n % 2 else TensorProto.FLOAT
    g = helper.make_graph(nodes, "chain",
                          [helper.make_tensor_value_info("X", TensorProto.FLOAT, [4, 8])],
                          [helper.make_tensor_value_info(prev, out_type, [4, 8])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=7)


def flat(n: int) -> onnx.ModelProto:
    """``n`` DequantizeLinear side by side, each with a weight, scale and zero point of its
    own; the odd ones read by a Relu, the rest graph outputs."""
    inits, nodes, outs = [], [], []
    weight = np.arange(8, dtype=np.int8).reshape(2, 4)
    for i in range(n):
        inits += [numpy_helper.from_array(weight, f"w{i}"),
                  numpy_helper.from_array(np.array(0.5, np.float32), f"s{i}"),
                  numpy_helper.from_array(np.array(1, np.int8), f"z{i}")]
        nodes.append(helper.make_node("DequantizeLinear", [f"w{i}", f"s{i}", f"z{i}"],
                                      [f"y{i}"], name=f"dq{i}"))
        out = f"y{i}"
        if i % 2:
            nodes.append(helper.make_node("Relu", [out], [f"r{i}"], name=f"relu{i}"))
            out = f"r{i}"
        outs.append(helper.make_tensor_value_info(out, TensorProto.FLOAT, [2, 4]))
    g = helper.make_graph(nodes, "flat", [], outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=7)
