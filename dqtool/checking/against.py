"""``check --against``: two models, the same inputs, every output compared on each runtime.

Both models run on onnxruntime (``ORT_DISABLE_ALL``) and on dqtool's reference evaluator;
on each runtime the checked model's outputs are compared with the original's. A runtime
that cannot run a model is reported with its reason and its comparison skipped, not failed:
onnxruntime lacks some dialects, the reference evaluator lacks other domains' ops (a
com.microsoft Gelu) and models onnx itself rejects (nodes out of topological order). The
check fails when a compared output differs, or when no runtime could compare at all.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from dqtool.checking import compare, deployed, float_steps, runners
from dqtool.checking.models import for_ort


@dataclass(frozen=True)
class RuntimeComparison:
    runtime: str  # "onnxruntime", "reference", or a deployment runtime (``deployed``)
    outputs: tuple[compare.OutputComparison, ...]
    skipped: str | None = None  # why nothing was compared on this runtime
    # False for a deployment runtime (``check --runtime``): its faithful arithmetic is
    # measured in quantization steps and reported; the verdict is the others'.
    judged: bool = True
    # Values inside the graph both models compute (same name), compared along the
    # original's node order: where the difference appears and grows. Reported, not judged;
    # on the reference runtime only (keeping a value changes nothing it computes).
    depth: tuple[DepthPoint, ...] = ()

    @property
    def passed(self) -> bool:
        """Nothing compared differs (a skipped runtime compared nothing)."""
        return all(o.passed for o in self.outputs)

    def judge(self, rtol: float, atol: float) -> RuntimeComparison:
        return replace(self, outputs=tuple(o.judge(rtol, atol) for o in self.outputs))

    def to_json(self) -> dict[str, Any]:
        return {"runtime": self.runtime, "passed": self.passed, "judged": self.judged,
                "skipped": self.skipped,
                "outputs": [o.to_json() for o in self.outputs],
                "depth": [d.to_json() for d in self.depth]}


@dataclass(frozen=True)
class DepthPoint:
    """One value both models compute, at ``position`` of the original's ``of`` nodes."""

    value: str
    position: int
    of: int
    comparison: compare.OutputComparison

    def to_json(self) -> dict[str, Any]:
        c = self.comparison
        return {"value": self.value, "position": self.position, "of": self.of,
                "max_abs": compare._num(c.max_abs), "max_rel": compare._num(c.max_rel),
                "mismatched": c.mismatched, "size": c.size, "histogram": c.histogram}


# Values compared along the depth of a model (``depth_probes``), at most.
DEPTH_POINTS = 48


def depth_probes(model: onnx.ModelProto, original: onnx.ModelProto) -> list[tuple[str, int]]:
    """(name, position in the original) of main-graph values both models make, not graph
    outputs, evenly spaced along the original's nodes (``DEPTH_POINTS`` at most)."""
    made = {o for n in model.graph.node for o in n.output if o}
    finals = {o.name for o in original.graph.output} | {o.name for o in model.graph.output}
    common = [(o, i) for i, n in enumerate(original.graph.node) for o in n.output[:1]
              if o and o in made and o not in finals]
    if len(common) <= DEPTH_POINTS:
        return common
    pick = np.linspace(0, len(common) - 1, DEPTH_POINTS).round().astype(int)
    return [common[i] for i in sorted(set(pick.tolist()))]


def explicable(o: compare.OutputComparison) -> bool:
    """An output beyond rtol/atol by its values alone (not a shape, a dtype, a NaN or a
    missing output), which a stated reason may tolerate. An output NaN or ±inf everywhere
    in both models is not: it differs in nothing, and fails for comparing nothing, which
    no reason excuses (a check of such a model ran onnxruntime's bounds for nothing)."""
    return not o.passed and o.failure is None and not o.nan_mismatches \
        and not o.compared_nothing


