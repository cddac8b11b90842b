"""DQ110: lint targets that lack integer operators report them with the fix."""

from __future__ import annotations

import onnx_ir as ir
import pytest
from test_integer_to_qdq import DYNAMIC, QCONV

import dqtool


@pytest.fixture()
def models(tmp_path):
    paths = {}
    for name, text in (("qop", QCONV), ("dyn", DYNAMIC)):
        paths[name] = tmp_path / f"{name}.onnx"
        ir.save(ir.from_onnx_text(text), paths[name])
    return paths


def _dq109(path, target) -> dict[str, str]:
    report = dqtool.lint(path, target=target, select="DQ110")
    return {f.op.split(":")[1]: f.message for f in report.findings}


def test_onnx_opset_flags_com_microsoft_and_new_ops(models):
    found = _dq109(models["qop"], "onnx-opset-21")
    assert list(found) == ["QLinearGlobalAveragePool"]
    assert "com.microsoft operators are not in ai.onnx" in found["QLinearGlobalAveragePool"]
    assert "fix: `dqtool qdq`" in found["QLinearGlobalAveragePool"]
    assert _dq109(models["dyn"], "onnx-opset-21") == {}
    assert list(_dq109(models["dyn"], "onnx-opset-10")) == ["DynamicQuantizeLinear"]


def test_onnxruntime_runs_them_all(models):
    assert _dq109(models["qop"], "onnxruntime") == {}
    assert _dq109(models["dyn"], "onnxruntime") == {}


def test_directml_by_feature_level(models):
    assert sorted(_dq109(models["qop"], "directml-fl1.0")) == [
        "QLinearConv", "QLinearGlobalAveragePool"]
    assert sorted(_dq109(models["qop"], "directml-fl6.2")) == []
    assert sorted(_dq109(models["dyn"], "directml-fl3.0")) == ["DynamicQuantizeLinear"]
    assert sorted(_dq109(models["dyn"], "directml-fl6.0")) == []


def test_onednn_graph_has_no_integer_operators(models):
    found = _dq109(models["dyn"], "onednn-graph")
    assert sorted(found) == ["DynamicQuantizeLinear", "MatMulInteger"]
    assert "fix: `dqtool qdq` (DequantizeLinear → MatMul)" in found["MatMulInteger"]
    assert "fix: none in dqtool" in found["DynamicQuantizeLinear"]


def test_rule_is_registered():
    from dqtool.linting import registry

    assert registry.load()["DQ110"].name == "target-integer-operator"


# Each DirectML operator's first feature level, and the one just below it.
_BOUNDARIES = [("QLinearConv", (2, 0), (2, 1)), ("QLinearMatMul", (2, 0), (2, 1)),
               ("MatMulInteger", (2, 0), (2, 1)), ("ConvInteger", (2, 0), (2, 1)),
               ("DynamicQuantizeLinear", (3, 1), (4, 0)), ("QLinearAdd", (3, 1), (4, 0)),
               ("MatMulIntegerToFloat", (6, 1), (6, 2)),
               ("QLinearAveragePool", (6, 1), (6, 2))]


@pytest.mark.parametrize(("op", "below", "since"), _BOUNDARIES, ids=lambda v: str(v))
def test_directml_feature_level_boundaries(op, below, since):
    from dqtool.families.integer import lint, ops

    domain = next(d.domain for d in ops.OPS if d.op == op)
    fact = lint.dml_fact(op)
    assert fact.since == since and fact.source.startswith("DirectML.h: DML_TARGET_VERSION")
    assert lint.why_not(op, domain, f"directml-fl{since[0]}.{since[1]}") is None
    reason = lint.why_not(op, domain, f"directml-fl{below[0]}.{below[1]}")
    assert reason == (f"DML_OPERATOR_{fact.operator} is in DirectML from feature level "
                      f"{since[0]}.{since[1]}, not {below[0]}.{below[1]}")


def test_directml_without_an_operator():
    from dqtool.families.integer import lint

    assert lint.why_not("QLinearSigmoid", "com.microsoft", "directml-fl6.3") == \
        "DirectML has no operator for com.microsoft QLinearSigmoid"


def test_directml_profiles_on_each_side_of_a_boundary(tmp_path):
    """The lint targets DirectML has profiles for: 1.0 | 2.1 (QLinearConv, MatMulInteger),
    3.0 | 6.0 (DynamicQuantizeLinear, QLinearAdd), 6.0 | 6.2 (QLinearAveragePool)."""
    text = """<ir_version: 8, opset_import: ["" : 13, "com.microsoft" : 1]>
    g (uint8[1,1,4,4] x, float[2,3] f) => (uint8[1,1,2,2] p, int32[2,2] mi, uint8[1,1,4,4] s) <
        float xs = {0.02}, uint8 xz = {128}, uint8[1,1,1,1] w = {3}, float ws = {0.1},
        uint8 wz = {0}, float ys = {0.1}, uint8 yz = {120}, uint8[3,2] b = {1,2,3,4,5,6}>
    {
        y = QLinearConv (x, xs, xz, w, ws, wz, ys, yz)
        p = com.microsoft.QLinearAveragePool <kernel_shape = [2, 2], strides = [2, 2]>
            (y, ys, yz, ys, yz)
        fq, fs, fz = DynamicQuantizeLinear (f)
        mi = MatMulInteger (fq, b, fz, wz)
        s = com.microsoft.QLinearAdd (x, xs, xz, y, ys, yz, ys, yz)
    }
    """
    path = tmp_path / "m.onnx"
    ir.save(ir.from_onnx_text(text), path)
    want = {"1.0": ["DynamicQuantizeLinear", "MatMulInteger",
                    "QLinearAdd", "QLinearAveragePool", "QLinearConv"],
            "2.1": ["DynamicQuantizeLinear", "QLinearAdd", "QLinearAveragePool"],
            "3.0": ["DynamicQuantizeLinear", "QLinearAdd", "QLinearAveragePool"],
            "6.0": ["QLinearAveragePool"], "6.2": [], "6.3": []}
    for level, ops_missing in want.items():
        assert sorted(_dq109(path, f"directml-fl{level}")) == ops_missing, level


