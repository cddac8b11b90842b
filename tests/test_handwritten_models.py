"""Small hand-written dequantization models built inline for the handwritten tests, and
their runs on onnxruntime (ORT_DISABLE_ALL) and dqtool's reference evaluator. The tests
here check the builders themselves: each model runs on both and gives the product the
pattern spells out."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import dqtool

H = helper.make_node
FT = {"float": TP.FLOAT, "float16": TP.FLOAT16, "bfloat16": TP.BFLOAT16, "double": TP.DOUBLE}
NP = {"float": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16,
      "double": np.float64}
IR_FOR = {13: 7, 17: 8, 19: 9, 21: 10, 23: 11}


def init(name: str, arr: Any) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(arr), name)


def model(nodes: list[onnx.NodeProto], inits: dict[str, Any], out: str, out_type: int,
          *, inputs: list[onnx.ValueInfoProto] | None = None, opset: int = 21,
          out_shape: list | None = None, functions: list | None = None) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", inputs or [],
                          [helper.make_tensor_value_info(out, out_type, out_shape)],
                          [init(n, a) for n, a in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=IR_FOR.get(opset, 10), functions=functions or [])


def cast_mul(x: np.ndarray, scale: np.ndarray, *, ft: str = "float", zp: Any = None,
             zp_where: str = "after", swap: bool = False, consumer: str = "none",
             opset: int = 21, k_in: int | None = None, add: bool = False) -> onnx.ModelProto:
    """``Cast(x → ft) [→ Sub zp] → Mul(scale)`` (the Sub ``before`` the Cast in x's type,
    or ``after`` it in ``ft``; ``add``: an Add of ``-zp``), feeding ``consumer``:
    ``none`` (the product is the output), ``MatMul`` (A @ w, A an input of k_in columns)
    or ``Gather`` (rows of w by an int64 input)."""
    nodes, inits = [], {"x": x, "s": scale}
    last = "x"
    if zp is not None and zp_where == "before":
        inits["zp"] = zp
        nodes.append(H("Sub", ["x", "zp"], ["xd"]))
        last = "xd"
    nodes.append(H("Cast", [last], ["c"], to=FT[ft]))
    last = "c"
    if zp is not None and zp_where == "after":
        inits["zp"] = -np.asarray(zp) if add else zp
        nodes.append(H("Add" if add else "Sub", [last, "zp"], ["d"]))
        last = "d"
    nodes.append(H("Mul", ["s", last] if swap else [last, "s"], ["w"]))
    return _consume(nodes, inits, ft, consumer, opset, x.shape, k_in)


def _consume(nodes: list, inits: dict, ft: str, consumer: str, opset: int, w_shape: tuple,
             k_in: int | None) -> onnx.ModelProto:
    if consumer == "none":
        return model(nodes, inits, "w", FT[ft], opset=opset)
    if consumer == "MatMul":
        a = helper.make_tensor_value_info("A", FT[ft], [3, k_in or w_shape[0]])
        nodes.append(H("MatMul", ["A", "w"], ["y"]))
        return model(nodes, inits, "y", FT[ft], inputs=[a], opset=opset)
    idx = helper.make_tensor_value_info("I", TP.INT64, [4])
    nodes.append(H("Gather", ["w", "I"], ["y"], axis=0))
    return model(nodes, inits, "y", FT[ft], inputs=[idx], opset=opset)


def feeds(m: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for vi in m.graph.input:
        t = vi.type.tensor_type
        shape = [d.dim_value for d in t.shape.dim]
        if t.elem_type == TP.INT64:
            out[vi.name] = rng.integers(0, 2, shape).astype(np.int64)
        else:
            dt = {TP.FLOAT: np.float32, TP.FLOAT16: np.float16}[t.elem_type]
            out[vi.name] = rng.standard_normal(shape).astype(dt)
    return out


def run_ort(m: onnx.ModelProto | ir.Model, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    proto = ir.to_proto(m) if isinstance(m, ir.Model) else m
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    sess = ort.InferenceSession(proto.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    return sess.run(None, inputs)


def run_ref(m: onnx.ModelProto | ir.Model, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    with np.errstate(all="ignore"):
        return list(dqtool.reference_evaluator(m).run(None, inputs))


def bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a).tobytes()


def same_bits(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(x.dtype == y.dtype and x.shape == y.shape
                                    and bits(x) == bits(y) for x, y in zip(a, b, strict=True))


def differing(a: np.ndarray, b: np.ndarray) -> int:
    """How many elements of ``a`` and ``b`` differ in their bits."""
    u = np.dtype(f"u{a.dtype.itemsize}")
    return int(np.count_nonzero(np.ascontiguousarray(a).view(u)
                                != np.ascontiguousarray(b).view(u)))


RNG = np.random.default_rng(7)
X8 = RNG.integers(-128, 128, (16, 12)).astype(np.int8)
S12 = (RNG.random(12) * 0.02 + 0.001).astype(np.float32)


@pytest.mark.parametrize("zp_where", ["before", "after"])
def test_builder_runs_on_both_runtimes_and_means_the_product(zp_where: str) -> None:
    zp = np.int8(3) if zp_where == "before" else np.float32(3)
    m = cast_mul(X8, S12.reshape(1, 12), zp=zp, zp_where=zp_where)
    # before the Cast the Sub is int8 arithmetic, and wraps (-128 - 3 = 125)
    d = np.subtract(X8, np.int8(3), dtype=np.int8) if zp_where == "before" else X8 - 3.0
    want = (d.astype(np.float32) * S12).astype(np.float32)
    assert bits(run_ort(m, {})[0]) == bits(want)
    assert bits(run_ref(m, {})[0]) == bits(want)


def test_differing_counts_elements() -> None:
    a = np.array([1.0, 2.0, 3.0], np.float32)
    assert differing(a, a.copy()) == 0
    assert differing(a, np.array([1.0, 2.5, 3.0], np.float32)) == 1
