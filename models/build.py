"""Build dqtool's sample models, deterministically.

    .venv/bin/python models/build.py [--out DIR] [--no-verify]

Writes small ONNX models covering every dequantization flavour dqtool reads (see
``models/README.md`` for the list and ``docs/semantics.md`` for what each one means):
one or more models per ai.onnx DequantizeLinear version (10, 13, 19, 21, 23, 24, 25, 28),
QDQ activation pairs around Conv and MatMul, weight QuantizeLinear(const)->DequantizeLinear
pairs, com.microsoft Q/DQ, OpenPPL opmx/pmx DequantizeLinear, a DQ inside an If subgraph and
inside a model-local function, an external-data model, intentionally invalid models
(``invalid_*.onnx``) and real models made by ``onnxruntime.quantization`` from small float
models built here.

Every run produces byte-identical files: fixed seeds, fixed producer name/version, no
timestamps or temporary paths, and the output of onnxruntime's quantizer is normalized
before it is saved. Each model gets the lowest IR version that its opsets and element types
need. Unless ``--no-verify`` is given, every valid model is checked with
``onnx.checker.check_model(full_check=True)`` and loaded (and run once) in onnxruntime where
onnxruntime supports its ops and types; the script exits 1 if a model fails a check it is
expected to pass.

This script deliberately does not import dqtool: the sample models are independent
evidence, written directly with ``onnx.helper``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import sys
import tempfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

PRODUCER_NAME = "dqtool-models"
PRODUCER_VERSION = "1"
LOCAL_DOMAIN = "dqtool.local"  # domain of the model-local function

TP = TensorProto
FLOAT, FLOAT16, BFLOAT16 = TP.FLOAT, TP.FLOAT16, TP.BFLOAT16

# The IR version that introduced each element type (onnx.proto, "IR VERSION n ... Added X").
_TYPE_MIN_IR = {
    TP.FLOAT8E4M3FN: 9,
    TP.FLOAT8E4M3FNUZ: 9,
    TP.FLOAT8E5M2: 9,
    TP.FLOAT8E5M2FNUZ: 9,
    TP.INT4: 10,
    TP.UINT4: 10,
    TP.FLOAT4E2M1: 11,
    TP.FLOAT8E8M0: 12,
    TP.INT2: 13,
    TP.UINT2: 13,
    TP.FLOAT6E2M3: 14,
    TP.FLOAT6E3M2: 14,
}


# --------------------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------------------


def rng_for(name: str) -> np.random.Generator:
    """A generator seeded from the model's name, so models do not depend on build order."""
    return np.random.default_rng(zlib.crc32(name.encode()))


def T(name: str, arr: np.ndarray) -> TensorProto:
    """An initializer; ml_dtypes arrays (int4, float8, float6, ...) are packed by onnx."""
    return numpy_helper.from_array(np.asarray(arr), name)


def vi(name: str, elem: int, shape: list | None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def node(op: str, inputs: list[str], outputs: list[str], name: str, domain: str = "", **attrs):
    return helper.make_node(op, inputs, outputs, name=name, domain=domain, **attrs)


def dq(inputs, output, name, domain="", **attrs):
    return node("DequantizeLinear", inputs, [output], name, domain, **attrs)


def q(inputs, output, name, domain="", **attrs):
    return node("QuantizeLinear", inputs, [output], name, domain, **attrs)


def _iter_graphs(g: onnx.GraphProto):
    yield g
    for n in g.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from _iter_graphs(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for sub in a.graphs:
                    yield from _iter_graphs(sub)


def _elem_types(model: onnx.ModelProto) -> set[int]:
    """Every element type a model stores or declares (initializers, value infos, attrs)."""
    found: set[int] = set()

    def from_type(t: onnx.TypeProto) -> None:
        if t.HasField("tensor_type"):
            found.add(t.tensor_type.elem_type)

    def from_nodes(nodes) -> None:
        for n in nodes:
            for a in n.attribute:
                if a.type == onnx.AttributeProto.TENSOR:
                    found.add(a.t.data_type)
                if a.name in ("to", "output_dtype") and a.type == onnx.AttributeProto.INT:
                    found.add(a.i)

    for g in _iter_graphs(model.graph):
        found.update(t.data_type for t in g.initializer)
        for v in (*g.input, *g.output, *g.value_info):
            from_type(v.type)
        from_nodes(g.node)
    for f in model.functions:
        from_nodes(f.node)
    return found


def min_ir_version(model: onnx.ModelProto) -> int:
    """The lowest IR version the model's opset imports and element types need."""
    ir = helper.find_min_ir_version_for(list(model.opset_import), ignore_unknown=True)
    for t in _elem_types(model):
        ir = max(ir, _TYPE_MIN_IR.get(t, 3))
    return ir


def make_model(
    graph: onnx.GraphProto,
    opsets: dict[str, int],
    functions: list[onnx.FunctionProto] | None = None,
    doc: str = "",
    metadata: dict[str, str] | None = None,
) -> onnx.ModelProto:
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()],
        functions=functions or [],
        producer_name=PRODUCER_NAME,
        producer_version=PRODUCER_VERSION,
        doc_string=doc,
    )
    for k, v in (metadata or {}).items():
        model.metadata_props.add(key=k, value=v)
    model.ir_version = min_ir_version(model)
    return model


def normalize(model: onnx.ModelProto, source: str) -> onnx.ModelProto:
    """Make a model written by another tool byte-stable: fixed producer, no metadata that
    could hold paths or times, minimal IR version, and a note of where it came from."""
    model.producer_name = PRODUCER_NAME
    model.producer_version = PRODUCER_VERSION
    model.domain = ""
    model.model_version = 0
    model.doc_string = ""
    del model.metadata_props[:]
    model.metadata_props.add(key="source", value=source)
    # opset imports in a stable order
    ops = sorted(((o.domain, o.version) for o in model.opset_import), key=lambda x: x[0])
    del model.opset_import[:]
    for d, v in ops:
        model.opset_import.add(domain=d, version=v)
    model.ir_version = min_ir_version(model)
    return model


# --------------------------------------------------------------------------------------
# quantization helpers (numpy) used to make plausible weights
# --------------------------------------------------------------------------------------


def f32(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32)


def sym_quant(w: np.ndarray, scale: np.ndarray, qmin: int, qmax: int, dtype) -> np.ndarray:
    return np.clip(np.rint(w / scale), qmin, qmax).astype(np.int64).astype(dtype)


def pow2(x: np.ndarray) -> np.ndarray:
    """Round positive scales to powers of two (exactly representable in every scale type)."""
    return f32(2.0 ** np.round(np.log2(x)))


# --------------------------------------------------------------------------------------
# the models
# --------------------------------------------------------------------------------------


@dataclass
class Spec:
    file: str
    build: Callable[[str], onnx.ModelProto | None]
    holds: str
    domain: str  # domain/version, human readable
    types: str
    granularity: str
    # what onnxruntime CPU is expected to do: "yes" load and run; "noopt" load and run only
    # with graph optimizations off; "no" refuse it
    ort: str = "yes"
    valid: bool = True  # expected to pass onnx.checker full_check
    note: str = ""  # why onnxruntime cannot load it, or what is invalid


SPECS: list[Spec] = []


def spec(**kw):
    def deco(fn):
        SPECS.append(Spec(build=fn, **kw))
        return fn

    return deco


# ---- ai.onnx DequantizeLinear 10 ------------------------------------------------------


@spec(
    file="dq10_uint8_per_tensor.onnx",
    holds="uint8 weight DQ (with zero point) -> MatMul, int32 bias DQ (no zero point) -> Add",
    domain="ai.onnx 10",
    types="uint8, int32 / float",
    granularity="per-tensor",
)
def dq10_uint8_per_tensor(name):
    r = rng_for(name)
    w = r.uniform(0, 255, (8, 4)).astype(np.uint8)
    b = r.integers(-500, 500, (4,)).astype(np.int32)
    inits = [
        T("W_q", w),
        T("W_scale", f32(0.0125)),
        T("W_zp", np.uint8(128)),
        T("B_q", b),
        T("B_scale", f32(0.0125 * 0.05)),
    ]
    nodes = [
        dq(["W_q", "W_scale", "W_zp"], "W", "W_DequantizeLinear"),
        node("MatMul", ["X", "W"], ["XW"], "MatMul"),
        dq(["B_q", "B_scale"], "B", "B_DequantizeLinear"),
        node("Add", ["XW", "B"], ["Y"], "Add"),
    ]
    g = helper.make_graph(nodes, "dq10", [vi("X", FLOAT, [1, 8])], [vi("Y", FLOAT, [1, 4])], inits)
    return make_model(g, {"": 10})


# ---- ai.onnx DequantizeLinear 13 ------------------------------------------------------


@spec(
    file="dq13_int8_per_axis.onnx",
    holds="int8 weight per-axis (axis=1) + int32 bias per-axis (axis=0), uint8 per-axis with "
    "axis=-1 and non-zero zero points, int8 with a 1-D length-1 (per-tensor) scale",
    domain="ai.onnx 13",
    types="int8, uint8, int32 / float",
    granularity="per-axis, per-tensor (1-D len 1)",
)
def dq13_int8_per_axis(name):
    r = rng_for(name)
    s1 = f32(r.uniform(0.005, 0.02, 6))
    s2 = f32(r.uniform(0.005, 0.02, 5))
    inits = [
        T("W1_q", r.integers(-127, 128, (8, 6)).astype(np.int8)),
        T("W1_scale", s1),
        T("W1_zp", np.zeros(6, np.int8)),
        T("B1_q", r.integers(-2000, 2000, (6,)).astype(np.int32)),
        T("B1_scale", f32(s1 * 0.04)),
        T("W2_q", r.integers(0, 256, (6, 5)).astype(np.uint8)),
        T("W2_scale", s2),
        T("W2_zp", r.integers(120, 136, (5,)).astype(np.uint8)),
        T("W3_q", r.integers(-127, 128, (5, 3)).astype(np.int8)),
        T("W3_scale", f32([0.01])),
        T("W3_zp", np.zeros(1, np.int8)),
    ]
    nodes = [
        dq(["W1_q", "W1_scale", "W1_zp"], "W1", "W1_DequantizeLinear", axis=1),
        node("MatMul", ["X", "W1"], ["H1a"], "MatMul_1"),
        dq(["B1_q", "B1_scale"], "B1", "B1_DequantizeLinear", axis=0),
        node("Add", ["H1a", "B1"], ["H1"], "Add_1"),
        dq(["W2_q", "W2_scale", "W2_zp"], "W2", "W2_DequantizeLinear", axis=-1),
        node("MatMul", ["H1", "W2"], ["H2"], "MatMul_2"),
        dq(["W3_q", "W3_scale", "W3_zp"], "W3", "W3_DequantizeLinear"),
        node("MatMul", ["H2", "W3"], ["Y"], "MatMul_3"),
    ]
    g = helper.make_graph(nodes, "dq13", [vi("X", FLOAT, [1, 8])], [vi("Y", FLOAT, [1, 3])], inits)
    return make_model(g, {"": 13})


