"""``check --against`` for a conversion that is faithful, not exact: integer operators
rewritten into QDQ (``dqtool qdq``), whose float simulation rounds differently from integer
accumulation (``docs/integer-ops.md``).

What such a conversion controls is each rewritten operator's own error: the family runs
each converted region alone on the original's inputs (``CheckReport.per_op``). When every
one of them was measured and is within one quantization step of the original, an output
difference end to end is that per-op rounding carried on (and, in a dynamically quantized
model, re-quantized) by the layers after it: it is tolerated, with that reason, and its
size stays in the report (max abs, steps). Any per-op entry beyond one step, or none
measured, leaves the outputs to ``--rtol/--atol`` alone. The same rule is the conversion's
own ``--check``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dqtool.checking import against
from dqtool.checking.against import RuntimeComparison


def within_one_step(entry: Any) -> bool:
    """A per-op entry that was measured and is within one step (or, with no step, equal)."""
    c = entry.comparison
    if c is None:
        return False
    within = c.within_one_step
    return c.max_abs == 0.0 if within is None else within


def apply(comparisons: Sequence[RuntimeComparison], per_op: Sequence[Any],
          notes: list[str]) -> tuple[RuntimeComparison, ...]:
    """The comparisons with output differences tolerated when every per-op entry is
    measured and within one step; ``notes`` says why either way."""
    if not per_op:
        return tuple(comparisons)
    unmeasured = [e for e in per_op if e.comparison is None]
    beyond = [e for e in per_op if e.comparison is not None and not within_one_step(e)]
    differing = [o for c in comparisons if c.skipped is None for o in c.outputs
                 if against.explicable(o)]
    if not differing:
        return tuple(comparisons)
    if unmeasured or beyond:
        why = (f"{len(beyond)} rewritten operator(s) beyond one step on the original's inputs"
               if beyond else
               f"{len(unmeasured)} rewritten operator(s) could not be measured alone")
        notes.append(f"output differences are judged by --rtol/--atol only: {why}")
        return tuple(comparisons)
    reason = (f"a faithful, not exact, conversion: each of the {len(per_op)} rewritten "
              "operator(s), fed the original's inputs, is within one quantization step; the "
              "output difference is that rounding carried through the layers after it")
    out, _ = against.tolerate(comparisons, reason)
    notes.append(f"{len(differing)} output comparison(s) beyond --rtol/--atol tolerated: "
                 f"{reason} (docs/integer-ops.md); their differences are reported above")
    return out
