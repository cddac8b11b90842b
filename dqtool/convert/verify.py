"""``--check``: the converted model must compute bit-identical outputs to the original.

Both models run on the same random inputs in dqtool's reference evaluator (every Q/DQ
dialect, our kernel) and, where it loads both, onnxruntime CPU with every graph
optimization off (otherwise onnxruntime fuses DQ→MatMul and the "reference" moves).
Outputs are compared as bytes, so NaN payloads and signed zeros count too.

Loading, inputs and both runtimes are ``dqtool check``'s (``dqtool.checking``); what is
``--check``'s own is the policy: a final-output difference is tolerated only when every
Q/DQ result compared bit-identical (and said so), and a runtime that lacks the target
opset / IR version / kernel is skipped only when the reference evaluator agreed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from dqtool.checking import inputs, models, runners
from dqtool.messages import one_line

REFERENCE = "dqtool.reference_evaluator"
ORT = f"onnxruntime (CPU, {runners.ORT_LEVEL})"


def to_proto(model: ir.Model | onnx.ModelProto) -> onnx.ModelProto:
    """The model as the runtimes run it, its tensors read in (``checking.models.load``:
    an ``onnx_ir`` model's external tensors come from the folder each was loaded from)."""
    return models.load(model).proto


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
    return models.with_outputs(original, names), models.with_outputs(converted, names), names


Run = Callable[[onnx.ModelProto, Mapping[str, np.ndarray]], dict[str, np.ndarray]]


def compare(original: onnx.ModelProto, converted: onnx.ModelProto, seed: int = 0
            ) -> dict[str, Any]:
    """Bitwise comparison of the outputs and of every Q/DQ result;
    ``{"ok": bool, "runtimes": {name: "identical" | reason}}``.

    A final-output difference with bit-identical Q/DQ results is reported but does not fail:
    numpy's MatMul rounds differently on a transposed view, and onnxruntime's float16 MatMul
    was seen to differ by one ulp on identical inputs held in different buffers.
    """
    feeds, _ = inputs.generate(original, seed=seed)
    checker = _checker(converted)
    if checker != "ok" and _checker(original) != "ok":
        checker = "skipped: the original fails onnx.checker too"
    qdq_made = {o for n in original.graph.node
                if n.op_type in ("DequantizeLinear", "QuantizeLinear") for o in n.output[:1]}
    qdq_final = [i for i, v in enumerate(original.graph.output) if v.name in qdq_made]
    original, converted, extra = with_qdq_outputs(original, converted)
    n_final = len(original.graph.output) - len(extra)
    result: dict[str, Any] = {"ok": True, "runtimes": {}, "inputs_seed": seed}
    # onnxruntime gets the models as every check hands them to it (IR version lowered to
    # what their opsets need when it loads no higher; the graph untouched).
    ort_original, note = models.for_ort(original)
    ort_converted, note_converted = models.for_ort(converted)
    notes = [f"{label}: {n}" for label, n in (("the original", note),
                                               ("the converted model", note_converted)) if n]
    if notes:
        result["notes"] = notes
    compared = 0
    reference_agrees = False
    runs: list[tuple[str, Run, onnx.ModelProto, onnx.ModelProto]] = [
        (REFERENCE, runners.run_reference, original, converted),
        (ORT, runners.run_ort, ort_original, ort_converted)]
    for name, run, model_a, model_b in runs:
        try:
            a = list(run(model_a, feeds).values())
        except runners.RuntimeFailure as e:  # the original does not run there: skip it
            result["runtimes"][name] = f"skipped: original does not run ({e})"
            continue
        try:
            b = list(run(model_b, feeds).values())
        except runners.RuntimeFailure as e:
            unsupported = _unsupported(e, converted) if name == ORT else None
            if unsupported and reference_agrees:
                # The runtime lacks the target opset / IR version / kernel: that says
                # nothing about the conversion, which the reference evaluator checked.
                result["runtimes"][name] = f"skipped ({unsupported})"
            else:
                result["runtimes"][name] = ("FAILED: the converted model does not run "
                                            f"({e})")
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
        if name == REFERENCE:
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
    """The check as lines a person reads: one per runtime, the notes, then onnx.checker."""
    lines = [f"{name}: {text}" for name, text in check.get("runtimes", {}).items()]
    lines += [f"note: {n}" for n in check.get("notes", ())]
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


def _unsupported(e: runners.RuntimeFailure, model: onnx.ModelProto) -> str | None:
    """What onnxruntime lacks, when that (not the model) is why it cannot run it."""
    text = e.detail
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
        return f"FAILED: {one_line(e)}"
