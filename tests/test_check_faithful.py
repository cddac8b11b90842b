"""check --against on a faithful (not exact) QDQ conversion: output differences are
tolerated only when every rewritten operator, fed the original's inputs, is within one step."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

import dqtool
from dqtool.checking import compare, faithful
from dqtool.checking.against import RuntimeComparison

MODELS = Path(__file__).resolve().parent.parent / "models"


@dataclass(frozen=True)
class _Entry:  # the shape of a family's per-op entry: a comparison or None
    comparison: compare.OutputComparison | None


def _cmp(got: list[float], want: list[float], step: float | None = 0.5):
    return compare.compare("y", np.array(got, np.float32), np.array(want, np.float32),
                           step=step)


def _runtime(*outputs: compare.OutputComparison) -> tuple[RuntimeComparison, ...]:
    return (RuntimeComparison("onnxruntime", outputs),)


def test_differences_tolerated_when_every_operator_is_within_one_step():
    end_to_end = _cmp([1.0, 2.0, 3.0], [1.0, 2.0, 4.0])  # 2 steps apart end to end
    assert not end_to_end.passed and end_to_end.max_steps == 2
    per_op = [_Entry(_cmp([1.0, 2.5], [1.0, 2.0])), _Entry(_cmp([0.0], [0.0]))]
    notes: list[str] = []
    (c,) = faithful.apply(_runtime(end_to_end), per_op, notes)
    (o,) = c.outputs
    assert o.passed and o.tolerated and "within one quantization step" in o.tolerated
    assert o.max_abs == 1.0 and o.max_steps == 2  # the difference stays in the report
    assert "tolerated" in notes[-1]


def test_one_operator_beyond_one_step_leaves_the_tolerances_to_judge():
    end_to_end = _cmp([1.0, 2.0, 3.0], [1.0, 2.0, 4.0])
    per_op = [_Entry(_cmp([1.0, 3.5], [1.0, 2.0])), _Entry(_cmp([0.0], [0.0]))]
    notes: list[str] = []
    (c,) = faithful.apply(_runtime(end_to_end), per_op, notes)
    assert not c.outputs[0].passed and c.outputs[0].tolerated is None
    assert "1 rewritten operator(s) beyond one step" in notes[-1]


def test_an_unmeasured_operator_or_a_shape_failure_is_never_tolerated():
    end_to_end = _cmp([1.0, 2.0, 3.0], [1.0, 2.0, 4.0])
    notes: list[str] = []
    (c,) = faithful.apply(_runtime(end_to_end), [_Entry(None)], notes)
    assert not c.outputs[0].passed and "could not be measured alone" in notes[-1]
    broken = compare.failed("y", "missing from the checked model").judge(0.0, 0.0)
    (c,) = faithful.apply(_runtime(broken), [_Entry(_cmp([1.0], [1.0]))], [])
    assert not c.outputs[0].passed


def test_a_wrong_weight_fails_check_against(tmp_path):
    # One weight code of the second conv moved by 60: that operator is far beyond one step
    # on the original's inputs, so nothing is tolerated and the check fails.
    from test_integer_drift import _tampered

    src = MODELS / "ort_dynamic_conv.onnx"
    _, bad = _tampered(src, "conv2_quant")
    path = tmp_path / "bad.onnx"
    onnx.save(bad, path)
    report = dqtool.check(path, against=src)
    assert not report.passed and report.exit_code == 1
    assert any("beyond one step" in n for n in report.notes)
    from dqtool.integer import api

    good = tmp_path / "good.onnx"
    api.to_qdq(src, good)
    report = dqtool.check(good, against=src)
    assert report.passed and [e.max_steps for e in report.per_op] == [0, 0, 0]


def test_unnamed_integer_operators_are_measured_alone(tmp_path):
    # A quantizer run on a model whose nodes carry no names leaves its integer operators
    # unnamed: each is still paired with its float operator (by op type, in graph order)
    # and measured, so the check is not left to the tolerances.
    m = onnx.load(MODELS / "ort_qop_per_tensor.onnx")
    for n in m.graph.node:
        n.name = ""
    src = tmp_path / "unnamed.onnx"
    onnx.save(m, src)
    from dqtool.integer import api

    out = tmp_path / "unnamed.qdq.onnx"
    api.to_qdq(src, out)
    report = dqtool.check(out, against=src)
    integer = [n for n in m.graph.node if n.op_type.startswith(("QLinear", "QGemm"))]
    assert len(report.per_op) == len(integer) >= 3
    assert all(e.comparison is not None for e in report.per_op)
    assert {e.max_steps for e in report.per_op} <= {0, 1}
    assert report.passed
