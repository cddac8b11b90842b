"""fold: MatMulNBits / GatherBlockQuantized become float MatMul / Gather weights."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
import pytest
from click.testing import CliRunner
from helpers.fused import bits_of, gbq_model, nbits_inputs, nbits_model, run_ort

import dqtool
from dqtool.cli import cli


def _fold(proto, **kw) -> tuple[onnx.ModelProto, object]:
    report = dqtool.fold(ir.serde.deserialize_model(proto), **kw)
    out = ir.serde.serialize_model(report.model)
    onnx.checker.check_model(out)
    return out, report


def _quantized_inits(proto) -> list[str]:
    return [t.name for t in proto.graph.initializer if t.data_type in (
        onnx.TensorProto.UINT4, onnx.TensorProto.INT4, onnx.TensorProto.UINT8,
        onnx.TensorProto.UINT2)]


@pytest.mark.parametrize(("bits", "zp", "dtype"), [(4, "packed", np.float32),
                                                   (8, "none", np.float16),
                                                   (4, "float", np.float32)])
def test_fold_matmul_nbits_into_float_matmul(bits, zp, dtype):
    rng = np.random.default_rng(bits)
    inputs = nbits_inputs(rng, 100, 8, bits, 32, dtype, zp)
    original = nbits_model(100, 8, bits, 32, inputs, dtype=dtype, opset=17)
    folded, report = _fold(original)
    ops = [n.op_type for n in folded.graph.node]
    assert "MatMulNBits" not in ops and "DequantizeLinear" not in ops and "MatMul" in ops
    assert _quantized_inits(folded) == []
    assert report.prepared == ["mm"] and len(report.folded) == 1
    assert {o.domain for o in folded.opset_import} == {""}
    eye = {"A": np.eye(100, dtype=dtype)}
    assert np.array_equal(bits_of(run_ort(original, eye)[0]), bits_of(run_ort(folded, eye)[0]))


def test_fold_to_float16_checkpoint():
    rng = np.random.default_rng(1)
    inputs = nbits_inputs(rng, 64, 8, 4, 32)
    folded, report = _fold(nbits_model(64, 8, 4, 32, inputs), dtype="float16")
    w = next(t for t in folded.graph.initializer if t.data_type == onnx.TensorProto.FLOAT16)
    ref = dqtool.dequantize_matmul_nbits(inputs["B"], inputs["scales"], inputs["zero_points"],
                                         K=64, N=8, bits=4, block_size=32)
    assert np.array_equal(onnx.numpy_helper.to_array(w), ref.astype(np.float16))
    assert report.folded[0].rounding is not None


def test_fold_gather_block_quantized():
    rng = np.random.default_rng(2)
    table = rng.integers(-8, 8, size=(10, 64)).astype(ml_dtypes.int4)
    original = gbq_model(table, (rng.random((10, 2)) + 0.1).astype(np.float32), None)
    folded, _ = _fold(original)
    assert [n.op_type for n in folded.graph.node] == ["Gather"]
    idx = {"indices": np.array([0, 9, 3, 3, 1], np.int64)}
    assert np.array_equal(run_ort(original, idx)[0], run_ort(folded, idx)[0])


def test_fold_leaves_act_order_with_the_reason(tmp_path):
    rng = np.random.default_rng(3)
    proto = nbits_model(64, 5, 4, 32, nbits_inputs(rng, 64, 5, 4, 32))
    proto.graph.initializer.append(onnx.numpy_helper.from_array(
        (np.arange(64) % 2).astype(np.int32), "g"))
    proto.graph.node[0].input.append("g")
    path = tmp_path / "m.onnx"
    onnx.save(proto, path)
    r = CliRunner().invoke(cli, ["fold", str(path)], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "left fused mm: g_idx reorders rows" in r.output


def _two_node_model():
    """A GatherBlockQuantized "emb" feeding a MatMulNBits "mm" (float32, 4-bit)."""
    rng = np.random.default_rng(5)
    table = rng.integers(0, 256, size=(10, 16), dtype=np.uint8)  # (10, 32) 4-bit codes
    g = gbq_model(table, (rng.random((10, 1)) * 0.1 + 0.01).astype(np.float32), None,
                  block=32, bits=4, n_indices=3)
    mm = nbits_model(32, 8, 4, 32, nbits_inputs(rng, 32, 8, 4, 32), m=3)
    g.graph.node[0].output[0] = "A"
    for t in mm.graph.initializer:
        t.name = f"mm.{t.name}"
    for i, name in enumerate(mm.graph.node[0].input):
        if i:
            mm.graph.node[0].input[i] = f"mm.{name}"
    g.graph.node.extend(mm.graph.node)
    g.graph.initializer.extend(mm.graph.initializer)
    del g.graph.output[:]
    g.graph.output.extend(mm.graph.output)
    onnx.checker.check_model(g)
    return g


@pytest.mark.parametrize(("options", "folded", "left"), [
    ({"op_types": "MatMul"}, ["mm"], ["gbq"]),
    ({"op_types": "Gather"}, ["gbq"], ["mm"]),
    ({"op_types": "MatMulNBits"}, ["mm"], ["gbq"]),
    ({"exclude": "mm"}, ["gbq"], ["mm"]),
    ({"exclude": "Y"}, ["gbq"], ["mm"]),  # by output name, as for DequantizeLinear
    ({"include": "mm"}, ["mm"], ["gbq"]),
    ({"min_elements": 300}, ["gbq"], ["mm"]),  # mm's weight has 256 elements, gbq's 320
    ({"x_types": "uint4"}, ["gbq", "mm"], []),
    ({"x_types": "int8"}, [], ["gbq", "mm"]),
    ({}, ["gbq", "mm"], []),
])
def test_the_selection_picks_fused_nodes_and_leaves_the_others_untouched(options, folded,
                                                                          left):
    original = _two_node_model()
    report = dqtool.fold(ir.serde.deserialize_model(original), **options)
    assert sorted(report.prepared) == folded
    assert sorted(n for n, _ in report.prepared_left) == left
    assert all(why.startswith("not selected: ") for _, why in report.prepared_left)
    out = ir.serde.serialize_model(report.model)
    ops = sorted(n.op_type for n in out.graph.node)
    # a selected node is folded all the way (its new DequantizeLinear too, though the
    # selection names the fused node); an unselected one keeps its op and its bytes
    assert "DequantizeLinear" not in ops
    kept = {"mm": "MatMulNBits", "gbq": "GatherBlockQuantized"}
    assert sorted(kept[n] for n in left) == sorted(o for o in ops if o in kept.values())
    before = {t.name: t.raw_data for t in original.graph.initializer}
    after = {t.name: t.raw_data for t in out.graph.initializer}
    for name in left:
        node = next(n for n in out.graph.node if n.name == name)
        for i in node.input:
            if i in before:
                assert after[i] == before[i]
    feeds = {"indices": np.array([0, 9, 4], np.int64)}
    got, want = run_ort(out, feeds)[0], run_ort(original, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_fold_text_names_the_rewritten_nodes_not_their_ops(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(_two_node_model(), src)
    r = CliRunner().invoke(cli, ["fold", str(src), "-o", str(tmp_path / "f.onnx"),
                                 "--op-types", "Gather"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "1 fused node(s) (dequantization inside the operator) rewritten exactly into " \
           "DequantizeLinear form before folding (or folded whole, listed above): gbq" \
           in " ".join(r.output.split())
    assert "left fused mm: not selected: becomes MatMul, not --op-types Gather" in r.output


@pytest.mark.parametrize(("dtype", "store", "want_type"), [
    (np.float32, "float16", np.float16), (np.float16, "float16", np.float16),
    (np.float32, "bfloat16", ml_dtypes.bfloat16)])
def test_float_zero_points_fold_into_one_weight_rounded_once(dtype, store, want_type):
    # HQQ: the weight is q·s + (-(zp·s)). Folding only q·s (the DequantizeLinear of the
    # ai.onnx form) to float16 rounded it before the offset: weights near zero were off by
    # up to a quarter of themselves. A narrower --dtype folds the node into one weight.
    rng = np.random.default_rng(7)
    inputs = nbits_inputs(rng, 96, 16, 4, 32, dtype, "float")
    bias = rng.random(16).astype(dtype)
    original = nbits_model(96, 16, 4, 32, inputs, dtype=dtype, bias=bias)
    folded, report = _fold(original, dtype=store)
    guard = "Cast" if np.dtype(want_type) != np.dtype(dtype) else "Identity"  # no prepack
    assert [n.op_type for n in folded.graph.node] == [guard, "MatMul", "Add"]
    [w] = [t for t in folded.graph.initializer if t.name != "bias"]
    got = onnx.numpy_helper.to_array(w)
    kernel_w = dqtool.dequantize_matmul_nbits(inputs["B"], inputs["scales"],
                                              inputs["zero_points"], K=96, N=16, bits=4,
                                              block_size=32)
    assert got.dtype == want_type
    assert np.array_equal(bits_of(got), bits_of(kernel_w.astype(want_type)))
    [rec] = report.folded
    assert rec.op == "com.microsoft:MatMulNBits-1" and rec.shape == (96, 16)
    assert rec.stored_type == np.dtype(want_type).name
    assert (rec.rounding is not None) == (np.dtype(want_type) != np.dtype(dtype))
    assert report.prepared == ["mm"]


@pytest.mark.parametrize(("dtype", "store"), [(np.float32, "keep"), (np.float16, "keep"),
                                              (np.float16, "float32")])
def test_float_zero_points_keep_their_exact_chain_otherwise(dtype, store):
    # Without a narrower --dtype the DequantizeLinear of q·s is folded (streamed, guarded
    # against onnxruntime's prepacking) and the offsets' chain stays: exact.
    rng = np.random.default_rng(8)
    inputs = nbits_inputs(rng, 300, 8, 4, 32, dtype, "float")
    original = nbits_model(300, 8, 4, 32, inputs, dtype=dtype, m=2)
    folded, report = _fold(original, dtype=store)
    ops = [n.op_type for n in folded.graph.node]
    assert "Add" in ops and "Reshape" in ops and "MatMulNBits" not in ops
    assert len(report.folded) == 1 and report.folded[0].op.startswith("ai.onnx:Dequantize")
    if dtype == np.float32:  # float16: onnxruntime's fused op rounds once (docs/fused.md)
        a = {"A": rng.standard_normal((2, 300)).astype(dtype)}
        assert np.array_equal(bits_of(run_ort(original, a)[0]), bits_of(run_ort(folded, a)[0]))


def test_fold_to_float16_of_upgraded_hqq_keeps_the_weight_before_its_offsets(tmp_path):
    """upgrade writes an HQQ weight as DequantizeLinear → Reshape → Add(-(zp·s)): folded
    to float16 before that Add, q·s was rounded where the Add then cancels most of it
    (weights near zero up to 90x off). That node keeps its own type: exact."""
    rng = np.random.default_rng(13)
    src, up, out = tmp_path / "m.onnx", tmp_path / "up.onnx", tmp_path / "f.onnx"
    onnx.save(nbits_model(64, 16, 4, 32, nbits_inputs(rng, 64, 16, 4, 32, zp="float")), src)
    dqtool.upgrade(src, 21, up)
    report = dqtool.fold(up, out, dtype="float16")
    assert [f.stored_type for f in report.folded] == ["float"]  # float32, unrounded
    weights = dqtool.check(out, against=src).weights
    assert [w.status for w in weights] == ["bit-identical"]


def test_fold_in_a_function_leaves_none_of_the_fused_nodes_constants(tmp_path):
    """In a function the weight's B, scales and zero points are Constant nodes: a fold
    left them there, unused (the model kept their bytes)."""
    from onnx import helper

    rng = np.random.default_rng(14)
    inner = nbits_model(64, 32, 4, 32, nbits_inputs(rng, 64, 32, 4, 32), m=2)
    consts = [helper.make_node("Constant", [], [t.name], value=t)
              for t in inner.graph.initializer]
    f = helper.make_function("local", "QLayer", ["A"], ["Y"], [*consts, inner.graph.node[0]],
                             list(inner.opset_import))
    g = helper.make_graph([helper.make_node("QLayer", ["x"], ["y"], domain="local")], "g",
                          [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 64])],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 32])])
    m = helper.make_model(g, ir_version=10, functions=[f], opset_imports=[
        *inner.opset_import, helper.make_opsetid("local", 1)])
    src, out = tmp_path / "m.onnx", tmp_path / "f.onnx"
    onnx.save(m, src)
    dqtool.fold(src, out)
    (fn,) = onnx.load(out).functions
    consts = [n for n in fn.node if n.op_type == "Constant"]
    assert len(consts) == 1 and consts[0].attribute[0].t.data_type == onnx.TensorProto.FLOAT
