"""Comparison statistics of two arrays, Polygraphy-style, as JSON-able data.

An output passes when its largest absolute error is within ``atol`` OR its largest relative
error is within ``rtol`` (``max`` criterion: the statistics alone decide, so a saved report
can be re-judged with other tolerances by ``OutputComparison.judge``). A NaN in one array
and not the other, a shape or a dtype difference always fails. Default tolerances are 0:
dqtool's conversions claim bit-identity.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from dqtool import types


@dataclass(frozen=True)
class OutputComparison:
    name: str
    shape: tuple[int, ...] | None  # None when the shapes differ
    dtype: str  # "float32", or "float32 vs float16" when they differ
    max_abs: float
    mean_abs: float
    max_rel: float
    mean_rel: float
    nan_mismatches: int  # elements NaN in exactly one of the two
    worst_index: tuple[int, ...] | None
    worst_actual: float | None  # the checked model's value at worst_index
    worst_expected: float | None  # the reference (``against``) value there
    mismatched: int  # elements not exactly equal (NaN == NaN counts as equal)
    size: int
    failure: str | None = None  # shape/dtype/missing, decided before any statistic
    rtol: float = 0.0
    atol: float = 0.0
    passed: bool = False
    # In quantization steps, when the output has one (an integer output: 1; the output of
    # a DequantizeLinear with a constant per-tensor scale: that scale); else None.
    step: float | None = None
    max_steps: float | int | None = None  # the largest distance in steps (see ``steps``)
    off_by_one: int | None = None  # elements more than half a step, at most one apart
    off_by_more: int | None = None  # elements more than one step apart (``steps``)
    # Why the output passes though beyond rtol/atol (a proven bound on the runtime's own
    # rounding, see ``dqtool.checking.bounded``); None when only the tolerances judge it.
    tolerated: str | None = None
    # Elements finite in both arrays; 0 means nothing was compared (every element NaN or
    # ±inf in both), which fails unless accepted (``check(accept_nonfinite=True)``).
    # None for a comparison read back from a report made before the field existed.
    finite: int | None = None
    nonfinite_accepted: bool = False
    # The error's distribution, in ulps of the output type or in quantization steps
    # (``histogram``), and the worst elements [(index, checked, original)]: what the HTML
    # report draws.
    histogram: dict[str, Any] | None = None
    worst: tuple[tuple[tuple[int, ...], float, float], ...] = ()

    @property
    def compared_nothing(self) -> bool:
        """Every element NaN or ±inf in both models: equal, and that says nothing."""
        return self.finite == 0 and self.size > 0 and self.failure is None

    @property
    def within_one_step(self) -> bool | None:
        """No element more than one quantization step apart (beyond the values' own float
        rounding) and no NaN against a number; None when the output has no step."""
        if self.off_by_more is None:
            return None
        return self.off_by_more == 0 and self.nan_mismatches == 0

    @property
    def min_atol(self) -> float:
        """The smallest atol that would pass this output (with rtol 0)."""
        return math.inf if self.failure or self.nan_mismatches else self.max_abs

    @property
    def min_rtol(self) -> float:
        """The smallest rtol that would pass this output (with atol 0)."""
        return math.inf if self.failure or self.nan_mismatches else self.max_rel

    def judge(self, rtol: float = 0.0, atol: float = 0.0) -> OutputComparison:
        """The same statistics judged with other tolerances."""
        ok = (self.failure is None and self.nan_mismatches == 0
              and (self.max_abs <= atol or self.max_rel <= rtol
                   or self.tolerated is not None)
              and (not self.compared_nothing or self.nonfinite_accepted))
        return replace(self, rtol=rtol, atol=atol, passed=ok)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "passed": self.passed, "failure": self.failure,
            "shape": None if self.shape is None else list(self.shape), "dtype": self.dtype,
            "size": self.size, "mismatched": self.mismatched,
            "nan_mismatches": self.nan_mismatches,
            "max_abs": _num(self.max_abs), "mean_abs": _num(self.mean_abs),
            "max_rel": _num(self.max_rel), "mean_rel": _num(self.mean_rel),
            "worst_index": None if self.worst_index is None else list(self.worst_index),
            "worst_actual": _num(self.worst_actual), "worst_expected": _num(self.worst_expected),
            "min_atol": _num(self.min_atol), "min_rtol": _num(self.min_rtol),
            "rtol": self.rtol, "atol": self.atol,
            "step": self.step, "max_steps": self.max_steps, "off_by_one": self.off_by_one,
            "off_by_more": self.off_by_more, "tolerated": self.tolerated,
            "finite": self.finite, "nonfinite_accepted": self.nonfinite_accepted,
            "histogram": self.histogram,
            "worst": [{"index": list(i), "actual": _num(a), "expected": _num(e)}
                      for i, a, e in self.worst],
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> OutputComparison:
        """Read back a saved comparison (to re-judge it with ``judge``)."""
        def f(key: str) -> float | None:
            v = doc.get(key)
            return None if v is None else float(v)

        return cls(
            name=doc["name"], shape=None if doc["shape"] is None else tuple(doc["shape"]),
            dtype=doc["dtype"], max_abs=f("max_abs"), mean_abs=f("mean_abs"),
            max_rel=f("max_rel"), mean_rel=f("mean_rel"),
            nan_mismatches=doc["nan_mismatches"],
            worst_index=None if doc["worst_index"] is None else tuple(doc["worst_index"]),
            worst_actual=f("worst_actual"), worst_expected=f("worst_expected"),
            mismatched=doc["mismatched"], size=doc["size"], failure=doc["failure"],
            step=doc.get("step"), max_steps=doc.get("max_steps"),
            off_by_one=doc.get("off_by_one"), off_by_more=doc.get("off_by_more"),
            tolerated=doc.get("tolerated"), finite=doc.get("finite"),
            nonfinite_accepted=bool(doc.get("nonfinite_accepted", False)),
            histogram=doc.get("histogram"),
            worst=tuple((tuple(w["index"]), float(w["actual"]), float(w["expected"]))
                        for w in doc.get("worst") or ()),
        ).judge(doc.get("rtol", 0.0), doc.get("atol", 0.0))


def _num(v: float | None) -> float | str | None:
    """JSON has no inf/NaN: write them as strings that ``float()`` reads back."""
    if v is None:
        return None
    return v if math.isfinite(v) else str(v)


def failed(name: str, reason: str) -> OutputComparison:
    """An output that could not be compared at all (missing, wrong shape, …)."""
    inf = math.inf
    return OutputComparison(name, None, "?", inf, inf, inf, inf, 0, None, None, None, 0, 0,
                            failure=reason)


def _as_float64(a: np.ndarray) -> np.ndarray:
    # ml_dtypes (bfloat16, float8 …) and bool convert to float64 exactly.
    return np.asarray(a).astype(np.float64)


def steps(absdiff: np.ndarray, step: float | np.ndarray | None,
          slack: np.ndarray | float = 0.0) -> dict[str, float | int | None]:
    """How many quantization steps apart two arrays are: the largest distance (an int when
    whole, as an integer output's always is; else to three decimals: a float output 1.47
    steps away reads 1.47, where rounding to the nearest step read 1 and passed), the
    elements about one step apart (more than half a step, at most one) and those more than
    one step apart. ``step`` is one size, or one per element (broadcast: a per-channel
    scale). ``slack``: what the values' own float rounding may add to a distance
    (``_slack``): an element is more than one step apart only beyond it, so that two
    float32 values one step of 0.01 apart near 1000 (1.006 steps as rounded) are not."""
    none = {"max_steps": None, "off_by_one": None, "off_by_more": None}
    if step is None or absdiff.size == 0:
        return none
    try:
        step = np.broadcast_to(np.asarray(step, np.float64), absdiff.shape)
    except ValueError:
        return none
    if not np.all(step > 0):
        return none
    with np.errstate(invalid="ignore", over="ignore"):
        n = absdiff / step
        beyond = (absdiff - slack) / step > 1
    n = np.where(np.isnan(n), np.inf, n)
    beyond |= ~np.isfinite(n)
    worst: float | int = float(n.max())
    if not math.isfinite(worst):  # a NaN against a number (JSON has no inf)
        worst = int(np.iinfo(np.int64).max)
    else:
        worst = round(worst, 3)
        worst = int(worst) if worst.is_integer() else worst
    return {"max_steps": worst, "off_by_one": int(((n > 0.5) & ~beyond).sum()),
            "off_by_more": int(beyond.sum())}


def _slack(actual: np.ndarray, expected: np.ndarray) -> np.ndarray | float:
    """Half a unit in the last place of each value, in its own float type (0 for integer
    outputs, whose steps are exact): the most by which a distance between two values
    rounded to that type can exceed the distance between what they stand for."""
    out: np.ndarray | float = 0.0
    for v in (actual, expected):
        if v.dtype.kind == "f":
            with np.errstate(invalid="ignore", over="ignore"):
                out = out + np.spacing(np.abs(v)).astype(np.float64) / 2
        elif v.dtype in _FLOATS:  # ml_dtypes' floats: NumPy has no spacing for them
            import ml_dtypes

            info = ml_dtypes.finfo(v.dtype)
            mag = np.abs(_as_float64(v))
            out = out + mag * float(info.eps) / 2 + float(info.smallest_subnormal)
    return out


def compare(name: str, actual: np.ndarray, expected: np.ndarray, *, rtol: float = 0.0,
            atol: float = 0.0, step: float | np.ndarray | None = None) -> OutputComparison:
    """Statistics of ``actual`` (the checked model) against ``expected`` (the reference);
    with ``step``, also in quantization steps of that size."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    if actual.shape != expected.shape:
        return failed(name, f"shape {actual.shape} differs from {expected.shape}").judge(
            rtol, atol)
    dtype = str(actual.dtype) if actual.dtype == expected.dtype else \
        f"{actual.dtype} vs {expected.dtype}"
    failure = None if actual.dtype == expected.dtype else f"dtype {dtype}"
    if _textual(actual) or _textual(expected):  # (object and str_ arrays alike)
        both = _textual(actual) and _textual(expected)
        return _compare_text(name, actual, expected, None if both else f"dtype {dtype}"
                             ).judge(rtol, atol)
    a, e = _as_float64(actual), _as_float64(expected)
    a_nan, e_nan = np.isnan(a), np.isnan(e)
    nan_mismatch = a_nan != e_nan
    both_nan = a_nan & e_nan
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        # inf - inf of the same sign is NaN: those elements are equal, so 0.
        same = (a == e) | both_nan
        absdiff = np.where(same, 0.0, np.abs(a - e))
        absdiff = np.where(nan_mismatch, np.inf, absdiff)
        rel = np.where(absdiff == 0, 0.0, absdiff / np.abs(e))
        rel = np.where(np.isnan(rel), np.inf, rel)
    n = int(a.size)
    if n == 0:
        return OutputComparison(name, actual.shape, dtype, 0.0, 0.0, 0.0, 0.0, 0, None, None,
                                None, 0, 0, failure=failure).judge(rtol, atol)
    # The worst element: a NaN mismatch first, else the largest absolute error.
    flat = int(np.argmax(nan_mismatch)) if nan_mismatch.any() else int(np.argmax(absdiff))
    idx = tuple(int(i) for i in np.unravel_index(flat, a.shape))
    return OutputComparison(
        name=name, shape=actual.shape, dtype=dtype,
        max_abs=float(absdiff.max()), mean_abs=float(absdiff.mean()),
        max_rel=float(rel.max()), mean_rel=float(rel.mean()),
        nan_mismatches=int(nan_mismatch.sum()), worst_index=idx,
        worst_actual=float(a.reshape(-1)[flat]), worst_expected=float(e.reshape(-1)[flat]),
        mismatched=int((~same).sum()), size=n, failure=failure,
        **_step_fields(absdiff, step, _slack(actual, expected)),
        finite=int((np.isfinite(a) & np.isfinite(e)).sum()),
        histogram=histogram(absdiff, actual, expected, step), worst=_worst(absdiff, a, e),
    ).judge(rtol, atol)


