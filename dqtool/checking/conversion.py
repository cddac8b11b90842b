"""``--check`` of a conversion: the converted model must compute bit-identical outputs to
the original.

Both models run on the same seeded inputs (``checking.inputs``) in dqtool's reference
evaluator (every Q/DQ dialect, our kernel) and, where it loads both, onnxruntime CPU with
every graph optimization off (``checking.runners``). Outputs are compared as bytes, so NaN
payloads and signed zeros count too.

The policy is this module's own: every main-graph Q/DQ result of the original is compared
too (conversion keeps those names); a final-output difference is tolerated only when every
Q/DQ result compared bit-identical (and says so); a runtime that lacks the target opset /
IR version / kernel is skipped only when the reference evaluator agreed.
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import onnx
import onnx_ir as ir

from dqtool import registry
from dqtool.checking import against, bounded, inputs, models, path_deviations, runners
from dqtool.checking.compare import max_abs_difference
from dqtool.messages import one_line
from dqtool.runtimes import onnxruntime as ort_facts

REFERENCE = "dqtool.reference_evaluator"
ORT = f"onnxruntime (CPU, {runners.ORT_LEVEL})"

# Every Q/DQ result is an extra output of one run while they total at most this many bytes;
# past it only the final outputs are compared (onnxruntime holds every graph output of a run
# to its end: a 2.4 GB model's dequantized weights took 12 GB).
QDQ_MAX_BYTES = 1 << 30

Status = Literal["identical", "tolerated", "different", "failed", "skipped"]


@dataclass(frozen=True)
class RuntimeVerdict:
    """What one runtime said: ``text`` is the line a person reads ("identical",
    "skipped: …", "DIFFERENT: …"), ``status`` the verdict a program reads."""

    runtime: str
    status: Status
    text: str

    @property
    def passed(self) -> bool:
        return self.status in ("identical", "tolerated", "skipped")

    @property
    def compared(self) -> bool:
        return self.status in ("identical", "tolerated", "different")


@dataclass(frozen=True)
class ConversionCheck:
    verdicts: tuple[RuntimeVerdict, ...]
    checker: str  # "ok", "FAILED: …" or "skipped: …" (onnx.checker on the converted model)
    checker_passed: bool
    seed: int
    notes: tuple[str, ...] = ()

    @property
    def compared(self) -> bool:
        return any(v.compared for v in self.verdicts)

    @property
    def error(self) -> str | None:
        return None if self.compared else \
            "no runtime could run both models, so nothing was compared"

    @property
    def ok(self) -> bool:
        return self.compared and self.checker_passed and all(v.passed for v in self.verdicts)

    @property
    def runtimes(self) -> dict[str, str]:
        return {v.runtime: v.text for v in self.verdicts}

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"ok": self.ok, "runtimes": self.runtimes,
                               "inputs_seed": self.seed}
        if self.notes:
            doc["notes"] = list(self.notes)
        if self.error:
            doc["error"] = self.error
        doc["checker"] = self.checker
        return doc

    def describe(self) -> list[str]:
        """As lines a person reads: one per runtime, the notes, then onnx.checker."""
        lines = [f"{v.runtime}: {v.text}" for v in self.verdicts]
        lines += [f"note: {n}" for n in self.notes]
        if self.error:
            lines.append(self.error)
        return [*lines, f"onnx.checker: {self.checker}"]

    def failures(self) -> str:
        """Why the check failed, in one line."""
        bad = [f"{v.runtime}: {v.text}" for v in self.verdicts if not v.passed]
        if self.error:
            bad.append(self.error)
        if not self.checker_passed:
            bad.append(f"onnx.checker: {self.checker}")
        return "; ".join(bad) or "no runtime compared the models"


def loaded(model: ir.Model | onnx.ModelProto | str | os.PathLike) -> models.Loaded:
    """The model as the runtimes run it: an in-memory model with its tensors read into the
    protobuf; a model file with its external tensors left in their files (onnxruntime reads
    them from the folder, the reference evaluator memory-maps them)."""
    return models.load(model, in_files=True)


def _qdq_results(proto: onnx.ModelProto) -> list[str]:
    return [o for n in proto.graph.node if n.op_type in ("DequantizeLinear", "QuantizeLinear")
            for o in n.output[:1]]


def with_qdq_outputs(original: onnx.ModelProto, converted: onnx.ModelProto
                     ) -> tuple[onnx.ModelProto, onnx.ModelProto, list[str]]:
    """Both models with every main-graph Q/DQ result of the original as an extra output
    (conversion keeps those names), so the Q/DQ values themselves are compared, not only
    what a MatMul made of them."""
    produced = {o for n in converted.graph.node for o in n.output}
    outputs = {v.name for v in original.graph.output}
    names = [o for o in _qdq_results(original) if o in produced and o not in outputs]
    return models.with_outputs(original, names), models.with_outputs(converted, names), names


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


@dataclass
class _Plan:
    """The two models as each runtime gets them, and which outputs say what."""

    original: models.Loaded
    converted: models.Loaded
    runs: list[tuple[str, Open, onnx.ModelProto, onnx.ModelProto]]
    finals: list[str]
    qdq_names: list[str]
    all_qdq_compared: bool
    notes: list[str]
    kept_note: str = ""  # where the bounds read their values (``bounded.kept_note``)


def _plan(original_model: models.Loaded, converted_model: models.Loaded) -> _Plan:
    original, converted = original_model.proto, converted_model.proto
    finals = [v.name for v in original.graph.output]
    qdq_made = sorted(_qdq_results(original))
    held = models.qdq_value_bytes(original)
    notes: list[str] = []
    if held <= QDQ_MAX_BYTES:
        original, converted, extra = with_qdq_outputs(original, converted)
    else:
        extra = []
        notes.append(f"Q/DQ results not compared one by one (about {held / 2**30:.1f} GiB "
                     "of values): the final outputs are compared, strictly")
    qdq_names = extra + [name for name in finals if name in set(qdq_made)]
    # onnxruntime gets the models as every check hands them to it (IR version lowered to
    # what their opsets need when it loads no higher; the graph untouched).
    ort_original, note = models.for_ort(original)
    ort_converted, note_converted = models.for_ort(converted)
    notes[:0] = [f"{label}: {n}" for label, n in (("the original", note),
                                                   ("the converted model", note_converted))
                 if n]
    return _Plan(original_model, converted_model,
                 [(REFERENCE, runners.reference_session, original, converted),
                  (ORT, runners.ort_session, ort_original, ort_converted)],
                 finals, qdq_names,
                 # A final difference is excused only when every Q/DQ result of the
                 # original was compared (and found identical): a partial set vouches for
                 # nothing downstream.
                 set(qdq_made) <= set(qdq_names), notes)


def compare(original_model: models.Loaded | onnx.ModelProto,
            converted_model: models.Loaded | onnx.ModelProto, seed: int = 0
            ) -> ConversionCheck:
    """Bitwise comparison of the outputs and of every Q/DQ result, on each runtime.

    A final-output difference with bit-identical Q/DQ results is reported but does not fail:
    onnxruntime's float16 MatMul was seen to differ by one ulp on identical inputs held in
    different buffers. Models whose tensors stay in their files (``models.Loaded``) are run
    from there, one session at a time.
    """
    if isinstance(original_model, onnx.ModelProto):
        original_model = models.load(original_model)
    if isinstance(converted_model, onnx.ModelProto):
        converted_model = models.load(converted_model)
    feeds, _ = inputs.generate(original_model.proto, seed=seed)
    checker, checker_passed = _checker(converted_model)
    if not checker_passed and not _checker(original_model)[1]:
        checker, checker_passed = "skipped: the original fails onnx.checker too", True
    plan = _plan(original_model, converted_model)
    runs: dict[str, _Runs] = {}
    ran: dict[int, dict[str, np.ndarray]] = {}
    if runners.streams(plan.original.proto) or runners.streams(plan.converted.proto):
        # At LLM size as ``check --against`` does (docs/benchmarks.md, 2026-11-28): the
        # runtimes side by side, the weights compared meanwhile, onnxruntime's runs keeping
        # what the bounds read.
        (ref_name, ref_open, ref_a, ref_b), (ort_name, _, ort_a, ort_b) = plan.runs
        keep = _bound_values(plan, ort_a, ort_b)
        stop = threading.Event()  # set when this thread fails: onnxruntime ends early
        with concurrent.futures.ThreadPoolExecutor(1, "dqtool-ort") as pool:
            pending = pool.submit(_runs, _beside(keep, stop), ort_a, ort_b, plan, feeds)
            try:
                runs[ref_name] = _runs(ref_open, ref_a, ref_b, plan, feeds)
                held, tolerated, kind = _held_weights(plan)
            except BaseException:
                stop.set()
                raise
            runs[ort_name] = pending.result()
        got_a, got_b = runs[ort_name]
        if keep and isinstance(got_a, dict) and isinstance(got_b, dict):
            ran = {id(plan.original.proto): got_a, id(plan.converted.proto): got_b}
            plan.kept_note = bounded.kept_note(
                {id(ort_a): got_a, id(ort_b): got_b}, keep,
                {id(ort_a): "the original", id(ort_b): "the converted model"},
                bounded.bound_kind())
    else:
        held, tolerated, kind = _held_weights(plan)
        for name, open_session, model_a, model_b in plan.runs:
            runs[name] = _runs(open_session, model_a, model_b, plan, feeds)
    verdicts: list[RuntimeVerdict] = []
    for name, _, _, model_b in plan.runs:
        reference_agrees = any(v.runtime == REFERENCE and v.status in ("identical",
                                                                       "tolerated")
                               for v in verdicts)
        verdicts.append(_on(name, runs[name], model_b, plan, feeds, reference_agrees, held,
                            tolerated, kind, ran))
    return ConversionCheck(tuple(verdicts), checker, checker_passed, seed, tuple(plan.notes))


# A runtime's runs of the original and of the converted model: each its outputs, or why it
# could not run (the converted model is not run when the original cannot be)
_Runs = tuple[dict[str, np.ndarray] | runners.RuntimeFailure,
              dict[str, np.ndarray] | runners.RuntimeFailure | None]


def _runs(open_session: Open, model_a: onnx.ModelProto, model_b: onnx.ModelProto,
          plan: _Plan, feeds: dict[str, np.ndarray]) -> _Runs:
    # One session at a time: a large model's weights are held once, not twice.
    try:
        got_a = open_session(model_a, plan.original.external_dir)(feeds, None)
    except runners.RuntimeFailure as e:
        return e, None
    try:
        return got_a, open_session(model_b, plan.converted.external_dir)(feeds, None)
    except runners.RuntimeFailure as e:
        return got_a, e


def _bound_values(plan: _Plan, ort_a: onnx.ModelProto, ort_b: onnx.ModelProto
                  ) -> dict[int, list[str]]:
    """The values the families' bounds read, by ``id`` of the protos onnxruntime runs."""
    keep: dict[int, list[str]] = {}
    for s in registry.check_supports():
        if s.bound_values is None or s.holds_weights is None or \
                not s.holds_weights(plan.original.proto):
            continue
        names = s.bound_values(plan.converted.proto, plan.original.proto,
                               plan.original.ir_model())
        keep.setdefault(id(ort_a), []).extend(names.get(id(plan.original.proto), []))
        keep.setdefault(id(ort_b), []).extend(names.get(id(plan.converted.proto), []))
    return keep


