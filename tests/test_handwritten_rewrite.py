"""``dqtool.handwritten.rewrite``: each hand-written dequantization into an ai.onnx
DequantizeLinear, bit-identical with the original on onnxruntime (ORT_DISABLE_ALL) and on
dqtool's reference evaluator; all or nothing."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto as TP
from onnx import helper
from test_handwritten_models import (
    S12,
    X8,
    H,
    cast_mul,
    differing,
    feeds,
    init,
    model,
    run_ort,
    run_ref,
    same_bits,
)
from test_handwritten_recognize import blocked, nibbles

from dqtool.errors import UsageError
from dqtool.handwritten import find, rewrite

RNG = np.random.default_rng(11)
U8 = RNG.integers(0, 256, (16, 12)).astype(np.uint8)
I16 = RNG.integers(-32768, 32768, (16, 12)).astype(np.int16)
S16 = S12.astype(np.float16)


def gather_matmul(ft: str = "float") -> onnx.ModelProto:
    return cast_mul(X8, np.float32(0.0123), consumer="Gather")


CASES: dict[str, tuple[Callable[[], onnx.ModelProto], str]] = {
    "per-axis, swapped, MatMul": (lambda: cast_mul(X8, S12.reshape(1, 12), swap=True,
                                                   consumer="MatMul"), "DequantizeLinear"),
    "per-tensor, Gather": (gather_matmul, "DequantizeLinear"),
    "per-axis 0, output": (lambda: cast_mul(X8, S12[:1].repeat(16).reshape(16, 1) * 3),
                           "DequantizeLinear"),
    "uint8, float zero point per axis": (
        lambda: cast_mul(U8, S12.reshape(1, 12), zp=np.arange(12, dtype=np.float32) + 100,
                         consumer="MatMul"), "DequantizeLinear"),
    "uint8, Add of -zp": (lambda: cast_mul(U8, np.float32(0.07), zp=np.float32(128), add=True),
                          "DequantizeLinear"),
    "uint8, zero point -1 widens to int16": (
        lambda: cast_mul(U8, np.float32(0.07), zp=np.float32(-1)), "DequantizeLinear"),
    "int8, integer Sub before the Cast": (
        lambda: cast_mul((X8 // 2).astype(np.int8), S12.reshape(1, 12), zp=np.int8(-9),
                         zp_where="before", consumer="MatMul"), "DequantizeLinear"),
    "int8, integer Sub that wraps": (
        lambda: cast_mul(X8, S12.reshape(1, 12), zp=np.int8(100), zp_where="before"),
        "DequantizeLinear"),
    "int16 codes in float32": (lambda: cast_mul(I16, S12.reshape(1, 12), consumer="MatMul"),
                               "DequantizeLinear"),
    "blocked through Reshape": (blocked, "DequantizeLinear"),
    "packed int4 unpacked": (nibbles, "DequantizeLinear"),
    "float16, MatMul": (lambda: cast_mul(X8, S16.reshape(1, 12), ft="float16",
                                         consumer="MatMul", opset=23), "Cast"),
    "float16, zero point, output": (
        lambda: cast_mul(U8, S16.reshape(1, 12), ft="float16", zp=np.float16(131),
                         opset=23), "Cast"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_bit_identical_on_both_runtimes(name: str) -> None:
    build, last_op = CASES[name]
    original = build()
    report = rewrite(ir.from_proto(original))
    assert report.ok and len(report.changed) == 1 and report.model is not None, report.to_json()
    out = ir.to_proto(report.model)
    onnx.shape_inference.infer_shapes(out, check_type=True, strict_mode=True)
    ops = [n.op_type for n in out.graph.node]
    assert "DequantizeLinear" in ops and "Mul" not in ops and "Sub" not in ops, ops
    assert find(report.model) == ()
    produced = next(n for n in out.graph.node if n.output[0] == report.changed[0].record.output)
    assert produced.op_type == last_op
    inputs = feeds(original)
    assert same_bits(run_ort(out, inputs), run_ort(original, inputs))
    assert same_bits(run_ref(out, inputs), run_ref(original, inputs))


def test_float16_plain_dequantize_linear_would_differ_on_onnxruntime() -> None:
    """What the float16 rule rests on (measured): onnxruntime computes this Mul in float32
    and, the MatMul after it having no float16 kernel, never rounds the product to
    float16; the ONNX definition (the reference evaluator) does. A DequantizeLinear with a
    float16 output rounds on both, so it is exact for the reference evaluator only."""
    original = cast_mul(X8, S16.reshape(1, 12), ft="float16", consumer="MatMul", opset=23)
    plain = model([H("DequantizeLinear", ["x", "s"], ["w"], axis=1),
                   H("MatMul", ["A", "w"], ["y"])], {"x": X8, "s": S16}, "y", TP.FLOAT16,
                  inputs=list(original.graph.input), opset=23)
    inputs = feeds(original)
    assert differing(run_ort(plain, inputs)[0], run_ort(original, inputs)[0]) > 0
    assert same_bits(run_ref(plain, inputs), run_ref(original, inputs))
    # the two runtimes read the original differently: the model has two meanings
    assert differing(run_ort(original, inputs)[0], run_ref(original, inputs)[0]) > 0


def test_float16_below_opset_23_is_refused() -> None:
    m = ir.from_proto(cast_mul(X8, S16.reshape(1, 12), ft="float16", opset=21))
    report = rewrite(m)
    assert not report.ok and report.model is None and report.changed == []
    assert "needs opset 23; the target is 21" in report.refused[0].how


def test_all_or_nothing() -> None:
    m = cast_mul(X8, S12.reshape(1, 12))
    g = m.graph
    g.initializer.extend([init("x2", X8), init("zp2", np.float32(0.5))])
    g.node.extend([H("Cast", ["x2"], ["c2"], to=TP.FLOAT), H("Sub", ["c2", "zp2"], ["d2"]),
                   H("Mul", ["d2", "s"], ["w2"])])
    g.output.append(helper.make_tensor_value_info("w2", TP.FLOAT, None))
    model_in = ir.from_proto(m)
    before = ir.to_proto(model_in).SerializeToString()
    report = rewrite(model_in)
    assert not report.ok and report.model is None and report.changed == []
    assert [o.record.output for o in report.refused] == ["w2"]
    assert "not an integer" in report.refused[0].how
    assert ir.to_proto(model_in).SerializeToString() == before


def test_run_time_scales_are_left() -> None:
    m = cast_mul(X8, S12.reshape(1, 12))
    m.graph.input.append(helper.make_tensor_value_info("S", TP.FLOAT, [1, 12]))
    m.graph.node.extend([H("Cast", ["x"], ["c2"], to=TP.FLOAT), H("Mul", ["c2", "S"], ["w2"])])
    m.graph.output.append(helper.make_tensor_value_info("w2", TP.FLOAT, None))
    report = rewrite(ir.from_proto(m))
    assert report.ok and [o.record.output for o in report.changed] == ["w"]
    assert [o.record.output for o in report.left] == ["w2"]
    out = ir.to_proto(report.model)
    inputs = {"S": S12.reshape(1, 12) * 2}
    assert same_bits(run_ort(out, inputs), run_ort(m, inputs))
    assert same_bits(run_ref(out, inputs), run_ref(m, inputs))


def test_codes_are_reused_and_dead_constants_removed() -> None:
    m = cast_mul(U8, S12.reshape(1, 12), zp=np.float32(128), consumer="MatMul")
    out = ir.to_proto(rewrite(ir.from_proto(m)).model)
    dq = next(n for n in out.graph.node if n.op_type == "DequantizeLinear")
    assert dq.input[0] == "x"  # the stored codes themselves, not a copy
    assert sorted(i.name for i in out.graph.initializer) == sorted(["x", *dq.input[1:]])


def raised(extra_reshape: bool) -> onnx.ModelProto:
    m = blocked()
    m.opset_import[0].version = 17
    m.ir_version = 8
    m.graph.input.append(helper.make_tensor_value_info("A", TP.FLOAT, [2, 6]))
    m.graph.node.append(H("MatMul", ["A", "w"], ["y"]))
    m.graph.output[0].CopyFrom(helper.make_tensor_value_info("y", TP.FLOAT, [2, 32]))
    if extra_reshape:
        m.graph.initializer.append(init("flat", np.array([-1], np.int64)))
        m.graph.node.append(H("Reshape", ["y", "flat"], ["z"]))
        m.graph.output[0].CopyFrom(helper.make_tensor_value_info("z", TP.FLOAT, [64]))
    return m


def test_opset_raised_where_nothing_else_changes_meaning() -> None:
    m = raised(extra_reshape=False)
    assert not rewrite(ir.from_proto(m)).ok  # blocked needs 21; the model is at 17
    report = rewrite(ir.from_proto(m), opset=21)
    assert report.ok, report.to_json()
    out = ir.to_proto(report.model)
    assert out.opset_import[0].version == 21 and out.ir_version >= 10
    inputs = feeds(m)
    assert same_bits(run_ort(out, inputs), run_ort(m, inputs))
    assert same_bits(run_ref(out, inputs), run_ref(m, inputs))


def test_opset_raise_refused_where_an_operator_changes() -> None:
    report = rewrite(ir.from_proto(raised(extra_reshape=True)), opset=21)
    assert not report.ok and report.model is None
    assert "Reshape (14→21)" in report.refused[0].how and "upgrade --opset 21" in \
        report.refused[0].how


def test_lower_opset_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="downgrade"):
        rewrite(ir.from_proto(cast_mul(X8, S12.reshape(1, 12))), opset=13)


def test_subgraph_and_function_rewritten() -> None:
    inner = helper.make_graph([H("Cast", ["x"], ["c"], to=TP.FLOAT), H("Mul", ["c", "s"], ["o"])],
                              "then", [], [helper.make_tensor_value_info("o", TP.FLOAT, None)])
    other = helper.make_graph([H("Cast", ["x"], ["o2"], to=TP.FLOAT)], "else", [],
                              [helper.make_tensor_value_info("o2", TP.FLOAT, None)])
    body = [helper.make_node("Constant", [], ["k"], value=init("k", X8)),
            helper.make_node("Constant", [], ["ks"], value=init("ks", S12.reshape(1, 12))),
            H("Cast", ["k"], ["ca"], to=TP.FLOAT), H("Mul", ["ks", "ca"], ["w"]),
            H("Add", ["a", "w"], ["y"])]
    fn = helper.make_function("local", "Deq", ["a"], ["y"], body, [helper.make_opsetid("", 21)])
    g = helper.make_graph([H("If", ["cond"], ["w"], then_branch=inner, else_branch=other),
                           H("Deq", ["w"], ["v"], domain="local")], "g",
                          [helper.make_tensor_value_info("cond", TP.BOOL, [])],
                          [helper.make_tensor_value_info("v", TP.FLOAT, None)],
                          [init("x", X8), init("s", np.float32(0.5))])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21),
                                            helper.make_opsetid("local", 1)],
                          functions=[fn], ir_version=10)
    report = rewrite(ir.from_proto(m))
    assert report.ok and sorted(o.record.graph for o in report.changed) == \
        ["function:local.Deq", "main/If/then_branch"]
    out = ir.to_proto(report.model)
    assert [n.op_type for n in out.functions[0].node].count("DequantizeLinear") == 1
    for cond in (True, False):
        inputs = {"cond": np.array(cond)}
        assert same_bits(run_ort(out, inputs), run_ort(m, inputs))
        assert same_bits(run_ref(out, inputs), run_ref(m, inputs))


def test_bfloat16_on_the_reference_evaluator() -> None:
    """onnxruntime runs neither a bfloat16 Mul nor a bfloat16 DequantizeLinear on CPU
    (test_handwritten_measured): the reference evaluator is the runtime to match."""
    import ml_dtypes

    sb = S12.astype(ml_dtypes.bfloat16).reshape(1, 12)
    original = cast_mul(U8, sb, ft="bfloat16", zp=np.asarray(100, ml_dtypes.bfloat16),
                        opset=23)
    report = rewrite(ir.from_proto(original))
    assert report.ok and "Cast to bfloat16" in report.changed[0].how
    assert same_bits(run_ref(report.model, {}), run_ref(original, {}))