def tolerate(comparisons: Sequence[RuntimeComparison], reason: str,
             runtime: str | None = None) -> tuple[tuple[RuntimeComparison, ...], int]:
    """The comparisons with every ``explicable`` output (on ``runtime``, or on any)
    passed with ``reason``; and how many outputs that was."""
    out, count = [], 0
    for c in comparisons:
        if c.skipped is not None or runtime not in (None, c.runtime):
            out.append(c)
            continue
        outputs = tuple(replace(o, tolerated=reason).judge(o.rtol, o.atol)
                        if explicable(o) else o for o in c.outputs)
        count += sum(explicable(o) for o in c.outputs)
        out.append(replace(c, outputs=outputs))
    return tuple(out), count


Runner = Callable[[onnx.ModelProto, Mapping[str, np.ndarray], Path | None],
                  dict[str, np.ndarray]]


def _run_ort(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray],
             external_dir: Path | None, keep: Sequence[str] = (),
             stop: threading.Event | None = None) -> dict[str, np.ndarray]:
    return runners.run_ort_beside(for_ort(model)[0], feeds, keep, KEEP_BYTES,
                                  external_dir=external_dir, stop=stop)


# Bytes of values a comparison's onnxruntime run of a model may keep (``keep``): past them,
# the values are dropped, and whoever wanted them runs the model again
KEEP_BYTES = 256 << 20


def _run_ref(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray],
             external_dir: Path | None, probes: Sequence[str] = ()) -> dict[str, np.ndarray]:
    names = [o.name for o in model.graph.output]
    return runners.run_reference(model, feeds, [*names, *(p for p in probes
                                                          if p not in names)],
                                 external_dir=external_dir)


def output_steps(model: onnx.ModelProto) -> dict[str, float]:
    """The quantization step of each output that has one: 1 for an integer output; the
    scale of the DequantizeLinear (any domain) that produces a float output, when that scale
    is one constant element."""
    out: dict[str, float] = {}
    consts = {t.name: t for t in model.graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output}
    for o in model.graph.output:
        elem = o.type.tensor_type.elem_type
        if elem in _INTEGER_ELEMS:
            out[o.name] = 1.0
            continue
        n = producers.get(o.name)
        if n is None or n.op_type != "DequantizeLinear" or len(n.input) < 2:
            continue
        scale = consts.get(n.input[1])
        if scale is not None:
            arr = onnx.numpy_helper.to_array(scale)
            if arr.size == 1:
                out[o.name] = float(arr.reshape(()))
    return out


# Ops a float output may pass through after its last scaling without changing its step.
_STEP_PRESERVING = frozenset({"Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze",
                              "Identity", "Relu", "Add"})


def runtime_step_sources(model: onnx.ModelProto) -> dict[str, str]:
    """Float outputs whose step is computed at run time: an integer accumulator Cast to
    float and multiplied by a scale (dynamic quantization's ``Cast → Mul(a_scale·w_scale)``),
    possibly followed by shape ops, Relu or a bias Add. Output name → the scale's name."""
    producers = {o: n for n in model.graph.node for o in n.output}
    out: dict[str, str] = {}
    for o in model.graph.output:
        name, seen = o.name, 0
        while name in producers and seen < 8:
            n = producers[name]
            if n.op_type == "Mul" and len(n.input) == 2:
                for i, j in ((0, 1), (1, 0)):
                    p = producers.get(n.input[i])
                    if p is not None and p.op_type == "Cast":
                        out[o.name] = n.input[j]
                break
            if n.op_type not in _STEP_PRESERVING or not n.input:
                break
            name, seen = n.input[0], seen + 1
    return out


_INTEGER_ELEMS = frozenset({onnx.TensorProto.INT8, onnx.TensorProto.UINT8,
                            onnx.TensorProto.INT16, onnx.TensorProto.UINT16,
                            onnx.TensorProto.INT32, onnx.TensorProto.UINT32,
                            onnx.TensorProto.INT4, onnx.TensorProto.UINT4})


