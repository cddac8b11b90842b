"""``dqtool.check``: validate a model, or a conversion against its original.

Alone, a model is checked structurally (onnx's checker, dqtool's rules) and numerically
(every DequantizeLinear on onnxruntime against the kernel, bit for bit). With ``against``,
both models run on the same seeded inputs on onnxruntime and on dqtool's reference
evaluator, and every output is compared (statistics in ``dqtool.checking.compare``).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np
import onnx_ir as ir

from dqtool import registry
from dqtool.checking import against as against_mod
from dqtool.checking import bounded, deployed, faithful, path_deviations, runners, selfcheck
from dqtool.checking import inputs as inputs_mod
from dqtool.checking.compare import OutputComparison
from dqtool.checking.models import KEEP_IN_FILES_BYTES, Loaded, ModelLike, load
from dqtool.checking.report import CheckReport
from dqtool.errors import InputError, UsageError


def check(
    model_or_path: ModelLike,
    *,
    against: ModelLike | None = None,
    rtol: float = 0.0,
    atol: float = 0.0,
    seed: int = 0,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    inputs: Mapping[str, np.ndarray] | None = None,
    accept_nonfinite: bool = False,
    runtime: str = "onnxruntime",
) -> CheckReport:
    """Check a model alone, or against the model it was converted from.

    ``shapes`` gives an input's shape by its name, or a symbolic dimension's size by its
    name; other unknown dimensions are 1. ``inputs`` gives feeds by name (the rest are
    generated from ``seed``). Tolerances apply to ``against`` comparisons; per-node checks
    are always bit-exact. An output NaN or ±inf in every element of both models compared
    nothing and fails, unless ``accept_nonfinite``. ``runtime``: ``onnxruntime`` (CPU), or a
    deployment runtime (``qnn-htp``, ``openvino``: ``deployed``), run beside the reference
    evaluator; a deployment runtime's outputs are measured in quantization steps and
    reported, never judged (alone: against the reference evaluator's). Raises
    ``InputError``/``UsageError`` for unreadable models or inputs that do not fit.
    """
    _refuse_bad_options(rtol, atol, seed)
    deployed.refuse_unknown(runtime)
    loaded = load(model_or_path, keep_over=KEEP_IN_FILES_BYTES)
    try:
        feeds, defaulted = inputs_mod.generate(loaded.proto, seed=seed, shapes=shapes,
                                               given=inputs)
    except InputError as e:
        raise InputError(f"{loaded.name}: {e}") from None
    given = set(inputs or {})
    bounds = inputs_mod.index_bounds(loaded.proto)
    specs = {sp.name: sp for sp in inputs_mod.model_inputs(loaded.proto)}
    feed_info = {k: {"shape": list(v.shape),
                     "dtype": "string" if v.dtype.kind in "OUS" else str(v.dtype),
                     "source": "given" if k in given else "generated",
                     **({} if k in given else {"values": inputs_mod.describe_values(
                         specs[k].type_name, bounds.get(k))})}
                 for k, v in feeds.items()}
    notes: list[str] = [n for n in (loaded.note(),) if n]
    first = runners.ort_runtime() if runtime == "onnxruntime" else deployed.describe(runtime)
    common = {"runtimes": (first, runners.reference_runtime()),
              "seed": seed, "rtol": rtol, "atol": atol, "inputs": feed_info,
              "defaulted_dims": tuple(defaulted)}
    if against is not None:
        other = load(against, keep_over=KEEP_IN_FILES_BYTES)
        report = _against(loaded, other, feeds, rtol, atol, notes, common, runtime)
        return _accepting(report) if accept_nonfinite else report
    report = _alone(loaded, feeds, notes, common)
    if runtime == "onnxruntime":
        return report
    return replace(report, comparisons=(deployed_alone(loaded, feeds, runtime, notes),))


def _accepting(report: CheckReport) -> CheckReport:
    """Outputs that compared nothing (NaN or ±inf everywhere in both) pass, as asked."""
    return replace(report, comparisons=tuple(
        replace(c, outputs=tuple(replace(o, nonfinite_accepted=True).judge(o.rtol, o.atol)
                                 for o in c.outputs)) for c in report.comparisons))


def _refuse_bad_options(rtol: float, atol: float, seed: int) -> None:
    for label, tol in (("--rtol", rtol), ("--atol", atol)):
        if not tol >= 0:  # also refuses NaN, which would fail every comparison
            raise UsageError(f"{label} must be a non-negative number, got {tol}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise UsageError(f"--seed must be a non-negative integer, got {seed!r}")


def _alone(loaded: Loaded, feeds: dict[str, np.ndarray], notes: list[str],
           common: dict[str, Any]) -> CheckReport:
    """``check MODEL``: each Q/DQ node (and each family's node) against the kernel."""
    model = loaded.ir_model()
    sites = selfcheck.quant_sites(model)
    structure = _structure(loaded, model, sites)
    nodes = selfcheck.numeric(loaded.proto, model, sites, feeds, notes,
                              external_dir=loaded.external_dir)
    # Operators that are not Q/DQ (the integer ones): their family checks them.
    for support in registry.check_supports():
        if support.numeric is not None:
            nodes += support.numeric(loaded.proto, model, feeds, notes,
                                     external_dir=loaded.external_dir)
    if not nodes:
        notes.append("the model has no DequantizeLinear, fused or integer operator node: nothing "
                     "to compare")
    return CheckReport(input=loaded.name, against=None, structure=structure,
                       nodes=tuple(nodes), notes=tuple(notes), **common)


def _against(loaded: Loaded, other_loaded: Loaded, feeds: dict[str, np.ndarray],
             rtol: float, atol: float, notes: list[str], common: dict[str, Any],
             runtime: str = "onnxruntime") -> CheckReport:
    """``check MODEL --against ORIGINAL``: both models' outputs, and each family's
    weights, bounds and rewritten operators."""
    name, proto = loaded.name, loaded.proto
    other_name, other = other_loaded.name, other_loaded.proto
    if other_loaded.note():
        notes.append(other_loaded.note())
    mine = {s.name: s for s in inputs_mod.model_inputs(proto)}
    theirs = {s.name: s for s in inputs_mod.model_inputs(other)}
    if _signature(mine) != _signature(theirs):
        raise InputError(f"{name} and {other_name} take different inputs: "
                         f"{_describe(mine)} vs {_describe(theirs)}")
    # A family's rewritten nodes, each run alone on the original's inputs.
    per_op = [e for support in registry.check_supports() if support.per_op
              for e in support.per_op(proto, other, feeds, other_loaded.external_dir)]
    ir_models = _IrModels()
    keep = _bound_values(loaded, other_loaded, ir_models) if runtime == "onnxruntime" \
        else {}
    kept: dict[int, dict[str, np.ndarray]] = {}
    weights: list[Any] = []
    bounds: list[Any] = []
    exposed: dict[str, Any] = {}

    def bound(compared: against_mod.RuntimeComparison) -> None:
        # beside the reference evaluator's runs and the weights' comparison, at LLM size
        got, moved = _family_bounds(loaded, other_loaded, feeds, [compared], kept,
                                    ir_models)
        bounds.extend(got)
        exposed.update(moved)

    comparisons = against_mod.compare_models(
        proto, other, feeds, rtol=rtol, atol=atol, notes=notes,
        model_dir=loaded.external_dir, original_dir=other_loaded.external_dir,
        range_steps=any(e.comparison is not None for e in per_op), runtime=runtime,
        keep=keep, kept=kept,
        meanwhile=lambda: weights.extend(_family_weights(loaded, other_loaded, ir_models)),
        after_runtime=bound if runtime == "onnxruntime" else None)
    note = bounded.kept_note(kept, keep, {id(proto): name, id(other): other_name},
                             bounded.bound_kind()) if bounds else ""
    notes += [note] if note else []
    kept.clear()  # the kept values, freed
    if bounds:
        comparisons = bounded.apply(
            comparisons, weights, bounds, notes, exposed,
            drift_cause=lambda: runners.roundings_skipped_cause(
                [(name, proto, loaded.external_dir),
                 (other_name, other, other_loaded.external_dir)]),
            kind="/".join(dict.fromkeys(s.kind for s in registry.check_supports() if s.kind)))
    comparisons = faithful.apply(comparisons, per_op, notes)
    found = path_deviations.applicable(proto, other)
    if found:
        comparisons = path_deviations.keep_out(comparisons, found, notes)
        notes += path_deviations.own_distance(other, feeds)
    optimized = next((r for support in registry.check_supports() if support.optimized_run
                      for r in [support.optimized_run(proto, other, feeds)] if r is not None),
                     None)
    return CheckReport(input=name, against=other_name, comparisons=tuple(comparisons),
                       notes=tuple(notes), weights=tuple(weights), bounds=tuple(bounds),
                       per_op=tuple(per_op), optimized_run=optimized,
                       structure=_checked_structure(loaded, other_loaded), **common)


def _sides(support: registry.CheckSupport, loaded: Loaded, other_loaded: Loaded
           ) -> tuple[Loaded, Loaded]:
    """(checked, original) as the family's hooks take them: the original is the model
    holding the family's nodes, unless only the checked model holds them (a conversion
    into them, as `pack` makes: the two swap places)."""
    if support.holds_weights is None or support.holds_weights(other_loaded.proto) or not \
            support.holds_weights(loaded.proto):
        return loaded, other_loaded
    return other_loaded, loaded


def _bound_values(loaded: Loaded, other_loaded: Loaded, ir_model: _IrModels
                  ) -> dict[int, list[str]]:
    """What the comparison's onnxruntime runs keep for the families' bounds, at LLM size
    (a model that streams: each run of a converted model is onnxruntime dequantizing
    every weight, 27 s of the bench model's check, docs/benchmarks.md 2026-11-28); a run
    keeps them while they fit ``against.KEEP_BYTES``, else the bounds run it again."""
    keep: dict[int, list[str]] = {}
    if not (runners.streams(loaded.proto) or runners.streams(other_loaded.proto)):
        return keep
    for support in registry.check_supports():
        if support.bound_values is None or support.bounds is None:
            continue
        checked, original = _sides(support, loaded, other_loaded)
        for key, names in support.bound_values(checked.proto, original.proto,
                                               ir_model(original)).items():
            keep.setdefault(key, []).extend(names)
    return keep


class _IrModels:
    """Each side's ``ir.Model``, deserialized once whichever family (or thread) asks."""

    def __init__(self) -> None:
        self.models: dict[int, ir.Model] = {}
        self.lock = threading.Lock()

    def __call__(self, side: Loaded) -> ir.Model:
        with self.lock:
            if id(side) not in self.models:
                self.models[id(side)] = side.ir_model()
            return self.models[id(side)]


def _family_weights(loaded: Loaded, other_loaded: Loaded, ir_model: _IrModels
                    ) -> list[Any]:
    """Each family's weights compared: those of the model holding its nodes (``_sides``),
    whose nodes are then compared with the other's in their place."""
    weights: list[Any] = []
    for support in registry.check_supports():
        if support.holds_weights is None or support.weights is None:
            continue
        checked, original = _sides(support, loaded, other_loaded)
        weights += support.weights(ir_model(checked), ir_model(original))
    return weights


def _family_bounds(loaded: Loaded, other_loaded: Loaded, feeds: dict[str, np.ndarray],
                   comparisons: list[OutputComparison],
                   kept: dict[int, dict[str, np.ndarray]], ir_model: _IrModels
                   ) -> tuple[list[Any], dict[str, Any]]:
    """Each family's bounds, where onnxruntime's outputs differ (``bounded``), and each
    output's difference in the runs they read."""
    bounds: list[Any] = []
    exposed: dict[str, Any] = {}
    if not bounded.needs_bounds(comparisons):
        return bounds, exposed
    for support in registry.check_supports():
        if support.holds_weights is None or support.bounds is None:
            continue
        checked, original = _sides(support, loaded, other_loaded)
        got = support.bounds(checked.proto, original.proto, ir_model(checked),
                             ir_model(original), feeds, checked.external_dir,
                             original.external_dir, ran=kept)
        exposed.update(getattr(got, "exposed", {}))
        bounds += got
    return bounds, exposed


def _checked_structure(loaded: Loaded, other_loaded: Loaded) -> selfcheck.Structure:
    """The checked model must be valid too: a runtime may run a model the standard
    forbids (onnxruntime ran a DequantizeLinear-13 with a float16 scale). A failure the
    original has too is shown and not counted."""
    model = loaded.ir_model()
    structure = _structure(loaded, model, selfcheck.quant_sites(model))
    if not structure.valid:
        theirs = other_loaded.ir_model()
        original = _structure(other_loaded, theirs, selfcheck.quant_sites(theirs))
        if not original.valid:
            structure = replace(structure, inherited=original.first_problem())
    return structure


def _structure(loaded: Loaded, model: ir.Model, sites: list) -> selfcheck.Structure:
    # Past protobuf's limit onnx's checker must read the file itself.
    return selfcheck.structure(loaded.proto, sites + selfcheck.family_spec_sites(model),
                               loaded.path if loaded.external_dir is not None else None)


def _signature(specs: dict[str, inputs_mod.InputSpec]) -> dict[str, tuple]:
    # Symbolic names may differ between a model and its conversion; fixed sizes may not.
    return {k: (s.type_name, tuple(d if isinstance(d, int) else None for d in s.dims))
            for k, s in specs.items()}


def _describe(specs: dict[str, inputs_mod.InputSpec]) -> str:
    return ", ".join(f"{k} {s.type_name}{list(s.dims)}" for k, s in sorted(specs.items())) \
        or "none"


__all__ = ["CheckReport", "OutputComparison", "check"]


def deployed_alone(loaded: Loaded, feeds: dict[str, np.ndarray], runtime: str,
                   notes: list[str]) -> against_mod.RuntimeComparison:
    """``check MODEL --runtime R``: the model on a deployment runtime against the reference
    evaluator's run of it, each output in quantization steps; reported, not judged."""
    ref = (loaded.proto, loaded.external_dir)

    def run(model: Any, f: Any, d: Any, *, on_reference: bool = False) -> dict:
        if on_reference:
            return runners.run_reference(model, f, external_dir=d)
        return deployed.run(runtime, model, f, d)

    comparison = against_mod.compare_runs(
        runtime, lambda m, f, d: run(m, f, d), lambda m, f, d: run(m, f, d, on_reference=True),
        ref, feeds, notes)
    return replace(comparison, judged=False)
