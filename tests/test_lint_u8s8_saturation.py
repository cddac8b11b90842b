"""DQ111: u8 activations × s8 weights that onnxruntime saturates on x86 without VNNI, decided
from the weights (never the machine), against the pairs measured on the AVX2 path."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers.integer import one_node
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import dqtool
from dqtool.families.integer import lint_saturation as rule


def _matmul_integer(b: np.ndarray) -> onnx.ModelProto:
    a = np.zeros((1, b.shape[0]), np.uint8)
    return one_node("MatMulInteger", [("in_a", a), ("b", b)], TP.INT32)


def _findings(model: onnx.ModelProto, tmp_path, target: str = "onnxruntime-1.32"):
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    return dqtool.lint(path, target=target, select="DQ111").findings


@pytest.mark.parametrize(("column", "fires"), [
    ([64, 64], False), ([64, 65], True), ([-64, -64], False), ([-64, -65], True),
    ([127, 1], False), ([127, 2], True), ([-128, 0], False), ([-128, -1], True),
    ([0, 127, 2, 0], False),  # 127 and 2 sit in different pairs
    ([0, 0, 127, 2], True), ([127, -128], False), ([127], False),
])
def test_the_pair_condition_measured_on_the_avx2_path(column, fires, tmp_path):
    # Each column was run as MatMulInteger with activations 255 on onnxruntime 1.32.0
    # under qemu -cpu Haswell: it saturated exactly where ``fires``.
    b = np.array(column, np.int8).reshape(-1, 1)
    found = _findings(_matmul_integer(b), tmp_path)
    assert bool(found) == fires
    if fires:
        f = found[0]
        assert f.code == "DQ111" and f.severity == "warning"
        assert "reduce_range" in f.fix and "1 of" in f.message


def test_pairs_beyond_counts_and_reports_the_largest():
    w = np.array([[100, 0], [100, 0], [0, -70], [0, -70], [5, 5]], np.int8)
    assert rule.pairs_beyond(w, 0) == (2, 6, 200)


def test_seven_bit_weights_never_fire(tmp_path):
    r = np.random.default_rng(0)
    b = r.integers(-64, 64, (64, 16)).astype(np.int8)
    assert not _findings(_matmul_integer(b), tmp_path)
    b[0, 0], b[1, 0] = 127, 127
    assert len(_findings(_matmul_integer(b), tmp_path)) == 1


def test_uint8_weights_and_int8_activations_never_fire(tmp_path):
    b = np.full((4, 2), 200, np.uint8)
    assert not _findings(_matmul_integer(b), tmp_path)
    a = np.zeros((1, 4), np.int8)
    m = one_node("MatMulInteger", [("in_a", a), ("b", np.full((4, 2), 127, np.int8))],
                 TP.INT32)
    assert not _findings(m, tmp_path)


def _qlinear_conv(w: np.ndarray, group: int = 1) -> onnx.ModelProto:
    c = w.shape[1] * group
    x = np.zeros((1, c, 3, 3), np.uint8)
    f = np.float32
    return one_node("QLinearConv", [
        ("in_x", x), ("xs", np.array(f(1))), ("xz", np.array(np.uint8(0))), ("w", w),
        ("ws", np.array(f(1))), ("wz", np.array(np.int8(0))), ("ys", np.array(f(1))),
        ("yz", np.array(np.uint8(0)))], TP.UINT8, group=group)


@pytest.mark.parametrize(("c", "kw", "where", "fires"), [
    (2, 1, [(0, 0), (1, 0)], True),  # channels innermost: c0, c1 pair
    (2, 2, [(0, 0), (0, 1)], False),  # one channel at two kernel positions: (0, 2)
    (3, 2, [(2, 0), (0, 1)], True),  # window index 2 and 3
    (3, 2, [(1, 0), (2, 0)], False),  # window index 1 and 2
])
def test_conv_window_order_as_measured(c, kw, where, fires, tmp_path):
    w = np.zeros((2, c, 1, kw), np.int8)
    for ch, k in where:
        w[:, ch, 0, k] = 127
    assert bool(_findings(_qlinear_conv(w), tmp_path)) == fires


def test_depthwise_conv_is_exact_and_never_fires(tmp_path):
    w = np.full((2, 1, 1, 3), 127, np.int8)
    assert not _findings(_qlinear_conv(w, group=2), tmp_path)


def test_the_qdq_pattern_onnxruntime_fuses_fires(tmp_path):
    w = np.full((4, 3), 100, np.int8)
    nodes = [helper.make_node("DequantizeLinear", ["x", "xs", "xz"], ["xf"]),
             helper.make_node("DequantizeLinear", ["w", "ws"], ["wf"]),
             helper.make_node("MatMul", ["xf", "wf"], ["y"], name="mm")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TP.UINT8, [1, 4])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, [1, 3])],
                          [numpy_helper.from_array(np.array(np.float32(0.1)), "xs"),
                           numpy_helper.from_array(np.array(np.uint8(3)), "xz"),
                           numpy_helper.from_array(w, "w"),
                           numpy_helper.from_array(np.array(np.float32(0.1)), "ws")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    found = _findings(m, tmp_path)
    assert [f.node for f in found] == ["mm"]
    assert "6 of 6" in found[0].message


@pytest.mark.parametrize("target", ["onnxruntime-1.31", "onnx-opset-21", "directml-fl6.2"])
def test_only_targets_with_a_measured_entry(target, tmp_path):
    b = np.full((2, 1), 127, np.int8)
    assert not _findings(_matmul_integer(b), tmp_path, target)
