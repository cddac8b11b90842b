"""Random DQ / QDQ graphs across version pairs: the converted model computes bit-identical
Q/DQ results (dqtool's reference evaluator; onnxruntime where it runs both).

Small by default; DQTOOL_SLOW=1 runs more examples.
"""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import dqtool
from dqtool.checking import conversion
from dqtool.convert import ConversionRefused

EXAMPLES = 60 if os.environ.get("DQTOOL_SLOW") else 12
QTYPES = {"int8": np.int8, "uint8": np.uint8, "int16": np.int16, "uint16": np.uint16,
          "int4": ml_dtypes.int4, "uint4": ml_dtypes.uint4, "int2": ml_dtypes.int2,
          "uint2": ml_dtypes.uint2}
RANGES = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767),
          "uint16": (0, 65535), "int4": (-8, 7), "uint4": (0, 15), "int2": (-2, 1),
          "uint2": (0, 3)}


@st.composite
def dq_models(draw):
    qt = draw(st.sampled_from(sorted(QTYPES)))
    rows, cols = draw(st.integers(1, 6)), draw(st.integers(1, 7))
    gran = draw(st.sampled_from(["per-tensor", "per-axis", "blocked"]))
    axis = draw(st.integers(0, 1))
    scale_t = draw(st.sampled_from([np.float32, np.float16]))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    lo, hi = RANGES[qt]
    x = rng.integers(lo, hi + 1, (rows, cols)).astype(QTYPES[qt])
    dims = (rows, cols)
    attrs = {}
    if gran == "per-tensor":
        sshape: tuple = ()
    elif gran == "per-axis":
        sshape = (dims[axis],)
        attrs["axis"] = axis
    else:
        block = draw(st.integers(1, dims[axis]))
        sshape = tuple(-(-d // block) if i == axis else d for i, d in enumerate(dims))
        attrs.update(axis=axis, block_size=block)
    scale = (rng.uniform(0.001, 2, sshape) * rng.choice([-1, 1], sshape)).astype(scale_t)
    zp = rng.integers(lo, hi + 1, sshape).astype(QTYPES[qt])
    inputs = ["x", "s"] + (["z"] if draw(st.booleans()) else [])
    out_f16 = scale_t == np.float32 and draw(st.booleans())
    if out_f16:
        attrs["output_dtype"] = TensorProto.FLOAT16
    node = helper.make_node("DequantizeLinear", inputs, ["y"], name="dq", **attrs)
    inits = [numpy_helper.from_array(x, "x"), numpy_helper.from_array(np.asarray(scale), "s"),
             numpy_helper.from_array(np.asarray(zp), "z")][: len(inputs)]
    out_t = TensorProto.FLOAT16 if (out_f16 or scale_t == np.float16) else TensorProto.FLOAT
    graph = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("y", out_t, None)],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 25)])
    model.ir_version = 13
    target = draw(st.sampled_from([13, 19, 21, 23, 24]))
    return model, target


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(dq_models())
def test_random_dq_downgrade_is_exact_or_refused(case):
    proto, target = case
    import onnx_ir as ir

    try:
        report = dqtool.downgrade(ir.from_proto(proto), target)
    except ConversionRefused as e:
        reasons = " ".join(r.reason for r in e.report.refusals)
        assert reasons
        return
    converted = ir.to_proto(report.model)
    res = conversion.compare(proto, converted)
    assert res.ok, res
    ref = res.runtimes["dqtool.reference_evaluator"]
    assert ref == "identical", res


@st.composite
def qdq_models(draw):
    qt = draw(st.sampled_from(["int8", "uint8"]))
    per_axis = draw(st.booleans())
    c = draw(st.integers(1, 5))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    shape = (2, c) if per_axis else ()
    sshape = (c,) if per_axis else ()
    scale = rng.uniform(0.01, 1, sshape).astype(np.float32)
    lo, hi = RANGES[qt]
    zp = rng.integers(lo, hi + 1, sshape).astype(QTYPES[qt])
    attrs = {"axis": 1} if per_axis else {}
    nodes = [helper.make_node("QuantizeLinear", ["X", "s", "z"], ["q"], name="q", **attrs),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["Y"], name="dq", **attrs)]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, c])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(scale, "s"), numpy_helper.from_array(zp, "z")])
    del shape
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 7
    return model, draw(st.sampled_from([19, 21, 23, 25]))


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(qdq_models())
def test_random_qdq_upgrade_and_back(case):
    import onnx_ir as ir

    proto, target = case
    up = ir.to_proto(dqtool.upgrade(ir.from_proto(proto), target).model)
    res = conversion.compare(proto, up)
    assert res.ok, res
    assert "identical" in res.runtimes["onnxruntime (CPU, ORT_DISABLE_ALL)"], res
    down = ir.to_proto(dqtool.downgrade(ir.from_proto(up), 13).model)
    res = conversion.compare(proto, down)
    assert res.ok, res


@pytest.mark.parametrize("target", [13, 19])
def test_every_dq_lowering_path_at_once(target):
    """A fixed int4 blocked ragged fp16 output_dtype node: every rewrite chained."""
    import onnx_ir as ir

    x = np.arange(-8, 7).repeat(2)[:21].reshape(3, 7).astype(ml_dtypes.int4)
    s = np.linspace(0.1, 1.0, 6).reshape(3, 2).astype(np.float32)
    z = np.array([[1, -1], [0, 2], [-3, 3]], ml_dtypes.int4)
    node = helper.make_node("DequantizeLinear", ["x", "s", "z"], ["y"], name="dq", axis=1,
                            block_size=4, output_dtype=TensorProto.FLOAT16)
    graph = helper.make_graph([node], "g", [], [helper.make_tensor_value_info(
        "y", TensorProto.FLOAT16, [3, 7])], [numpy_helper.from_array(x, "x"),
                                             numpy_helper.from_array(s, "s"),
                                             numpy_helper.from_array(z, "z")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    proto.ir_version = 11
    out = ir.to_proto(dqtool.downgrade(ir.from_proto(proto), target).model)
    res = conversion.compare(proto, out)
    assert res.ok and res.runtimes["dqtool.reference_evaluator"] == "identical", res
