"""The fused samples in models/ (written by onnxruntime's MatMulNBitsQuantizer): every
command on them, and the round trip upgrade → pack back to the same tensors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from helpers.fused import nbits_inputs, nbits_model, run_ort

import dqtool

MODELS = Path(__file__).resolve().parent.parent / "models"
SAMPLES = {  # file -> (fused ops, opset upgrade needs)
    "ort_matmulnbits_4bit_sym_b32.onnx": (3, 21),
    "ort_matmulnbits_4bit_asym_b128.onnx": (3, 21),
    "ort_matmulnbits_8bit_b32.onnx": (2, 21),
    "ort_matmulnbits_2bit_b32.onnx": (2, 25),
}
FEEDS = {"ids": np.array([[0, 5, 63, 5]], np.int64)}


def _tensors(proto: onnx.ModelProto) -> list:
    return sorted((t.data_type, tuple(t.dims), onnx.numpy_helper.to_array(t).tobytes())
                  for t in proto.graph.initializer)


def _nodes(proto: onnx.ModelProto) -> list:
    return [(n.op_type, n.domain, sorted((a.name, onnx.helper.get_attribute_value(a))
                                         for a in n.attribute)) for n in proto.graph.node]


def _names(proto: onnx.ModelProto) -> tuple:
    return ([(n.name, list(n.input), list(n.output)) for n in proto.graph.node],
            sorted(t.name for t in proto.graph.initializer))


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_inspect_counts_every_fused_op(name):
    doc = dqtool.inspect(MODELS / name).to_json()
    fused, _ = SAMPLES[name]
    assert doc["summary"]["fused_nodes"] == fused
    assert sum(n["kind"] == "fused" for n in doc["nodes"]) == fused
    assert all(not n["problems"] for n in doc["nodes"])


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_upgrade_leaves_none_and_pack_restores_the_original(name, tmp_path):
    _, opset = SAMPLES[name]
    original = onnx.load(MODELS / name)
    up = tmp_path / "up.onnx"
    dqtool.upgrade(MODELS / name, opset, up)
    converted = onnx.load(up)
    onnx.checker.check_model(converted, full_check=True)
    assert not [n for n in converted.graph.node if n.domain == "com.microsoft"]
    report = dqtool.check(up, against=MODELS / name, rtol=1e-4, atol=1e-4,
                          inputs=FEEDS)
    assert report.weights and all(w.status == "bit-identical" for w in report.weights)
    assert report.passed
    back = tmp_path / "back.onnx"
    dqtool.pack(up, back)
    restored = onnx.load(back)
    assert _tensors(restored) == _tensors(original)
    assert _nodes(restored) == _nodes(original)
    # and by name: every node's name, inputs and outputs, every initializer's (upgrade
    # notes the originals' names; pack gives them back)
    assert _names(restored) == _names(original)
    assert np.array_equal(run_ort(restored, FEEDS)[0], run_ort(original, FEEDS)[0])


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_fold_leaves_no_quantized_weight(name):
    report = dqtool.fold(ir.load(MODELS / name), dtype="float16")
    out = ir.serde.serialize_model(report.model)
    assert not [n for n in out.graph.node if n.domain == "com.microsoft"]
    assert {t.data_type for t in out.graph.initializer} <= {
        onnx.TensorProto.FLOAT16, onnx.TensorProto.FLOAT, onnx.TensorProto.INT64}
    (y,) = run_ort(out, FEEDS)
    (want,) = run_ort(onnx.load(MODELS / name), FEEDS)
    assert np.allclose(y, want, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_lint_flags_them_off_onnxruntime(name):
    fused, _ = SAMPLES[name]
    found = dqtool.lint(MODELS / name, target="directml-fl6.2").findings
    assert sum(f.code == "DQ109" for f in found) == fused
    assert not [f for f in dqtool.lint(MODELS / name, target="onnxruntime").findings
                if f.code == "DQ109"]


def test_external_data_models_convert_and_pack_from_their_files(tmp_path):
    """Weights in a data file: read without a memory map, the uint8-packed table of a
    GatherBlockQuantized reinterpreted over the same bytes, the result loadable."""
    from helpers.fused import gbq_model

    from dqtool.families.fused import packing

    rng = np.random.default_rng(0)
    table = packing.pack(rng.integers(0, 16, size=(40, 64), dtype=np.uint8), 4)
    proto = gbq_model(table, (rng.random((40, 2)) + 0.1).astype(np.float32), None)
    idx = {"indices": np.array([39, 0, 7, 7, 1], np.int64)}
    (want,) = run_ort(proto, idx)
    src = tmp_path / "g.onnx"
    onnx.save(proto, src, save_as_external_data=True, location="g.onnx.data",
              size_threshold=0)
    up = tmp_path / "up.onnx"
    dqtool.upgrade(src, 21, up)
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    got = ort.InferenceSession(str(up), so, providers=["CPUExecutionProvider"]).run(None, idx)
    assert np.array_equal(got[0], want)
    report = dqtool.check(up, against=src, inputs=idx)
    assert [w.status for w in report.weights] == ["bit-identical"] and report.passed
    back = tmp_path / "back.onnx"
    dqtool.pack(up, back)
    packed = ort.InferenceSession(str(back), so, providers=["CPUExecutionProvider"])
    assert np.array_equal(packed.run(None, idx)[0], want)
    assert [n.op_type for n in onnx.load(back, load_external_data=False).graph.node] == \
        ["GatherBlockQuantized"]


def test_lowered_below_opset_21_the_model_keeps_a_low_ir_version(tmp_path):
    """Node metadata needs IR version 10: upgrade's notes for pack (names, bias, accuracy
    level, width) go only where the model is IR 10 anyway, so an 8-bit model lowered to
    opset 13 stays IR 7, with a bias and an accuracy level too; and a fold, at any
    opset, leaves none of them."""
    out = tmp_path / "o13.onnx"
    dqtool.downgrade(MODELS / "ort_matmulnbits_8bit_b32.onnx", 13, out)
    m = onnx.load(out)
    assert m.ir_version == 7
    assert not [n for n in m.graph.node if n.metadata_props]
    rng = np.random.default_rng(3)
    src = tmp_path / "biased.onnx"
    onnx.save(nbits_model(64, 16, 8, 64, nbits_inputs(rng, 64, 16, 8, 64),
                          bias=rng.random(16).astype(np.float32), accuracy_level=4,
                          opset=17), src)
    for make in (lambda o: dqtool.upgrade(src, 17, o),
                 lambda o: dqtool.fold(src, o)):
        out = tmp_path / "out.onnx"
        make(out)
        m = onnx.load(out)
        assert m.ir_version < 10, m.ir_version
        assert [n.op_type for n in m.graph.node if n.metadata_props] == []
    up = dqtool.upgrade(src, 21).model
    assert {k for n in up.graph for k in n.metadata_props} == {
        "dqtool.fused.names", "dqtool.fused.accuracy_level", "dqtool.fused.bias"}
    # and lowered again: the notes go (they kept a downgraded upgrade at IR 10)
    low = dqtool.downgrade(up, 17).model
    assert low.ir_version < 10 and not [n for n in low.graph if n.metadata_props]
