"""Where a runtime release computes something other than the specification: one table.

Each entry names the runtime, the releases it was measured on, the operator and the case,
and carries ``emulate``: what that release gives for the affected elements, so tests assert
the kernel against the spec everywhere and the runtime against this table where a listed
release deviates (and against the kernel everywhere else). dqtool's kernel never follows a
deviation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Deviation:
    runtime: str
    releases: tuple[str, ...]  # "1.31": every 1.31.x; measured on the versions in ``measured``
    measured: str
    op: str
    case: str
    spec: str
    runtime_gives: str
    # (v = round_half_even(x/scale) as float32, zero point or None, lo, hi) -> int64 values
    emulate: Callable[[np.ndarray, np.ndarray | None, int, int], np.ndarray]
    affected: Callable[[np.ndarray, np.dtype], np.ndarray]  # (x, quantized type) -> mask
    # True: the release gives either the spec's value or ``emulate``'s, depending on where
    # the element falls in its vectorized loop (a scalar tail takes the other path).
    position_dependent: bool = False

    def applies(self, runtime: str, version: str) -> bool:
        return runtime == self.runtime and ".".join(version.split(".")[:2]) in self.releases


def _int32_first(v: np.ndarray, z: np.ndarray | None, lo: int, hi: int) -> np.ndarray:
    """Convert to int32 first (NaN, ±inf and values outside int32 give INT32_MIN, as x86's
    conversion does), add the zero point in wrapping int32 arithmetic, then clamp."""
    r = np.rint(np.asarray(v, np.float32)).astype(np.float64)
    bad = ~((r >= -(2.0**31)) & (r < 2.0**31))  # also NaN
    i = np.where(bad, -(2**31), np.where(bad, 0, r)).astype(np.int64)
    if z is not None:
        i = i + np.asarray(z).astype(np.int64)
    i = (i + 2**31) % 2**32 - 2**31
    return np.clip(i, lo, hi)


def _float16_to_bytes(x: np.ndarray, out: np.dtype) -> np.ndarray:
    """float16 x quantized to an 8- or 16-bit integer type."""
    return np.broadcast_to(np.asarray(x).dtype == np.float16
                           and np.dtype(out).kind in "iu", np.shape(x))


def _scalar_paths(x: np.ndarray, out: np.dtype) -> np.ndarray:
    """float32 x quantized to an integer type, or float16 x to int4/uint4."""
    four = np.dtype(out).name in ("int4", "uint4")
    integer = four or np.dtype(out).kind in "iu"
    return np.broadcast_to(integer and (np.asarray(x).dtype == np.float32 or four),
                           np.shape(x))


DEVIATIONS: tuple[Deviation, ...] = (
    Deviation(
        runtime="onnxruntime", releases=("1.31",), measured="1.31.1",
        op="QuantizeLinear",
        case="float16 x to an 8- or 16-bit integer type, where round(x / scale) is NaN, "
             "±inf or outside int32",
        spec="saturate(...): +inf and large values give the type's maximum, -inf its minimum",
        runtime_gives="INT32_MIN plus the zero point, wrapped in int32, then clamped "
                      "(+inf with zero point 0 gives 0 for uint8)",
        emulate=_int32_first, affected=_float16_to_bytes),
    Deviation(
        runtime="onnxruntime", releases=("1.31",), measured="1.31.1",
        op="QuantizeLinear",
        case="float32 x to an integer type, or float16 x to int4/uint4, where "
             "round(x / scale) is NaN, ±inf or outside int32, for the elements its scalar "
             "code handles (a vectorized loop's tail; per-axis and blocked nodes often)",
        spec="saturate(...): +inf and large values give the type's maximum",
        runtime_gives="INT32_MIN plus the zero point, wrapped in int32, then clamped (+inf "
                      "gives -8 for int4), elsewhere the spec's value",
        emulate=_int32_first, affected=_scalar_paths, position_dependent=True),
)


def applicable(runtime: str, version: str) -> tuple[Deviation, ...]:
    return tuple(d for d in DEVIATIONS if d.applies(runtime, version))