def test_a_fused_block_has_no_fix_where_its_float_twin_is_missing_too(tmp_path):
    text = """<ir_version: 8, opset_import: ["" : 13, "com.microsoft" : 1]>
    g (uint8[1,2,4] x) => (float[1,2,4] y) <
        uint8[4,12] w = {1,2,3,4,5,6,7,8,9,10,11,12,1,2,3,4,5,6,7,8,9,10,11,12,
                         1,2,3,4,5,6,7,8,9,10,11,12,1,2,3,4,5,6,7,8,9,10,11,12},
        float[12] b = {0,0,0,0,0,0,0,0,0,0,0,0}, float xs = {0.1}, float ws = {0.02},
        uint8 xz = {128}, uint8 wz = {6}>
    {
        y = com.microsoft.QAttention <num_heads = 1> (x, w, b, xs, ws, , xz, wz)
    }
    """
    path = tmp_path / "att.onnx"
    ir.save(ir.from_onnx_text(text), path)
    (msg,) = _dq109(path, "onnx-opset-21").values()
    assert msg.endswith("fix: none for onnx-opset-21: the QDQ form (`dqtool qdq`) still "
                        "needs com.microsoft Attention, which it lacks too")
    assert _dq109(path, "onnxruntime") == {}
    from dqtool.integer import api

    report = api.to_qdq(ir.from_onnx_text(text))
    assert [n.op_type for n in report.model.graph] == ["DequantizeLinear", "DequantizeLinear",
                                                       "Attention"]


MUL_INTEGER = """
<ir_version: 8, opset_import: ["" : 17, "com.microsoft" : 1]>
g (uint8[4] A, uint8[4] B) => (int32[4] C) <uint8 az = {3}, uint8 bz = {5}> {
  C = com.microsoft.MulInteger (A, az, B, bz)
}
"""


@pytest.mark.parametrize("release", ["1.31", "1.32"])
def test_onnxruntime_release_without_a_cpu_kernel_is_flagged(tmp_path, release):
    # Measured: these releases have MulInteger's schema but no CPU kernel (ort_facts).
    path = tmp_path / "mi.onnx"
    ir.save(ir.from_onnx_text(MUL_INTEGER), path)
    found = _dq109(path, f"onnxruntime-{release}")
    assert list(found) == ["MulInteger"]
    assert f"onnxruntime {release} has no CPU kernel" in found["MulInteger"]


def test_onnxruntime_release_not_measured_is_assumed_to_run_it():
    from dqtool.families.integer import lint

    assert lint.why_not("MulInteger", "com.microsoft", "onnxruntime-9.99") is None
    assert lint.why_not("QLinearConv", "ai.onnx", "onnxruntime-1.32") is None


QMATMUL = """
<ir_version: 8, opset_import: ["" : 13]>
g (TA[2,4] a) => (TY[2,3] y) <float as = {0.1}, TA az = {0},
                             TB[4,3] b = {1,2,3,4,5,6,7,8,9,10,11,12}, float bs = {0.1},
                             TB bz = {0}, float ys = {0.2}, TY yz = {0}> {
  y = QLinearMatMul (a, as, az, b, bs, bz, ys, yz)
}
"""


@pytest.mark.parametrize("target", ["onnxruntime", "onnxruntime-1.31", "onnxruntime-1.32"])
@pytest.mark.parametrize(("a", "b", "ok"), [("int8", "uint8", False), ("uint8", "int8", True),
                                            ("int8", "int8", True)])
def test_onnxruntime_types_its_kernels_do_not_take_are_flagged(tmp_path, target, a, b, ok):
    # The schema lets A and B be int8 or uint8 alike; the CPU kernels of these releases
    # take no int8 A with a uint8 B (measured, ort_types; "Could not find an
    # implementation").
    path = tmp_path / "qmm.onnx"
    text = QMATMUL.replace("TA", a).replace("TB", b).replace("TY", a)
    ir.save(ir.from_onnx_text(text), path)
    found = _dq109(path, target)
    if ok:
        assert found == {}
    else:
        assert list(found) == ["QLinearMatMul"]
        assert f"(a {a}, b {b}, output {a}; measured)" in found["QLinearMatMul"]


def test_the_type_table_is_what_the_installed_release_runs():
    # Runtime facts are data keyed by release: the installed one, probed with one-node
    # sessions, agrees with the table of its release.
    from importlib import metadata

    from dqtool.families.integer import ort_types
    from dqtool.runtimes.onnxruntime import release_of

    release = release_of(metadata.version("onnxruntime"))
    assert release in ort_types.TYPE_COMBOS, (
        f"onnxruntime {release} has no entry in ort_types.TYPE_COMBOS; measured here: "
        f"{ {k: sorted(v) for k, v in ort_types.probe().items()} }")
    assert ort_types.probe() == ort_types.TYPE_COMBOS[release]
