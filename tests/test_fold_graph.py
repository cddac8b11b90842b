"""Fold on tiny inline models: rewiring, outputs, shared constants, subgraphs, functions,
selection, --dtype, and the chunked computation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from helpers import assert_bitwise_equal, make_model, run_ort, save, tensor
from onnx import TensorProto as TP
from onnx import helper as h

from dqtool import kernel
from dqtool.errors import UsageError
from dqtool.folding import compute, fold
from dqtool.folding.kernel_call import KernelCall

RNG = np.random.default_rng(5)
WQ = RNG.integers(-128, 127, (8, 4), dtype=np.int8)
WS = np.array([0.5, 0.25, 0.125, 2.0], np.float32)


def weight_model(**kw) -> onnx.ModelProto:
    """X(2,8) @ DQ(W_q per-axis) -> Y; the DQ output is also a graph output "W"."""
    nodes = [h.make_node("DequantizeLinear", ["W_q", "W_s"], ["W"], name="dq", axis=1),
             h.make_node("MatMul", ["X", "W"], ["Y"], name="mm")]
    return make_model(nodes, [tensor("W_q", WQ), tensor("W_s", WS)],
                      [("X", TP.FLOAT, [2, 8])],
                      [("Y", TP.FLOAT, [2, 4]), ("W", TP.FLOAT, [8, 4])], **kw)


def x_feed() -> dict[str, np.ndarray]:
    return {"X": RNG.standard_normal((2, 8)).astype(np.float32)}


def test_graph_output_keeps_its_name_and_values(tmp_path: Path) -> None:
    src = save(weight_model(), tmp_path / "m.onnx")
    report = fold(src, tmp_path / "o.onnx")
    m = ir.load(tmp_path / "o.onnx")
    assert [o.name for o in m.graph.outputs] == ["Y", "W"]
    assert "W" in m.graph.initializers and "W_q" not in m.graph.initializers
    assert report.folded[0].output == "W"
    feed = x_feed()
    assert_bitwise_equal(run_ort(src, feed), run_ort(tmp_path / "o.onnx", feed))
    np.testing.assert_array_equal(m.graph.initializers["W"].const_value.numpy(),
                                  kernel.dequantize(WQ, WS, axis=1))


def test_prepack_guard_identity_and_opt_out(tmp_path: Path) -> None:
    src = save(weight_model(), tmp_path / "m.onnx")
    fold(src, tmp_path / "g.onnx")
    mm = next(n for n in ir.load(tmp_path / "g.onnx").graph if n.op_type == "MatMul")
    assert mm.inputs[1].producer().op_type == "Identity"
    fold(src, tmp_path / "p.onnx", prepack_guard=False)
    mm = next(n for n in ir.load(tmp_path / "p.onnx").graph if n.op_type == "MatMul")
    assert mm.inputs[1].name == "W" and mm.inputs[1].producer() is None


def test_shared_quantized_initializer_is_kept(tmp_path: Path) -> None:
    m = weight_model()
    m.graph.node.append(h.make_node("Cast", ["W_q"], ["Wc"], to=TP.FLOAT))
    m.graph.output.append(h.make_tensor_value_info("Wc", TP.FLOAT, [8, 4]))
    report = fold(save(m, tmp_path / "m.onnx"), tmp_path / "o.onnx")
    assert report.kept == ["W_q"] and report.removed == ["W_s"]
    assert "W_q" in ir.load(tmp_path / "o.onnx").graph.initializers


def test_initializer_that_is_a_graph_input_is_not_constant(tmp_path: Path) -> None:
    m = weight_model()
    m.graph.input.append(h.make_tensor_value_info("W_s", TP.FLOAT, [4]))
    report = fold(save(m, tmp_path / "m.onnx"), dry_run=True)
    assert not report.folded
    assert "overridable" in report.left[0].reason and not report.left[0].refused


def test_subgraph_with_outer_scope_initializers(tmp_path: Path) -> None:
    then_g = h.make_graph([h.make_node("DequantizeLinear", ["W_q", "W_s"], ["Wt"], axis=1)],
                          "then", [], [h.make_tensor_value_info("Wt", TP.FLOAT, [8, 4])])
    else_g = h.make_graph([h.make_node("Identity", ["Z"], ["We"])], "else", [],
                          [h.make_tensor_value_info("We", TP.FLOAT, [8, 4])])
    nodes = [h.make_node("If", ["C"], ["W"], then_branch=then_g, else_branch=else_g),
             h.make_node("MatMul", ["X", "W"], ["Y"])]
    m = make_model(nodes, [tensor("W_q", WQ), tensor("W_s", WS),
                           tensor("Z", np.ones((8, 4), np.float32))],
                   [("X", TP.FLOAT, [2, 8]), ("C", TP.BOOL, [])], [("Y", TP.FLOAT, [2, 4])])
    src = save(m, tmp_path / "m.onnx")
    report = fold(src, tmp_path / "o.onnx")
    assert [n.graph for n in report.folded] == ["main/If/then_branch"]
    out = ir.load(tmp_path / "o.onnx")
    assert "W_q" not in out.graph.initializers
    feed = {**x_feed(), "C": np.array(True)}
    assert_bitwise_equal(run_ort(src, feed), run_ort(tmp_path / "o.onnx", feed))


def test_function_constant_nodes_become_a_constant_node(tmp_path: Path) -> None:
    fn = h.make_function(
        "local", "F", ["X"], ["Y"],
        [h.make_node("Constant", [], ["q"], value=tensor("q", WQ)),
         h.make_node("Constant", [], ["s"], value=tensor("s", WS)),
         h.make_node("DequantizeLinear", ["q", "s"], ["w"], axis=1),
         h.make_node("MatMul", ["X", "w"], ["Y"])],
        [h.make_opsetid("", 21)])
    m = make_model([h.make_node("F", ["X"], ["Y"], domain="local")], [],
                   [("X", TP.FLOAT, [2, 8])], [("Y", TP.FLOAT, [2, 4])], functions=[fn],
                   extra_opsets={"local": 1})
    src = save(m, tmp_path / "m.onnx")
    report = fold(src, tmp_path / "o.onnx")
    assert len(report.folded) == 1 and report.folded[0].graph == "function:local.F"
    ops = [n.op_type for n in next(iter(ir.load(tmp_path / "o.onnx").functions.values()))]
    assert ops == ["Constant", "Identity", "MatMul"]
    feed = x_feed()
    assert_bitwise_equal(run_ort(src, feed), run_ort(tmp_path / "o.onnx", feed))


def test_q_const_dq_pair(tmp_path: Path) -> None:
    w = RNG.standard_normal((8, 4)).astype(np.float32)
    nodes = [h.make_node("QuantizeLinear", ["W", "s", "zp"], ["Wq"], axis=1),
             h.make_node("DequantizeLinear", ["Wq", "s", "zp"], ["Wd"], axis=1),
             h.make_node("MatMul", ["X", "Wd"], ["Y"])]
    m = make_model(nodes, [tensor("W", w), tensor("s", WS), tensor("zp", np.zeros(4, np.int8))],
                   [("X", TP.FLOAT, [2, 8])], [("Y", TP.FLOAT, [2, 4])])
    src = save(m, tmp_path / "m.onnx")
    report = fold(src, tmp_path / "o.onnx")
    assert report.folded[0].pair and sorted(report.removed) == ["W", "s", "zp"]
    feed = x_feed()
    assert_bitwise_equal(run_ort(src, feed), run_ort(tmp_path / "o.onnx", feed))


def test_selection(tmp_path: Path) -> None:
    bias_q = np.array([100, -3, 7, 0], np.int32)
    nodes = [h.make_node("DequantizeLinear", ["W_q", "W_s"], ["W"], name="w_dq", axis=1),
             h.make_node("DequantizeLinear", ["B_q", "B_s"], ["B"], name="b_dq"),
             h.make_node("MatMul", ["X", "W"], ["M"]), h.make_node("Add", ["M", "B"], ["Y"])]
    m = make_model(nodes, [tensor("W_q", WQ), tensor("W_s", WS), tensor("B_q", bias_q),
                           tensor("B_s", np.float32(0.5))],
                   [("X", TP.FLOAT, [2, 8])], [("Y", TP.FLOAT, [2, 4])])
    src = save(m, tmp_path / "m.onnx")

    def names(**kw) -> list[str]:
        return [n.name for n in fold(src, dry_run=True, **kw).folded]

    assert names() == ["w_dq", "b_dq"]
    assert names(x_types="int32") == ["b_dq"]
    assert names(op_types=["MatMul,Gemm"]) == ["w_dq"]
    assert names(include="w_*") == ["w_dq"]
    assert names(include=["B"]) == ["b_dq"]  # output names match too
    assert names(exclude="w_*") == ["b_dq"]
    assert names(min_elements=5) == ["w_dq"]
    left = fold(src, dry_run=True, x_types="int32").left
    assert left[0].reason.startswith("not selected") and not left[0].refused
    with pytest.raises(UsageError):
        fold(src, dry_run=True, x_types="int33")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_dtype_is_one_cast_of_the_output(tmp_path: Path, dtype: str) -> None:
    src = save(weight_model(), tmp_path / "m.onnx")
    report = fold(src, tmp_path / "o.onnx", dtype=dtype)
    node = report.folded[0]
    assert node.rounding == (None if dtype == "float32" else f"float→{dtype}")
    m = ir.load(tmp_path / "o.onnx")
    y = kernel.dequantize(WQ, WS, axis=1)
    stored = {v.name: v for v in m.graph.initializers.values()}
    name = "W" if dtype == "float32" else f"W_{dtype}"
    got = stored[name].const_value.numpy()
    np.testing.assert_array_equal(got.view(np.uint8), y.astype(got.dtype).view(np.uint8))
    if dtype != "float32":  # a Cast back keeps the graph's types; ORT runs it
        assert m.graph.outputs[1].name == "W"
        run_ort(tmp_path / "o.onnx", x_feed())


def test_com_microsoft_import_dropped_when_unused(tmp_path: Path) -> None:
    nodes = [h.make_node("DequantizeLinear", ["W_q", "W_s"], ["W"], domain="com.microsoft",
                         axis=1), h.make_node("MatMul", ["X", "W"], ["Y"])]
    m = make_model(nodes, [tensor("W_q", WQ), tensor("W_s", WS)], [("X", TP.FLOAT, [2, 8])],
                   [("Y", TP.FLOAT, [2, 4])], opset=17, extra_opsets={"com.microsoft": 1})
    report = fold(save(m, tmp_path / "m.onnx"), tmp_path / "o.onnx")
    assert report.opset_imports == {"": 17} and report.ir_version == 8


@pytest.mark.parametrize("kind", ["per-tensor", "per-axis0", "per-axis1", "blocked0",
                                  "blocked1", "int4-blocked0"])
def test_chunks_equal_whole(kind: str, monkeypatch) -> None:
    x = RNG.integers(-8, 7, (37, 6)).astype(np.int8)
    scale, axis, bs, gran, norm = np.float32(0.3), 1, 0, "per-tensor", None
    if kind == "per-axis0":
        scale, axis, gran, norm = RNG.random(37).astype(np.float32), 0, "per-axis", 0
    elif kind == "per-axis1":
        scale, axis, gran, norm = RNG.random(6).astype(np.float32), 1, "per-axis", 1
    elif kind.endswith("blocked0"):
        scale, axis, bs, gran, norm = RNG.random((10, 6)).astype(np.float32), 0, 4, "blocked", 0
    elif kind == "blocked1":
        scale, axis, bs, gran, norm = RNG.random((37, 2)).astype(np.float32), 1, 4, "blocked", 1
    if kind.startswith("int4"):
        import ml_dtypes

        x = x.astype(ml_dtypes.int4)
    step = KernelCall("dq", ir.tensor(np.asarray(scale)), None, axis, bs, gran, norm,
                        np.dtype(np.float32))
    folding = compute.Folding(ir.tensor(x), (step,), x.shape, np.dtype(np.float32),
                              np.dtype(np.float32))
    whole = folding.compute()
    monkeypatch.setattr(compute, "CHUNK_ELEMENTS", 13)
    parts: list[bytes] = []
    folding.write(lambda b: parts.append(bytes(b)))
    assert len(parts) > 2
    assert b"".join(parts) == whole.tobytes()
    assert whole.tobytes() == kernel.dequantize(x, scale, axis=axis, block_size=bs).tobytes()