# Bucket edges of an error histogram: 0, then powers of two (in ulps or steps).
EDGES = (0.0, *(2.0 ** k for k in range(0, 21)))
WORST = 8  # elements listed by ``worst``


def histogram(absdiff: np.ndarray, actual: np.ndarray, expected: np.ndarray,
              step: float | np.ndarray | None) -> dict[str, Any] | None:
    """How many elements are how far apart: in quantization steps when the output has one,
    else in ulps of its float type (of the larger of the two values); buckets 0, ≤1, ≤2,
    ≤4 … ≤2^20, more, and not finite. None for other types."""
    if step is not None:
        unit, size = "step", np.broadcast_to(np.asarray(step, np.float64), absdiff.shape)
    elif actual.dtype.kind == "f" and actual.dtype == expected.dtype:
        unit = f"ulp of {actual.dtype}"
        with np.errstate(invalid="ignore", over="ignore"):
            big = np.maximum(np.abs(actual), np.abs(expected))
            size = np.spacing(np.where(np.isfinite(big), big, 0).astype(actual.dtype)
                              ).astype(np.float64)
    else:
        return None
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        dist = absdiff / size
    finite = np.isfinite(dist)
    counts = [int((dist[finite] == 0).sum())]
    counts += [int(((dist > lo) & (dist <= hi)).sum())
               for lo, hi in itertools.pairwise(EDGES)]
    counts.append(int((finite & (dist > EDGES[-1])).sum()))
    counts.append(int((~finite).sum()))
    return {"unit": unit, "edges": list(EDGES), "counts": counts}


