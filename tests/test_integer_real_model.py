"""A real third-party dynamically quantized model: ddddocr's ``common_old.onnx``, shipped in
the ``ddddocr`` wheel (a dev dependency, pinned). Made by an older onnxruntime quantizer
("onnx.quantize 0.1.0"): 22 DynamicQuantizeLinear, 21 ConvInteger whose int32 bias is
quantized at run time and added before the Cast, 1 MatMulInteger, 1 DynamicQuantizeLSTM.

The file is read, the package is never imported. A missing package fails these tests."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers.integer import run_ort
from helpers.wheels import packaged_model

import dqtool
from dqtool.checking import path_deviations
from dqtool.integer import api


@pytest.fixture(scope="module")
def model_path() -> Path:
    return packaged_model("ddddocr", "ddddocr/common_old.onnx",
                          "`pip install -e '.[dev]'` (it carries the real model these tests "
                          "read)")


def _census(proto: onnx.ModelProto) -> Counter:
    return Counter(n.op_type for n in proto.graph.node)


def test_inspect_counts_every_integer_operator(model_path):
    report = dqtool.inspect(model_path)
    assert report.summary["integer_by_op"] == {
        "ai.onnx:ConvInteger": 21, "ai.onnx:DynamicQuantizeLinear": 22,
        "ai.onnx:MatMulInteger": 1, "com.microsoft:DynamicQuantizeLSTM": 1}
    census = _census(onnx.load(str(model_path)))
    assert census["ConvInteger"] == 21 and census["DynamicQuantizeLSTM"] == 1
    (lstm,) = report.summary["integer_without_qdq_form"]
    assert lstm == "LSTM_202_quant"


def test_to_qdq_rewrites_all_but_the_lstm(model_path, tmp_path):
    with pytest.raises(api.IntegerConversionRefused) as e:
        api.to_qdq(model_path, tmp_path / "refused.onnx")
    assert [r.op for r in e.value.report.refusals] == ["com.microsoft:DynamicQuantizeLSTM"]
    assert not (tmp_path / "refused.onnx").exists()
    out = tmp_path / "qdq.onnx"
    report = api.to_qdq(model_path, out, keep_unconvertible=True)
    assert Counter(c.op for c in report.changes) == {"ai.onnx:ConvInteger": 21,
                                                     "ai.onnx:MatMulInteger": 1}
    converted = onnx.load(str(out))
    onnx.checker.check_model(converted, full_check=True)
    census = _census(converted)
    assert census["ConvInteger"] == census["MatMulInteger"] == 0
    assert census["DequantizeLinear"] == 2 * 22 + 21  # x and w per op, plus each conv bias
    assert census["DynamicQuantizeLSTM"] == 1


def test_first_layers_stay_within_one_step(model_path, tmp_path):
    """Integer accumulation vs the float QDQ form: the first quantized activations agree to
    one step; later ones drift as each layer re-quantizes (measured, not hidden)."""
    out = tmp_path / "qdq.onnx"
    api.to_qdq(model_path, out, keep_unconvertible=True)
    a, b = onnx.load(str(model_path)), onnx.load(str(out))
    names = ["147_quantized", "158_quantized", "191_quantized"]
    for m in (a, b):
        m.graph.output.extend(onnx.helper.make_empty_tensor_value_info(n) for n in names)
    x = np.random.default_rng(0).standard_normal((1, 1, 64, 128)).astype(np.float32)
    got, want = run_ort(b, {"input1": x}), run_ort(a, {"input1": x})
    steps = [int(np.abs(g.astype(int) - w.astype(int)).max()) for g, w in
             zip(got[-3:], want[-3:], strict=True)]
    assert steps[0] == 0 and steps[1] <= 1
    assert steps[2] >= 1  # the drift is real: a check must report it


def test_check_against_reports_steps_and_lint_flags(model_path, tmp_path):
    out = tmp_path / "qdq.onnx"
    api.to_qdq(model_path, out, keep_unconvertible=True)
    report = dqtool.check(out, against=model_path, shapes={"image_width": (32,)})
    ort = next(c for c in report.comparisons if c.runtime == "onnxruntime")
    (o,) = ort.outputs
    assert o.step is not None and o.step > 0
    assert o.off_by_one is not None and o.off_by_more is not None
    assert o.max_steps > 0.5  # the drift, in steps (a fraction: a float output)
    lint = dqtool.lint(model_path, target="onnx-opset-21", select="DQ110")
    assert [f.op.split(":")[1] for f in lint.findings] == ["DynamicQuantizeLSTM"]


def _statuses_for(node: onnx.NodeProto, weights: dict[str, onnx.TensorProto]) -> set[str]:
    """check's status for ``node`` through the entries of ``dqtool.runtimes.code_paths``
    for the installed onnxruntime on the probed CPU path: bit-exact where none applies,
    runtime-deviation where one does. u8s8-pair-saturation changes a result only where two
    adjacent u8×s8 products pass int16, which depends on the data (the LSTM's s8 weights
    can, lint DQ111; check's inputs measured bit-exact under Haswell): either status there.
    Every activation here is u8 (from a DynamicQuantizeLinear, or quantized by the LSTM
    itself), so that entry applies only to a node with s8 weights."""
    found = path_deviations.for_op(f"{node.domain or 'ai.onnx'}:{node.op_type}")
    s8 = any(weights[i].data_type == onnx.TensorProto.INT8 for i in node.input
             if i in weights)
    keys = {d.key for d in found if d.key != "u8s8-pair-saturation" or s8}
    if not keys:
        return {"bit-exact"}
    if keys == {"u8s8-pair-saturation"}:
        return {"bit-exact", "runtime-deviation"}
    return {"runtime-deviation"}


def test_check_alone_runs_every_node_as_the_path_says(model_path):
    """Every node bit-exact where no entry applies on this CPU's path; where one does
    (on arm64-dotprod, fma-lstm for the LSTM), the node's difference is that deviation,
    named and not counted: the verdict passes on every path."""
    proto = onnx.load(str(model_path))
    weights = {t.name: t for t in proto.graph.initializer}
    expected = {n.name: _statuses_for(n, weights) for n in proto.graph.node
                if n.op_type in ("DynamicQuantizeLinear", "ConvInteger", "MatMulInteger",
                                 "DynamicQuantizeLSTM")}
    assert len(expected) == 22 + 21 + 1 + 1
    report = dqtool.check(model_path, shapes={"image_width": (48,)})
    got = {n.name: n for n in report.nodes}
    assert set(got) == set(expected)
    wrong = {k: (got[k].status, got[k].reason) for k in got
             if got[k].status not in expected[k]}
    assert not wrong, wrong
    for n in report.nodes:
        if n.status == "runtime-deviation":
            assert "known deviation" in (n.reason or ""), n.reason
    assert report.passed


def test_each_converted_operator_is_within_a_step_where_the_output_drifts(model_path,
                                                                          tmp_path):
    """The conversion's own error (each op fed the original's inputs) against the growth
    through 21 re-quantizing layers, on a 64-wide image: every op 0 steps of its output's
    dynamic step (float error a few ulps), the output a few steps away end to end."""
    out = tmp_path / "qdq.onnx"
    api.to_qdq(model_path, out, keep_unconvertible=True)
    report = dqtool.check(out, against=model_path, shapes={"image_width": (64,)})
    assert len(report.per_op) == 22
    assert all(e.max_steps == 0 for e in report.per_op)
    assert max(e.comparison.max_abs for e in report.per_op) < 1e-4
    assert {e.op for e in report.per_op} == {"ai.onnx:ConvInteger", "ai.onnx:MatMulInteger"}
    (o,) = next(c for c in report.comparisons if c.runtime == "onnxruntime").outputs
    # in the output's own dynamic step: most elements agree, a few move by 1-3 steps
    assert 1 <= o.max_steps <= 4
    assert o.off_by_more < o.size // 100 and o.off_by_one < o.size // 10
    from dqtool.checking import inputs

    original = onnx.load(str(model_path))
    feeds, _ = inputs.generate(original, seed=0, shapes={"image_width": (64,)})
    (want,) = run_ort(original, feeds)
    assert o.step == pytest.approx((max(0, want.max()) - min(0, want.min())) / 255,
                                   rel=1e-6)
    doc = report.to_json()
    assert doc["per_op"][0]["max_steps"] == 0 and doc["per_op"][0]["node"] == "Conv_0_quant"


def test_exact_dynamic_form_is_bit_identical_on_the_real_model(model_path, tmp_path):
    """DequantizeLinear with scale 1 and the original Mul by the scale product: no drift at
    all, where the default form's output moves by a few steps (above)."""
    out = tmp_path / "exact.onnx"
    api.to_qdq(model_path, out, keep_unconvertible=True, exact_dynamic=True)
    report = dqtool.check(out, against=model_path, shapes={"image_width": (64,)})
    (o,) = next(c for c in report.comparisons if c.runtime == "onnxruntime").outputs
    assert o.mismatched == 0 and o.max_steps == 0
    assert len(report.per_op) == 22 and all(e.comparison.max_abs == 0.0
                                            for e in report.per_op)
    back = api.to_qoperator(out).model
    assert Counter(n.op_type for n in back.graph) == _census(onnx.load(str(model_path)))