# ---- ai.onnx DequantizeLinear 19 ------------------------------------------------------


def _f8(r, shape, dt, scale):
    return (r.standard_normal(shape) * 0.1 / scale).astype(np.float32).astype(dt)


@spec(
    file="dq19_float8e4m3fn_fp16_scale.onnx",
    holds="the four float8 types: float8e4m3fn per-axis with float16 scale (float16 output), "
    "float8e5m2 per-tensor float16 scale with an explicit zero zero point, float8e4m3fnuz "
    "per-axis and float8e5m2fnuz per-tensor with float scales",
    domain="ai.onnx 19",
    types="float8e4m3fn, float8e5m2, float8e4m3fnuz, float8e5m2fnuz / float16, float",
    granularity="per-axis, per-tensor",
)
def dq19_float8(name):
    r = rng_for(name)
    s1 = np.full(6, 0.03125, np.float16) * np.arange(1, 7).astype(np.float16)
    inits = [
        T("W1_q", _f8(r, (8, 6), ml_dtypes.float8_e4m3fn, 0.05)),
        T("W1_scale", s1.astype(np.float16)),
        T("W2_q", _f8(r, (6, 4), ml_dtypes.float8_e5m2, 0.05)),
        T("W2_scale", np.float16(0.0625)),
        T("W2_zp", np.zeros((), ml_dtypes.float8_e5m2)),
        T("W3_q", _f8(r, (4, 4), ml_dtypes.float8_e4m3fnuz, 0.05)),
        T("W3_scale", f32([0.05, 0.04, 0.03, 0.02])),
        T("W4_q", _f8(r, (4, 3), ml_dtypes.float8_e5m2fnuz, 0.05)),
        T("W4_scale", f32(0.05)),
    ]
    nodes = [
        dq(["W1_q", "W1_scale"], "W1", "W1_DequantizeLinear", axis=1),
        node("MatMul", ["X", "W1"], ["H1"], "MatMul_1"),
        dq(["W2_q", "W2_scale", "W2_zp"], "W2", "W2_DequantizeLinear"),
        node("MatMul", ["H1", "W2"], ["H2h"], "MatMul_2"),
        node("Cast", ["H2h"], ["H2"], "Cast_to_float", to=FLOAT),
        dq(["W3_q", "W3_scale"], "W3", "W3_DequantizeLinear", axis=1),
        node("MatMul", ["H2", "W3"], ["H3"], "MatMul_3"),
        dq(["W4_q", "W4_scale"], "W4", "W4_DequantizeLinear"),
        node("MatMul", ["H3", "W4"], ["Y"], "MatMul_4"),
    ]
    g = helper.make_graph(
        nodes, "dq19_float8", [vi("X", FLOAT16, [1, 8])], [vi("Y", FLOAT, [1, 3])], inits
    )
    return make_model(g, {"": 19})


@spec(
    file="dq19_uint8_bfloat16_scale.onnx",
    holds="uint8 weight per-axis with a bfloat16 scale (bfloat16 output) -> Cast -> MatMul",
    domain="ai.onnx 19",
    types="uint8 / bfloat16",
    granularity="per-axis",
    ort="no",
    note="onnxruntime CPU has no bfloat16-scale DequantizeLinear",
)
def dq19_bfloat16(name):
    r = rng_for(name)
    inits = [
        T("W_q", r.integers(0, 256, (8, 4)).astype(np.uint8)),
        T("W_scale", f32([0.01, 0.02, 0.015, 0.03]).astype(ml_dtypes.bfloat16)),
        T("W_zp", np.array([128, 127, 129, 128], np.uint8)),
    ]
    nodes = [
        dq(["W_q", "W_scale", "W_zp"], "W_bf16", "W_DequantizeLinear", axis=1),
        node("Cast", ["W_bf16"], ["W"], "Cast_to_float", to=FLOAT),
        node("MatMul", ["X", "W"], ["Y"], "MatMul"),
    ]
    g = helper.make_graph(
        nodes, "dq19_bf16", [vi("X", FLOAT, [1, 8])], [vi("Y", FLOAT, [1, 4])], inits
    )
    return make_model(g, {"": 19})


# ---- ai.onnx DequantizeLinear 21 ------------------------------------------------------


@spec(
    file="dq21_int4_blocked_ragged.onnx",
    holds="int4 weight (10, 4) blocked on axis 0 with block_size 4 (scale (3, 4): the last "
    "block holds 2 rows) with an int4 zero point -> MatMul",
    domain="ai.onnx 21",
    types="int4 / float",
    granularity="blocked (ragged)",
)
def dq21_int4_blocked_ragged(name):
    r = rng_for(name)
    inits = [
        T("W_q", r.integers(-8, 8, (10, 4)).astype(ml_dtypes.int4)),
        T("W_scale", f32(r.uniform(0.01, 0.05, (3, 4)))),
        T("W_zp", r.integers(-2, 3, (3, 4)).astype(ml_dtypes.int4)),
    ]
    nodes = [
        dq(["W_q", "W_scale", "W_zp"], "W", "W_DequantizeLinear", axis=0, block_size=4),
        node("MatMul", ["X", "W"], ["Y"], "MatMul"),
    ]
    g = helper.make_graph(
        nodes, "dq21_int4", [vi("X", FLOAT, [1, 10])], [vi("Y", FLOAT, [1, 4])], inits
    )
    return make_model(g, {"": 21})


@spec(
    file="dq21_uint4_blocked_axis1.onnx",
    holds="uint4 weight (6, 16) blocked on axis 1 with block_size 8 (exact) and uint4 zero "
    "point; plus uint4 per-tensor without zero point",
    domain="ai.onnx 21",
    types="uint4 / float",
    granularity="blocked, per-tensor",
)
def dq21_uint4_blocked_axis1(name):
    r = rng_for(name)
    inits = [
        T("W1_q", r.integers(0, 16, (6, 16)).astype(ml_dtypes.uint4)),
        T("W1_scale", f32(r.uniform(0.01, 0.05, (6, 2)))),
        T("W1_zp", r.integers(6, 10, (6, 2)).astype(ml_dtypes.uint4)),
        T("W2_q", r.integers(0, 16, (16, 4)).astype(ml_dtypes.uint4)),
        T("W2_scale", f32(0.02)),
    ]
    nodes = [
        dq(["W1_q", "W1_scale", "W1_zp"], "W1", "W1_DequantizeLinear", axis=1, block_size=8),
        node("MatMul", ["X", "W1"], ["H"], "MatMul_1"),
        dq(["W2_q", "W2_scale"], "W2", "W2_DequantizeLinear"),
        node("MatMul", ["H", "W2"], ["Y"], "MatMul_2"),
    ]
    g = helper.make_graph(
        nodes, "dq21_uint4", [vi("X", FLOAT, [1, 6])], [vi("Y", FLOAT, [1, 4])], inits
    )
    return make_model(g, {"": 21})


@spec(
    file="dq21_uint16_per_axis.onnx",
    holds="uint16 weight per-axis with uint16 zero point; int16 weight per-tensor with int16 "
    "zero point",
    domain="ai.onnx 21",
    types="uint16, int16 / float",
    granularity="per-axis, per-tensor",
)
def dq21_uint16_per_axis(name):
    r = rng_for(name)
    inits = [
        T("W1_q", r.integers(0, 65536, (8, 4)).astype(np.uint16)),
        T("W1_scale", f32(r.uniform(1e-5, 4e-5, 4))),
        T("W1_zp", np.array([32768, 32767, 32770, 32768], np.uint16)),
        T("W2_q", r.integers(-32768, 32768, (4, 3)).astype(np.int16)),
        T("W2_scale", f32(3e-5)),
        T("W2_zp", np.int16(-3)),
    ]
    nodes = [
        dq(["W1_q", "W1_scale", "W1_zp"], "W1", "W1_DequantizeLinear", axis=1),
        node("MatMul", ["X", "W1"], ["H"], "MatMul_1"),
        dq(["W2_q", "W2_scale", "W2_zp"], "W2", "W2_DequantizeLinear"),
        node("MatMul", ["H", "W2"], ["Y"], "MatMul_2"),
    ]
    g = helper.make_graph(
        nodes, "dq21_16bit", [vi("X", FLOAT, [1, 8])], [vi("Y", FLOAT, [1, 3])], inits
    )
    return make_model(g, {"": 21})


@spec(
    file="dq21_int8_blocked_fp16.onnx",
    holds="int8 weight (32, 8) blocked on axis 0 (block_size 16) with float16 scale and "
    "float16 output -> MatMul in float16",
    domain="ai.onnx 21",
    types="int8 / float16",
    granularity="blocked",
)
def dq21_int8_blocked_fp16(name):
    r = rng_for(name)
    inits = [
        T("W_q", r.integers(-127, 128, (32, 8)).astype(np.int8)),
        T("W_scale", r.uniform(0.001, 0.004, (2, 8)).astype(np.float16)),
    ]
    nodes = [
        dq(["W_q", "W_scale"], "W", "W_DequantizeLinear", axis=0, block_size=16),
        node("MatMul", ["X", "W"], ["Y"], "MatMul"),
    ]
    g = helper.make_graph(
        nodes, "dq21_int8_blocked", [vi("X", FLOAT16, [1, 32])], [vi("Y", FLOAT16, [1, 8])], inits
    )
    return make_model(g, {"": 21})


# ---- ai.onnx DequantizeLinear 23 / 24 / 25 / 28 ---------------------------------------


@spec(
    file="dq23_float4e2m1_output_dtype.onnx",
    holds="float4e2m1 weight blocked (axis 0, block 8) with float scale and "
    "output_dtype=float16 (scale type != output type); uint8 per-axis with float16 scale "
    "and output_dtype=float",
    domain="ai.onnx 23",
    types="float4e2m1, uint8 / float, float16",
    granularity="blocked, per-axis",
    ort="no",
    note="onnxruntime CPU has no float4e2m1 DequantizeLinear (with graph optimizations on, "
    "loading fails earlier: its MatMulNBits fusion mis-types the float4e2m1 weight)",
)
def dq23_float4(name):
    r = rng_for(name)
    w1 = (r.standard_normal((16, 8)) * 2).astype(np.float32).astype(ml_dtypes.float4_e2m1fn)
    inits = [
        T("W1_q", w1),
        T("W1_scale", f32(r.uniform(0.05, 0.2, (2, 8)))),
        T("W2_q", r.integers(0, 256, (8, 4)).astype(np.uint8)),
        T("W2_scale", r.uniform(0.001, 0.01, 4).astype(np.float16)),
        T("W2_zp", np.full(4, 128, np.uint8)),
    ]
    nodes = [
        dq(
            ["W1_q", "W1_scale"],
            "W1",
            "W1_DequantizeLinear",
            axis=0,
            block_size=8,
            output_dtype=FLOAT16,
        ),
        node("MatMul", ["X", "W1"], ["H16"], "MatMul_1"),
        node("Cast", ["H16"], ["H"], "Cast_to_float", to=FLOAT),
        dq(["W2_q", "W2_scale", "W2_zp"], "W2", "W2_DequantizeLinear", axis=1, output_dtype=FLOAT),
        node("MatMul", ["H", "W2"], ["Y"], "MatMul_2"),
    ]
    g = helper.make_graph(
        nodes, "dq23", [vi("X", FLOAT16, [1, 16])], [vi("Y", FLOAT, [1, 4])], inits
    )
    return make_model(g, {"": 23})


