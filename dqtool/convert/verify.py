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

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from dqtool.checking import inputs, models, runners
from dqtool.messages import one_line

REFERENCE = "dqtool.reference_evaluator"
ORT = f"onnxruntime (CPU, {runners.ORT_LEVEL})"


def loaded(model: ir.Model | onnx.ModelProto | str | os.PathLike) -> models.Loaded:
    """The model as the runtimes run it: an in-memory model with its tensors read into the
    protobuf; a model file with its external tensors left in their files (onnxruntime reads
    them from the folder, the reference evaluator memory-maps them)."""
    return models.load(model, in_files=True)


def with_qdq_outputs(original: onnx.ModelProto, converted: onnx.ModelProto
                     ) -> tuple[onnx.ModelProto, onnx.ModelProto, list[str]]:
    """Both models with every main-graph Q/DQ result of the original as an extra output
    (conversion keeps those names), so the Q/DQ values themselves are compared, not only
    what a MatMul made of them."""
    produced = {o for n in converted.graph.node for o in n.output}
    outputs = {v.name for v in original.graph.output}
    names = [o for n in original.graph.node
             if n.op_type in ("DequantizeLinear", "QuantizeLinear") for o in n.output[:1]
             if o in produced and o not in outputs]
    return models.with_outputs(original, names), models.with_outputs(converted, names), names


# Every Q/DQ result is an extra output of one run while they total at most this many bytes;
# past it only the final outputs are compared (onnxruntime holds every graph output of a run
# to its end: a 2.4 GB model's dequantized weights took 12 GB).
QDQ_MAX_BYTES = 1 << 30


def _first_difference(names: list[str], a: dict[str, np.ndarray],
                      b: dict[str, np.ndarray]) -> str | None:
    for name in names:
        x, y = a[name], b[name]
        if x.dtype != y.dtype or x.shape != y.shape:
            return f"{name}: {x.dtype}{x.shape} against {y.dtype}{y.shape}"
        if x.tobytes() != y.tobytes():
            diff = np.count_nonzero(x.view(np.uint8) != y.view(np.uint8))
            return f"{name}: {diff} bytes differ"
    return None


Open = Callable[[onnx.ModelProto, Path | None], runners.Session]


def compare(original_model: models.Loaded | onnx.ModelProto,
            converted_model: models.Loaded | onnx.ModelProto, seed: int = 0
            ) -> dict[str, Any]:
    """Bitwise comparison of the outputs and of every Q/DQ result;
    ``{"ok": bool, "runtimes": {name: "identical" | reason}}``.

    A final-output difference with bit-identical Q/DQ results is reported but does not fail:
    onnxruntime's float16 MatMul was seen to differ by one ulp on identical inputs held in
    different buffers. Models whose tensors stay in their files (``models.Loaded``) are run
    from there, one session at a time.
    """
    if isinstance(original_model, onnx.ModelProto):
        original_model = models.load(original_model)
    if isinstance(converted_model, onnx.ModelProto):
        converted_model = models.load(converted_model)
    original, converted = original_model.proto, converted_model.proto
    feeds, _ = inputs.generate(original, seed=seed)
    checker = _checker(converted_model)
    if checker != "ok" and _checker(original_model) != "ok":
        checker = "skipped: the original fails onnx.checker too"
    finals = [v.name for v in original.graph.output]
    qdq_made = sorted(o for n in original.graph.node
                      if n.op_type in ("DequantizeLinear", "QuantizeLinear")
                      for o in n.output[:1])
    held = models.qdq_value_bytes(original)
    notes = []
    if held <= QDQ_MAX_BYTES:
        original, converted, extra = with_qdq_outputs(original, converted)
    else:
        extra = []
        notes.append(f"Q/DQ results not compared one by one (about {held / 2**30:.1f} GiB "
                     "of values): the final outputs are compared, strictly")
    qdq_names = extra + [name for name in finals if name in set(qdq_made)]
    # A final difference is excused only when every Q/DQ result of the original was
    # compared (and found identical): a partial set vouches for nothing downstream.
    all_qdq_compared = set(qdq_made) <= set(qdq_names)
    result: dict[str, Any] = {"ok": True, "runtimes": {}, "inputs_seed": seed}
    # onnxruntime gets the models as every check hands them to it (IR version lowered to
    # what their opsets need when it loads no higher; the graph untouched).
    ort_original, note = models.for_ort(original)
    ort_converted, note_converted = models.for_ort(converted)
    notes[:0] = [f"{label}: {n}" for label, n in (("the original", note),
                                                   ("the converted model", note_converted))
                 if n]
    if notes:
        result["notes"] = notes
    compared = 0
    reference_agrees = False
    runtimes: list[tuple[str, Open, onnx.ModelProto, onnx.ModelProto]] = [
        (REFERENCE, runners.reference_session, original, converted),
        (ORT, runners.ort_session, ort_original, ort_converted)]
    too_big = models.reference_too_big(original)
    for name, open_session, model_a, model_b in runtimes:
        if name == REFERENCE and too_big:
            result["runtimes"][name] = f"skipped: {too_big}"
            continue
        # One session at a time: a large model's weights are held once, not twice.
        try:
            got_a = open_session(model_a, original_model.external_dir)(feeds, None)
        except runners.RuntimeFailure as e:  # the original does not run there: skip it
            result["runtimes"][name] = f"skipped: original does not run ({e})"
            continue
        try:
            got_b = open_session(model_b, converted_model.external_dir)(feeds, None)
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
        final_diff = _first_difference(finals, got_a, got_b)
        qdq_diff = _first_difference(qdq_names, got_a, got_b)
        del got_a, got_b
        compared += 1
        if qdq_diff:
            text, ok = f"DIFFERENT Q/DQ result: {qdq_diff}", False
        elif final_diff and not (qdq_names and all_qdq_compared):
            # No complete set of Q/DQ results vouches for the inputs of the ops that differ.
            text, ok = f"DIFFERENT: {final_diff}", False
        elif final_diff:
            # Identical Q/DQ results, so the ops after them differ on identical inputs
            # (onnxruntime's float16 MatMul on a differently placed buffer): not the
            # conversion's doing.
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
    """What onnxruntime lacks, when that (not the model) is why it cannot run it: from the
    installed runtime's probed profile, else from its message."""
    from dqtool.runtimes import onnxruntime as ort_facts

    why = ort_facts.why_cannot_run(model)
    if why:
        return why
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


def _checker(model: models.Loaded) -> str:
    try:
        # Past 2 GB onnx's checker must read the file itself.
        onnx.checker.check_model(model.proto if model.external_dir is None
                                 else str(model.path), full_check=True)
        return "ok"
    except Exception as e:
        return f"FAILED: {one_line(e)}"