def _worst(absdiff: np.ndarray, a: np.ndarray, e: np.ndarray
           ) -> tuple[tuple[tuple[int, ...], float, float], ...]:
    flat = absdiff.reshape(-1)
    if not flat.size or not (flat > 0).any():
        return ()
    k = min(WORST, int((flat > 0).sum()))
    top = np.argpartition(-np.nan_to_num(flat, nan=np.inf), k - 1)[:k]
    top = top[np.argsort(-np.nan_to_num(flat[top], nan=np.inf), kind="stable")]
    return tuple((tuple(int(i) for i in np.unravel_index(int(t), a.shape)),
                  float(a.reshape(-1)[t]), float(e.reshape(-1)[t])) for t in top)


def _textual(a: np.ndarray) -> bool:
    """Strings (a string output: onnxruntime's are objects, the reference's ``str_``)."""
    return a.dtype.kind in "OUS"


def _compare_text(name: str, actual: np.ndarray, expected: np.ndarray,
                  failure: str | None) -> OutputComparison:
    """String outputs are equal element by element or not at all: a difference is
    infinitely far (so any tolerance fails it)."""
    same = _as_text(actual) == _as_text(expected)
    n, wrong = int(same.size), int((~same).sum())
    if n == 0 or not wrong:
        return OutputComparison(name, actual.shape, "string", 0.0, 0.0, 0.0, 0.0, 0, None,
                                None, None, 0, n, failure=failure)
    flat = int(np.argmin(same))
    idx = tuple(int(i) for i in np.unravel_index(flat, same.shape))
    inf = math.inf
    return OutputComparison(name, actual.shape, "string", inf, inf, inf, inf, 0, idx, None,
                            None, wrong, n,
                            failure=failure or f"{wrong} of {n} strings differ, the first at "
                            f"{list(idx)}: {_as_text(actual).reshape(-1)[flat]!r} against "
                            f"{_as_text(expected).reshape(-1)[flat]!r}")


