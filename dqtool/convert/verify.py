"""``--check``: the converted model must compute bit-identical outputs to the original.

Both models run on the same random inputs in dqtool's reference evaluator (every Q/DQ
dialect, our kernel) and, where it loads both, onnxruntime CPU with every graph
optimization off (otherwise onnxruntime fuses DQ→MatMul and the "reference" moves).
Outputs are compared as bytes, so NaN payloads and signed zeros count too.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from dqtool import types
from dqtool.messages import one_line


def to_proto(model: ir.Model | onnx.ModelProto, base_dir: str | Path | None) -> onnx.ModelProto:
    proto = model if isinstance(model, onnx.ModelProto) else ir.to_proto(model)
    if base_dir is not None:
        from onnx.external_data_helper import load_external_data_for_model

        load_external_data_for_model(proto, str(base_dir))
    return proto


def random_inputs(proto: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    inits = {t.name for t in proto.graph.initializer}
    feeds: dict[str, np.ndarray] = {}
    for vi in proto.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else 2 for d in tt.shape.dim]
        et = types.from_onnx_int(tt.elem_type)
        if et is None:
            raise ValueError(f"input {vi.name}: unsupported type {tt.elem_type}")
        if et.is_integer:
            lo, hi = max(et.min, -100), min(et.max, 100)
            arr = rng.integers(lo, hi + 1, shape).astype(et.dtype)
        else:
            arr = rng.standard_normal(shape).astype(np.float32).astype(et.dtype)
        feeds[vi.name] = arr
    return feeds


def _run_reference(proto: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    from dqtool.kernel import reference_evaluator

    return [np.asarray(o) for o in reference_evaluator(proto).run(None, feeds)]


def _run_ort(proto: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    sess = ort.InferenceSession(proto.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    return [np.asarray(o) for o in sess.run(None, feeds)]


def _same(a: list[np.ndarray], b: list[np.ndarray]) -> str | None:
    if len(a) != len(b):
        return f"{len(a)} outputs against {len(b)}"
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if x.dtype != y.dtype or x.shape != y.shape:
            return f"output {i}: {x.dtype}{x.shape} against {y.dtype}{y.shape}"
        if x.tobytes() != y.tobytes():
            diff = np.count_nonzero(x.view(np.uint8) != y.view(np.uint8))
            return f"output {i}: {diff} bytes differ"
    return None


def with_qdq_outputs(original: onnx.ModelProto, converted: onnx.ModelProto
                     ) -> tuple[onnx.ModelProto, onnx.ModelProto, list[str]]:
    """Both models with every main-graph Q/DQ result of the original as an extra output
    (conversion keeps those names), so the Q/DQ values themselves are compared, not only
    what a MatMul made of them."""
    produced = {o for n in converted.graph.node for o in n.output}
    names = [o for n in original.graph.node
             if n.op_type in ("DequantizeLinear", "QuantizeLinear") for o in n.output[:1]
             if o in produced and o not in {v.name for v in original.graph.output}]
    out = []
    for m in (original, converted):
        m2 = onnx.ModelProto()
        m2.CopyFrom(m)
        for name in names:
            m2.graph.output.append(onnx.ValueInfoProto(name=name))
        out.append(m2)
    return out[0], out[1], names


def compare(original: onnx.ModelProto, converted: onnx.ModelProto, seed: int = 0
            ) -> dict[str, Any]:
    """Bitwise comparison of the outputs and of every Q/DQ result;
    ``{"ok": bool, "runtimes": {name: "identical" | reason}}``.

    A final-output difference with bit-identical Q/DQ results is reported but does not fail:
    numpy's MatMul rounds differently on a transposed view, and onnxruntime's float16 MatMul
    was seen to differ by one ulp on identical inputs held in different buffers.
    """
    feeds = random_inputs(original, seed)
    checker = _checker(converted)
    if checker != "ok" and _checker(original) != "ok":
        checker = "skipped: the original fails onnx.checker too"
    qdq_made = {o for n in original.graph.node
                if n.op_type in ("DequantizeLinear", "QuantizeLinear") for o in n.output[:1]}
    qdq_final = [i for i, v in enumerate(original.graph.output) if v.name in qdq_made]
    original, converted, extra = with_qdq_outputs(original, converted)
    n_final = len(original.graph.output) - len(extra)
    result: dict[str, Any] = {"ok": True, "runtimes": {}, "inputs_seed": seed}
    compared = 0
    reference_agrees = False
    for name, runner in (("dqtool.reference_evaluator", _run_reference),
                         ("onnxruntime (CPU, ORT_DISABLE_ALL)", _run_ort)):
        try:
            a = runner(original, feeds)
        except Exception as e:  # the original does not run there: skip this runtime
            result["runtimes"][name] = f"skipped: original does not run ({_first(e)})"
            continue
        try:
            b = runner(converted, feeds)
        except Exception as e:
            unsupported = _unsupported(e, converted) if runner is _run_ort else None
            if unsupported and reference_agrees:
                # The runtime lacks the target opset / IR version / kernel: that says
                # nothing about the conversion, which the reference evaluator checked.
                result["runtimes"][name] = f"skipped ({unsupported})"
            else:
                result["runtimes"][name] = ("FAILED: the converted model does not run "
                                            f"({_first(e)})")
                result["ok"] = False
            continue
        compared += 1
        qa, qb = a[n_final:] + [a[i] for i in qdq_final], b[n_final:] + [b[i] for i in qdq_final]
        qdq_diff = _same(qa, qb)
        final_diff = _same(a[:n_final], b[:n_final])
        if qdq_diff:
            text, ok = f"DIFFERENT Q/DQ result: {qdq_diff}", False
        elif final_diff and not qa:
            # No Q/DQ result vouches for the inputs of the ops that differ.
            text, ok = f"DIFFERENT: {final_diff}", False
        elif final_diff:
            # Identical Q/DQ results, so the ops after them differ on identical inputs
            # (numpy's MatMul on a transposed view; onnxruntime's float16 MatMul on a
            # differently placed buffer): not the conversion's doing.
            text, ok = (f"Q/DQ results identical; final {final_diff} (downstream op "
                        "rounding on identical inputs)"), True
        else:
            text, ok = "identical", True
        if runner is _run_reference:
            reference_agrees = ok
        result["runtimes"][name] = text
        result["ok"] = result["ok"] and ok
    if not compared:
        result["ok"] = False
        result["error"] = "no runtime could run both models, so nothing was compared"
    result["checker"] = checker
    result["ok"] = result["ok"] and not checker.startswith("FAILED")
    return result


def describe(check: dict[str, Any]) -> list[str]:
    """The check as lines a person reads: one per runtime, then onnx.checker."""
    lines = [f"{name}: {text}" for name, text in check.get("runtimes", {}).items()]
    if check.get("error"):
        lines.append(check["error"])
    if "checker" in check:
        lines.append(f"onnx.checker: {check['checker']}")
    return lines


def failures(check: dict[str, Any]) -> str:
    """Why the check failed, in one line."""
    bad = [f"{name}: {text}" for name, text in check.get("runtimes", {}).items()
           if text.startswith(("DIFFERENT", "FAILED"))]
    if check.get("error"):
        bad.append(check["error"])
    if str(check.get("checker", "")).startswith("FAILED"):
        bad.append(f"onnx.checker: {check['checker']}")
    return "; ".join(bad) or "no runtime compared the models"


_ORT_LIMITS = (
    (re.compile(r"Opset (\d+) is under development.*?domain (\S+) is till opset (\d+)", re.S),
     lambda m: f"onnxruntime cannot run opset {m[1]}; it supports {m[2]} up to opset {m[3]}"),
    (re.compile(r"Unsupported model IR version: (\d+), max supported IR version: (\d+)"),
     lambda m: f"onnxruntime cannot run IR version {m[1]}; it supports up to {m[2]}"),
    (re.compile(r"NOT_IMPLEMENTED : Could not find an implementation for (\w+)\((\d+)\)"),
     lambda m: f"onnxruntime has no CPU kernel for {m[1]}-{m[2]} with these types"),
)


def _unsupported(e: Exception, model: onnx.ModelProto) -> str | None:
    """What onnxruntime lacks, when that (not the model) is why it cannot run it."""
    text = str(e)
    for pattern, say in _ORT_LIMITS:
        m = pattern.search(text)
        if m:
            why = say(m)
            if "IR version" in why:
                opset = max((o.version for o in model.opset_import
                             if o.domain in ("", "ai.onnx")), default=None)
                why = why.replace("; it", f" (which opset {opset} needs); it") \
                    if opset else why
            return why
    return None


def _checker(model: onnx.ModelProto) -> str:
    try:
        onnx.checker.check_model(model, full_check=True)
        return "ok"
    except Exception as e:
        return f"FAILED: {_first(e)}"


def _first(e: Exception) -> str:
    return one_line(e)