def compare_models(model: onnx.ModelProto, original: onnx.ModelProto,
                   feeds: Mapping[str, np.ndarray], *, rtol: float, atol: float,
                   notes: list[str], model_dir: Path | None = None,
                   original_dir: Path | None = None,
                   range_steps: bool = False,
                   runtime: str = "onnxruntime",
                   keep: Mapping[int, Sequence[str]] | None = None,
                   kept: dict[int, dict[str, np.ndarray]] | None = None,
                   meanwhile: Callable[[], object] | None = None,
                   after_runtime: Callable[[RuntimeComparison], object] | None = None
                   ) -> list[RuntimeComparison]:
    """``model_dir``/``original_dir``: where a model's external tensors stay (see
    ``models.Loaded.external_dir``); None when they are in the protobuf. ``range_steps``:
    a float output that no scale measures is measured in its own run-time 8-bit step
    (``float_steps``), for a conversion of a quantized model whose outputs pass through
    float operators (a Softmax after the last rescale). ``runtime``: the runtime beside the
    reference evaluator; a deployment runtime's comparison is reported, not judged.
    ``keep``: values (by ``id`` of the model's proto) onnxruntime's run of each model keeps
    beside its outputs, handed back in ``kept`` (the same keys): what a family's bounds
    read (``CheckSupport.bound_values``), so that they need no runs of their own.
    ``meanwhile``: work of the caller's that needs no run, done after the reference
    evaluator's runs while onnxruntime's may still go on; ``after_runtime``: work that
    needs onnxruntime's comparison (given it), done as soon as it is made, beside the
    reference evaluator's runs or ``meanwhile``."""
    names = [o.name for o in model.graph.output]
    extra = sorted(set(names) - {o.name for o in original.graph.output})
    if extra:
        notes.append(f"outputs only the checked model has (not compared): {', '.join(extra)}")
    probes = depth_probes(model, original)

    def run_ref(m: onnx.ModelProto, f: Mapping[str, np.ndarray], d: Path | None
                ) -> dict[str, np.ndarray]:
        return _run_ref(m, f, d, [p for p, _ in probes])

    ort_notes: list[str] = []
    ref_notes: list[str] = []
    stop = threading.Event()  # set when this thread fails: onnxruntime's run ends early

    def run_ort(m: onnx.ModelProto, f: Mapping[str, np.ndarray], d: Path | None
                ) -> dict[str, np.ndarray]:
        got = _run_ort(m, f, d, (keep or {}).get(id(m), ()), stop)
        if keep and kept is not None:
            kept[id(m)] = got
        return got

    def on_runtime() -> RuntimeComparison:
        if runtime == "onnxruntime":
            got = _on("onnxruntime", run_ort, (model, model_dir), (original, original_dir),
                      feeds, rtol, atol, range_steps, ort_notes)
        else:
            got = replace(_on(runtime, lambda m, f, d: deployed.run(runtime, m, f, d),
                              (model, model_dir), (original, original_dir), feeds, rtol,
                              atol, True, ort_notes), judged=False)
        if after_runtime is not None and not stop.is_set():
            after_runtime(got)
        return got

    def on_reference() -> RuntimeComparison:
        return _on("reference", run_ref, (model, model_dir), (original, original_dir), feeds,
                   rtol, atol, range_steps, ref_notes, probes=probes)

    side_by_side = runtime == "onnxruntime" and (runners.streams(model)
                                                 or runners.streams(original))
    ort, ref = _both(on_runtime, on_reference, meanwhile, stop, side_by_side)
    notes += ort_notes + ref_notes  # in the same order whichever finished first
    return [ort, ref]


