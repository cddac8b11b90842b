"""Target profiles reproduce their seed tables (``docs/semantics.md``)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from helpers import dq_model, save
from onnx import TensorProto

from dqtool import codecs, graph, storage, versions
from dqtool.linting import lint

F32, F16 = np.float32, np.float16


def codes(tmp_path, model, target):
    path = model if isinstance(model, str) else save(model, tmp_path / "m.onnx")
    report = lint(path, target=target, select="DQ1")
    assert all(f.fix for f in report.findings if f.code != "DQ108"), report.findings
    return {f.code for f in report.findings}


def x4(dtype, shape=(1, 2, 2, 2)):
    return np.zeros(shape, dtype)


def per_tensor(x, scale_dtype=F32, zp=True, **kw):
    z = np.zeros((), x.dtype) if zp else None
    return dq_model(x, np.array(0.5, scale_dtype), z, **kw)


# DirectML: (level, model factory, runs?)
DML = [
    ("1.0", lambda: per_tensor(x4(np.uint8)), True),
    ("1.0", lambda: per_tensor(x4(np.int8)), False),  # FL1.0: uint8 only
    ("1.0", lambda: per_tensor(x4(np.uint8, (2, 4))), False),  # 4-D only
    ("1.0", lambda: per_tensor(x4(np.uint8), F16, out_type=TensorProto.FLOAT16), False),
    ("2.1", lambda: per_tensor(x4(np.int16)), True),
    ("2.1", lambda: per_tensor(x4(np.int8, (2, 4))), False),
    ("3.0", lambda: per_tensor(x4(np.int8, (2, 4))), True),  # 1–8 dims from 3.0
    ("3.0", lambda: per_tensor(x4(np.int8), F16, out_type=TensorProto.FLOAT16), False),
    ("6.0", lambda: per_tensor(x4(np.int8), F16, out_type=TensorProto.FLOAT16), True),
    ("6.0", lambda: per_tensor(x4(np.int8), zp=False), False),  # zero point required
    ("6.2", lambda: per_tensor(x4(np.int8), zp=False), True),  # optional from 6.2
    ("6.2", lambda: dq_model(np.zeros((4, 8), np.int8), np.ones((4, 2), F32), axis=1,
                             block_size=4), False),  # blocked: only DML_DEQUANTIZE (6.3)
    ("6.3", lambda: dq_model(np.zeros((4, 8), ml_dtypes.int4), np.ones((4, 2), F32),
                             axis=1, block_size=4), True),
    ("6.3", lambda: dq_model(np.zeros((4, 6), ml_dtypes.int4), np.ones((4, 2), F32),
                             axis=1, block_size=4), False),  # ragged: exact division only
    ("6.3", lambda: dq_model(np.zeros((4, 8), np.int16), np.ones((4, 2), F32), axis=1,
                             block_size=4), False),  # DML_DEQUANTIZE: int8/int4/uint8/uint4
]


@pytest.mark.parametrize(("level", "factory", "runs"), DML)
def test_directml_table(tmp_path, level, factory, runs):
    assert (not codes(tmp_path, factory(), f"directml-fl{level}")) == runs


def test_directml_fl10_flags_int8_with_reason(tmp_path):
    found = codes(tmp_path, per_tensor(x4(np.int8)), "directml-fl1.0")
    assert found == {"DQ101"}


ONEDNN = [
    (lambda: per_tensor(np.zeros((2, 4), np.int8)), True),  # Dequantize s8
    (lambda: per_tensor(np.zeros((2, 4), np.int16)), False),
    (lambda: per_tensor(np.zeros((2, 4), ml_dtypes.float8_e4m3fn), zp=False), True),
    # DynamicDequantize: s4 per-group on the last two dims, exact division
    (lambda: dq_model(np.zeros((2, 4, 8), ml_dtypes.int4), np.ones((2, 4, 2), F16), axis=2,
                      block_size=4, out_type=TensorProto.FLOAT16), True),
    (lambda: dq_model(np.zeros((2, 4, 6), ml_dtypes.int4), np.ones((2, 4, 2), F16), axis=2,
                      block_size=4, out_type=TensorProto.FLOAT16), False),  # ragged
    (lambda: dq_model(np.zeros((8, 4, 4), ml_dtypes.int4), np.ones((2, 4, 4), F32), axis=0,
                      block_size=4), False),  # groups only on the last two dims
    (lambda: per_tensor(np.zeros((2, 4), np.int8), ml_dtypes.bfloat16, opset=21,
                        out_type=TensorProto.BFLOAT16), True),  # Dynamic: bf16 scale
]


@pytest.mark.parametrize(("factory", "runs"), ONEDNN)
def test_onednn_graph_table(tmp_path, factory, runs):
    assert (not codes(tmp_path, factory(), "onednn-graph")) == runs


def test_onednn_exact_division_code(tmp_path):
    m = dq_model(np.zeros((2, 4, 6), ml_dtypes.int4), np.ones((2, 4, 2), F16), axis=2,
                 block_size=4, out_type=TensorProto.FLOAT16)
    assert codes(tmp_path, m, "onednn-graph") == {"DQ107"}


@pytest.mark.parametrize("target", ["onnxruntime", "onnxruntime-1.31", "onnxruntime-1.32"])
def test_onnxruntime_profile(tmp_path, target):
    """What every measured release lacks alike (the installed one is probed)."""
    assert codes(tmp_path, "models/dq23_float4e2m1_output_dtype.onnx", target) == {"DQ101"}
    assert codes(tmp_path, "models/dq19_uint8_bfloat16_scale.onnx", target) == {"DQ102"}
    assert codes(tmp_path, "models/dq24_float8e8m0_scale.onnx", target) >= {"DQ102"}
    assert "DQ100" in codes(tmp_path, "models/dq28_float6e2m3.onnx", target)
    assert codes(tmp_path, "models/opmx_int8.onnx", target) == {"DQ106"}
    for healthy in ("models/qdq_conv_int8.onnx", "models/ort_qdq_per_channel.onnx",
                    "models/ms_qdq_contrib.onnx"):
        assert lint(healthy, target=target).exit_code == 0
    # com.microsoft DequantizeLinear: float16 scales run (measured on both releases),
    # bfloat16 ones do not.
    for dtype, elem, want in ((F16, TensorProto.FLOAT16, set()),
                              (ml_dtypes.bfloat16, TensorProto.BFLOAT16, {"DQ102"})):
        ms = dq_model(np.zeros(4, np.int8), np.array(1, dtype), domain="com.microsoft",
                      opset=17, extra_opsets={"com.microsoft": 1}, ir_version=8,
                      out_type=elem)
        assert codes(tmp_path, ms, target) == want


def test_onnxruntime_releases_differ_where_the_runtimes_do(tmp_path):
    """1.31 runs DequantizeLinear up to opset 26, 1.32 up to 27 (both measured)."""
    at27 = dq_model(np.zeros(4, np.int8), np.array(1, np.float32), opset=27, ir_version=10)
    found = {t: lint(str(save(at27, tmp_path / "m.onnx")), target=t,
                     select="DQ1").findings
             for t in ("onnxruntime-1.31", "onnxruntime-1.32")}
    (f,) = found["onnxruntime-1.31"]
    assert f.code == "DQ100"
    assert "opset 27 is above the target's 26 (onnxruntime 1.31 CPU)" in f.message
    assert f.fix == "`dqtool downgrade --opset 26` would lower it"
    assert not found["onnxruntime-1.32"]
    (f,) = lint("models/dq28_float6e2m3.onnx", target="onnxruntime-1.32",
                select="DQ100").findings
    assert "opset 28 is above the target's 27 (onnxruntime 1.32 CPU)" in f.message


def test_onnx_opset_profile(tmp_path):
    found = codes(tmp_path, "models/dq21_int4_blocked_ragged.onnx", "onnx-opset-13")
    assert {"DQ100", "DQ101", "DQ103"} <= found
    assert not codes(tmp_path, "models/dq21_int4_blocked_ragged.onnx", "onnx-opset-21")
    assert codes(tmp_path, "models/dq19_float8e4m3fn_fp16_scale.onnx", "onnx-opset-18") >= \
        {"DQ101", "DQ102"}
    assert "DQ106" in codes(tmp_path, "models/ms_qdq_contrib.onnx", "onnx-opset-21")
    assert not codes(tmp_path, "models/qdq_conv_int8.onnx", "onnx-opset-13")


def test_onnx_opset_fix_names_downgrade(tmp_path):
    report = lint("models/dq21_int4_blocked_ragged.onnx", target="onnx-opset-13")
    blocked = [f for f in report.findings if f.code == "DQ103"]
    assert blocked and "dqtool downgrade --opset 13" in blocked[0].fix


def _first_spec(path):
    site = next(s for s in graph.walk(storage.load(path)) if codecs.is_quant_node(s.node))
    return site.node.name, codecs.read_node(site.node, site.opsets)


@pytest.mark.parametrize(("model", "since", "want"), [
    ("models/dq21_int4_blocked_ragged.onnx", 13, ["DQ101", "DQ103"]),
    ("models/dq19_float8e4m3fn_fp16_scale.onnx", 13, ["DQ101", "DQ102", "DQ102"]),
    ("models/dq13_int8_per_axis.onnx", 10, ["DQ103"]),
    ("models/dq13_int8_per_axis.onnx", 13, []),
])
def test_version_reasons_carry_the_codes_lint_reports(model, since, want):
    node, spec = _first_spec(model)
    reasons = versions.reasons(spec, since)
    assert [r.code for r in reasons] == want
    assert versions.why_not(spec, since) == [r.message for r in reasons]  # plain strings
    opset = since if since > 10 else 11  # DequantizeLinear-10 is in force at opset 11
    report = lint(model, target=f"onnx-opset-{opset}", select="DQ101,DQ102,DQ103")
    # Each reason is one finding about that node, under the reason's own code.
    findings = [f for f in report.findings if f.node == node]
    assert len(findings) == len(reasons)
    for f, r in zip(findings, reasons, strict=True):
        assert f.code == r.code and f": {r.message}; fix: " in f.message, (f, r)


def test_opmx_profile(tmp_path):
    assert not codes(tmp_path, "models/opmx_int4_packed.onnx", "opmx")
    good = dq_model(np.zeros((8, 4), np.int8), np.ones((8, 1), F32), axis=1, block_size=4)
    assert not codes(tmp_path, good, "opmx")
    assert codes(tmp_path, per_tensor(np.zeros((2, 4), np.uint8)), "opmx") == {"DQ101"}
    ragged = dq_model(np.zeros((8, 6), np.int8), np.ones((8, 2), F32), axis=1, block_size=4)
    assert codes(tmp_path, ragged, "opmx") == {"DQ107"}


def test_unknown_target_is_a_usage_error():
    from dqtool.errors import UsageError

    with pytest.raises(UsageError, match="known: onnx-opset-N"):
        lint("models/qdq_conv_int8.onnx", target="coreml")


def test_target_opset_message_reads_as_a_sentence():
    report = lint("models/dq21_int4_blocked_ragged.onnx", target="onnx-opset-13",
                  select="DQ100")
    (f,) = report.findings
    assert "the model's ai.onnx opset 21 is above the target's 13" in f.message
    assert "`dqtool downgrade --opset 13` would lower it" in f.message
    assert "opset 13's 13" not in f.message
    (f,) = lint("models/dq28_float6e2m3.onnx", target="onnxruntime-1.31",
                select="DQ100").findings
    assert "opset 28 is above the target's 26 (onnxruntime 1.31 CPU)" in f.message
