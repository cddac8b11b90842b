"""Tiny MatMulNBits / GatherBlockQuantized models, built from random codes."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from dqtool.families.fused import packing

_FLOAT = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float16): TensorProto.FLOAT16,
          np.dtype(ml_dtypes.bfloat16): TensorProto.BFLOAT16}


def nbits_inputs(rng: np.random.Generator, k: int, n: int, bits: int, block: int,
                 dtype=np.float32, zp: str = "packed") -> dict[str, np.ndarray | None]:
    """Random B, scales and zero points ("packed", "float" or "none") of a MatMulNBits."""
    kb = -(-k // block)
    codes = rng.integers(0, 1 << bits, size=(n, kb * block), dtype=np.uint8)
    b = packing.pack(codes, bits).reshape(n, kb, block * bits // 8)
    scales = (rng.random((n, kb)) * 0.1 + 0.01).astype(dtype)
    zero_points = None
    if zp == "packed":
        zero_points = packing.pack(rng.integers(0, 1 << bits, size=(n, kb), dtype=np.uint8),
                                   bits)
    elif zp == "float":  # as onnxruntime's HQQ quantizer writes them: flat, with the scales
        zero_points = (rng.random(n * kb) * (1 << bits)).astype(dtype)
        scales = scales.reshape(-1)
    return {"B": b, "scales": scales, "zero_points": zero_points}


def nbits_model(k: int, n: int, bits: int, block: int, inputs: dict, *, dtype=np.float32,
                m: int | None = None, bias: np.ndarray | None = None,
                accuracy_level: int | None = None, opset: int = 21) -> onnx.ModelProto:
    """A = graph input (m, K) (m defaults to K), then one MatMulNBits with its weight."""
    t = _FLOAT[np.dtype(dtype)]
    names = ["A", "B", "scales"]
    inits = [numpy_helper.from_array(inputs["B"], "B"),
             numpy_helper.from_array(inputs["scales"], "scales")]
    if inputs.get("zero_points") is not None:
        names.append("zero_points")
        inits.append(numpy_helper.from_array(inputs["zero_points"], "zero_points"))
    if bias is not None:
        while len(names) < 5:
            names.append("")
        names.append("bias")
        inits.append(numpy_helper.from_array(bias, "bias"))
    attrs = {"K": k, "N": n, "bits": bits, "block_size": block}
    if accuracy_level is not None:
        attrs["accuracy_level"] = accuracy_level
    node = helper.make_node("MatMulNBits", names, ["Y"], name="mm", domain="com.microsoft",
                            **attrs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("A", t, [m or k, k])],
        [helper.make_tensor_value_info("Y", t, [m or k, n])], initializer=inits)
    return helper.make_model(graph, ir_version=10, opset_imports=[
        helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)])


def gbq_model(table: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None, *,
              quantize_axis: int = 1, gather_axis: int = 0, block: int = 32, bits: int = 4,
              n_indices: int = 5, opset: int = 21) -> onnx.ModelProto:
    """indices = graph input (int64, n_indices), one GatherBlockQuantized of a constant table."""
    def tensor(arr: np.ndarray, name: str) -> onnx.TensorProto:
        if arr.dtype in (np.dtype(ml_dtypes.int4), np.dtype(ml_dtypes.uint4)):
            code = TensorProto.INT4 if arr.dtype == np.dtype(ml_dtypes.int4) else \
                TensorProto.UINT4
            flat = arr.astype(np.int8).reshape(-1).astype(np.uint8) & 0x0F
            return helper.make_tensor(name, code, arr.shape,
                                      packing.pack(flat, 4).tobytes(), raw=True)
        return numpy_helper.from_array(arr, name)

    names = ["data", "indices", "scales"]
    inits = [tensor(table, "data"), tensor(scales, "scales")]
    if zero_points is not None:
        names.append("zero_points")
        inits.append(tensor(zero_points, "zero_points"))
    node = helper.make_node("GatherBlockQuantized", names, ["Y"], name="gbq",
                            domain="com.microsoft", gather_axis=gather_axis,
                            quantize_axis=quantize_axis, block_size=block, bits=bits)
    t = _FLOAT[np.dtype(scales.dtype)]
    logical = list(table.shape)
    if table.dtype == np.uint8:
        logical[-1] *= 8 // bits
    out_shape = [*logical[:gather_axis], n_indices, *logical[gather_axis + 1:]]
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("indices", TensorProto.INT64, [n_indices])],
        [helper.make_tensor_value_info("Y", t, out_shape)], initializer=inits)
    return helper.make_model(graph, ir_version=10, opset_imports=[
        helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)])


def run_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), so,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def bits_of(a: np.ndarray) -> np.ndarray:
    return np.asarray(a).view(np.uint32 if np.asarray(a).dtype.itemsize == 4 else np.uint16)


def in_function(nbits: onnx.ModelProto, after: str = "Relu") -> onnx.ModelProto:
    """``nbits``'s MatMulNBits inside a model-local function (its weights Constant nodes),
    called by the main graph, whose next node reads the call's output."""
    consts = [helper.make_node("Constant", [], [t.name], name=f"c_{t.name}", value=t)
              for t in nbits.graph.initializer]
    fn = helper.make_function("local", "QLinear", ["A"], ["Y"],
                              [*consts, *nbits.graph.node],
                              [helper.make_opsetid("", 21),
                               helper.make_opsetid("com.microsoft", 1)])
    g = nbits.graph
    out = onnx.ValueInfoProto()
    out.CopyFrom(g.output[0])
    out.name = "Z"
    main = helper.make_graph(
        [helper.make_node("QLinear", ["A"], ["q"], domain="local"),
         helper.make_node(after, ["q"], ["Z"])], "g", list(g.input), [out])
    return helper.make_model(main, functions=[fn], ir_version=10, opset_imports=[
        helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1),
        helper.make_opsetid("local", 1)])
