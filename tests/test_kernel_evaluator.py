"""reference_evaluator: every dialect, subgraphs and functions, compared with onnxruntime."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import onnx_ir
import pytest
from helpers import assert_bits_equal, node_model
from onnx import TensorProto, helper, numpy_helper

from dqtool import reference_evaluator
from dqtool.errors import KernelError
from dqtool.kernel import dequantize, dequantize_opmx, pack_opmx_int4, quantize


def _qdq_model(opset: int, domain: str = "") -> onnx.ModelProto:
    """x -> QuantizeLinear -> DequantizeLinear -> MatMul with a per-axis DQ weight."""
    rng = np.random.default_rng(0)
    w = rng.integers(-127, 128, size=(8, 4)).astype(np.int8)
    ws = (rng.random(4) * 0.05 + 0.01).astype(np.float32)
    inits = [
        numpy_helper.from_array(np.array(0.02, np.float32), "xs"),
        numpy_helper.from_array(np.array(128, np.uint8), "xz"),
        numpy_helper.from_array(w, "w"),
        numpy_helper.from_array(ws, "ws"),
        numpy_helper.from_array(np.zeros(4, np.int8), "wz"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"], domain=domain),
        helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"], domain=domain),
        helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], domain=domain,
                         axis=1),
        helper.make_node("MatMul", ["xd", "wd"], ["y"]),
    ]
    g = helper.make_graph(
        nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])], initializer=inits)
    opsets = [helper.make_opsetid("", opset)]
    if domain:
        opsets.append(helper.make_opsetid(domain, 1))
    return helper.make_model(g, opset_imports=opsets, ir_version=7)


def _ort(model: onnx.ModelProto, feeds: dict) -> np.ndarray:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0]


X = (np.random.default_rng(1).standard_normal((3, 8)) * 2).astype(np.float32)


def test_opset13_qdq_matches_onnxruntime() -> None:
    m = _qdq_model(13)
    assert_bits_equal(reference_evaluator(m).run(None, {"x": X})[0], _ort(m, {"x": X}), "13")


def test_opset10_runs() -> None:
    m = _qdq_model(13)
    m.graph.node[2].ClearField("attribute")
    m.graph.initializer[3].CopyFrom(numpy_helper.from_array(np.array(0.03, np.float32), "ws"))
    m.graph.initializer[4].CopyFrom(numpy_helper.from_array(np.array(0, np.int8), "wz"))
    m.opset_import[0].version = 10
    m.ir_version = 5
    assert_bits_equal(reference_evaluator(m).run(None, {"x": X})[0], _ort(m, {"x": X}), "10")


def test_com_microsoft_matches_onnxruntime() -> None:
    m = _qdq_model(13, "com.microsoft")
    assert_bits_equal(reference_evaluator(m).run(None, {"x": X})[0], _ort(m, {"x": X}), "ms")


def test_onnx_ir_model_and_path(tmp_path) -> None:
    m = _qdq_model(13)
    want = _ort(m, {"x": X})
    assert_bits_equal(reference_evaluator(onnx_ir.from_proto(m)).run(None, {"x": X})[0],
                      want, "ir")
    p = tmp_path / "m.onnx"
    onnx.save(m, p)
    assert_bits_equal(reference_evaluator(p).run(None, {"x": X})[0], want, "path")


def test_opmx_model() -> None:
    rng = np.random.default_rng(3)
    q = rng.integers(0, 16, size=(8, 6)).astype(np.uint8)
    s = (rng.random((8, 3)) * 0.1).astype(np.float16)
    x = pack_opmx_int4(q)
    for domain in ("opmx", "pmx"):
        node = helper.make_node("DequantizeLinear", ["x", "s"], ["y"], domain=domain,
                                quant_data_type="int4", quant_axis=1, group_size=2)
        g = helper.make_graph([node], "g", [], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT16, None)], initializer=[
            numpy_helper.from_array(x, "x"), numpy_helper.from_array(s, "s")])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13),
                                                helper.make_opsetid(domain, 1)])
        got = reference_evaluator(m).run(None, {})[0]
        want = dequantize_opmx(x, s, quant_data_type="int4", quant_axis=1, group_size=2)
        assert_bits_equal(got, want, domain)


def _dq13_node(out: str) -> onnx.NodeProto:
    return helper.make_node("DequantizeLinear", ["q", "s"], [out])


def test_if_subgraph_and_local_function() -> None:
    q = np.arange(-4, 4, dtype=np.int8)
    s = np.array(0.25, np.float32)
    want = dequantize(q, s)
    branch = helper.make_graph([_dq13_node("b")], "then", [],
                               [helper.make_tensor_value_info("b", TensorProto.FLOAT, None)])
    fn = helper.make_function("local", "DQ", ["q", "s"], ["o"], [_dq13_node("o")],
                              [helper.make_opsetid("", 13)])
    nodes = [
        helper.make_node("If", ["c"], ["y1"], then_branch=branch, else_branch=branch),
        helper.make_node("DQ", ["q", "s"], ["y2"], domain="local"),
    ]
    g = helper.make_graph(nodes, "g", [
        helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y1", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("y2", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(q, "q"), numpy_helper.from_array(s, "s")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13),
                                            helper.make_opsetid("local", 1)],
                          functions=[fn], ir_version=8)
    y1, y2 = reference_evaluator(m).run(None, {"c": np.array(True)})
    assert_bits_equal(y1, want, "If")
    assert_bits_equal(y2, want, "function")
    # and onnxruntime agrees
    assert_bits_equal(_ort(m, {"c": np.array(True)}), want, "ort")


def test_callers_new_ops_run_inside_local_functions_too() -> None:
    """onnx builds a function's evaluator without the caller's new_ops: check's layout-free
    MatMul ran in the main graph only, and a weight made through Transpose inside a
    function gave outputs 1e-6 apart from the same weight stored whole."""
    from onnx.reference.op_run import OpRun

    class Neg(OpRun):  # stands in for a caller's own implementation of an ai.onnx op
        op_domain = ""

        def _run(self, x):
            return (np.full_like(x, 42.0),)

    fn = helper.make_function("local", "F", ["x"], ["y"], [helper.make_node("Neg", ["x"], ["y"])],
                              [helper.make_opsetid("", 13)])
    g = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["a"]), helper.make_node("F", ["x"], ["b"],
                                                                 domain="local")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13),
                                            helper.make_opsetid("local", 1)],
                          functions=[fn], ir_version=8)
    x = np.array([1.0, -2.0], np.float32)
    a, b = reference_evaluator(m, new_ops=[Neg]).run(None, {"x": x})
    assert a.tolist() == b.tolist() == [42.0, 42.0]
    # and an evaluator made without them runs onnx's own
    a, b = reference_evaluator(m).run(None, {"x": x})
    assert a.tolist() == b.tolist() == [-1.0, 2.0]


def _one(node: onnx.NodeProto, inits: list, out_type: int) -> onnx.ModelProto:
    return node_model(node.op_type, inits, out_type, node=node, ir_version=10)


def test_output_dtype_attributes() -> None:
    """output_dtype codes reach the kernels as the dtypes dqtool.types gives them."""
    rng = np.random.default_rng(3)
    x = rng.integers(-8, 8, size=(4, 8)).astype(ml_dtypes.int4)
    s = (rng.random((4, 2)) + 0.5).astype(np.float32)
    inits = [numpy_helper.from_array(x, "x"), numpy_helper.from_array(s, "s")]
    dq = helper.make_node("DequantizeLinear", ["x", "s"], ["y"], axis=1, block_size=4,
                          output_dtype=TensorProto.FLOAT16)
    got = reference_evaluator(_one(dq, inits, TensorProto.FLOAT16)).run(None, {})[0]
    want = dequantize(x, s, axis=1, block_size=4, output_dtype=np.float16)
    assert_bits_equal(got, want)

    f = (rng.standard_normal((4, 8)) * 3).astype(np.float32)
    q = helper.make_node("QuantizeLinear", ["f", "s"], ["y"], axis=1, block_size=4,
                         output_dtype=TensorProto.FLOAT8E4M3FN, saturate=0)
    model = _one(q, [numpy_helper.from_array(f, "f"), inits[1]],
                        TensorProto.FLOAT8E4M3FN)
    got = reference_evaluator(model).run(None, {})[0]
    want = quantize(f, s, axis=1, block_size=4, output_dtype=ml_dtypes.float8_e4m3fn,
                    saturate=False)
    assert got.dtype == want.dtype
    assert_bits_equal(got, want)

    bad = helper.make_node("DequantizeLinear", ["x", "s"], ["y"], axis=1, block_size=4,
                           output_dtype=TensorProto.UINT64)
    with pytest.raises(KernelError, match="output_dtype=13"):
        reference_evaluator(_one(bad, inits, TensorProto.UINT64)).run(None, {})