@spec(
    file="dq23_int4_output_dtype.onnx",
    holds="int4 weight blocked (axis 1, block 16) with float16 scale and output_dtype=float16 "
    "(same as scale); uint8 per-tensor without output_dtype",
    domain="ai.onnx 23",
    types="int4, uint8 / float16",
    granularity="blocked, per-tensor",
)
def dq23_int4(name):
    r = rng_for(name)
    inits = [
        T("W1_q", r.integers(-8, 8, (16, 32)).astype(ml_dtypes.int4)),
        T("W1_scale", r.uniform(0.01, 0.05, (16, 2)).astype(np.float16)),
        T("W2_q", r.integers(0, 256, (32, 4)).astype(np.uint8)),
        T("W2_scale", np.float16(0.004)),
        T("W2_zp", np.uint8(128)),
    ]
    nodes = [
        dq(
            ["W1_q", "W1_scale"],
            "W1",
            "W1_DequantizeLinear",
            axis=1,
            block_size=16,
            output_dtype=FLOAT16,
        ),
        node("MatMul", ["X", "W1"], ["H"], "MatMul_1"),
        dq(["W2_q", "W2_scale", "W2_zp"], "W2", "W2_DequantizeLinear"),
        node("MatMul", ["H", "W2"], ["Y"], "MatMul_2"),
    ]
    g = helper.make_graph(
        nodes, "dq23_int4", [vi("X", FLOAT16, [1, 16])], [vi("Y", FLOAT16, [1, 4])], inits
    )
    return make_model(g, {"": 23})


@spec(
    file="dq24_float8e8m0_scale.onnx",
    holds="MXFP4-style: float4e2m1 weight (64, 8) blocked (axis 0, block 32) with float8e8m0 "
    "scale and output_dtype=float; float8e4m3fn per-axis with float8e8m0 scale and "
    "output_dtype=float",
    domain="ai.onnx 24",
    types="float4e2m1, float8e4m3fn / float8e8m0 -> float",
    granularity="blocked, per-axis",
    ort="no",
    note="onnxruntime CPU has no float8e8m0-scale or float4e2m1 DequantizeLinear",
)
def dq24_e8m0(name):
    r = rng_for(name)
    w1 = (r.standard_normal((64, 8)) * 2).astype(np.float32).astype(ml_dtypes.float4_e2m1fn)
    w2 = (r.standard_normal((8, 4)) * 16).astype(np.float32).astype(ml_dtypes.float8_e4m3fn)
    s1 = (2.0 ** r.integers(-6, -2, (2, 8))).astype(np.float32).astype(ml_dtypes.float8_e8m0fnu)
    s2 = (2.0 ** r.integers(-8, -4, (4,))).astype(np.float32).astype(ml_dtypes.float8_e8m0fnu)
    inits = [T("W1_q", w1), T("W1_scale", s1), T("W2_q", w2), T("W2_scale", s2)]
    nodes = [
        dq(
            ["W1_q", "W1_scale"],
            "W1",
            "W1_DequantizeLinear",
            axis=0,
            block_size=32,
            output_dtype=FLOAT,
        ),
        node("MatMul", ["X", "W1"], ["H"], "MatMul_1"),
        dq(["W2_q", "W2_scale"], "W2", "W2_DequantizeLinear", axis=1, output_dtype=FLOAT),
        node("MatMul", ["H", "W2"], ["Y"], "MatMul_2"),
    ]
    g = helper.make_graph(nodes, "dq24", [vi("X", FLOAT, [1, 64])], [vi("Y", FLOAT, [1, 4])], inits)
    return make_model(g, {"": 24})


@spec(
    file="dq25_int2_blocked.onnx",
    holds="int2 weight (16, 4) blocked (axis 0, block 8) with int2 zero point; uint2 "
    "per-axis with uint2 zero point, float16 scale and output_dtype=float",
    domain="ai.onnx 25",
    types="int2, uint2 / float, float16",
    granularity="blocked, per-axis",
    ort="noopt",
    note="onnxruntime 1.31 runs int2 DequantizeLinear, but its DQ+MatMul -> MatMulNBits "
    "fusion mis-types the int2 blocked weight, so the model loads only with graph "
    "optimizations disabled",
)
def dq25_int2(name):
    r = rng_for(name)
    inits = [
        T("W1_q", r.integers(-2, 2, (16, 4)).astype(ml_dtypes.int2)),
        T("W1_scale", f32(r.uniform(0.1, 0.3, (2, 4)))),
        T("W1_zp", r.integers(-1, 1, (2, 4)).astype(ml_dtypes.int2)),
        T("W2_q", r.integers(0, 4, (4, 3)).astype(ml_dtypes.uint2)),
        T("W2_scale", np.array([0.25, 0.5, 0.125], np.float16)),
        T("W2_zp", np.array([1, 2, 1], ml_dtypes.uint2)),
    ]
    nodes = [
        dq(["W1_q", "W1_scale", "W1_zp"], "W1", "W1_DequantizeLinear", axis=0, block_size=8),
        node("MatMul", ["X", "W1"], ["H"], "MatMul_1"),
        dq(["W2_q", "W2_scale", "W2_zp"], "W2", "W2_DequantizeLinear", axis=1, output_dtype=FLOAT),
        node("MatMul", ["H", "W2"], ["Y"], "MatMul_2"),
    ]
    g = helper.make_graph(nodes, "dq25", [vi("X", FLOAT, [1, 16])], [vi("Y", FLOAT, [1, 3])], inits)
    return make_model(g, {"": 25})


@spec(
    file="dq28_float6e2m3.onnx",
    holds="float6e2m3 weight (16, 4) blocked (axis 0, block 8) with float scale; float6e3m2 "
    "per-axis with float16 scale and output_dtype=float",
    domain="ai.onnx 28",
    types="float6e2m3, float6e3m2 / float, float16",
    granularity="blocked, per-axis",
    ort="no",
    note="IR 14 / opset 28: onnxruntime 1.31 accepts IR <= 13 and has no opset 28",
)
def dq28_float6(name):
    r = rng_for(name)
    w1 = (r.standard_normal((16, 4)) * 2).astype(np.float32).astype(ml_dtypes.float6_e2m3fn)
    w2 = (r.standard_normal((4, 3)) * 4).astype(np.float32).astype(ml_dtypes.float6_e3m2fn)
    inits = [
        T("W1_q", w1),
        T("W1_scale", f32(r.uniform(0.05, 0.2, (2, 4)))),
        T("W2_q", w2),
        T("W2_scale", np.array([0.125, 0.25, 0.0625], np.float16)),
    ]
    nodes = [
        dq(["W1_q", "W1_scale"], "W1", "W1_DequantizeLinear", axis=0, block_size=8),
        node("MatMul", ["X", "W1"], ["H"], "MatMul_1"),
        dq(["W2_q", "W2_scale"], "W2", "W2_DequantizeLinear", axis=1, output_dtype=FLOAT),
        node("MatMul", ["H", "W2"], ["Y"], "MatMul_2"),
    ]
    g = helper.make_graph(nodes, "dq28", [vi("X", FLOAT, [1, 16])], [vi("Y", FLOAT, [1, 3])], inits)
    return make_model(g, {"": 28})


# ---- QDQ pairs --------------------------------------------------------------------------


