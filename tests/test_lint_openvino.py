"""``openvino``: each rule trips on one model and not on its neighbour, and lint's verdict
per node agrees with OpenVINO's CPU plugin (the compiled model's runtime precision; skipped
where the package is absent; DQTOOL_SLOW=1 compares the whole product of the family)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import agreement, save
from helpers import deploy_models as dm

from dqtool.linting import lint
from dqtool.linting.targets import names

MODELS = Path(__file__).resolve().parent.parent / "models"
V = dm.Variant

RULES = [
    ("DQ130", V("Conv", act="uint16"), V("Conv")),
    ("DQ130", V("MatMul", quantize_input=False), V("MatMul")),
    ("DQ130", V("Conv", act="int8", act_zp="nonzero"), V("Conv", act="int8")),
    ("DQ131", V("Conv", weight="uint8", weight_zp="nonzero"), V("Conv")),
    ("DQ132", V("MatMul", granularity="per-tensor", weight_zp="nonzero"),
     V("MatMul", granularity="per-tensor")),
    ("DQ133", V("Conv", granularity="blocked", axis=1, block=8), V("Conv")),
    ("DQ133", V("Conv", axis=1), V("Conv")),
    ("DQ134", V("Conv", granularity="blocked", weight="int4", block=4),
     V("Conv", granularity="blocked", weight="int8", block=2)),
    ("DQ135", V("MatMul", granularity="blocked", block=2),
     V("MatMul", granularity="blocked", block=8)),
    ("DQ136", V("Conv", weight="uint8", act_zp="nonzero"), V("Conv", act_zp="nonzero")),
    ("DQ136", V("Conv", act="int8", weight="uint8", act_zp="nonzero"),
     V("Conv", act="int8", weight="uint8", act_zp="nonzero", axis=1)),
]


def _codes(tmp_path: Path, model, target: str = "openvino") -> set[str]:
    path = model if isinstance(model, Path) else save(dm.model(model), tmp_path / "m.onnx")
    return {f.code for f in lint(path, target=target, select="DQ1").findings} - {"DQ112"}


@pytest.mark.parametrize(("code", "trips", "passes"), RULES,
                         ids=[f"{c}-{i}" for i, (c, _, _) in enumerate(RULES)])
def test_rule_trips_and_its_neighbour_does_not(tmp_path, code, trips, passes):
    assert code in _codes(tmp_path, trips)
    assert code not in _codes(tmp_path, passes)


@pytest.mark.parametrize(("code", "model"), [
    ("DQ137", "opmx_int8.onnx"), ("DQ138", "dq25_int2_blocked.onnx"),
    ("DQ138", "dq28_float6e2m3.onnx"), ("DQ139", "qdq_weight_q_const.onnx")])
def test_models_refused(tmp_path, code, model):
    assert code in _codes(tmp_path, MODELS / model)


def test_refusal_is_worded_as_one(tmp_path):
    path = save(dm.model(V("MatMul", granularity="blocked", block=2)), tmp_path / "m.onnx")
    (f,) = [f for f in lint(path, target="openvino-2026.4").findings if f.code == "DQ135"]
    assert "openvino-2026.4 refuses the model: weight 'w_DQ' is blocked along the output " \
        "axis in 4 blocks" in f.message
    assert f.node == "op" and f.fix


def test_only_weighted_operators_are_judged(tmp_path):
    path = save(dm.model(V("Add")), tmp_path / "m.onnx")
    assert [f for f in lint(path, target="openvino").findings if f.code == "DQ112"] == []


def test_targets_listed():
    assert {"openvino", "openvino-2026.4"} <= set(names())


# ---- the oracle: OpenVINO's CPU plugin -------------------------------------------------

@pytest.fixture(scope="module")
def openvino():
    pytest.importorskip("openvino")
    from helpers.oracles import OpenVino

    return OpenVino()


def test_family_agrees_with_the_cpu_plugin(openvino, tmp_path):
    tally = agreement.over_family("openvino", openvino, tmp_path, save, dm)
    assert tally.disagreements == [], f"{tally.agree}/{tally.compared}"
    assert tally.not_compared == []
    assert tally.compared >= 100


def test_models_agree_with_the_cpu_plugin(openvino):
    tally = agreement.Tally()
    for path in sorted(MODELS.glob("*.onnx")):
        agreement.compare(path, "openvino", openvino, tally)
    assert tally.disagreements == [], f"{tally.agree}/{tally.compared}"
    assert tally.not_compared == []
    assert tally.compared >= 40


def test_the_oracle_tells_int8_from_float(openvino, tmp_path):
    """Not vacuous: the same Conv runs int8 with int8 weights and float with uint8 ones."""
    node = [("op", "Conv", ["op_out"])]
    assert openvino.verdicts(save(dm.model(V("Conv")), tmp_path / "a.onnx"), node) == \
        {"op": (True, None)}
    quantized, why = openvino.verdicts(
        save(dm.model(V("Conv", weight="uint8", weight_zp="nonzero")), tmp_path / "b.onnx"),
        node)["op"]
    assert not quantized and "float32" in why
