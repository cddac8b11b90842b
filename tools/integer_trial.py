"""A judge's trial of the integer family on held-out-like models.

Builds small float models (a CNN, an MLP, a transformer block, an LSTM and an embedding
lookup, each with several chained layers), quantizes each with onnxruntime's quantizer in
QOperator format (``quantize_static``) and dynamically (``quantize_dynamic``) under the
options users set, and runs on each what the issue's judge runs:

* ``inspect --json`` counts every integer operator of the model;
* ``dqtool qdq`` leaves none that has a QDQ form, passes ``onnx.checker`` (full_check),
  runs on onnxruntime, and ``check --against`` finds every output within one quantization
  step (per op for dynamic models, whose end-to-end drift is reported, not judged);
* with ``ORT_ENABLE_ALL`` the QDQ form fuses back: whether it is identical is reported;
* ``dqtool qoperator`` restores the integer operators;
* ``lint --target`` flags them for the targets that lack them.

    python -m tools.integer_trial [--only SUBSTRING] [--json] [--keep DIR]

Exit 1 when any case fails. ``tests/test_integer_trial.py`` runs a few cases by default and
all of them with ``DQTOOL_SLOW=1``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

FLOAT = TensorProto.FLOAT


# ---- float models -----------------------------------------------------------------------

def _w(r: np.random.Generator, shape: tuple[int, ...], scale: float) -> np.ndarray:
    return (r.standard_normal(shape) * scale).astype(np.float32)


def _model(nodes, name, inputs, outputs, inits, opset: int = 13) -> onnx.ModelProto:
    g = helper.make_graph(nodes, name, inputs, outputs,
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.checker.check_model(m, full_check=True)
    return m


def cnn() -> onnx.ModelProto:
    """Conv → Relu → MaxPool → Conv → LeakyRelu, a residual Add, Mul, Sigmoid, Pad,
    AveragePool, Resize, Concat, Split, Transpose, GlobalAveragePool, Reshape, Gemm,
    Softmax."""
    r = np.random.default_rng(1)
    inits = {
        "c1.w": _w(r, (8, 3, 3, 3), 0.3), "c1.b": _w(r, (8,), 0.1),
        "c2.w": _w(r, (8, 8, 3, 3), 0.15), "c2.b": _w(r, (8,), 0.1),
        "c3.w": _w(r, (8, 8, 1, 1), 0.3), "c3.b": _w(r, (8,), 0.1),
        "c4.w": _w(r, (8, 16, 3, 3), 0.1), "c4.b": _w(r, (8,), 0.1),
        "fc.w": _w(r, (10, 8), 0.3), "fc.b": _w(r, (10,), 0.1),
        "shape": np.array([1, 8], np.int64), "pads": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64),
        "scales": np.array([1, 1, 2, 2], np.float32), "split": np.array([4, 4], np.int64),
    }
    n = helper.make_node
    nodes = [
        n("Conv", ["input", "c1.w", "c1.b"], ["c1"], "conv1", kernel_shape=[3, 3],
          pads=[1, 1, 1, 1]),
        n("Relu", ["c1"], ["r1"], "relu1"),
        n("MaxPool", ["r1"], ["p1"], "pool1", kernel_shape=[2, 2], strides=[2, 2]),
        n("Conv", ["p1", "c2.w", "c2.b"], ["c2"], "conv2", kernel_shape=[3, 3],
          pads=[1, 1, 1, 1]),
        n("LeakyRelu", ["c2"], ["l2"], "leaky2", alpha=0.1),
        n("Conv", ["l2", "c3.w", "c3.b"], ["c3"], "conv3", kernel_shape=[1, 1]),
        n("Add", ["c3", "p1"], ["res"], "residual"),
        n("Sigmoid", ["res"], ["sig"], "sigmoid"),
        n("Mul", ["res", "sig"], ["swish"], "swish"),
        n("Pad", ["swish", "pads"], ["padded"], "pad"),
        n("AveragePool", ["padded"], ["ap"], "avgpool", kernel_shape=[2, 2], strides=[2, 2]),
        n("Resize", ["ap", "", "scales"], ["up"], "resize", mode="nearest"),
        n("Concat", ["up", "padded"], ["cat"], "concat", axis=1),
        n("Conv", ["cat", "c4.w", "c4.b"], ["c4"], "conv4", kernel_shape=[3, 3],
          pads=[1, 1, 1, 1]),
        n("Split", ["c4", "split"], ["s1", "s2"], "split", axis=1),
        n("Transpose", ["s2"], ["t2"], "transpose", perm=[0, 1, 3, 2]),
        n("Concat", ["s1", "t2"], ["cat2"], "concat2", axis=1),
        n("GlobalAveragePool", ["cat2"], ["gap"], "gap"),
        n("Reshape", ["gap", "shape"], ["flat"], "reshape"),
        n("Gemm", ["flat", "fc.w", "fc.b"], ["logits"], "fc", transB=1),
        n("Softmax", ["logits"], ["probs"], "softmax", axis=1),
    ]
    return _model(nodes, "cnn", [helper.make_tensor_value_info("input", FLOAT, [1, 3, 16, 16])],
                  [helper.make_tensor_value_info("probs", FLOAT, [1, 10])], inits)


def mlp() -> onnx.ModelProto:
    """MatMul + Add → Relu → MatMul + Add → Where(x > 0) → MatMul → ReduceMean."""
    r = np.random.default_rng(2)
    inits = {"w1": _w(r, (32, 48), 0.18), "b1": _w(r, (48,), 0.1),
             "w2": _w(r, (48, 24), 0.15), "b2": _w(r, (24,), 0.1),
             "w3": _w(r, (24, 16), 0.2), "zero": np.zeros((), np.float32),
             "alt": _w(r, (24,), 0.5)}
    n = helper.make_node
    nodes = [
        n("MatMul", ["input", "w1"], ["m1"], "fc1"), n("Add", ["m1", "b1"], ["a1"], "fc1_add"),
        n("Relu", ["a1"], ["r1"], "relu1"),
        n("MatMul", ["r1", "w2"], ["m2"], "fc2"), n("Add", ["m2", "b2"], ["a2"], "fc2_add"),
        n("Greater", ["a2", "zero"], ["pos"], "gt"),
        n("Where", ["pos", "a2", "alt"], ["wh"], "where"),
        n("MatMul", ["wh", "w3"], ["m3"], "fc3"),
        n("ReduceMean", ["m3"], ["out"], "mean", axes=[-1], keepdims=1),
    ]
    return _model(nodes, "mlp", [helper.make_tensor_value_info("input", FLOAT, [4, 32])],
                  [helper.make_tensor_value_info("out", FLOAT, [4, 1])], inits)


def transformer() -> onnx.ModelProto:
    """Embedding Gather, Q/K/V MatMuls, Reshape/Transpose into heads, QKᵀ, Softmax, ·V,
    back, an output projection, a residual Add and a feed-forward MatMul pair."""
    r = np.random.default_rng(3)
    d, h, s, v = 32, 4, 8, 50
    inits = {"emb": _w(r, (v, d), 0.5),
             **{f"w{k}": _w(r, (d, d), 1 / np.sqrt(d)) for k in "qkvo"},
             "bq": _w(r, (d,), 0.1), "ff1": _w(r, (d, 64), 1 / np.sqrt(d)),
             "ff2": _w(r, (64, d), 1 / 8), "bff": _w(r, (64,), 0.1),
             "heads": np.array([1, s, h, d // h], np.int64),
             "back": np.array([1, s, d], np.int64),
             "inv": np.array(1 / np.sqrt(d // h), np.float32)}
    n = helper.make_node
    nodes = [n("Gather", ["emb", "ids"], ["x"], "embed", axis=0)]
    for k in "qkv":
        nodes.append(n("MatMul", ["x", f"w{k}"], [f"{k}0"], f"proj_{k}"))
    nodes += [
        n("Add", ["q0", "bq"], ["q1"], "q_bias"),
        n("Reshape", ["q1", "heads"], ["q2"], "q_heads"),
        n("Reshape", ["k0", "heads"], ["k2"], "k_heads"),
        n("Reshape", ["v0", "heads"], ["v2"], "v_heads"),
        n("Transpose", ["q2"], ["q"], "q_t", perm=[0, 2, 1, 3]),
        n("Transpose", ["k2"], ["kt"], "k_t", perm=[0, 2, 3, 1]),
        n("Transpose", ["v2"], ["vv"], "v_t", perm=[0, 2, 1, 3]),
        n("MatMul", ["q", "kt"], ["qk"], "scores"),
        n("Mul", ["qk", "inv"], ["qks"], "scale"),
        n("Softmax", ["qks"], ["att"], "softmax", axis=-1),
        n("MatMul", ["att", "vv"], ["ctx"], "context"),
        n("Transpose", ["ctx"], ["ctx_t"], "ctx_t", perm=[0, 2, 1, 3]),
        n("Reshape", ["ctx_t", "back"], ["ctx2"], "ctx_merge"),
        n("MatMul", ["ctx2", "wo"], ["o"], "proj_o"),
        n("Add", ["o", "x"], ["res"], "residual"),
        n("MatMul", ["res", "ff1"], ["f1"], "ff1"), n("Add", ["f1", "bff"], ["f1b"], "ff1_add"),
        n("Relu", ["f1b"], ["f1r"], "ff_relu"),
        n("MatMul", ["f1r", "ff2"], ["f2"], "ff2"),
        n("Add", ["f2", "res"], ["out"], "residual2"),
    ]
    return _model(nodes, "transformer",
                  [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, s])],
                  [helper.make_tensor_value_info("out", FLOAT, [1, s, d])], inits)


def lstm() -> onnx.ModelProto:
    """MatMul → LSTM → MatMul (dynamic quantization quantizes all three)."""
    r = np.random.default_rng(4)
    t, b, i, hid = 6, 1, 16, 12
    inits = {"win": _w(r, (i, i), 0.3), "W": _w(r, (1, 4 * hid, i), 0.3),
             "R": _w(r, (1, 4 * hid, hid), 0.3), "B": _w(r, (1, 8 * hid), 0.1),
             "wout": _w(r, (hid, 8), 0.3)}
    n = helper.make_node
    nodes = [n("MatMul", ["input", "win"], ["x"], "fc_in"),
             n("LSTM", ["x", "W", "R", "B"], ["y", "", ""], "lstm", hidden_size=hid),
             n("Reshape", ["y", "shape"], ["y2"], "squeeze"),
             n("MatMul", ["y2", "wout"], ["out"], "fc_out")]
    inits["shape"] = np.array([t, b, hid], np.int64)
    return _model(nodes, "lstm", [helper.make_tensor_value_info("input", FLOAT, [t, b, i])],
                  [helper.make_tensor_value_info("out", FLOAT, [t, b, 8])], inits)


def attention() -> onnx.ModelProto:
    """com.microsoft EmbedLayerNormalization → Attention → MatMul (dynamic quantization
    turns them into QEmbedLayerNormalization and QAttention, whose QDQ forms dequantize
    into the float com.microsoft operators)."""
    r = np.random.default_rng(5)
    s, d, v = 8, 16, 30
    inits = {"word": _w(r, (v, d), 0.5), "pos": _w(r, (s, d), 0.1), "seg": _w(r, (2, d), 0.1),
             "gamma": np.ones(d, np.float32), "beta": np.zeros(d, np.float32),
             "qkv": _w(r, (d, 3 * d), 0.25), "qkv_b": _w(r, (3 * d,), 0.1),
             "wo": _w(r, (d, d), 0.25)}
    n = helper.make_node
    nodes = [
        n("EmbedLayerNormalization", ["ids", "segs", "word", "pos", "seg", "gamma", "beta"],
          ["emb", "mask_index"], "embed", domain="com.microsoft", epsilon=1e-5),
        n("Attention", ["emb", "qkv", "qkv_b"], ["att"], "attention", domain="com.microsoft",
          num_heads=2),
        n("MatMul", ["att", "wo"], ["out"], "proj"),
    ]
    g = helper.make_graph(nodes, "attention",
                          [helper.make_tensor_value_info("ids", TensorProto.INT32, [1, s]),
                           helper.make_tensor_value_info("segs", TensorProto.INT32, [1, s])],
                          [helper.make_tensor_value_info("out", FLOAT, [1, s, d])],
                          [numpy_helper.from_array(a, k) for k, a in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13),
                                            helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    return m


FLOAT_MODELS: dict[str, Callable[[], onnx.ModelProto]] = {
    "cnn": cnn, "mlp": mlp, "transformer": transformer, "lstm": lstm, "attention": attention}


# ---- quantization -----------------------------------------------------------------------

@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


def _feeds(model: onnx.ModelProto, r: np.random.Generator) -> dict[str, np.ndarray]:
    out = {}
    for i in model.graph.input:
        shape = [d.dim_value for d in i.type.tensor_type.shape.dim]
        if i.type.tensor_type.elem_type == TensorProto.INT64:
            out[i.name] = r.integers(0, 50, shape).astype(np.int64)
        elif i.type.tensor_type.elem_type == TensorProto.INT32:
            out[i.name] = r.integers(0, 2 if "seg" in i.name else 30, shape).astype(np.int32)
        else:
            out[i.name] = r.standard_normal(shape).astype(np.float32)
    return out


@dataclass(frozen=True)
class Case:
    name: str
    model: str  # a key of FLOAT_MODELS
    mode: str  # "static" (QOperator) or "dynamic"
    options: dict[str, Any] = field(default_factory=dict)

    def quantize(self, tmp: Path) -> onnx.ModelProto:
        from onnxruntime.quantization import (
            CalibrationDataReader,
            QuantFormat,
            quantize_dynamic,
            quantize_static,
        )

        float_model = FLOAT_MODELS[self.model]()
        src, dst = tmp / f"{self.name}.float.onnx", tmp / f"{self.name}.onnx"
        onnx.save(float_model, src)
        kw = dict(self.options)
        cwd = os.getcwd()
        os.chdir(tmp)
        try:
            with _quiet():
                if self.mode == "static":
                    r = np.random.default_rng(7)
                    data = iter([_feeds(float_model, r) for _ in range(8)])

                    class Reader(CalibrationDataReader):
                        def get_next(self):
                            return next(data, None)

                    quantize_static(str(src), str(dst), Reader(),
                                    quant_format=QuantFormat.QOperator, **kw)
                else:
                    quantize_dynamic(str(src), str(dst), **kw)
        finally:
            os.chdir(cwd)
        return onnx.load(dst)


def _cases() -> list[Case]:
    from onnxruntime.quantization import QuantType

    u8, s8 = QuantType.QUInt8, QuantType.QInt8
    cases = []
    static = {
        "u8u8": dict(activation_type=u8, weight_type=u8),
        "u8s8": dict(activation_type=u8, weight_type=s8),
        "s8s8": dict(activation_type=s8, weight_type=s8),
        "u8s8_pc": dict(activation_type=u8, weight_type=s8, per_channel=True),
        "s8s8_pc_rr": dict(activation_type=s8, weight_type=s8, per_channel=True,
                           reduce_range=True),
        "s8s8_sym": dict(activation_type=s8, weight_type=s8, per_channel=True,
                         extra_options={"ActivationSymmetric": True, "WeightSymmetric": True}),
        "u8u8_asym_w": dict(activation_type=u8, weight_type=u8,
                            extra_options={"WeightSymmetric": False}),
    }
    for model in ("cnn", "mlp", "transformer"):
        for tag, kw in static.items():
            cases.append(Case(f"static_{model}_{tag}", model, "static", kw))
    dynamic = {
        "u8": dict(weight_type=u8),
        "s8": dict(weight_type=s8),
        "s8_pc": dict(weight_type=s8, per_channel=True),
        "u8_pc_rr": dict(weight_type=u8, per_channel=True, reduce_range=True),
        "s8_constb": dict(weight_type=s8, extra_options={"MatMulConstBOnly": True}),
        "u8_anyb": dict(weight_type=u8, extra_options={"MatMulConstBOnly": False}),
    }
    for model in ("cnn", "mlp", "transformer", "lstm", "attention"):
        for tag, kw in dynamic.items():
            opts = dict(kw)
            if model == "cnn":
                opts["op_types_to_quantize"] = ["Conv", "MatMul", "Gemm"]
            cases.append(Case(f"dynamic_{model}_{tag}", model, "dynamic", opts))
    return cases


CASES = _cases()


# ---- the judge ---------------------------------------------------------------------------

def integer_ops(model: onnx.ModelProto) -> Counter:
    """Every integer operator of the model (main graph), by ``domain:op``, as the family's
    operator table names them."""
    from dqtool.families.integer import ops

    out: Counter = Counter()
    for n in model.graph.node:
        d = ops.lookup(n.domain if n.domain not in ("", "ai.onnx") else "ai.onnx", n.op_type)
        if d is not None:
            out[f"{d.domain}:{d.op}"] += 1
    return out


def _lint_targets(ops_present: Counter) -> dict[str, int]:
    """How many DQ110 findings each target must give: the operators it cannot run."""
    from dqtool.families.integer import lint

    targets = ["onnx-opset-21", "onnxruntime", "directml-fl1.0", "directml-fl6.3",
               "onednn-graph"]
    return {t: sum(c for k, c in ops_present.items()
                   if lint.why_not(k.split(":")[1], k.split(":")[0], t) is not None)
            for t in targets}


def run_case(case: Case, tmp: Path) -> dict[str, Any]:
    import onnxruntime as ort

    from dqtool import inspection
    from dqtool.checking import check as dq_check
    from dqtool.families.integer import ops
    from dqtool.integer import api, numerics
    from dqtool.linting import lint

    problems: list[str] = []
    doc: dict[str, Any] = {"case": case.name}
    model = case.quantize(tmp)
    src = tmp / f"{case.name}.onnx"
    present = integer_ops(model)
    doc["integer_ops"] = dict(present)
    if not present:
        problems.append("the quantizer wrote no integer operator")
    # inspect --json counts every integer operator
    report = inspection.inspect(str(src)).to_json()
    counted = report["summary"].get("integer_by_op", {})
    if counted != dict(sorted(present.items())):
        problems.append(f"inspect counts {counted}, the model holds {dict(present)}")
    # qdq
    qdq_path = tmp / f"{case.name}.qdq.onnx"
    try:
        conv = api.to_qdq(str(src), str(qdq_path), keep_unconvertible=True)
    except Exception as e:  # a failure of the tool is the finding
        problems.append(f"qdq raised {type(e).__name__}: {e}")
        doc["problems"] = problems
        return doc
    doc["refused"] = [f"{r.op} {r.node}: {r.reason}" for r in conv.refusals]
    qdq_model = onnx.load(qdq_path)
    left = integer_ops(qdq_model)
    with_form = {k: c for k, c in left.items()
                 if k != "ai.onnx:DynamicQuantizeLinear"
                 and not ops.lookup(*k.split(":")).no_qdq}
    if with_form:
        problems.append(f"qdq left operators that have a QDQ form: {with_form}")
    try:
        onnx.checker.check_model(qdq_model, full_check=True)
    except Exception as e:
        problems.append(f"onnx checker: {str(e).splitlines()[0]}")
    try:
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        sess = ort.InferenceSession(str(qdq_path), so, providers=["CPUExecutionProvider"])
        sess.run(None, _feeds(qdq_model, np.random.default_rng(0)))
    except Exception as e:
        problems.append(f"onnxruntime cannot run the QDQ model: {str(e).splitlines()[0]}")
    # check --against: within one step per element (end to end); per-op for dynamic
    feeds = _feeds(model, np.random.default_rng(0))  # token ids within the vocabulary
    chk = dq_check(str(qdq_path), against=str(src), inputs=feeds)
    ends = []
    for c in chk.comparisons:
        for o in c.outputs:
            ends.append({"runtime": c.runtime, "output": o.name, "max_steps": o.max_steps,
                         "step": o.step, "max_abs": o.max_abs,
                         "off_by_one": o.off_by_one, "off_by_more": o.off_by_more})
    doc["end_to_end"] = ends
    local = getattr(chk, "local", None)
    if local is not None:
        doc["per_op"] = local.to_json() if hasattr(local, "to_json") else local
    if not ends:
        problems.append("check --against compared nothing")
    verdict = numerics.judge(onnx.load(src), qdq_model, given=feeds)
    doc["verdict"] = verdict.to_json()
    if not verdict.ok:
        problems.append("qdq --check's verdict: " + "; ".join(
            line for line in verdict.describe() if "BEYOND" in line or "cannot" in line))
    # fused back
    doc["fused_identical"] = None if verdict.fused is None else verdict.fused["identical"]
    # qoperator restores the operators
    qop_path = tmp / f"{case.name}.qop.onnx"
    try:
        api.to_qoperator(str(qdq_path), str(qop_path))
        back = integer_ops(onnx.load(qop_path))
        if back != present:
            problems.append(f"qoperator gives {dict(back)}, the original had {dict(present)}")
    except Exception as e:
        problems.append(f"qoperator raised {type(e).__name__}: {e}")
    if case.mode == "dynamic":
        _exact_form(src, tmp, case, present, doc, problems, feeds)
    # lint
    for target, want in _lint_targets(present).items():
        findings = [f for f in lint([str(src)], target=target).findings
                    if f.code == "DQ110"]
        if len(findings) != want:
            problems.append(f"lint --target {target}: {len(findings)} DQ110, want {want}")
    doc["problems"] = problems
    return doc


def _exact_form(src: Path, tmp: Path, case: Case, present: Counter, doc: dict[str, Any],
                problems: list[str], feeds: dict[str, np.ndarray]) -> None:
    """``qdq --exact-dynamic``: every converted operator bit-identical on the original's
    inputs (the models here stay far below the 2**24 bound), and back again."""
    from dqtool.integer import api, numerics

    path = tmp / f"{case.name}.exact.onnx"
    api.to_qdq(str(src), str(path), keep_unconvertible=True, exact_dynamic=True)
    verdict = numerics.judge(onnx.load(src), onnx.load(path), given=feeds)
    # Only MatMulInteger / ConvInteger take the exact form; QAttention's float twin is not.
    worst = max((e.comparison.max_abs for e in verdict.local if e.comparison is not None
                 and e.op in ("ai.onnx:MatMulInteger", "ai.onnx:ConvInteger")), default=None)
    doc["exact"] = {"per_op_max_abs": worst,
                    "end_to_end_max_abs": max((o["max_abs"] for o in verdict.outputs),
                                              default=None),
                    "fused_identical": None if verdict.fused is None
                    else verdict.fused["identical"]}
    if worst != 0.0:
        problems.append(f"--exact-dynamic: a converted operator differs by {worst}")
    back = integer_ops(ir_to_proto(api.to_qoperator(str(path)).model))
    if back != present:
        problems.append(f"qoperator of the exact form gives {dict(back)}")


def ir_to_proto(model: Any) -> onnx.ModelProto:
    import onnx_ir as ir

    return ir.to_proto(model)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default="", help="run the cases whose name contains this")
    p.add_argument("--json", action="store_true", help="print every case's document")
    p.add_argument("--keep", default=None, help="keep the models in this folder")
    args = p.parse_args(argv)
    failed = 0
    docs = []
    with tempfile.TemporaryDirectory(prefix="dqtool-trial-") as t:
        tmp = Path(args.keep or t)
        tmp.mkdir(parents=True, exist_ok=True)
        for case in CASES:
            if args.only not in case.name:
                continue
            doc = run_case(case, tmp)
            docs.append(doc)
            worst = max((e["max_steps"] for e in doc.get("end_to_end", [])
                         if e["max_steps"] is not None), default=None)
            status = "ok" if not doc["problems"] else "FAIL"
            failed += bool(doc["problems"])
            exact = doc.get("exact")
            more = "" if exact is None else (
                f"; --exact-dynamic end-to-end max abs {exact['end_to_end_max_abs']}, "
                f"fused identical {exact['fused_identical']}")
            print(f"{status:4} {case.name}: {sum(doc['integer_ops'].values())} integer ops, "
                  f"end-to-end max steps {worst}, fused identical "
                  f"{doc.get('fused_identical')}, refused {len(doc.get('refused', []))}"
                  + more)
            for pr in doc["problems"]:
                print(f"     {pr}")
    if args.json:
        print(json.dumps(docs, indent=1, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
