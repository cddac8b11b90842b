"""The integer-operator sample models (made by onnxruntime's quantizer): inspect counts every
integer operator, the reference evaluator runs them as onnxruntime does, the QDQ form
leaves none with a QDQ form, passes onnx's checker, runs within one step, and goes back."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import paths
from helpers.integer import run_ort
from onnx import numpy_helper

import dqtool
from dqtool.families.integer import ops
from dqtool.integer import api

MODELS = Path(__file__).resolve().parent.parent / "models"
QOP = ["ort_qop_per_tensor.onnx", "ort_qop_per_channel.onnx", "ort_qop_matmul.onnx"]
DYNAMIC = ["ort_dynamic_matmul.onnx", "ort_dynamic_conv.onnx"]
ALL = QOP + DYNAMIC


def _integer_census(proto: onnx.ModelProto) -> Counter:
    """Integer operators counted straight from the protobuf."""
    keys = {(d.domain, d.op) for d in ops.OPS}
    return Counter((n.domain or "ai.onnx", n.op_type) for n in proto.graph.node
                   if (n.domain or "ai.onnx", n.op_type) in keys)


def _feeds(proto: onnx.ModelProto) -> dict[str, np.ndarray]:
    inp = proto.graph.input[0]
    shape = [d.dim_value or 1 for d in inp.type.tensor_type.shape.dim]
    return {inp.name: np.random.default_rng(7).standard_normal(shape).astype(np.float32)}


@pytest.mark.parametrize("name", ALL)
def test_inspect_counts_every_integer_operator(name):
    proto = onnx.load(str(MODELS / name))
    report = dqtool.inspect(MODELS / name)
    ours = Counter((n.spec.domain, n.spec.op) for n in report.integer_nodes)
    assert ours == _integer_census(proto) and sum(ours.values()) >= 3
    assert report.summary["integer_nodes"] == sum(ours.values())
    for n in report.integer_nodes:
        assert not n.spec.errors, (n.name, n.spec.problems)


@pytest.mark.parametrize("name", [*QOP, "ort_dynamic_matmul.onnx"])
def test_reference_evaluator_matches_onnxruntime_bit_for_bit(name, monkeypatch):
    paths.patch_accumulation(monkeypatch)
    proto = onnx.load(str(MODELS / name))
    feeds = _feeds(proto)
    got = dqtool.reference_evaluator(proto).run(None, feeds)
    want = run_ort(proto, feeds)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and np.array_equal(g, w)


def test_per_channel_weights_are_read_per_channel():
    report = dqtool.inspect(MODELS / "ort_qop_per_channel.onnx")
    convs = [n for n in report.integer_nodes if n.spec.op == "QLinearConv"]
    assert [c.spec.inputs[1].granularity for c in convs] == ["per-axis", "per-axis"]
    gemm = next(n for n in report.integer_nodes if n.spec.op == "QGemm")
    assert (gemm.spec.inputs[1].granularity, gemm.spec.inputs[1].axis) == ("per-axis", 0)


@pytest.mark.parametrize("name", ALL)
def test_to_qdq_then_back(name, tmp_path):
    out, back = tmp_path / "q.onnx", tmp_path / "b.onnx"
    report = api.to_qdq(MODELS / name, out, check=True)
    assert report.check.ok and not report.refusals
    converted = onnx.load(str(out))
    onnx.checker.check_model(converted, full_check=True)
    assert sum(_integer_census(converted).values()) == sum(
        1 for n in converted.graph.node if n.op_type == "DynamicQuantizeLinear")
    for o in report.check.outputs:
        if o["runtime"] == "onnxruntime" and not paths.ort_follows_spec(MODELS / name):
            continue  # this CPU path's deviation, reported beside the verdict
        assert o["max_steps"] is None or o["max_steps"] <= 1
    run_ort(converted, _feeds(converted))
    api.to_qoperator(out, back)
    original, restored = onnx.load(str(MODELS / name)), onnx.load(str(back))
    assert Counter((n.domain, n.op_type) for n in restored.graph.node) == \
        Counter((n.domain, n.op_type) for n in original.graph.node)
    want = {t.name: numpy_helper.to_array(t) for t in original.graph.initializer}
    got = {t.name: numpy_helper.to_array(t) for t in restored.graph.initializer}
    assert set(got) == set(want)
    assert all(got[k].dtype == want[k].dtype and np.array_equal(got[k], want[k]) for k in want)


def test_qoperator_qdq_form_is_fused_back_identically():
    report = api.to_qdq(MODELS / "ort_qop_per_channel.onnx", check=True)
    assert report.check.fused["identical"] is True


def test_lint_flags_com_microsoft_ops_for_an_onnx_opset():
    report = dqtool.lint(MODELS / "ort_qop_per_tensor.onnx", target="onnx-opset-21",
                         select="DQ110")
    assert sorted(f.op.split(":")[1] for f in report.findings) == [
        "QGemm", "QLinearGlobalAveragePool"]


@pytest.mark.parametrize("name", ALL)
def test_check_alone_runs_every_integer_operator_bit_exact(name, monkeypatch):
    paths.patch_accumulation(monkeypatch)
    report = dqtool.check(MODELS / name)
    integer = [n for n in report.nodes if not n.op.split(":")[1].startswith(
        ("DequantizeLinear", "QuantizeLinear"))]
    assert len(integer) == sum(_integer_census(onnx.load(str(MODELS / name))).values())
    assert all(n.status == "bit-exact" for n in integer), [n.to_json() for n in integer]
    assert report.passed


@pytest.mark.parametrize(("name", "fused"), [
    ("ort_qdq_per_channel.onnx", {"QLinearConv": 2, "QLinearGlobalAveragePool": 1,
                                  "QGemm": 1}),
    ("ort_qdq_contrib.onnx", {"QLinearMatMul": 2, "QLinearAdd": 2}),  # com.microsoft Q/DQ
    ("ort_qdq_int16.onnx", {}),  # 16-bit: no integer operator takes it
])
def test_qoperator_on_the_quantizers_qdq_models(name, fused, tmp_path):
    report = api.to_qoperator(MODELS / name, tmp_path / "q.onnx", check=True)
    assert report.check.ok
    assert Counter(c.into for c in report.changes) == fused
    if fused:
        run_ort(onnx.load(str(tmp_path / "q.onnx")), _feeds(onnx.load(str(MODELS / name))))