def _as_text(a: np.ndarray) -> np.ndarray:
    """Strings as ``str`` (bytes decoded as UTF-8), so both runtimes' forms compare."""
    return np.vectorize(lambda v: v.decode("utf-8", "replace") if isinstance(v, bytes)
                        else str(v), otypes=[object])(a) if a.size else a.astype(object)


def _step_fields(absdiff: np.ndarray, step: float | np.ndarray | None,
                 slack: np.ndarray | float = 0.0) -> dict[str, Any]:
    counted = steps(absdiff, step, slack)
    if counted["max_steps"] is None:
        return {"step": None, **counted}
    return {"step": float(np.min(step)), **counted}  # the smallest, when per channel


def bit_identical(actual: np.ndarray, expected: np.ndarray) -> bool:
    """Same dtype, shape and bits (any NaN equals any NaN: payloads are not meaningful)."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    if _textual(actual) and _textual(expected) and actual.shape == expected.shape:
        return bool((_as_text(actual) == _as_text(expected)).all())
    if actual.dtype != expected.dtype or actual.shape != expected.shape:
        return False
    if actual.dtype.itemsize not in (1, 2, 4, 8):
        return actual.tobytes() == expected.tobytes()
    view = np.dtype(f"u{actual.dtype.itemsize}")
    same = actual.view(view) == expected.view(view)
    if not same.all() and (actual.dtype.kind == "f" or actual.dtype in _FLOATS):
        with np.errstate(invalid="ignore"):
            same |= np.isnan(_as_float64(actual)) & np.isnan(_as_float64(expected))
    return bool(same.all())


# Every float type dqtool knows, ml_dtypes' too (bfloat16, float8 …: numpy kind "V", not "f").
_FLOATS = frozenset(t.dtype for t in types.TYPES.values() if not t.is_integer)


def max_abs_difference(a: np.ndarray, b: np.ndarray) -> float:
    """The largest absolute difference of two outputs in float64 (inf for other shapes or
    a NaN in one only; NaN against NaN is no difference)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return float("inf")
    if _textual(a) or _textual(b):
        return 0.0 if bit_identical(a, b) else float("inf")
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    if (np.isnan(a64) != np.isnan(b64)).any():
        return float("inf")
    diff = np.abs(np.where(np.isnan(a64), 0.0, a64) - np.where(np.isnan(b64), 0.0, b64))
    return float(np.max(diff)) if diff.size else 0.0
