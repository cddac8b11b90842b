"""``tensorrt``: the IDequantizeLayer rules of NVIDIA's documentation (TensorRT 8.6.1 and 10
operator pages; no GPU here, so no oracle), each tripped by one model and not by its
neighbour, and where the two releases differ."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from helpers import deploy_models as dm
from helpers import dq_model, make_model, save
from onnx import TensorProto, helper, numpy_helper

from dqtool.linting import lint
from dqtool.linting.targets import names

MODELS = Path(__file__).resolve().parent.parent / "models"
F32 = np.float32


def _codes(tmp_path: Path, model, target: str = "tensorrt") -> set[str]:
    path = model if isinstance(model, Path) else save(model, tmp_path / "m.onnx")
    return {f.code for f in lint(path, target=target, select="DQ1").findings} - {"DQ112"}


def _int8(zp=0, shape=(4, 8)):
    return dq_model(np.ones(shape, np.int8), np.array(0.5, F32), np.array(zp, np.int8))


def _blocked(dtype, rank=2):
    shape = (4, 8) if rank == 2 else (2, 4, 8)
    scale = np.ones((*shape[:-1], 2), F32)
    return dq_model(np.ones(shape, dtype), scale, axis=-1, block_size=4)


def _runtime_scale():
    """The scale is a graph input: not a build-time constant."""
    node = helper.make_node("DequantizeLinear", ["x", "s"], ["y"], name="W_dq")
    return make_model([node], [numpy_helper.from_array(np.ones((4, 8), np.int8), "x")],
                      [("s", TensorProto.FLOAT, [])], [("y", TensorProto.FLOAT, [4, 8])])


def _huge():
    """x of 2^31 elements, a graph input (nothing stored)."""
    node = helper.make_node("DequantizeLinear", ["x", "s"], ["y"], name="W_dq")
    return make_model([node], [numpy_helper.from_array(np.array(0.5, F32), "s")],
                      [("x", TensorProto.INT8, [65536, 32768])],
                      [("y", TensorProto.FLOAT, [65536, 32768])])


CASES = [  # (code, target, trips, passes)
    ("DQ140", "tensorrt", lambda: dq_model(np.ones((4, 8), np.uint8), np.array(0.5, F32)),
     lambda: _int8()),
    ("DQ140", "tensorrt-8.6",
     lambda: dq_model(np.ones((4, 8), ml_dtypes.float8_e4m3fn), np.array(0.5, F32)),
     lambda: _int8()),
    ("DQ141", "tensorrt", lambda: _int8(zp=3), lambda: _int8(zp=0)),
    ("DQ142", "tensorrt", _runtime_scale, lambda: _int8()),
    ("DQ143", "tensorrt", lambda: _blocked(np.int8), lambda: _blocked(ml_dtypes.int4)),
    ("DQ143", "tensorrt", lambda: _blocked(ml_dtypes.int4, rank=3),
     lambda: _blocked(ml_dtypes.int4)),
    ("DQ143", "tensorrt-8.6", lambda: _blocked(ml_dtypes.int4), lambda: _int8()),
    ("DQ144", "tensorrt", _huge, lambda: _int8()),
    ("DQ145", "tensorrt-8.6",
     lambda: dq_model(np.ones((4, 8), np.int8), np.array(0.5, np.float16),
                      out_type=TensorProto.FLOAT16), lambda: _int8()),
]


@pytest.mark.parametrize(("code", "target", "trips", "passes"), CASES,
                         ids=[f"{c}-{t}-{i}" for i, (c, t, _, _) in enumerate(CASES)])
def test_rule_trips_and_its_neighbour_does_not(tmp_path, code, target, trips, passes):
    assert code in _codes(tmp_path, trips(), target)
    assert _codes(tmp_path, passes(), target) == set()


def test_releases_differ_where_the_docs_do(tmp_path):
    fp16 = dq_model(np.ones((4, 8), np.int8), np.array(0.5, np.float16),
                    out_type=TensorProto.FLOAT16)
    assert _codes(tmp_path, fp16, "tensorrt-10") == set()
    assert _codes(tmp_path, fp16, "tensorrt-8.6") == {"DQ145"}
    assert _codes(tmp_path, _blocked(ml_dtypes.int4), "tensorrt-10") == set()


def test_contrib_domain(tmp_path):
    assert "DQ146" in _codes(tmp_path, MODELS / "ms_qdq_contrib.onnx")


def test_float_activation_runs_in_float(tmp_path):
    v = dm.Variant("MatMul", act="int8", weight_zp="none", quantize_input=False,
                   quantize_output=False)
    assert _codes(tmp_path, dm.model(v)) == {"DQ147"}
    weight_only = dm.Variant("MatMul", weight="int4", granularity="blocked", axis=0,
                             block=8, weight_zp="none", quantize_input=False,
                             quantize_output=False)
    assert _codes(tmp_path, dm.model(weight_only)) == set()


def test_summary_and_fixes(tmp_path):
    path = save(_blocked(ml_dtypes.int4), tmp_path / "m.onnx")
    (f,) = lint(path, target="tensorrt-8.6", select="DQ143").findings
    assert f.fix == "`dqtool downgrade --opset 20` (widens to int8, blocks → per-axis)"
    v = dm.Variant("Conv", act="int8", weight="int8", weight_zp="none")
    report = lint(save(dm.model(v), tmp_path / "c.onnx"), target="tensorrt")
    codes = {f.code for f in report.findings}
    assert "DQ140" in codes  # the int32 bias: TensorRT dequantizes int8/fp8/int4 only
    (summary,) = [f for f in report.findings if f.code == "DQ112"]
    assert summary.message.endswith("tensorrt: 0 of 1 Conv run quantized on TensorRT 10; "
                                    "1 fall back: op")


def test_targets_listed():
    assert {"tensorrt", "tensorrt-10", "tensorrt-8.6"} <= set(names())
