"""``check --against`` finds the fused weights of two correct conversions whose names or
scopes move: a MatMulNBits followed by a separate bias ``Add``, which ``pack`` takes into
MatMulNBits' bias (the packed node's output is the Add's, so the original's output name is
gone), and a MatMulNBits inside a model-local function (its values are named within the
function)."""

from __future__ import annotations

import numpy as np
import onnx
from helpers.fused import nbits_inputs, nbits_model
from onnx import helper, numpy_helper

import dqtool
from dqtool.fused.pack_api import pack

K, N = 64, 32


def _with_bias_add(tmp_path):
    rng = np.random.default_rng(5)
    m = nbits_model(K, N, 4, 32, nbits_inputs(rng, K, N, 4, 32), m=2, accuracy_level=4)
    m.graph.node[0].output[0] = "h"
    m.graph.initializer.append(numpy_helper.from_array(
        rng.standard_normal(N).astype(np.float32), "b"))
    m.graph.node.append(helper.make_node("Add", ["h", "b"], ["Y"], name="add"))
    src = tmp_path / "bias_add.onnx"
    onnx.save(m, src)
    return src


def _in_function(tmp_path):
    rng = np.random.default_rng(6)
    inner = nbits_model(K, N, 4, 32, nbits_inputs(rng, K, N, 4, 32), m=2)
    consts = [helper.make_node("Constant", [], [t.name], value=t)
              for t in inner.graph.initializer]
    body = [*consts, inner.graph.node[0]]
    f = helper.make_function("local", "QLayer", ["A"], ["Y"], body, list(inner.opset_import))
    g = helper.make_graph([helper.make_node("QLayer", ["x"], ["y"], domain="local")], "g",
                          [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, K])],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, N])])
    m = helper.make_model(g, ir_version=10, functions=[f], opset_imports=[
        *inner.opset_import, helper.make_opsetid("local", 1)])
    src = tmp_path / "in_function.onnx"
    onnx.save(m, src)
    return src


def test_pack_taking_the_bias_add_keeps_its_weight_checked(tmp_path):
    src = _with_bias_add(tmp_path)
    up = tmp_path / "up.onnx"
    dqtool.upgrade(src, 21, up)
    packed = tmp_path / "packed.onnx"
    pack(up, packed, accuracy_level=4, fuse_bias=True)
    assert [n.op_type for n in onnx.load(packed).graph.node] == ["MatMulNBits"]
    report = dqtool.check(packed, against=src)
    assert [w.status for w in report.weights] == ["bit-identical"]
    # the original node's output is gone: it cannot be bounded, so onnxruntime's
    # difference (the bias summed inside the node) is not tolerated as its rounding
    (bound,) = report.bounds
    assert bound.status == "unbounded" and "not in the checked model" in bound.detail
    (ort,) = [c for c in report.comparisons if c.runtime == "onnxruntime"]
    identical = all(o.max_abs == 0 for o in ort.outputs)
    assert report.passed == identical
    assert identical or any("could not be bounded" in n for n in report.notes)


def test_pack_leaves_a_separate_bias_add_of_the_original(tmp_path):
    """An Add the original model had after its MatMulNBits stays an Add (inside the node
    onnxruntime sums the bias in its own order); only upgrade's own bias Add goes back."""
    src = _with_bias_add(tmp_path)
    up = tmp_path / "up.onnx"
    dqtool.upgrade(src, 21, up)
    packed = tmp_path / "packed.onnx"
    pack(up, packed)
    assert [n.op_type for n in onnx.load(packed).graph.node] == ["MatMulNBits", "Add"]
    report = dqtool.check(packed, against=src)
    (ort,) = [c for c in report.comparisons if c.runtime == "onnxruntime"]
    assert report.passed and all(o.max_abs == 0 for o in ort.outputs)


def test_a_fused_node_in_a_function_keeps_its_weight_checked(tmp_path):
    src = _in_function(tmp_path)
    up = tmp_path / "up.onnx"
    dqtool.upgrade(src, 21, up)
    report = dqtool.check(up, against=src)
    assert [w.status for w in report.weights] == ["bit-identical"]
    assert report.passed


def test_both_conversions_are_exact_on_the_reference_runtime(tmp_path):
    for src in (_with_bias_add(tmp_path), _in_function(tmp_path)):
        up = tmp_path / f"{src.stem}.up.onnx"
        dqtool.upgrade(src, 21, up)
        report = dqtool.check(up, against=src)
        (ref,) = [c for c in report.comparisons if c.runtime == "reference"]
        assert ref.outputs and all(o.mismatched == 0 and o.max_abs == 0 for o in ref.outputs)