@spec(
    file="qdq_conv_int8.onnx",
    holds="activation Q->DQ (int8) around a Conv whose weight is DQ int8 per-channel (axis 0) "
    "and bias DQ int32 per-channel; output Q->DQ",
    domain="ai.onnx 13",
    types="int8, int32 / float",
    granularity="per-tensor (activations), per-axis (weight, bias)",
)
def qdq_conv_int8(name):
    r = rng_for(name)
    x_scale, y_scale = 0.02, 0.05
    w = f32(r.standard_normal((4, 3, 3, 3)) * 0.2)
    ws = f32(np.abs(w).reshape(4, -1).max(axis=1) / 127)
    b = f32(r.standard_normal(4) * 0.1)
    bs = f32(ws * x_scale)
    inits = [
        T("X_scale", f32(x_scale)),
        T("X_zp", np.int8(0)),
        T("W_q", sym_quant(w, ws.reshape(4, 1, 1, 1), -127, 127, np.int8)),
        T("W_scale", ws),
        T("W_zp", np.zeros(4, np.int8)),
        T("B_q", np.rint(b / bs).astype(np.int32)),
        T("B_scale", bs),
        T("Y_scale", f32(y_scale)),
        T("Y_zp", np.int8(0)),
    ]
    nodes = [
        q(["X", "X_scale", "X_zp"], "X_q", "X_QuantizeLinear"),
        dq(["X_q", "X_scale", "X_zp"], "X_dq", "X_DequantizeLinear"),
        dq(["W_q", "W_scale", "W_zp"], "W", "W_DequantizeLinear", axis=0),
        dq(["B_q", "B_scale"], "B", "B_DequantizeLinear", axis=0),
        node("Conv", ["X_dq", "W", "B"], ["C"], "Conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        q(["C", "Y_scale", "Y_zp"], "C_q", "C_QuantizeLinear"),
        dq(["C_q", "Y_scale", "Y_zp"], "Y", "C_DequantizeLinear"),
    ]
    g = helper.make_graph(
        nodes, "qdq_conv", [vi("X", FLOAT, [1, 3, 8, 8])], [vi("Y", FLOAT, [1, 4, 8, 8])], inits
    )
    return make_model(g, {"": 13})


@spec(
    file="qdq_matmul_uint8.onnx",
    holds="activation Q->DQ (uint8, zero point 128) around a MatMul whose weight is DQ uint8 "
    "per-tensor; output Q->DQ",
    domain="ai.onnx 13",
    types="uint8 / float",
    granularity="per-tensor",
)
def qdq_matmul_uint8(name):
    r = rng_for(name)
    w = f32(r.standard_normal((16, 8)) * 0.2)
    ws = float(np.abs(w).max() / 127)
    inits = [
        T("X_scale", f32(0.01)),
        T("X_zp", np.uint8(128)),
        T("W_q", (sym_quant(w, ws, -127, 127, np.int32) + 128).astype(np.uint8)),
        T("W_scale", f32(ws)),
        T("W_zp", np.uint8(128)),
        T("Y_scale", f32(0.03)),
        T("Y_zp", np.uint8(128)),
    ]
    nodes = [
        q(["X", "X_scale", "X_zp"], "X_q", "X_QuantizeLinear"),
        dq(["X_q", "X_scale", "X_zp"], "X_dq", "X_DequantizeLinear"),
        dq(["W_q", "W_scale", "W_zp"], "W", "W_DequantizeLinear"),
        node("MatMul", ["X_dq", "W"], ["M"], "MatMul"),
        q(["M", "Y_scale", "Y_zp"], "M_q", "M_QuantizeLinear"),
        dq(["M_q", "Y_scale", "Y_zp"], "Y", "M_DequantizeLinear"),
    ]
    g = helper.make_graph(
        nodes, "qdq_matmul", [vi("X", FLOAT, [2, 16])], [vi("Y", FLOAT, [2, 8])], inits
    )
    return make_model(g, {"": 13})


@spec(
    file="qdq_weight_q_const.onnx",
    holds="weights stored as float and quantized in the graph: Q(const)->DQ int8 per-axis, "
    "Q(const, output_dtype=int4, block_size 4)->DQ int4 blocked, Q(const)->DQ float8e4m3fn "
    "(type from the zero point, saturate=1)",
    domain="ai.onnx 21",
    types="int8, int4, float8e4m3fn / float",
    granularity="per-axis, blocked, per-tensor",
)
def qdq_weight_q_const(name):
    r = rng_for(name)
    w1 = f32(r.standard_normal((16, 8)) * 0.2)
    w2 = f32(r.standard_normal((8, 6)) * 0.2)
    w3 = f32(r.standard_normal((6, 4)) * 0.2)
    s1 = f32(np.abs(w1).max(axis=0) / 127)
    s2 = f32(np.abs(w2).reshape(2, 4, 6).max(axis=1) / 7)
    inits = [
        T("W1", w1),
        T("W1_scale", s1),
        T("W1_zp", np.zeros(8, np.int8)),
        T("W2", w2),
        T("W2_scale", s2),
        T("W3", w3),
        T("W3_scale", f32(0.002)),
        T("W3_zp", np.zeros((), ml_dtypes.float8_e4m3fn)),
    ]
    nodes = [
        q(["W1", "W1_scale", "W1_zp"], "W1_q", "W1_QuantizeLinear", axis=1),
        dq(["W1_q", "W1_scale", "W1_zp"], "W1_dq", "W1_DequantizeLinear", axis=1),
        node("MatMul", ["X", "W1_dq"], ["H1"], "MatMul_1"),
        q(
            ["W2", "W2_scale"],
            "W2_q",
            "W2_QuantizeLinear",
            axis=0,
            block_size=4,
            output_dtype=TP.INT4,
        ),
        dq(["W2_q", "W2_scale"], "W2_dq", "W2_DequantizeLinear", axis=0, block_size=4),
        node("MatMul", ["H1", "W2_dq"], ["H2"], "MatMul_2"),
        q(["W3", "W3_scale", "W3_zp"], "W3_q", "W3_QuantizeLinear", saturate=1),
        dq(["W3_q", "W3_scale", "W3_zp"], "W3_dq", "W3_DequantizeLinear"),
        node("MatMul", ["H2", "W3_dq"], ["Y"], "MatMul_3"),
    ]
    g = helper.make_graph(
        nodes, "qdq_weights", [vi("X", FLOAT, [1, 16])], [vi("Y", FLOAT, [1, 4])], inits
    )
    return make_model(g, {"": 21})


# ---- com.microsoft ---------------------------------------------------------------------


@spec(
    file="ms_qdq_contrib.onnx",
    holds="com.microsoft QuantizeLinear/DequantizeLinear: uint16 activation Q->DQ, int16 "
    "weight per-axis, int8 activation Q->DQ, int4 weight per-axis with int4 zero point, "
    "uint4 weight per-tensor; the ai.onnx opset is 17",
    domain="com.microsoft 1 (ai.onnx 17)",
    types="uint16, int16, int8, int4, uint4 / float",
    granularity="per-tensor, per-axis",
)
def ms_qdq_contrib(name):
    r = rng_for(name)
    ms = "com.microsoft"
    inits = [
        T("X_scale", f32(1.5e-4)),
        T("X_zp", np.uint16(32768)),
        T("W1_q", r.integers(-32767, 32768, (16, 8)).astype(np.int16)),
        T("W1_scale", f32(r.uniform(1e-5, 3e-5, 8))),
        T("W1_zp", np.zeros(8, np.int16)),
        T("H_scale", f32(0.02)),
        T("H_zp", np.int8(0)),
        T("W2_q", r.integers(-8, 8, (8, 6)).astype(ml_dtypes.int4)),
        T("W2_scale", f32(r.uniform(0.02, 0.06, 6))),
        T("W2_zp", np.array([0, 1, -1, 0, 0, 2], ml_dtypes.int4)),
        T("W3_q", r.integers(0, 16, (6, 4)).astype(ml_dtypes.uint4)),
        T("W3_scale", f32(0.03)),
        T("W3_zp", np.array(8, ml_dtypes.uint4)),
    ]
    nodes = [
        q(["X", "X_scale", "X_zp"], "X_q", "X_QuantizeLinear", ms),
        dq(["X_q", "X_scale", "X_zp"], "X_dq", "X_DequantizeLinear", ms),
        dq(["W1_q", "W1_scale", "W1_zp"], "W1", "W1_DequantizeLinear", ms, axis=1),
        node("MatMul", ["X_dq", "W1"], ["H"], "MatMul_1"),
        q(["H", "H_scale", "H_zp"], "H_q", "H_QuantizeLinear", ms),
        dq(["H_q", "H_scale", "H_zp"], "H_dq", "H_DequantizeLinear", ms),
        dq(["W2_q", "W2_scale", "W2_zp"], "W2", "W2_DequantizeLinear", ms, axis=1),
        node("MatMul", ["H_dq", "W2"], ["H2"], "MatMul_2"),
        dq(["W3_q", "W3_scale", "W3_zp"], "W3", "W3_DequantizeLinear", ms),
        node("MatMul", ["H2", "W3"], ["Y"], "MatMul_3"),
    ]
    g = helper.make_graph(
        nodes, "ms_qdq", [vi("X", FLOAT, [1, 16])], [vi("Y", FLOAT, [1, 4])], inits
    )
    return make_model(g, {"": 17, ms: 1})


# ---- OpenPPL opmx / pmx ----------------------------------------------------------------


def opmx_pack_int4(nibbles: np.ndarray) -> np.ndarray:
    """(N, K) unsigned nibbles -> (N/4, K) int16, four nibbles per int16 along dim 0:
    packed[r, c] = sum_j (q[4r+j, c] & 0xF) << 4j."""
    n, k = nibbles.shape
    assert n % 4 == 0
    u = (nibbles.astype(np.uint16) & 0xF).reshape(n // 4, 4, k)
    packed = u[:, 0] | (u[:, 1] << 4) | (u[:, 2] << 8) | (u[:, 3] << 12)
    return packed.astype(np.uint16).view(np.int16)


def _opmx_model(name, domain, *, nibbles, scale, zp, attrs, x_type, doc):
    """X (1, K) @ DQ(W)^T, the weight W (N, K) as OpenPPL stores a Linear weight."""
    n, k = scale.shape[0], nibbles.shape[1]
    inits = [T("W_q", nibbles), T("W_scale", scale)]
    ins = ["W_q", "W_scale"]
    if zp is not None:
        inits.append(T("W_zp", zp))
        ins.append("W_zp")
    nodes = [
        dq(ins, "W", "W_DequantizeLinear", domain, **attrs),
        node("Transpose", ["W"], ["W_t"], "Transpose", perm=[1, 0]),
        node("MatMul", ["X", "W_t"], ["Y"], "MatMul"),
    ]
    g = helper.make_graph(
        nodes,
        name.removesuffix(".onnx"),
        [vi("X", x_type, [1, k])],
        [vi("Y", x_type, [1, n])],
        inits,
    )
    return make_model(g, {"": 13, domain: 1}, doc=doc)


def _opmx_attrs(qtype, group_size, has_zp, float_zp):
    return dict(
        quant_data_type=qtype,
        quant_method="",
        quant_axis=1,
        group_size=group_size,
        has_zeropoint=int(has_zp),
        float_zeropoint=int(float_zp),
    )


_OPMX_NOTE = "onnxruntime has no opmx/pmx domain"


@spec(
    file="opmx_int4_packed.onnx",
    holds="opmx int4 weight (N=8, K=32) packed four nibbles per int16 along dim 0 -> (2, 32); "
    "group_size 16 along K (quant_axis=1), float16 scale (8, 2), no zero point (value = "
    "(nibble - 8) * scale)",
    domain="opmx 1 (ai.onnx 13)",
    types="int4 packed in int16 / float16",
    granularity="grouped (group 16, axis 1)",
    ort="no",
    note=_OPMX_NOTE,
)
def opmx_int4_packed(name):
    r = rng_for(name)
    nib = r.integers(0, 16, (8, 32))
    return _opmx_model(
        name,
        "opmx",
        nibbles=opmx_pack_int4(nib),
        scale=r.uniform(0.01, 0.05, (8, 2)).astype(np.float16),
        zp=None,
        attrs=_opmx_attrs("int4", 16, False, False),
        x_type=FLOAT16,
        doc="OpenPPL OPMX DequantizeLinear, int4 packed four per int16 along dim 0",
    )


@spec(
    file="opmx_int4_zp.onnx",
    holds="opmx int4 weight (8, 32) packed in int16 (2, 32), group 16, float16 scale (8, 2) "
    "and integer zero point int8 (8, 2) with values 0-15 (has_zeropoint=1)",
    domain="opmx 1 (ai.onnx 13)",
    types="int4 packed in int16, zp int8 / float16",
    granularity="grouped (group 16, axis 1)",
    ort="no",
    note=_OPMX_NOTE,
)
def opmx_int4_zp(name):
    r = rng_for(name)
    nib = r.integers(0, 16, (8, 32))
    return _opmx_model(
        name,
        "opmx",
        nibbles=opmx_pack_int4(nib),
        scale=r.uniform(0.01, 0.05, (8, 2)).astype(np.float16),
        zp=r.integers(0, 16, (8, 2)).astype(np.int8),
        attrs=_opmx_attrs("int4", 16, True, False),
        x_type=FLOAT16,
        doc="OpenPPL OPMX DequantizeLinear, int4 with integer zero point",
    )


@spec(
    file="opmx_int4_float_zp.onnx",
    holds="opmx int4 weight (8, 32) packed in int16, group 16, float scale (8, 2) and float "
    "zero point (8, 2) used as a bias (has_zeropoint=1, float_zeropoint=1)",
    domain="opmx 1 (ai.onnx 13)",
    types="int4 packed in int16, zp float / float",
    granularity="grouped (group 16, axis 1)",
    ort="no",
    note=_OPMX_NOTE,
)
def opmx_int4_float_zp(name):
    r = rng_for(name)
    nib = r.integers(0, 16, (8, 32))
    return _opmx_model(
        name,
        "opmx",
        nibbles=opmx_pack_int4(nib),
        scale=f32(r.uniform(0.01, 0.05, (8, 2))),
        zp=f32(r.uniform(-0.1, 0.1, (8, 2))),
        attrs=_opmx_attrs("int4", 16, True, True),
        x_type=FLOAT,
        doc="OpenPPL OPMX DequantizeLinear, int4 with float zero point (y = scale*q + zp)",
    )


@spec(
    file="opmx_int8.onnx",
    holds="opmx int8 weight (8, 32), per-channel (group_size 0) float16 scale (8, 1), no zero "
    "point",
    domain="opmx 1 (ai.onnx 13)",
    types="int8 / float16",
    granularity="per-channel (scale (N, 1))",
    ort="no",
    note=_OPMX_NOTE,
)
def opmx_int8(name):
    r = rng_for(name)
    w = r.integers(-127, 128, (8, 32)).astype(np.int8)
    return _opmx_model(
        name,
        "opmx",
        nibbles=w,
        scale=r.uniform(0.001, 0.004, (8, 1)).astype(np.float16),
        zp=None,
        attrs=_opmx_attrs("int8", 0, False, False),
        x_type=FLOAT16,
        doc="OpenPPL OPMX DequantizeLinear, int8 per output channel",
    )


@spec(
    file="pmx_int4_legacy.onnx",
    holds='older domain "pmx": int4 weight (8, 64) packed in int16 (2, 64), group 32, float '
    "scale (8, 2), no zero point",
    domain="pmx 1 (ai.onnx 13)",
    types="int4 packed in int16 / float",
    granularity="grouped (group 32, axis 1)",
    ort="no",
    note=_OPMX_NOTE,
)
def pmx_int4_legacy(name):
    r = rng_for(name)
    nib = r.integers(0, 16, (8, 64))
    return _opmx_model(
        name,
        "pmx",
        nibbles=opmx_pack_int4(nib),
        scale=f32(r.uniform(0.01, 0.05, (8, 2))),
        zp=None,
        attrs=_opmx_attrs("int4", 32, False, False),
        x_type=FLOAT,
        doc="OpenPPL PMX (older domain) DequantizeLinear, int4 packed",
    )


# ---- subgraphs and functions -----------------------------------------------------------


@spec(
    file="dq_in_if_subgraph.onnx",
    holds="If: then-branch DQs a branch-local int8 per-axis initializer, else-branch DQs an "
    "outer-scope uint4 blocked initializer; the result feeds a MatMul in the main graph",
    domain="ai.onnx 21",
    types="int8, uint4 / float",
    granularity="per-axis, blocked",
)
def dq_in_if(name):
    r = rng_for(name)
    then_inits = [
        T("Wt_q", r.integers(-127, 128, (8, 4)).astype(np.int8)),
        T("Wt_scale", f32(r.uniform(0.005, 0.02, 4))),
        T("Wt_zp", np.zeros(4, np.int8)),
    ]
    then_g = helper.make_graph(
        [dq(["Wt_q", "Wt_scale", "Wt_zp"], "W_then", "then/W_DequantizeLinear", axis=1)],
        "then_branch",
        [],
        [vi("W_then", FLOAT, [8, 4])],
        then_inits,
    )
    else_g = helper.make_graph(
        [
            dq(
                ["We_q", "We_scale", "We_zp"],
                "W_else",
                "else/W_DequantizeLinear",
                axis=0,
                block_size=4,
            )
        ],
        "else_branch",
        [],
        [vi("W_else", FLOAT, [8, 4])],
    )
    inits = [
        T("We_q", r.integers(0, 16, (8, 4)).astype(ml_dtypes.uint4)),
        T("We_scale", f32(r.uniform(0.01, 0.05, (2, 4)))),
        T("We_zp", np.full((2, 4), 8, ml_dtypes.uint4)),
    ]
    nodes = [
        node("If", ["cond"], ["W"], "If", then_branch=then_g, else_branch=else_g),
        node("MatMul", ["X", "W"], ["Y"], "MatMul"),
    ]
    g = helper.make_graph(
        nodes,
        "dq_in_if",
        [vi("X", FLOAT, [1, 8]), vi("cond", TP.BOOL, [])],
        [vi("Y", FLOAT, [1, 4])],
        inits,
    )
    return make_model(g, {"": 21})


@spec(
    file="dq_in_function.onnx",
    holds=f"model-local function {LOCAL_DOMAIN}.QMatMul (its own opset import ai.onnx 21) "
    "holding a DQ (axis=1) + MatMul, called twice: int8 per-axis and uint8 per-tensor "
    "weights",
    domain=f"ai.onnx 21 (+ {LOCAL_DOMAIN} 1)",
    types="int8, uint8 / float",
    granularity="per-axis, per-tensor (decided at each call)",
)
def dq_in_function(name):
    r = rng_for(name)
    fn = helper.make_function(
        LOCAL_DOMAIN,
        "QMatMul",
        ["X", "W_q", "W_scale", "W_zp"],
        ["Y"],
        [
            dq(["W_q", "W_scale", "W_zp"], "W", "W_DequantizeLinear", axis=1),
            node("MatMul", ["X", "W"], ["Y"], "MatMul"),
        ],
        opset_imports=[helper.make_opsetid("", 21)],
        doc_string="y = x @ DequantizeLinear(w_q, w_scale, w_zp)",
    )
    inits = [
        T("W1_q", r.integers(-127, 128, (8, 6)).astype(np.int8)),
        T("W1_scale", f32(r.uniform(0.005, 0.02, 6))),
        T("W1_zp", np.zeros(6, np.int8)),
        T("W2_q", r.integers(0, 256, (6, 4)).astype(np.uint8)),
        T("W2_scale", f32(0.01)),
        T("W2_zp", np.uint8(128)),
    ]
    nodes = [
        node("QMatMul", ["X", "W1_q", "W1_scale", "W1_zp"], ["H"], "layer1", LOCAL_DOMAIN),
        node("Relu", ["H"], ["Hr"], "Relu"),
        node("QMatMul", ["Hr", "W2_q", "W2_scale", "W2_zp"], ["Y"], "layer2", LOCAL_DOMAIN),
    ]
    g = helper.make_graph(
        nodes, "dq_in_function", [vi("X", FLOAT, [1, 8])], [vi("Y", FLOAT, [1, 4])], inits
    )
    return make_model(g, {"": 21, LOCAL_DOMAIN: 1}, functions=[fn])


@spec(
    file="dq_in_loop_body.onnx",
    holds="Loop (2 iterations) whose body DQs an outer-scope int8 per-axis weight and a "
    "body-local uint4 blocked weight, carrying H = relu(H @ W1 @ W2)",
    domain="ai.onnx 21",
    types="int8, uint4 / float",
    granularity="per-axis, blocked",
    ort="noopt",
    note="onnxruntime 1.31's DQ+MatMul -> MatMulNBits fusion fails on the outer-scope weight "
    "(TransposeDQWeightsForMatMulNBits: Missing required weight W1_q); loads with graph "
    "optimizations disabled",
)
def dq_in_loop(name):
    r = rng_for(name)
    body_inits = [
        T("W2_q", r.integers(0, 16, (8, 8)).astype(ml_dtypes.uint4)),
        T("W2_scale", f32(r.uniform(0.01, 0.04, (8, 2)))),
        T("W2_zp", np.full((8, 2), 8, ml_dtypes.uint4)),
    ]
    body = helper.make_graph(
        [
            dq(["W1_q", "W1_scale"], "W1", "body/W1_DequantizeLinear", axis=1),
            node("MatMul", ["H_in", "W1"], ["H1"], "body/MatMul_1"),
            dq(
                ["W2_q", "W2_scale", "W2_zp"],
                "W2",
                "body/W2_DequantizeLinear",
                axis=1,
                block_size=4,
            ),
            node("MatMul", ["H1", "W2"], ["H2"], "body/MatMul_2"),
            node("Relu", ["H2"], ["H_out"], "body/Relu"),
            node("Identity", ["cond_in"], ["cond_out"], "body/cond"),
        ],
        "loop_body",
        [vi("iter", TP.INT64, []), vi("cond_in", TP.BOOL, []), vi("H_in", FLOAT, [1, 8])],
        [vi("cond_out", TP.BOOL, []), vi("H_out", FLOAT, [1, 8])],
        body_inits,
    )
    inits = [
        T("W1_q", r.integers(-127, 128, (8, 8)).astype(np.int8)),
        T("W1_scale", f32(r.uniform(0.005, 0.02, 8))),
        T("trip_count", np.int64(2)),
        T("cond", np.bool_(True)),
    ]
    nodes = [node("Loop", ["trip_count", "cond", "X"], ["Y"], "Loop", body=body)]
    g = helper.make_graph(
        nodes, "dq_in_loop", [vi("X", FLOAT, [1, 8])], [vi("Y", FLOAT, [1, 8])], inits
    )
    return make_model(g, {"": 21})


@spec(
    file="dq21_constant_nodes.onnx",
    holds="weight, scale and zero point given by Constant nodes (as torch.onnx exports them) "
    "for an int8 per-axis DQ; a uint8 per-tensor DQ whose scale is a graph input (not "
    "constant)",
    domain="ai.onnx 21",
    types="int8, uint8 / float",
    granularity="per-axis, per-tensor",
)
def dq21_constant_nodes(name):
    r = rng_for(name)

    def const(out, arr):
        return node("Constant", [], [out], out + "_Constant", value=T(out, arr))

    inits = [
        T("W2_q", r.integers(0, 256, (6, 4)).astype(np.uint8)),
        T("W2_zp", np.uint8(128)),
    ]
    nodes = [
        const("W1_q", r.integers(-127, 128, (8, 6)).astype(np.int8)),
        const("W1_scale", f32(r.uniform(0.005, 0.02, 6))),
        const("W1_zp", np.zeros(6, np.int8)),
        dq(["W1_q", "W1_scale", "W1_zp"], "W1", "W1_DequantizeLinear", axis=1),
        node("MatMul", ["X", "W1"], ["H"], "MatMul_1"),
        dq(["W2_q", "w2_scale", "W2_zp"], "W2", "W2_DequantizeLinear"),
        node("MatMul", ["H", "W2"], ["Y"], "MatMul_2"),
    ]
    g = helper.make_graph(
        nodes,
        "dq21_constants",
        [vi("X", FLOAT, [1, 8]), vi("w2_scale", FLOAT, [])],
        [vi("Y", FLOAT, [1, 4])],
        inits,
    )
    return make_model(g, {"": 21})


# ---- external data ---------------------------------------------------------------------

EXTERNAL_DATA_FILE = "model.onnx.data"
EXTERNAL_THRESHOLD = 256  # bytes; tensors at least this big go to the data file
EXTERNAL_ALIGN = 64


def to_external(model: onnx.ModelProto, location: str) -> bytes:
    """Move the large initializers' bytes out of the model; returns the data file's bytes.
    Offsets are aligned to EXTERNAL_ALIGN; `location` is relative to the model's folder."""
    blob = bytearray()
    for t in model.graph.initializer:
        raw = numpy_helper.from_array(numpy_helper.to_array(t), t.name).raw_data
        if len(raw) < EXTERNAL_THRESHOLD:
            continue
        blob.extend(b"\0" * (-len(blob) % EXTERNAL_ALIGN))
        offset = len(blob)
        blob.extend(raw)
        for field in ("raw_data", "int32_data", "float_data", "int64_data"):
            t.ClearField(field)
        t.data_location = TP.EXTERNAL
        del t.external_data[:]
        for k, v in (("location", location), ("offset", str(offset)), ("length", str(len(raw)))):
            t.external_data.add(key=k, value=v)
    return bytes(blob)


@spec(
    file="external_data/model.onnx",
    holds=f"int8 per-axis (64, 32) and int4 blocked (32, 16) weights whose bytes live in "
    f"external_data/{EXTERNAL_DATA_FILE} (relative location, 64-byte aligned offsets); "
    "scales and zero points stay inline",
    domain="ai.onnx 21",
    types="int8, int4 / float",
    granularity="per-axis, blocked",
)
def external_data_model(name):
    r = rng_for(name)
    inits = [
        T("W1_q", r.integers(-127, 128, (64, 32)).astype(np.int8)),
        T("W1_scale", f32(r.uniform(0.002, 0.01, 32))),
        T("W1_zp", np.zeros(32, np.int8)),
        T("W2_q", r.integers(-8, 8, (32, 16)).astype(ml_dtypes.int4)),
        T("W2_scale", f32(r.uniform(0.01, 0.05, (2, 16)))),
    ]
    nodes = [
        dq(["W1_q", "W1_scale", "W1_zp"], "W1", "W1_DequantizeLinear", axis=1),
        node("MatMul", ["X", "W1"], ["H"], "MatMul_1"),
        node("Relu", ["H"], ["Hr"], "Relu"),
        dq(["W2_q", "W2_scale"], "W2", "W2_DequantizeLinear", axis=0, block_size=16),
        node("MatMul", ["Hr", "W2"], ["Y"], "MatMul_2"),
    ]
    g = helper.make_graph(
        nodes, "external_data", [vi("X", FLOAT, [1, 64])], [vi("Y", FLOAT, [1, 16])], inits
    )
    return make_model(g, {"": 21})


# ---- intentionally invalid -------------------------------------------------------------


@spec(
    file="invalid_ort_axis_opset11.onnx",
    holds="as onnxruntime's old quantizer wrote: Conv weight DQ int8 per-channel with an axis=0 "
    "attribute and a 1-D scale at opset 11 (DequantizeLinear-10 has no axis and takes a "
    "scalar scale only)",
    domain="ai.onnx 11",
    types="int8 (weight), uint8 (activation) / float",
    granularity="per-axis (not allowed at 10)",
    valid=False,
    note="axis attribute unknown at DequantizeLinear-10; scale must be a scalar",
)
def invalid_ort_axis_opset11(name):
    r = rng_for(name)
    w = f32(r.standard_normal((4, 3, 3, 3)) * 0.2)
    ws = f32(np.abs(w).reshape(4, -1).max(axis=1) / 127)
    inits = [
        T("X_scale", f32(0.02)),
        T("X_zp", np.uint8(128)),
        T("W_q", sym_quant(w, ws.reshape(4, 1, 1, 1), -127, 127, np.int8)),
        T("W_scale", ws),
        T("W_zp", np.zeros(4, np.int8)),
    ]
    nodes = [
        q(["X", "X_scale", "X_zp"], "X_q", "X_QuantizeLinear"),
        dq(["X_q", "X_scale", "X_zp"], "X_dq", "X_DequantizeLinear"),
        dq(["W_q", "W_scale", "W_zp"], "W", "W_DequantizeLinear", axis=0),
        node("Conv", ["X_dq", "W"], ["Y"], "Conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
    ]
    g = helper.make_graph(
        nodes,
        "ort_axis_opset11",
        [vi("X", FLOAT, [1, 3, 8, 8])],
        [vi("Y", FLOAT, [1, 4, 8, 8])],
        inits,
    )
    return make_model(g, {"": 11})


@spec(
    file="invalid_nncf_uint4_opset17.onnx",
    holds="as nncf writes int4 weight compression into an opset-17 model: uint4 weight "
    "per-axis with uint4 zero point, DequantizeLinear-13 (uint4 needs version 21); IR 10 "
    "for the uint4 tensors",
    domain="ai.onnx 17",
    types="uint4 / float",
    granularity="per-axis",
    valid=False,
    note="uint4 is not a DequantizeLinear-13 type",
)
def invalid_nncf_uint4_opset17(name):
    r = rng_for(name)
    inits = [
        T("W_q", r.integers(0, 16, (32, 8)).astype(ml_dtypes.uint4)),
        T("W_scale", f32(r.uniform(0.01, 0.05, 8))),
        T("W_zp", np.full(8, 8, ml_dtypes.uint4)),
    ]
    nodes = [
        dq(["W_q", "W_scale", "W_zp"], "W", "W_DequantizeLinear", axis=1),
        node("MatMul", ["X", "W"], ["Y"], "MatMul"),
    ]
    g = helper.make_graph(
        nodes, "nncf_uint4", [vi("X", FLOAT, [1, 32])], [vi("Y", FLOAT, [1, 8])], inits
    )
    return make_model(g, {"": 17})


@spec(
    file="invalid_dq21_block_scale_shape.onnx",
    holds="int4 (10, 4) blocked on axis 0 with block_size 4 but scale/zero point (2, 4): "
    "ceil(10/4) = 3 blocks are needed",
    domain="ai.onnx 21",
    types="int4 / float",
    granularity="blocked (wrong scale shape)",
    valid=False,
    note="scale shape does not match block_size (onnx's checker does not notice)",
)
def invalid_dq21_block_scale_shape(name):
    r = rng_for(name)
    inits = [
        T("W_q", r.integers(-8, 8, (10, 4)).astype(ml_dtypes.int4)),
        T("W_scale", f32(r.uniform(0.01, 0.05, (2, 4)))),
        T("W_zp", np.zeros((2, 4), ml_dtypes.int4)),
    ]
    nodes = [
        dq(["W_q", "W_scale", "W_zp"], "W", "W_DequantizeLinear", axis=0, block_size=4),
        node("MatMul", ["X", "W"], ["Y"], "MatMul"),
    ]
    g = helper.make_graph(
        nodes, "bad_block", [vi("X", FLOAT, [1, 10])], [vi("Y", FLOAT, [1, 4])], inits
    )
    return make_model(g, {"": 21})


@spec(
    file="invalid_dq19_float8_nonzero_zp.onnx",
    holds="float8e4m3fn weight per-tensor with a non-zero float8 zero point (1.0)",
    domain="ai.onnx 19",
    types="float8e4m3fn / float",
    granularity="per-tensor",
    valid=False,
    note="float8 zero point must be 0 (runtimes reject it; onnx's checker does not notice)",
)
def invalid_dq19_float8_nonzero_zp(name):
    r = rng_for(name)
    inits = [
        T("W_q", _f8(r, (8, 4), ml_dtypes.float8_e4m3fn, 0.05)),
        T("W_scale", f32(0.05)),
        T("W_zp", np.array(1.0, ml_dtypes.float8_e4m3fn)),
    ]
    nodes = [
        dq(["W_q", "W_scale", "W_zp"], "W", "W_DequantizeLinear"),
        node("MatMul", ["X", "W"], ["Y"], "MatMul"),
    ]
    g = helper.make_graph(
        nodes, "bad_f8_zp", [vi("X", FLOAT, [1, 8])], [vi("Y", FLOAT, [1, 4])], inits
    )
    return make_model(g, {"": 19})


@spec(
    file="invalid_dq13_axis_out_of_range.onnx",
    holds="int8 (8, 4) per-axis with axis=2 on a rank-2 tensor",
    domain="ai.onnx 13",
    types="int8 / float",
    granularity="per-axis (axis out of range)",
    valid=False,
    note="axis must be in [-2, 1]",
)
def invalid_dq13_axis_out_of_range(name):
    r = rng_for(name)
    inits = [
        T("W_q", r.integers(-127, 128, (8, 4)).astype(np.int8)),
        T("W_scale", f32(r.uniform(0.005, 0.02, 4))),
    ]
    nodes = [
        dq(["W_q", "W_scale"], "W", "W_DequantizeLinear", axis=2),
        node("MatMul", ["X", "W"], ["Y"], "MatMul"),
    ]
    g = helper.make_graph(
        nodes, "bad_axis", [vi("X", FLOAT, [1, 8])], [vi("Y", FLOAT, [1, 4])], inits
    )
    return make_model(g, {"": 13})


# ---- real models from onnxruntime.quantization -----------------------------------------


def float_convnet(opset: int = 13) -> onnx.ModelProto:
    r = rng_for("float_convnet")
    inits = [
        T("conv1.weight", f32(r.standard_normal((8, 3, 3, 3)) * 0.3)),
        T("conv1.bias", f32(r.standard_normal(8) * 0.1)),
        T("conv2.weight", f32(r.standard_normal((8, 8, 3, 3)) * 0.15)),
        T("conv2.bias", f32(r.standard_normal(8) * 0.1)),
        T("fc.weight", f32(r.standard_normal((10, 8)) * 0.3)),
        T("fc.bias", f32(r.standard_normal(10) * 0.1)),
    ]
    nodes = [
        node(
            "Conv",
            ["input", "conv1.weight", "conv1.bias"],
            ["c1"],
            "conv1",
            kernel_shape=[3, 3],
            pads=[1, 1, 1, 1],
        ),
        node("Relu", ["c1"], ["r1"], "relu1"),
        node(
            "Conv",
            ["r1", "conv2.weight", "conv2.bias"],
            ["c2"],
            "conv2",
            kernel_shape=[3, 3],
            pads=[1, 1, 1, 1],
            strides=[2, 2],
        ),
        node("Relu", ["c2"], ["r2"], "relu2"),
        node("GlobalAveragePool", ["r2"], ["gap"], "gap"),
        node("Flatten", ["gap"], ["flat"], "flatten"),
        node("Gemm", ["flat", "fc.weight", "fc.bias"], ["logits"], "fc", transB=1),
    ]
    g = helper.make_graph(
        nodes,
        "convnet",
        [vi("input", FLOAT, [1, 3, 16, 16])],
        [vi("logits", FLOAT, [1, 10])],
        inits,
    )
    return make_model(g, {"": opset})


def float_mlp(opset: int = 13, k: int = 64) -> onnx.ModelProto:
    r = rng_for(f"float_mlp_{k}")
    inits = [
        T("fc1.weight", f32(r.standard_normal((k, 32)) / np.sqrt(k))),
        T("fc1.bias", f32(r.standard_normal(32) * 0.1)),
        T("fc2.weight", f32(r.standard_normal((32, 16)) / np.sqrt(32))),
        T("fc2.bias", f32(r.standard_normal(16) * 0.1)),
    ]
    nodes = [
        node("MatMul", ["input", "fc1.weight"], ["m1"], "fc1/MatMul"),
        node("Add", ["m1", "fc1.bias"], ["a1"], "fc1/Add"),
        node("Relu", ["a1"], ["r1"], "relu"),
        node("MatMul", ["r1", "fc2.weight"], ["m2"], "fc2/MatMul"),
        node("Add", ["m2", "fc2.bias"], ["output"], "fc2/Add"),
    ]
    g = helper.make_graph(
        nodes, "mlp", [vi("input", FLOAT, [1, k])], [vi("output", FLOAT, [1, 16])], inits
    )
    return make_model(g, {"": opset})


@contextlib.contextmanager
def _quiet():
    """onnxruntime's quantizer logs advice ("consider pre-processing") and progress."""
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


def _reader(model: onnx.ModelProto, seed: int, n: int = 8):
    from onnxruntime.quantization import CalibrationDataReader

    inp = model.graph.input[0]
    shape = [d.dim_value for d in inp.type.tensor_type.shape.dim]

    class Reader(CalibrationDataReader):
        def __init__(self):
            r = np.random.default_rng(seed)
            self.data = iter([{inp.name: f32(r.standard_normal(shape))} for _ in range(n)])

        def get_next(self):
            return next(self.data, None)

    return Reader()


def _quantize_static(float_model: onnx.ModelProto, seed: int, **kw) -> onnx.ModelProto:
    from onnxruntime.quantization import quantize_static

    with tempfile.TemporaryDirectory(prefix="dqtool-models-") as tmp:
        src, dst = os.path.join(tmp, "float.onnx"), os.path.join(tmp, "quant.onnx")
        onnx.save(float_model, src)
        cwd = os.getcwd()
        os.chdir(tmp)  # the calibrator writes its augmented model next to cwd on some paths
        try:
            with _quiet():
                quantize_static(src, dst, _reader(float_model, seed), **kw)
        finally:
            os.chdir(cwd)
        return onnx.load(dst)


@spec(
    file="ort_qdq_per_channel.onnx",
    holds="small conv net (2 Conv, Gemm) quantized by onnxruntime.quantization.quantize_static: "
    "QDQ, per_channel=True, activations uint8, weights int8, MinMax on 8 seeded samples",
    domain="ai.onnx 13",
    types="uint8, int8, int32 / float",
    granularity="per-tensor (activations), per-axis (weights, biases)",
)
def ort_qdq_per_channel(name):
    from onnxruntime.quantization import QuantFormat, QuantType

    m = _quantize_static(
        float_convnet(13),
        1,
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
    )
    return normalize(
        m,
        "onnxruntime.quantization.quantize_static(QDQ, per_channel=True, "
        "activation=QUInt8, weight=QInt8) of a float conv net",
    )


@spec(
    file="ort_qdq_per_tensor.onnx",
    holds="the same conv net quantized by quantize_static with its defaults (QDQ, "
    "per-tensor): its int32 bias DQs have a (1,) scale beside a scalar zero point, which "
    "onnx and every runtime accept as per-tensor",
    domain="ai.onnx 13",
    types="uint8, int8, int32 / float",
    granularity="per-tensor",
)
def ort_qdq_per_tensor(name):
    from onnxruntime.quantization import QuantFormat

    m = _quantize_static(float_convnet(13), 1, quant_format=QuantFormat.QDQ)
    return normalize(
        m, "onnxruntime.quantization.quantize_static(QDQ) with default options of a float "
        "conv net")


@spec(
    file="ort_qdq_contrib.onnx",
    holds="small MLP (MatMul + Add) quantized by quantize_static with UseQDQContribOps: "
    "com.microsoft Q/DQ, per_channel=True, activations uint8, weights int8 per-axis; the Add "
    "biases are quantized like activations (uint8 per-tensor, not int32)",
    domain="com.microsoft 1 (ai.onnx 13)",
    types="uint8, int8 / float",
    granularity="per-tensor, per-axis",
)
def ort_qdq_contrib(name):
    from onnxruntime.quantization import QuantFormat, QuantType

    m = _quantize_static(
        float_mlp(13),
        2,
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        extra_options={"UseQDQContribOps": True},
    )
    return normalize(
        m,
        "onnxruntime.quantization.quantize_static(QDQ, per_channel=True, "
        "UseQDQContribOps=True) of a float MLP",
    )


@spec(
    file="ort_qdq_int16.onnx",
    holds="small MLP (MatMul + Add) quantized by quantize_static: QDQ, activations int16, "
    "weights int8 per-tensor, at opset 21 (ai.onnx int16 Q/DQ, no contrib ops needed); the "
    "Add biases are int16 per-tensor",
    domain="ai.onnx 21",
    types="int16, int8 / float",
    granularity="per-tensor",
)
def ort_qdq_int16(name):
    from onnxruntime.quantization import QuantFormat, QuantType

    m = _quantize_static(
        float_mlp(21),
        3,
        quant_format=QuantFormat.QDQ,
        per_channel=False,
        activation_type=QuantType.QInt16,
        weight_type=QuantType.QInt8,
    )
    return normalize(
        m,
        "onnxruntime.quantization.quantize_static(QDQ, activation=QInt16, "
        "weight=QInt8) of a float MLP",
    )


def _matmul_nbits_qdq(k: int, symmetric: bool) -> onnx.ModelProto:
    from onnxruntime.quantization import QuantFormat
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig,
        MatMulNBitsQuantizer,
    )

    cfg = DefaultWeightOnlyQuantConfig(
        block_size=32, is_symmetric=symmetric, quant_format=QuantFormat.QDQ
    )
    qz = MatMulNBitsQuantizer(
        float_mlp(21, k),
        block_size=32,
        is_symmetric=symmetric,
        quant_format=QuantFormat.QDQ,
        algo_config=cfg,
    )
    with _quiet():
        qz.process()
    return qz.model.model


@spec(
    file="ort_int4_blocked_qdq.onnx",
    holds="MLP (K=64) weights quantized by onnxruntime's MatMulNBitsQuantizer in QDQ mode, "
    "symmetric: int4 weights blocked along K (axis 0, block_size 32), no zero point -> MatMul "
    "(fc2 has K=32: a single block, scale (1, 16))",
    domain="ai.onnx 21",
    types="int4 / float",
    granularity="blocked",
)
def ort_int4_blocked_qdq(name):
    m = _matmul_nbits_qdq(64, symmetric=True)
    return normalize(
        m,
        "onnxruntime.quantization.matmul_nbits_quantizer.MatMulNBitsQuantizer"
        "(block_size=32, is_symmetric=True, quant_format=QDQ) of a float MLP",
    )


@spec(
    file="ort_uint4_blocked_ragged_qdq.onnx",
    holds="MLP (K=80) weights quantized by MatMulNBitsQuantizer in QDQ mode, asymmetric (the "
    "default): uint4 weights (80, 32) blocked along K with block_size 32 -> 3 blocks, the "
    "last one ragged (16 rows), uint4 zero points",
    domain="ai.onnx 21",
    types="uint4 / float",
    granularity="blocked (ragged)",
)
def ort_uint4_blocked_ragged_qdq(name):
    m = _matmul_nbits_qdq(80, symmetric=False)
    return normalize(
        m,
        "onnxruntime.quantization.matmul_nbits_quantizer.MatMulNBitsQuantizer"
        "(block_size=32, is_symmetric=False, quant_format=QDQ) of a float MLP",
    )


# ---- com.microsoft fused: MatMulNBits / GatherBlockQuantized (MatMulNBitsQuantizer) ----
# A tiny language model (Gather of an embedding table, MatMul up, Relu, MatMul down)
# quantized by onnxruntime's MatMulNBitsQuantizer in its default QOperator format: the
# dequantization lives inside the fused operators.


def float_lm(opset: int, vocab: int, d: int, h: int) -> onnx.ModelProto:
    r = rng_for(f"float_lm_{vocab}_{d}_{h}")
    inits = [
        T("embed.weight", f32(r.standard_normal((vocab, d)))),
        T("up.weight", f32(r.standard_normal((d, h)) / np.sqrt(d))),
        T("down.weight", f32(r.standard_normal((h, d)) / np.sqrt(h))),
    ]
    nodes = [
        node("Gather", ["embed.weight", "ids"], ["x"], "embed/Gather"),
        node("MatMul", ["x", "up.weight"], ["u"], "up/MatMul"),
        node("Relu", ["u"], ["a"], "act"),
        node("MatMul", ["a", "down.weight"], ["logits"], "down/MatMul"),
    ]
    g = helper.make_graph(
        nodes, "lm", [vi("ids", TensorProto.INT64, [1, 4])], [vi("logits", FLOAT, [1, 4, d])],
        inits,
    )
    return make_model(g, {"": opset})


def _matmul_nbits_qop(bits: int, symmetric: bool, block: int, d: int, gather: bool
                      ) -> onnx.ModelProto:
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig,
        MatMulNBitsQuantizer,
    )

    ops = ("MatMul", "Gather") if gather else ("MatMul",)
    cfg = DefaultWeightOnlyQuantConfig(block_size=block, is_symmetric=symmetric, bits=bits,
                                       op_types_to_quantize=ops)
    qz = MatMulNBitsQuantizer(float_lm(21, 64, d, 96), algo_config=cfg)
    with _quiet():
        qz.process()
    return normalize(
        qz.model.model,
        "onnxruntime.quantization.matmul_nbits_quantizer.MatMulNBitsQuantizer(DefaultWeight"
        f"OnlyQuantConfig(block_size={block}, is_symmetric={symmetric}, bits={bits}, "
        f"op_types_to_quantize={ops})) of a float Gather/MatMul model",
    )


@spec(
    file="ort_matmulnbits_4bit_sym_b32.onnx",
    holds="tiny LM quantized by MatMulNBitsQuantizer (QOperator), 4-bit symmetric, block 32: "
    "GatherBlockQuantized (int4 table (64, 64), no zero point) + 2 MatMulNBits without zero "
    "points (the default 8)",
    domain="com.microsoft 1 (fused)",
    types="int4, uint4 in uint8 / float",
    granularity="blocked along K / along axis 1",
)
def ort_matmulnbits_4bit_sym_b32(name):
    return _matmul_nbits_qop(4, True, 32, 64, gather=True)


@spec(
    file="ort_matmulnbits_4bit_asym_b128.onnx",
    holds="tiny LM quantized by MatMulNBitsQuantizer, 4-bit asymmetric, block 128: "
    "GatherBlockQuantized (uint4 table (64, 200), uint4 zero points) + MatMulNBits K=200 "
    "(2 blocks, the last ragged; packed zero points) and K=96 (one block spans K)",
    domain="com.microsoft 1 (fused)",
    types="uint4, uint4 in uint8 / float",
    granularity="blocked (ragged) / one block",
)
def ort_matmulnbits_4bit_asym_b128(name):
    return _matmul_nbits_qop(4, False, 128, 200, gather=True)


@spec(
    file="ort_matmulnbits_8bit_b32.onnx",
    holds="tiny LM quantized by MatMulNBitsQuantizer, 8-bit asymmetric, block 32: 2 "
    "MatMulNBits with uint8 zero points (the Gather stays float: Gather is 4-bit only)",
    domain="com.microsoft 1 (fused)",
    types="uint8 / float",
    granularity="blocked along K",
)
def ort_matmulnbits_8bit_b32(name):
    return _matmul_nbits_qop(8, False, 32, 64, gather=False)


@spec(
    file="ort_matmulnbits_2bit_b32.onnx",
    holds="tiny LM quantized by MatMulNBitsQuantizer, 2-bit asymmetric, block 32: 2 "
    "MatMulNBits, four codes per byte, packed 2-bit zero points",
    domain="com.microsoft 1 (fused)",
    types="uint2 in uint8 / float",
    granularity="blocked along K",
)
def ort_matmulnbits_2bit_b32(name):
    return _matmul_nbits_qop(2, False, 32, 64, gather=False)


# --------------------------------------------------------------------------------------
# writing and verifying
# ---- integer operators from onnxruntime.quantization --------------------------------------
# QOperator format (QLinearConv, QLinearMatMul, com.microsoft QGemm / QLinearAdd /
# QLinearGlobalAveragePool) and dynamic quantization (DynamicQuantizeLinear → MatMulInteger /
# ConvInteger → Cast → Mul).


def _quantize_dynamic(float_model: onnx.ModelProto, **kw) -> onnx.ModelProto:
    from onnxruntime.quantization import quantize_dynamic

    with tempfile.TemporaryDirectory(prefix="dqtool-models-") as tmp:
        src, dst = os.path.join(tmp, "float.onnx"), os.path.join(tmp, "quant.onnx")
        onnx.save(float_model, src)
        with _quiet():
            quantize_dynamic(src, dst, **kw)
        return onnx.load(dst)


@spec(
    file="ort_qop_per_tensor.onnx",
    holds="the conv net quantized by quantize_static in QOperator format with its defaults: "
    "QLinearConv ×2 with int32 biases, com.microsoft QLinearGlobalAveragePool, Flatten of the "
    "quantized tensor, com.microsoft QGemm; input QuantizeLinear, output DequantizeLinear",
    domain="ai.onnx 13 + com.microsoft 1",
    types="int8, int32 / float",
    granularity="per-tensor",
)
def ort_qop_per_tensor(name):
    from onnxruntime.quantization import QuantFormat

    m = _quantize_static(float_convnet(13), 1, quant_format=QuantFormat.QOperator)
    return normalize(m, "onnxruntime.quantization.quantize_static(QOperator) with default "
                     "options of a float conv net")


@spec(
    file="ort_qop_per_channel.onnx",
    holds="the conv net quantized by quantize_static in QOperator format, per_channel=True, "
    "activations uint8, weights int8: QLinearConv with per-channel weight scales (8,), "
    "QLinearGlobalAveragePool, QGemm with per-row (transB) weight scales",
    domain="ai.onnx 13 + com.microsoft 1",
    types="uint8, int8, int32 / float",
    granularity="per-tensor (activations), per-axis (weights)",
)
def ort_qop_per_channel(name):
    from onnxruntime.quantization import QuantFormat, QuantType

    m = _quantize_static(float_convnet(13), 1, quant_format=QuantFormat.QOperator,
                         per_channel=True, activation_type=QuantType.QUInt8,
                         weight_type=QuantType.QInt8)
    return normalize(m, "onnxruntime.quantization.quantize_static(QOperator, per_channel=True, "
                     "activation=QUInt8, weight=QInt8) of a float conv net")


@spec(
    file="ort_qop_matmul.onnx",
    holds="the MLP quantized by quantize_static in QOperator format: QLinearMatMul ×2 and "
    "com.microsoft QLinearAdd ×2 (the biases quantized as int8 tensors)",
    domain="ai.onnx 13 + com.microsoft 1",
    types="int8 / float",
    granularity="per-tensor",
)
def ort_qop_matmul(name):
    from onnxruntime.quantization import QuantFormat

    m = _quantize_static(float_mlp(13), 3, quant_format=QuantFormat.QOperator)
    return normalize(m, "onnxruntime.quantization.quantize_static(QOperator) of a float MLP")


@spec(
    file="ort_dynamic_matmul.onnx",
    holds="the MLP quantized by quantize_dynamic, per_channel=True: DynamicQuantizeLinear → "
    "MatMulInteger (int8 weights, per-column zero points) → Cast → Mul by "
    "Mul(activation scale, weight scale (N,)) → Add bias",
    domain="ai.onnx 13",
    types="uint8 (activations), int8 (weights) / float",
    granularity="per-tensor (activations), per-axis (weights)",
)
def ort_dynamic_matmul(name):
    m = _quantize_dynamic(float_mlp(13), per_channel=True)
    return normalize(m, "onnxruntime.quantization.quantize_dynamic(per_channel=True) of a "
                     "float MLP")


@spec(
    file="ort_dynamic_conv.onnx",
    holds="the conv net quantized by quantize_dynamic with op_types_to_quantize Conv and "
    "MatMul: DynamicQuantizeLinear → ConvInteger ×2 → Cast → Mul → Add (reshaped bias), "
    "and MatMulInteger for the Gemm",
    domain="ai.onnx 13",
    types="uint8 (activations), int8 (weights) / float",
    granularity="per-tensor",
)
def ort_dynamic_conv(name):
    m = _quantize_dynamic(float_convnet(13), op_types_to_quantize=["Conv", "MatMul", "Gemm"])
    return normalize(m, "onnxruntime.quantization.quantize_dynamic(op_types_to_quantize="
                     "[Conv, MatMul, Gemm]) of a float conv net")


# --------------------------------------------------------------------------------------


def write(model: onnx.ModelProto, path: Path) -> list[Path]:
    path.parent.mkdir(parents=True, exist_ok=True)
    written = [path]
    if path.parent.name == "external_data":
        data = to_external(model, EXTERNAL_DATA_FILE)
        (path.parent / EXTERNAL_DATA_FILE).write_bytes(data)
        written.append(path.parent / EXTERNAL_DATA_FILE)
    path.write_bytes(model.SerializeToString(deterministic=True))
    return written


def count_nodes(model: onnx.ModelProto) -> int:
    n = sum(len(g.node) for g in _iter_graphs(model.graph))
    return n + sum(len(f.node) for f in model.functions)


def check(path: Path) -> str:
    try:
        onnx.checker.check_model(str(path), full_check=True)
        return "ok"
    except Exception as e:  # checker raises several types
        return "FAIL: " + str(e).strip().splitlines()[0][:120]


def _session(path: Path, optimize: bool):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 4
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def ort_run(path: Path) -> str:
    """Load (retrying with graph optimizations off) and run once on seeded inputs.
    Returns "ok", "ok (no graph opt)", or what went wrong."""
    note = ""
    try:
        sess = _session(path, True)
    except Exception as e:
        first = "no load: " + str(e).strip().splitlines()[0]
        try:
            sess = _session(path, False)
            note = " (no graph opt)"
        except Exception:
            return first
    r = np.random.default_rng(0)
    np_types = {
        "tensor(float)": np.float32,
        "tensor(float16)": np.float16,
        "tensor(bool)": np.bool_,
    }
    feeds = {}
    for i in sess.get_inputs():
        shape = [d if isinstance(d, int) else 1 for d in i.shape]
        if i.type == "tensor(int64)":  # token ids of the fused samples' embedding
            feeds[i.name] = r.integers(0, 4, shape, dtype=np.int64)
            continue
        feeds[i.name] = r.standard_normal(shape).astype(np_types[i.type])
    try:
        outs = sess.run(None, feeds)
    except Exception as e:
        return "no run: " + str(e).strip().splitlines()[0]
    if not all(np.isfinite(np.asarray(o, np.float64)).all() for o in outs):
        return "non-finite output"
    return "ok" + note


def markdown_table() -> str:
    """The model table of models/README.md, from the specs above."""
    ort_text = {"yes": "yes", "noopt": "graph opt off", "no": "no"}
    lines = [
        "| file | what it holds | domain / version | types (quantized / scale) | granularity "
        "| onnxruntime CPU | notes |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in SPECS:
        valid = "" if s.valid else "**invalid**: "
        lines.append(
            f"| `{s.file}` | {s.holds} | {s.domain} | {s.types} | {s.granularity} "
            f"| {ort_text[s.ort] if s.valid else 'no'} | {valid}{s.note} |"
        )
    return "\n".join(lines)


def _short(message: str) -> str:
    """onnxruntime's error text without paths, source locations and status codes."""
    for pattern in (
        r"\[ONNXRuntimeError\] : \d+ : \w+ : ",
        r"Load model from \S+ failed: ?",
        r"Fatal error: ",
        r"This is an invalid model\. ",
        r"/onnxruntime_src/\S+ .*?\) (?=[A-Z])",
    ):
        message = re.sub(pattern, "", message)
    return message


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    ap.add_argument("--no-verify", action="store_true", help="skip checker/onnxruntime checks")
    ap.add_argument(
        "--table", action="store_true", help="print the markdown table for models/README.md"
    )
    args = ap.parse_args(argv)
    if args.table:
        print(markdown_table())
        return 0

    rows, failures, total = [], [], 0
    for s in SPECS:
        model = s.build(s.file)
        path = args.out / s.file
        written = write(model, path)
        size = sum(p.stat().st_size for p in written)
        total += size
        chk = ort = "-"
        if not args.no_verify:
            chk = check(path)
            ort = ort_run(path)
            if s.valid and chk != "ok":
                failures.append(f"{s.file}: checker: {chk}")
            expected = {"yes": "ok", "noopt": "ok (no graph opt)"}.get(s.ort, "no")
            if s.valid and s.ort != "no" and not ort.startswith("ok"):
                failures.append(f"{s.file}: onnxruntime: {ort}")
            elif s.valid and ort != expected and ort.startswith("ok"):
                ort += " [expected: " + expected + "]"
        rows.append((s.file, size, count_nodes(model), model.ir_version, chk, ort))

    w = max(len(r[0]) for r in rows)
    print(f"{'file':<{w}}  {'bytes':>6}  {'nodes':>5}  ir  {'checker':<7}  onnxruntime")
    for f, size, n, ir, chk, ort in rows:
        chk = chk if chk in ("ok", "-") else "fails"
        ort = _short(ort)
        print(f"{f:<{w}}  {size:>6}  {n:>5}  {ir:>2}  {chk:<7}  {ort[:70]}")
    print(f"{len(rows)} models, {total} bytes in {args.out}")
    for f in failures:
        print("FAILED", f, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
