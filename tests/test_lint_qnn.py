"""``qnn-htp``: each rule trips on one generated model and not on its neighbour, and lint's
verdict per node agrees with onnxruntime-qnn's HTP backend (skipped where the package is
absent; DQTOOL_SLOW=1 compares the whole product of the family's axes)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from helpers import agreement, save
from helpers import deploy_models as dm

from dqtool.linting import lint
from dqtool.linting.targets import names

MODELS = Path(__file__).resolve().parent.parent / "models"
V = dm.Variant

# (code, a model that trips it, its neighbour that does not)
RULES = [
    ("DQ120", V("MatMul", act="float8e4m3fn"), V("MatMul")),
    ("DQ121", V("Conv", act="int8", weight="uint8"), V("Conv", act="int8")),
    ("DQ122", V("Conv", axis=1), V("Conv")),
    ("DQ123", V("MatMul", weight_zp="nonzero"), V("MatMul")),
    ("DQ123", V("Gemm", weight="uint16"), V("Gemm", act="uint16")),
    ("DQ123", V("MatMul", weight="uint4", weight_zp="none"), V("MatMul", weight="uint4")),
    ("DQ123", V("MatMul", act="int16", weight="uint8", granularity="per-tensor"),
     V("MatMul", act="int16", granularity="per-tensor")),
    ("DQ124", V("MatMul", granularity="blocked", axis=0, block=8),
     V("MatMul", granularity="blocked", block=8)),
    ("DQ124", V("Conv", granularity="blocked", weight="int4", axis=1, block=4),
     V("Conv", granularity="blocked", weight="int4", axis=1, block=8)),
    ("DQ125", V("MatMul", quantize_output=False), V("MatMul")),
    ("DQ125", V("Conv", quantize_input=False), V("Conv")),
]


def _codes(tmp_path: Path, model, target: str = "qnn-htp") -> set[str]:
    path = model if isinstance(model, Path) else save(dm.model(model), tmp_path / "m.onnx")
    return {f.code for f in lint(path, target=target, select="DQ1").findings} - {"DQ112"}


@pytest.mark.parametrize(("code", "trips", "passes"), RULES,
                         ids=[f"{c}-{i}" for i, (c, _, _) in enumerate(RULES)])
def test_rule_trips_and_its_neighbour_does_not(tmp_path, code, trips, passes):
    assert code in _codes(tmp_path, trips)
    assert _codes(tmp_path, passes) == set()


def test_opmx_domain(tmp_path):
    assert "DQ126" in _codes(tmp_path, MODELS / "opmx_int8.onnx")


def test_findings_name_the_node_the_reason_and_the_fix(tmp_path):
    path = save(dm.model(V("Conv", axis=1)), tmp_path / "m.onnx")
    report = lint(path, target="qnn-htp-2.7", select="DQ1")
    (rule,) = [f for f in report.findings if f.code == "DQ122"]
    assert rule.node == "op" and rule.op == "ai.onnx:Conv" and rule.target == "qnn-htp-2.7"
    assert "weight 'w_DQ' is per-axis on axis 1" in rule.message
    assert rule.fix and "axis 0" in rule.fix
    (summary,) = [f for f in report.findings if f.code == "DQ112"]
    assert summary.severity == "info"
    assert summary.message.endswith("qnn-htp-2.7: 0 of 1 Conv run quantized on HTP; "
                                    "1 fall back: op")
    assert report.exit_code == 1


def test_summary_counts_each_operator_type():
    report = lint(MODELS / "ort_qdq_per_channel.onnx", target="qnn-htp")
    lines = sorted(f.message.split("model: ")[1] for f in report.findings if f.code == "DQ112")
    assert lines == ["qnn-htp: 1 of 1 Flatten run quantized on HTP",
                     "qnn-htp: 1 of 1 Gemm run quantized on HTP",
                     "qnn-htp: 1 of 1 GlobalAveragePool run quantized on HTP",
                     "qnn-htp: 2 of 2 Conv run quantized on HTP"]
    assert report.passed


def test_targets_listed():
    assert {"qnn-htp", "qnn-htp-2.7"} <= set(names())


# ---- the oracle: onnxruntime-qnn's HTP backend ----------------------------------------

# Units the runtime gives no verdict for, and why (docs/targets-qnn.md): onnxruntime
# refuses the model before any EP sees it (float6, opmx), or rewrites the nodes first
# (MatMul + Add → Gemm by MatMulAddFusion, model-local functions inlined, a Loop body). Units
# with an invalid DequantizeLinear are not judged at all (the model rules report them).
NOT_COMPARED = {
    "dq10_uint8_per_tensor.onnx:MatMul (MatMul)", "dq10_uint8_per_tensor.onnx:Add (Add)",
    "dq13_int8_per_axis.onnx:MatMul_1 (MatMul)", "dq13_int8_per_axis.onnx:Add_1 (Add)",
    "dq28_float6e2m3.onnx:MatMul_1 (MatMul)", "dq28_float6e2m3.onnx:MatMul_2 (MatMul)",
    "dq_in_function.onnx:MatMul (MatMul)", "dq_in_loop_body.onnx:body/MatMul_1 (MatMul)",
    "dq_in_loop_body.onnx:body/MatMul_2 (MatMul)",
    "opmx_int4_float_zp.onnx:Transpose (Transpose)",
    "opmx_int4_packed.onnx:Transpose (Transpose)", "opmx_int4_zp.onnx:Transpose (Transpose)",
    "opmx_int8.onnx:Transpose (Transpose)", "pmx_int4_legacy.onnx:Transpose (Transpose)",
    "ort_int4_blocked_qdq.onnx:fc1/MatMul_matmul_Q4 (MatMul)",
    "ort_int4_blocked_qdq.onnx:fc2/MatMul_matmul_Q4 (MatMul)",
    "ort_uint4_blocked_ragged_qdq.onnx:fc1/MatMul_matmul_Q4 (MatMul)",
    "ort_uint4_blocked_ragged_qdq.onnx:fc2/MatMul_matmul_Q4 (MatMul)",
}


@pytest.fixture(scope="module")
def qnn():
    pytest.importorskip("onnxruntime_qnn")
    from helpers.oracles import Qnn

    return Qnn()


def test_family_agrees_with_the_htp_backend(qnn, tmp_path):
    tally = agreement.over_family("qnn-htp", qnn, tmp_path, save, dm)
    assert tally.compared >= tally.family_size
    assert tally.disagreements == [], f"{tally.agree}/{tally.compared}"
    assert tally.not_compared == []


def test_models_agree_with_the_htp_backend(qnn):
    tally = agreement.Tally()
    for path in sorted(MODELS.glob("*.onnx")):
        agreement.compare(path, "qnn-htp", qnn, tally)
    assert tally.disagreements == [], f"{tally.agree}/{tally.compared}"
    assert set(tally.not_compared) == NOT_COMPARED
    assert tally.compared >= 45


def test_the_oracle_can_disagree(qnn, tmp_path):
    """The comparison is not vacuous: a unit the backend runs quantized is counted as a
    disagreement when lint is told the opposite."""
    path = save(dm.model(V("Conv")), tmp_path / "m.onnx")
    assert qnn.verdicts(path)["op"] == (True, None)
    refused = save(dm.model(V("Conv", axis=1)), tmp_path / "a.onnx")
    quantized, reason = qnn.verdicts(refused)["op"]
    assert not quantized and "axis == 0" in reason
    tally = agreement.Tally()
    tally.add("op", False, qnn.verdicts(path)["op"][0])
    assert tally.disagreements == ["op: lint False, runtime True"]


def test_variants_are_distinct():
    family = dm.family("small")
    assert len(set(family)) == len(family) > 100
    assert all(dm.valid(v) for v in family)
    assert replace(family[0], opset=13) in family