def test_default_form_round_trips_to_the_original_operators(model_path, tmp_path):
    """QDQ back to integer operators restores the original: the conv bias DequantizeLinear
    (scale a_scale·w_scale) goes back into an int32 Add before the Cast, reusing the scale
    product, so the model is the original's operators and runs bit for bit like it."""
    out = tmp_path / "qdq.onnx"
    api.to_qdq(model_path, out, keep_unconvertible=True)
    back = tmp_path / "back.onnx"
    report = api.to_qoperator(out, back)
    assert sum("Add of the int32 bias" in c.into for c in report.changes) == 21
    original = onnx.load(str(model_path))
    restored = onnx.load(str(back))
    assert _census(restored) == _census(original)
    for n in restored.graph.node:
        if n.op_type == "ConvInteger":
            (add,) = [m for m in restored.graph.node if n.output[0] in m.input]
            assert add.op_type == "Add"
    checked = dqtool.check(back, against=model_path, shapes={"image_width": (64,)})
    assert checked.passed
    for c in checked.comparisons:
        assert all(o.mismatched == 0 for o in c.outputs)


def test_reference_evaluator_runs_the_whole_model(model_path):
    """The reference evaluator runs every node, the DynamicQuantizeLSTM included (its
    float Sigmoid nodes are onnx's reference, not MLAS's, so the output is compared with
    onnxruntime's at the float level only)."""
    proto = onnx.load(str(model_path))
    x = np.random.default_rng(1).standard_normal((1, 1, 64, 96)).astype(np.float32)
    got = dqtool.reference_evaluator(proto).run(None, {"input1": x})
    (want,) = run_ort(proto, {"input1": x})
    assert got[0].shape == want.shape and want.size > 1000
    # measured: 0.09% of the largest magnitude, every argmax (the decoded text) equal
    np.testing.assert_allclose(got[0], want, rtol=0, atol=0.005 * float(np.abs(want).max()))
    assert (got[0].argmax(-1) == want.argmax(-1)).all()