def _beside(keep: dict[int, list[str]], stop: threading.Event) -> Open:
    """onnxruntime's sessions beside the reference evaluator's runs, keeping ``keep``."""
    def open_session(model: onnx.ModelProto, external_dir: Path | None) -> runners.Session:
        def run(feeds: Any, outputs: Any = None) -> dict[str, np.ndarray]:
            return runners.run_ort_beside(model, feeds, keep.get(id(model), ()),
                                          against.KEEP_BYTES, external_dir, stop)
        return run

    return open_session


def _beyond_bounds(plan: _Plan, feeds: dict[str, np.ndarray],
                   got_a: dict[str, np.ndarray], got_b: dict[str, np.ndarray],
                   ran: dict[int, dict[str, np.ndarray]] | None = None) -> str:
    """Why onnxruntime's final differences are not its rounding: the original's
    weight-holding nodes beyond the family's rounding bound (``CheckSupport.bounds``) or
    not bounded at all (outside a subgraph or function, which no run can expose), or final
    outputs that differ otherwise when the nodes' values are exposed (the runs behind the
    bounds) for no reason onnxruntime's own graph gives (``runners.roundings_skipped_cause``: then
    the notes say so); "" when none."""
    bad: list[str] = []
    drift: list[str] = []
    if ran and plan.kept_note:
        plan.notes.append(plan.kept_note)
    for s in registry.check_supports():
        if s.bounds is None or s.holds_weights is None or \
                not s.holds_weights(plan.original.proto):
            continue
        got = s.bounds(plan.converted.proto, plan.original.proto,
                       plan.converted.ir_model(), plan.original.ir_model(), feeds,
                       plan.converted.external_dir, plan.original.external_dir, ran=ran)
        for b in got:
            if not b.passed or (b.status == "unbounded" and not getattr(b, "hidden", False)):
                bad.append(b.describe())
        for name, seen in getattr(got, "exposed", {}).items():
            if name in got_a and name in got_b:
                here = max_abs_difference(got_a[name], got_b[name])
                if here != seen:
                    drift.append(f"onnxruntime's {name} differs by {here:.6g} here, by "
                                 f"{seen:.6g} when the nodes' values are exposed")
    if drift:
        cause = runners.roundings_skipped_cause(
            [("the original", plan.original.proto, plan.original.external_dir),
             ("the converted model", plan.converted.proto, plan.converted.external_dir)])
        if cause:
            plan.notes.append(f"{drift[0]}, because {cause}")
        else:
            bad += drift
    return "; ".join(bad[:3])


