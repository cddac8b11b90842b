"""``dqtool.handwritten.find``: every hand-written dequantization, with its codes and scale
types, granularity from the shapes, zero point, constants, and whether an exact
DequantizeLinear exists (and why not)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto as TP
from onnx import helper
from test_handwritten_models import S12, X8, H, cast_mul, init, model

from dqtool.handwritten import find


def one(m: onnx.ModelProto):
    found = find(ir.from_proto(m))
    assert len(found) == 1, found
    return found[0]


def test_per_axis_int8_operands_swapped() -> None:
    r = one(cast_mul(X8, S12.reshape(1, 12), swap=True, consumer="MatMul"))
    assert (r.ops, r.codes, r.stored_type, r.codes_type) == (("Cast", "Mul"), "x", "int8", "int8")
    assert (r.granularity, r.axis, r.block_size, r.scale_shape) == ("per-axis", 1, None, (12,))
    assert (r.float_type, r.scale_type, r.zero_point, r.consumers) == \
        ("float", "float", "none", ("MatMul",))
    assert r.rewritable and r.exact and r.min_opset == 13 and r.reasons == ()


@pytest.mark.parametrize("shape", [(), (1,), (1, 1)])
def test_per_tensor(shape: tuple[int, ...]) -> None:
    r = one(cast_mul(X8, np.full(shape, 0.5, np.float32)))
    assert (r.granularity, r.axis, r.min_opset, r.scale_shape) == ("per-tensor", None, 10, ())


def test_per_axis_on_axis_0() -> None:
    r = one(cast_mul(X8, np.full((16, 1), 0.25, np.float32)))
    assert (r.granularity, r.axis, r.min_opset) == ("per-axis", 0, 13)


def blocked(out_reshape: bool = True) -> onnx.ModelProto:
    x = np.random.default_rng(1).integers(-8, 8, (6, 32)).astype(np.int8)
    s = (np.random.default_rng(2).random((6, 4, 1)) * 0.1).astype(np.float32)
    nodes = [H("Cast", ["x"], ["c"], to=TP.FLOAT), H("Reshape", ["c", "blk"], ["r"]),
             H("Mul", ["r", "s"], ["m"])]
    if out_reshape:
        nodes.append(H("Reshape", ["m", "back"], ["w"]))
    return model(nodes, {"x": x, "s": s, "blk": np.array([6, 4, 8], np.int64),
                         "back": np.array([6, 32], np.int64)},
                 "w" if out_reshape else "m", TP.FLOAT)


def test_blocked_through_reshape_merged_back() -> None:
    r = one(blocked())
    assert r.ops == ("Cast", "Reshape", "Mul", "Reshape")
    assert (r.granularity, r.axis, r.block_size, r.shape, r.scale_shape) == \
        ("blocked", 1, 8, (6, 32), (6, 4))
    assert r.min_opset == 21 and r.output == "w"


def test_blocked_without_the_reshape_back_is_blocked_on_its_last_axis() -> None:
    r = one(blocked(out_reshape=False))
    assert (r.granularity, r.axis, r.block_size, r.shape) == ("blocked", 2, 8, (6, 4, 8))


@pytest.mark.parametrize("add", [False, True])
def test_float_zero_point_after_the_cast(add: bool) -> None:
    x = np.arange(0, 256, dtype=np.uint8).reshape(16, 16)
    zp = np.arange(16, dtype=np.float32).reshape(1, 16) + 120
    r = one(cast_mul(x, np.full((1, 16), 0.1, np.float32), zp=zp, add=add))
    assert (r.zero_point, r.zero_point_where, r.codes_type) == ("integer", "after-cast", "uint8")
    assert r.ops == ("Cast", "Add" if add else "Sub", "Mul") and r.exact


def test_zero_point_outside_the_codes_type_widens_them() -> None:
    x = np.arange(0, 256, dtype=np.uint8).reshape(16, 16)
    r = one(cast_mul(x, np.float32(0.1), zp=np.float32(-1)))
    assert (r.codes_type, r.min_opset) == ("int16", 21)


def test_integer_zero_point_before_the_cast() -> None:
    x = np.random.default_rng(3).integers(-100, 100, (8, 8)).astype(np.int8)
    r = one(cast_mul(x, np.float32(0.5), zp=np.int8(7), zp_where="before"))
    assert (r.zero_point, r.zero_point_where, r.notes) == ("integer", "before-cast", ())
    assert r.ops == ("Sub", "Cast", "Mul") and r.exact


def test_integer_sub_that_wraps_is_no_zero_point() -> None:
    r = one(cast_mul(X8, np.float32(0.5), zp=np.int8(100), zp_where="before"))
    assert r.zero_point == "none" and r.exact
    assert "wraps" in r.notes[0]


def test_non_integer_zero_point_has_no_exact_form() -> None:
    r = one(cast_mul(X8, np.float32(0.5), zp=np.float32(0.5)))
    assert not r.exact and r.min_opset is None
    assert "not an integer" in r.reasons[0]


def test_run_time_scale_is_listed_not_rewritable() -> None:
    nodes = [H("Cast", ["x"], ["c"], to=TP.FLOAT), H("Mul", ["c", "S"], ["w"])]
    m = model(nodes, {"x": X8}, "w", TP.FLOAT,
              inputs=[helper.make_tensor_value_info("S", TP.FLOAT, [1, 12])])
    r = one(m)
    assert not r.rewritable and not r.scale_constant and not r.exact
    assert (r.granularity, r.axis) == ("per-axis", 1)
    assert "computed at run time" in r.reasons[0]


def test_double_has_no_dequantize_linear() -> None:
    r = one(cast_mul(X8, np.float64(0.5), ft="double"))
    assert not r.exact and "float64" in r.reasons[0]


def test_float16_needs_output_dtype_and_a_cast() -> None:
    r = one(cast_mul(X8, S12.astype(np.float16).reshape(1, 12), ft="float16", opset=23))
    assert r.exact and r.min_opset == 23 and "Cast to float16" in (r.form or "")


def test_float16_codes_it_cannot_hold_have_two_meanings() -> None:
    x = np.array([[2049, 3, -5000, 7]], np.int16)
    r = one(cast_mul(x, np.float16(1.5), ft="float16", opset=23))
    assert not r.exact and "two meanings" in r.reasons[0]


def test_scale_varying_along_two_axes_and_shared_along_two() -> None:
    x = np.zeros((2, 3, 4, 5), np.int8)
    r = one(cast_mul(x, np.ones((2, 3, 1, 1), np.float32)))
    assert not r.exact and "shared along" in r.reasons[0]


def nibbles() -> onnx.ModelProto:
    p = np.random.default_rng(4).integers(0, 256, (8, 4)).astype(np.uint8)
    nodes = [H("BitwiseAnd", ["p", "m"], ["lo"]), H("BitShift", ["p", "four"], ["hi"],
                                                    direction="RIGHT"),
             H("Unsqueeze", ["lo", "ax"], ["lo1"]), H("Unsqueeze", ["hi", "ax"], ["hi1"]),
             H("Concat", ["lo1", "hi1"], ["n"], axis=-1), H("Reshape", ["n", "shp"], ["q"]),
             H("Cast", ["q"], ["c"], to=TP.FLOAT), H("Sub", ["c", "eight"], ["d"]),
             H("Mul", ["d", "s"], ["w"])]
    return model(nodes, {"p": p, "m": np.uint8(15), "four": np.uint8(4),
                         "ax": np.array([-1], np.int64), "shp": np.array([8, 8], np.int64),
                         "eight": np.float32(8), "s": np.full((8, 1), 0.3, np.float32)},
                 "w", TP.FLOAT)


def test_packed_int4_unpacked_with_bitshift() -> None:
    r = one(nibbles())
    assert r.unpacked and (r.stored_type, r.codes_type, r.codes) == ("uint8", "uint4", "p")
    assert (r.granularity, r.axis, r.zero_point, r.min_opset) == ("per-axis", 0, "integer", 21)
    assert r.ops[:2] == ("BitwiseAnd", "BitShift") and r.ops[-1] == "Mul"


@pytest.mark.parametrize("build", [
    # a Cast of a run-time integer input (image bytes, masks) is no weight
    lambda: model([H("Cast", ["X"], ["c"], to=TP.FLOAT), H("Mul", ["c", "s"], ["w"])],
                  {"s": np.float32(1 / 255)}, "w", TP.FLOAT,
                  inputs=[helper.make_tensor_value_info("X", TP.UINT8, [4])]),
    # int64 constants are shape arithmetic
    lambda: cast_mul(np.arange(6, dtype=np.int64).reshape(2, 3), np.float32(2.0)),
    # a scale that grows the product is no dequantization
    lambda: cast_mul(np.arange(3, dtype=np.int8), np.ones((4, 3), np.float32)),
    # zp - x
    lambda: model([H("Cast", ["x"], ["c"], to=TP.FLOAT), H("Sub", ["zp", "c"], ["d"]),
                   H("Mul", ["d", "s"], ["w"])],
                  {"x": X8, "zp": np.float32(1), "s": np.float32(2)}, "w", TP.FLOAT),
    # a Cast to an integer type
    lambda: model([H("Cast", ["x"], ["c"], to=TP.INT32), H("Mul", ["c", "s"], ["w"])],
                  {"x": X8, "s": np.int32(2)}, "w", TP.INT32),
])
def test_not_dequantization(build) -> None:
    assert find(ir.from_proto(build())) == ()


def test_subgraphs_and_functions() -> None:
    inner = helper.make_graph([H("Cast", ["x"], ["c"], to=TP.FLOAT), H("Mul", ["c", "s"], ["o"])],
                              "then", [], [helper.make_tensor_value_info("o", TP.FLOAT, None)])
    other = helper.make_graph([H("Identity", ["s"], ["o2"])], "else", [],
                              [helper.make_tensor_value_info("o2", TP.FLOAT, None)])
    # inside a function the codes and scale are Constant nodes (it has no initializers)
    body = [helper.make_node("Constant", [], ["k"], value=init("k", X8)),
            helper.make_node("Constant", [], ["ks"], value=init("ks", np.float32(0.5))),
            H("Cast", ["k"], ["ca"], to=TP.FLOAT), H("Mul", ["ca", "ks"], ["w"]),
            H("Add", ["a", "w"], ["y"])]
    fn = helper.make_function("local", "Deq", ["a"], ["y"], body,
                              [helper.make_opsetid("", 21)])
    nodes = [H("If", ["cond"], ["w"], then_branch=inner, else_branch=other),
             H("Deq", ["s"], ["v"], domain="local")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("cond", TP.BOOL, [])],
                          [helper.make_tensor_value_info("w", TP.FLOAT, None),
                           helper.make_tensor_value_info("v", TP.FLOAT, None)],
                          [init("x", X8), init("s", np.float32(0.5))])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21),
                                            helper.make_opsetid("local", 1)],
                          functions=[fn], ir_version=10)
    graphs = sorted(r.graph for r in find(ir.from_proto(m)))
    assert graphs == ["function:local.Deq", "main/If/then_branch"]


def test_json_and_the_model_untouched() -> None:
    m = ir.from_proto(nibbles())
    before = ir.to_proto(m).SerializeToString()
    records = find(m)
    assert ir.to_proto(m).SerializeToString() == before
    doc = json.loads(json.dumps([r.to_json() for r in records]))
    assert doc[0]["codes_type"] == "uint4" and doc[0]["granularity"] == "per-axis"
    assert set(doc[0]) >= {"reasons", "exact", "min_opset", "zero_point", "scale_constant"}


@pytest.mark.parametrize("shift,shape", [(8, [8, 8]), (4, [7, 8])])
def test_an_integer_computation_that_cannot_run_is_not_read(shift: int, shape: list) -> None:
    m = nibbles()
    for t in m.graph.initializer:
        if t.name == "four":
            t.CopyFrom(init("four", np.uint8(shift)))
        if t.name == "shp":
            t.CopyFrom(init("shp", np.array(shape, np.int64)))
    assert find(ir.from_proto(m)) == ()
