"""Random small DequantizeLinear graphs: the folded model's outputs are bit-identical to the
original's in onnxruntime (ORT_DISABLE_ALL). DQTOOL_SLOW=1 runs many more examples."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import ml_dtypes
import numpy as np
from helpers import assert_bitwise_equal, make_model, run_ort, save, tensor
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto as TP
from onnx import helper as h

from dqtool.folding import fold

EXAMPLES = 300 if os.environ.get("DQTOOL_SLOW") else 20
TYPES = {"int8": np.int8, "uint8": np.uint8, "int16": np.int16, "uint16": np.uint16,
         "int32": np.int32, "int4": ml_dtypes.int4, "uint4": ml_dtypes.uint4}
SCALES = {"float": (np.float32, TP.FLOAT), "float16": (np.float16, TP.FLOAT16)}


@st.composite
def dq_cases(draw):
    qtype = draw(st.sampled_from(sorted(TYPES)))
    rows, cols = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    gran = draw(st.sampled_from(["per-tensor", "per-axis", "blocked"]))
    axis = draw(st.integers(0, 1))
    block = draw(st.integers(1, 5))
    scale_name = draw(st.sampled_from(sorted(SCALES)))
    with_zp = draw(st.booleans()) and qtype != "int32"
    seed = draw(st.integers(0, 2**31))
    consumer = draw(st.sampled_from(["output", "MatMul", "Add"]))
    return qtype, (rows, cols), gran, axis, block, scale_name, with_zp, seed, consumer


def build(case) -> tuple:
    qtype, shape, gran, axis, block, scale_name, with_zp, seed, consumer = case
    rng = np.random.default_rng(seed)
    dt = np.dtype(TYPES[qtype])
    lo, hi = ((-8, 7) if qtype == "int4" else (0, 15) if qtype == "uint4"
              else (np.iinfo(dt).min, np.iinfo(dt).max))
    x = rng.integers(lo, hi, shape, endpoint=True).astype(dt)
    if gran == "per-tensor":
        sshape: tuple = ()
    elif gran == "per-axis":
        sshape = (shape[axis],)
    else:
        sshape = tuple(-(-d // block) if i == axis else d for i, d in enumerate(shape))
    sdt, stype = SCALES[scale_name]
    scale = (rng.random(sshape) * 2.0 ** rng.integers(-12, 4, sshape) + 1e-3).astype(sdt)
    inits = [tensor("x", x), tensor("s", scale)]
    ins = ["x", "s"]
    if with_zp:
        inits.append(tensor("zp", rng.integers(lo, hi, sshape, endpoint=True).astype(dt)))
        ins.append("zp")
    attrs = {"axis": axis} | ({"block_size": block} if gran == "blocked" else {})
    nodes = [h.make_node("DequantizeLinear", ins, ["y"], **attrs)]
    inputs, outputs = [], [("y", stype, list(shape))]
    if consumer == "MatMul":
        nodes.append(h.make_node("MatMul", ["A", "y"], ["z"]))
        inputs, outputs = [("A", stype, [3, shape[0]])], [("z", stype, [3, shape[1]])]
    elif consumer == "Add":
        nodes.append(h.make_node("Add", ["A", "y"], ["z"]))
        inputs, outputs = [("A", stype, list(shape))], [("z", stype, list(shape))]
    feed = {n: rng.standard_normal(s).astype(sdt) for n, _, s in inputs}
    return make_model(nodes, inits, inputs, outputs), feed


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(dq_cases())
def test_random_dq_graphs_fold_bit_identically(case) -> None:
    model, feed = build(case)
    with tempfile.TemporaryDirectory() as tmp:
        src = save(model, Path(tmp) / "m.onnx")
        report = fold(src, Path(tmp) / "o.onnx")
        assert len(report.folded) == 1, report.left
        assert_bitwise_equal(run_ort(src, feed), run_ort(Path(tmp) / "o.onnx", feed))