def _held_weights(plan: _Plan) -> tuple[str | None, str, str]:
    """For an original whose families hold weights inside operators (a fused MatMul): ""
    when every such weight is bit-identical in the converted model (then the notes say
    so), else what differs; None without such nodes. Second: why outputs may still differ;
    third: what the families call such nodes (``CheckSupport.kind``)."""
    supports = [s for s in registry.check_supports() if s.weights is not None
                and s.holds_weights is not None and s.holds_weights(plan.original.proto)]
    if not supports:
        return None, "", ""
    kind = "/".join(dict.fromkeys(s.kind for s in supports if s.kind))
    for s in supports:
        weights = s.weights(plan.converted.ir_model(), plan.original.ir_model())
        bad = [w for w in weights if not w.same]
        if bad:
            return "; ".join(f"{w.node}: {w.status} ({w.detail})" for w in bad), "", kind
        plan.notes.append(f"{len(weights)} {s.weights_label} bit-identical in the converted "
                          "model")
    return "", "; ".join(s.tolerated for s in supports if s.tolerated), kind


def _on(name: str, runs: _Runs, model_b: onnx.ModelProto, plan: _Plan,
        feeds: dict[str, np.ndarray], reference_agrees: bool, held: str | None = None,
        tolerated: str = "", kind: str = "",
        ran: dict[int, dict[str, np.ndarray]] | None = None) -> RuntimeVerdict:
    got_a, got_b = runs
    if isinstance(got_a, runners.RuntimeFailure):  # the original does not run there
        return RuntimeVerdict(name, "skipped", f"skipped: original does not run ({got_a})")
    if not isinstance(got_b, dict):  # a failure (run only when the original ran)
        e = got_b if got_b is not None else runners.RuntimeFailure("not run")
        unsupported = _unsupported(e, model_b) if name == ORT else None
        if unsupported and reference_agrees:
            # The runtime lacks the target opset / IR version / kernel: that says nothing
            # about the conversion, which the reference evaluator checked.
            return RuntimeVerdict(name, "skipped", f"skipped ({unsupported})")
        return RuntimeVerdict(name, "failed", f"FAILED: the converted model does not run "
                              f"({e})")
    final_diff = _first_difference(plan.finals, got_a, got_b)
    qdq_diff = _first_difference(plan.qdq_names, got_a, got_b)
    if qdq_diff:
        return RuntimeVerdict(name, "different", f"DIFFERENT Q/DQ result: {qdq_diff}")
    kind = f"{kind} " if kind else ""
    if held:
        return RuntimeVerdict(name, "different", f"DIFFERENT {kind}weight: {held}")
    if final_diff and held == "" and name == ORT:
        # The weights held inside operators are bit-identical; onnxruntime's operator (a
        # fused MatMul, and its MatMul) rounds in its own ways, so outputs may differ: by
        # design, not the conversion's, when every such node is within its proven rounding
        # bound. The reference evaluator runs the operator as its ai.onnx decomposition,
        # so there a difference is the conversion's.
        beyond = _beyond_bounds(plan, feeds, got_a, got_b, ran)
        found = path_deviations.applicable(plan.original.proto, plan.converted.proto) \
            if beyond and reference_agrees else ()
        if found:  # this CPU's onnxruntime deviates there: the reference evaluator decides
            return RuntimeVerdict(name, "tolerated", f"{kind}weights identical; final "
                                  f"{final_diff}, beyond the rounding bound ({beyond}) "
                                  f"where {'; '.join(path_deviations.describe(found))} (a "
                                  "known deviation from the spec: the reference evaluator "
                                  "decides)")
        if beyond:
            return RuntimeVerdict(name, "different", f"DIFFERENT: final {final_diff}; "
                                  f"beyond the rounding bound: {beyond}")
        return RuntimeVerdict(name, "tolerated", f"{kind}weights identical; final "
                              f"{final_diff} ({tolerated}; every {kind}node within its "
                              "rounding bound)")
    if final_diff and not (plan.qdq_names and plan.all_qdq_compared):
        # No complete set of Q/DQ results vouches for the inputs of the ops that differ.
        return RuntimeVerdict(name, "different", f"DIFFERENT: {final_diff}")
    if final_diff and name == ORT:
        # Identical Q/DQ results fetched as outputs, yet the outputs differ: onnxruntime
        # reads a float16 value in float32 past the Cast that rounds it (a float16
        # DequantizeLinear lowered through float32, feeding a node with no float16 CPU
        # kernel), which fetching it hides. Its own graph says where; then the models do
        # not compute alike there, whatever the specification says.
        cause = runners.roundings_skipped_cause(
            [("the converted model", plan.converted.proto, plan.converted.external_dir)])
        if cause:
            return RuntimeVerdict(name, "different", f"DIFFERENT: final {final_diff}, "
                                  f"though the Q/DQ results are identical: {cause}")
    if final_diff:
        # Identical Q/DQ results, so the ops after them differ on identical inputs (the
        # reference's NumPy MatMul on a transposed view): not the conversion's doing.
        return RuntimeVerdict(name, "tolerated", f"Q/DQ results identical; final "
                              f"{final_diff} (downstream op rounding on identical inputs)")
    return RuntimeVerdict(name, "identical", "identical")


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


def _checker(model: models.Loaded) -> tuple[str, bool]:
    try:
        # Past 2 GB onnx's checker must read the file itself.
        onnx.checker.check_model(model.proto if model.external_dir is None
                                 else str(model.path), full_check=True)
        return "ok", True
    except Exception as e:
        return f"FAILED: {one_line(e)}", False