def _both(on_runtime: Callable[[], RuntimeComparison],
          on_reference: Callable[[], RuntimeComparison],
          meanwhile: Callable[[], object] | None, stop: threading.Event,
          side_by_side: bool) -> tuple[RuntimeComparison, RuntimeComparison]:
    """(onnxruntime's comparison, the reference evaluator's), then ``meanwhile``. At LLM
    size (``side_by_side``) the two runtimes run side by side: onnxruntime's
    DequantizeLinear runs on one core (a float16 model's converted weights: 27 s of the
    bench model's check, docs/benchmarks.md 2026-11-28) and releases the interpreter, as
    NumPy's large operations do; each streams, so memory stays one piece each."""
    if not side_by_side:
        ort, ref = on_runtime(), on_reference()
        if meanwhile is not None:
            meanwhile()
        return ort, ref
    with concurrent.futures.ThreadPoolExecutor(1, "dqtool-ort") as pool:
        pending = pool.submit(on_runtime)
        try:
            ref = on_reference()
            if meanwhile is not None:
                meanwhile()
        except BaseException:  # an error, Ctrl-C: onnxruntime stops at its next piece
            stop.set()
            raise
        return pending.result(), ref


def _on(runtime: str, run: Runner, model: tuple[onnx.ModelProto, Path | None],
        original: tuple[onnx.ModelProto, Path | None], feeds: Mapping[str, np.ndarray],
        rtol: float, atol: float, range_steps: bool = False,
        notes: list[str] | None = None, probes: Sequence[tuple[str, int]] = (),
        run_original: Runner | None = None) -> RuntimeComparison:
    """``notes``: where an output is NaN or ±inf everywhere in both models, it says so
    (they are equal, and that says nothing of the conversion: the output fails unless
    accepted). ``probes``: values inside both models to compare too (``depth``).
    ``run_original``: the original's runner, when it is not ``run`` (one model on two
    runtimes)."""
    results = []
    runtime_steps = runtime_step_sources(original[0])
    runs = ((run, "the checked model", model),
            (run_original or run, "the original", original))
    for how, label, (m, d) in runs:
        try:
            results.append(how(m, feeds, d))
        except runners.RuntimeFailure as e:
            return RuntimeComparison(runtime, (), f"{runtime} cannot run {label}: {e}")
    got, want = results
    steps: dict[str, float | np.ndarray] = dict(output_steps(original[0]))
    unscaled = [o.name for o in original[0].graph.output if o.name not in steps] \
        if range_steps else list(runtime_steps)
    for out in unscaled:  # a float output: in its own run-time step (float_steps)
        step = float_steps.dynamic_step(want.get(out))
        if step is not None:
            steps[out] = step
    outputs = []
    for o in original[0].graph.output:
        if o.name not in got:
            outputs.append(compare.failed(o.name, "missing from the checked model").judge(
                rtol, atol))
        else:
            outputs.append(compare.compare(o.name, got[o.name], want[o.name], rtol=rtol,
                                           atol=atol, step=steps.get(o.name)))
            if notes is not None and outputs[-1].compared_nothing:
                notes.append(f"{runtime}: output '{o.name}' is NaN or ±inf in every element "
                             "of both models: nothing compared (equal, but that says nothing "
                             "about the conversion), which fails unless accepted "
                             "(--accept-nonfinite); other inputs: --inputs, --seed")
    of = len(original[0].graph.node)
    depth = tuple(DepthPoint(name, i, of, compare.compare(name, got[name], want[name]))
                  for name, i in probes if name in got and name in want)
    return RuntimeComparison(runtime, tuple(outputs), depth=depth)


def compare_runs(runtime: str, run: Runner, reference: Runner,
                 model: tuple[onnx.ModelProto, Path | None], feeds: Mapping[str, np.ndarray],
                 notes: list[str]) -> RuntimeComparison:
    """One model on ``runtime`` (``run``) against the reference evaluator (``reference``),
    every output exactly compared and measured in its quantization step (a float output
    no scale measures: its own run-time 8-bit step)."""
    return _on(runtime, run, model, model, feeds, 0.0, 0.0, True, notes,
               run_original=reference)
