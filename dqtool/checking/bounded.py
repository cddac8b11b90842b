"""``check --against`` for operators that hold their weights (a family's ``CheckSupport``
with ``weights`` and ``bounds``: a fused MatMul): when is an onnxruntime output difference
the runtime's own rounding, and not the conversion's?

The exactness proof is (1) every such weight bit-identical between the two models and (2)
the reference runtime's outputs identical (within rtol/atol, by default bit for bit).
onnxruntime's kernels for such operators sum in their own order, so its outputs may still
differ; such a difference is tolerated, and said so, only when (3) every one of those
nodes, run on onnxruntime in both models, differs by no more than the family's proven
bound on that order's rounding (``CheckSupport.bounds``); a node that cannot be run on its
own (inside a subgraph or a function) only when the reference runtime agreed. Anything
else is judged by rtol/atol alone, as for any model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dqtool import registry
from dqtool.checking import against
from dqtool.checking.against import RuntimeComparison

ORT = "onnxruntime"
REFERENCE = "reference"


def moved_when_exposed(comparisons: Sequence[RuntimeComparison],
                       exposed: Mapping[str, float]) -> str:
    """How onnxruntime's compared outputs differ from those of the runs that exposed the
    nodes' values (the runs the bounds come from); "" when they agree."""
    ort = next((c for c in comparisons if c.runtime == ORT and c.skipped is None), None)
    for o in ort.outputs if ort is not None else ():
        seen = exposed.get(o.name)
        if seen is not None and against.explicable(o) and not _same(seen, o.max_abs):
            return (f"onnxruntime's {o.name} differs by {o.max_abs:.6g} in the run "
                    f"compared, by {seen:.6g} when the nodes' values are exposed: its "
                    "node-by-node runs do not describe it")
    return ""


def _same(a: float, b: float) -> bool:
    return a == b or abs(a - b) <= 1e-9 * max(abs(a), abs(b))


def bound_kind() -> str:
    """What the families whose bounds read values from onnxruntime's runs call their nodes
    ("fused")."""
    return "/".join(dict.fromkeys(s.kind for s in registry.check_supports()
                                  if s.bound_values is not None and s.kind))


def kept_note(kept: Mapping[int, Mapping[str, Any]], keep: Mapping[int, Sequence[str]],
              labels: Mapping[int, str], kind: str = "") -> str:
    """Where the bounds read each node's input and output (``keep``: the values asked of
    each model's compared onnxruntime run, ``kept``: what each run handed back; keys as
    ``labels``'): "" when nothing was asked."""
    asked = [k for k, names in keep.items() if names]
    if not asked:
        return ""
    what = f"each {kind + ' ' if kind else ''}node's input and output"
    whole = [labels[k] for k in asked if all(n in kept.get(k, {}) for n in keep[k])]
    again = [labels[k] for k in asked if labels[k] not in whole]
    if not again:
        return f"onnxruntime ran each model once: its compared runs kept {what} for the bounds"
    why = ("keeping them in the run compared would change what onnxruntime computes (a "
           "float16 value it keeps in float32), or they passed 256 MiB")
    if not whole:
        return f"the bounds ran {' and '.join(again)} again with {what} exposed: {why}"
    return (f"the bounds read {what} from onnxruntime's compared run of "
            f"{' and '.join(whole)}; {' and '.join(again)} ran again with them exposed: "
            f"{why}")


def needs_bounds(comparisons: Sequence[RuntimeComparison]) -> bool:
    """Whether onnxruntime compared and some output is beyond rtol/atol for a reason a
    bound could explain (not a shape, a dtype, a NaN or a missing output)."""
    return any(c.runtime == ORT and c.skipped is None and any(
        against.explicable(o) for o in c.outputs) for c in comparisons)


def apply(comparisons: Sequence[RuntimeComparison], weights: Sequence[Any],
          bounds: Sequence[Any], notes: list[str],
          exposed: Mapping[str, float] | None = None,
          drift_cause: Callable[[], str] | None = None, kind: str = ""
          ) -> tuple[RuntimeComparison, ...]:
    """The comparisons with onnxruntime's outputs tolerated where (1)–(3) hold; ``notes``
    gets the reason either way. ``exposed``: each output's difference in the runs behind
    the bounds (``Bounds.exposed``); an output that differs otherwise in the run compared
    was not what the bounds describe, unless ``drift_cause()`` names why (onnxruntime's
    own graph skips roundings the model asks for, which exposing the values restores).
    ``kind``: what the notes call the nodes (``CheckSupport.kind``)."""
    kind = f"{kind} " if kind else ""
    if not bounds:
        return tuple(comparisons)
    ref = next((c for c in comparisons if c.runtime == REFERENCE), None)
    ref_ok = ref is not None and ref.skipped is None and ref.passed
    bad_weights = [w for w in weights if not w.same]
    beyond = [b for b in bounds if b.status == "beyond"]
    unbounded = [b for b in bounds if b.status == "unbounded"]
    # A node that could have been compared and was not (its output gone from the checked
    # model, a bias taken into it, onnxruntime failing on it ...) leaves its difference
    # unexplained: the reference runtime agreeing says nothing of how onnxruntime rounds
    # (it ignores accuracy_level, for one).
    open_nodes = [b for b in unbounded if not getattr(b, "hidden", False)]
    why_not = None
    drift = moved_when_exposed(comparisons, exposed or {})
    cause = drift_cause() if drift and drift_cause is not None else ""
    if cause:
        notes.append(f"{drift}, because {cause}")
        drift = ""
    if drift:
        why_not = drift
    elif not weights or bad_weights:
        why_not = (f"not every {kind}weight is bit-identical" if weights else
                   f"no {kind}weight was compared")
    elif beyond:
        why_not = (f"{len(beyond)} {kind}node(s) differ beyond their rounding bound "
                   f"({', '.join(b.node for b in beyond[:3])})")
    elif ref is not None and ref.skipped is None and not ref.passed:
        why_not = "the reference runtime's outputs differ too"
    elif open_nodes:
        why_not = (f"{len(open_nodes)} {kind}node(s) could not be bounded ("
                   + "; ".join(b.describe() for b in open_nodes[:2]) + ")")
    elif unbounded and not ref_ok:
        why_not = (f"{len(unbounded)} {kind}node(s) could not be bounded and the reference "
                   "runtime did not confirm the outputs")
    if why_not is not None:
        notes.append(f"onnxruntime's output differences are judged by --rtol/--atol only: "
                     f"{why_not}")
        return tuple(comparisons)
    reason = (f"{len(weights)} {kind}weight(s) bit-identical; "
              + ("the reference runtime agrees; " if ref_ok else
                 "the reference runtime did not compare; ")
              + f"{len(bounds) - len(unbounded)} {kind}node(s) within their "
              "rounding bound on onnxruntime")
    if unbounded:
        reason += f" ({len(unbounded)} not bounded)"
    out, tolerated = against.tolerate(comparisons, reason, runtime=ORT)
    if tolerated:
        notes.append(f"onnxruntime: {tolerated} output(s) beyond --rtol/--atol tolerated: "
                     f"{reason} (the difference is how onnxruntime rounds, not the "
                     "conversion)")
    return out
