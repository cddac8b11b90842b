"""How far a QDQ conversion is from its integer original: the unit of a float output's
step, the per-op local error, and what ``qdq --check`` judges."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from helpers import paths

import dqtool
from dqtool.checking.float_steps import dynamic_step
from dqtool.families.integer import local_error
from dqtool.integer import api, numerics

MODELS = Path(__file__).resolve().parent.parent / "models"


def test_dynamic_step_is_dynamicquantizelinears_scale():
    assert dynamic_step(np.array([-1.0, 0.5, 1.55], np.float32)) == pytest.approx(
        2.55 / 255, rel=1e-6)
    assert dynamic_step(np.array([2.0, 3.0], np.float32)) == pytest.approx(3 / 255)  # 0 in
    assert dynamic_step(np.array([-5.1, -1.0], np.float32)) == pytest.approx(0.02)
    assert dynamic_step(np.zeros(3, np.float32)) is None
    assert dynamic_step(np.array([1.0, np.inf], np.float32)) is None
    assert dynamic_step(np.array([1, 2], np.int8)) is None


def test_a_dynamic_output_is_measured_in_its_own_step(tmp_path):
    src = MODELS / "ort_dynamic_matmul.onnx"
    out = tmp_path / "q.onnx"
    api.to_qdq(src, out)
    report = dqtool.check(out, against=src)
    from dqtool.checking import inputs, runners

    feeds, _ = inputs.generate(onnx.load(str(src)), seed=0)
    want = runners.run_reference(onnx.load(str(src)), feeds)["output"]
    for c in report.comparisons:
        if c.runtime == "onnxruntime" and not paths.ort_follows_spec(src):
            continue  # this CPU path's deviation, reported beside the verdict
        (o,) = c.outputs
        assert o.step == pytest.approx(float((max(0, want.max()) - min(0, want.min())) / 255))
        assert o.max_steps == 0
    (a, b) = report.per_op
    assert (a.node, b.node) == ("fc1/MatMul_quant", "fc2/MatMul_quant")
    assert a.max_steps == b.max_steps == 0 and a.comparison.size == 32


def _tampered(src: Path, node_name: str) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """The QDQ conversion with one weight code of ``node_name``'s float op moved by 60."""
    original = onnx.load(str(src))
    conv = api.to_qdq(src).model
    op = next(n for n in conv.graph if n.name == node_name)
    w_dq = op.inputs[1].producer()
    w = w_dq.inputs[0]
    arr = w.const_value.numpy().copy()
    flat = arr.reshape(-1)
    flat[0] = np.int8(flat[0] - 60 if flat[0] > 0 else flat[0] + 60)
    w.const_value = ir.tensor(arr, name=w.name)
    return original, ir.to_proto(conv)


def test_a_wrong_operator_fails_the_check_by_name():
    original, bad = _tampered(MODELS / "ort_dynamic_conv.onnx", "conv2_quant")
    check = numerics.judge(original, bad)
    assert check.measured_locally and not check.ok
    summary = local_error.summary(check.local)
    assert summary["beyond_one_step"] == ["conv2_quant"]
    by_node = {e.node: e for e in check.local}
    assert by_node["conv1_quant"].max_steps == 0
    assert by_node["conv2_quant"].max_steps > 1


def test_per_op_is_what_check_judges_and_end_to_end_is_reported():
    original = onnx.load(str(MODELS / "ort_dynamic_conv.onnx"))
    good = ir.to_proto(api.to_qdq(MODELS / "ort_dynamic_conv.onnx").model)
    check = numerics.judge(original, good)
    assert check.ok and check.to_json()["judged"] == "per-op"
    assert [e.max_steps for e in check.local] == [0, 0, 0]
    # Reported outputs stay in the verdict's text even when they are not judged.
    lines = check.describe()
    assert lines[0].startswith("per op") and any(line.startswith("end to end") for line in lines)


def test_qoperator_check_judges_outputs_end_to_end():
    qdq = MODELS / "ort_qdq_per_channel.onnx"
    report = api.to_qoperator(qdq, check=True)
    assert report.check.local == [] and report.check.to_json()["judged"] == "end-to-end"
    assert report.check.ok


@pytest.mark.parametrize("name", ["ort_dynamic_matmul.onnx", "ort_dynamic_conv.onnx"])
def test_exact_dynamic_form_is_bit_identical_and_round_trips(name, tmp_path):
    src = MODELS / name
    report = api.to_qdq(src, tmp_path / "exact.onnx", exact_dynamic=True, check=True)
    assert report.changes and all("DequantizeLinear(scale 1)" in c.into
                                  for c in report.changes)
    for o in report.check.outputs:  # both runtimes, end to end (where onnxruntime
        if o["runtime"] == "onnxruntime" and not paths.ort_follows_spec(src):  # is the spec)
            continue
        assert o["max_abs"] == 0.0 and o["mismatched"] == 0
    assert all(e.comparison.max_abs == 0.0 for e in report.check.local)
    assert report.check.fused["identical"] is True
    back = api.to_qoperator(tmp_path / "exact.onnx").model
    original = onnx.load(str(src))
    assert sorted(n.op_type for n in back.graph) == sorted(n.op_type
                                                           for n in original.graph.node)
    assert set(back.graph.initializers) == {t.name for t in original.graph.initializer}


def test_exact_dynamic_form_states_its_bound():
    from test_integer_to_qdq import DYNAMIC

    report = api.to_qdq(ir.from_onnx_text(DYNAMIC), exact_dynamic=True)
    (change,) = report.changes
    # |a - a_zp| <= 255 for a run-time uint8 zero point; the widest column of |w - w_zp| is
    # |3+1| + |6+1| + |9+1| + |-12+1| = 32: 255 * 32 = 8160
    assert change.into.endswith("(exact: every partial sum is at most 8160 < 2**24)")
    ops = [n.op_type for n in report.model.graph]
    assert ops.count("Mul") == 2 and "Cast" not in ops and "MatMulInteger" not in ops


def test_check_against_reports_the_fused_back_run(tmp_path):
    src = MODELS / "ort_qop_per_channel.onnx"
    out = tmp_path / "q.onnx"
    api.to_qdq(src, out)
    doc = dqtool.check(out, against=src).to_json()
    assert doc["fused"] == {"identical": True, "mismatched": 0, "error": None}
    assert len(doc["per_op"]) == 4 and all(e["max_steps"] == 0 for e in doc["per_op"])
    # the dynamic default form is not the original's once fused; the exact form is
    dyn = MODELS / "ort_dynamic_matmul.onnx"
    api.to_qdq(dyn, tmp_path / "d.onnx")
    api.to_qdq(dyn, tmp_path / "e.onnx", exact_dynamic=True)
    fused = dqtool.check(tmp_path / "d.onnx", against=dyn).optimized_run
    assert fused["identical"] is False and fused["mismatched"] > 0
    assert dqtool.check(tmp_path / "e.onnx", against=dyn).optimized_run["identical"] is True
    # not a conversion out of integer operators: nothing to report
    assert dqtool.check(src, against=src).optimized_run is None
