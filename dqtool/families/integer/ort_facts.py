"""What onnxruntime releases do with the integer family's com.microsoft operators: data
keyed by release, measured by this family's tests (never a timeless claim).

``NO_CPU_KERNEL``: the operator has a schema but no CPU kernel in these releases (a session
refuses the model), so dqtool's kernel is the only implementation ``check`` can run.

``FLOAT_TOLERANCE``: where dqtool's kernel is not bit-identical to onnxruntime's CPU
kernel, the largest difference measured per output over the random cases of the tests,
and why, in ulps of the row: ``|kernel - onnxruntime|`` divided by the float32 spacing at
the largest magnitude of the same row (last axis) of onnxruntime's output. (A plain
elementwise ulp count is unbounded where a sum cancels to nearly zero; the row's spacing
is the precision the float stage works at.) ``check`` compares these outputs at that
tolerance and says so ("within N ulps"); an operator absent here (or an output not listed)
must be bit-identical. The integer stages (int32 accumulation, zero points, scales) are
always exact; differences come only from a float stage whose summation order dqtool does
not reproduce.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Tolerance:
    op: str
    releases: tuple[str, ...]  # "1.32": every 1.32.x; measured on ``measured``
    measured: str  # the versions measured, comma-separated
    output: int
    ulps: int
    why: str


NO_CPU_KERNEL: dict[str, tuple[str, ...]] = {
    # a session refuses it: "Could not find an implementation for MulInteger(1)"
    "MulInteger": ("1.31", "1.32"),
}

# Empty: on onnxruntime 1.31.1 and 1.32.0 (x86-64, MLAS's AVX2/FMA3 and AVX-512F
# kernels) every float stage of DynamicQuantizeLSTM, QAttention and
# QEmbedLayerNormalization is reproduced bit for bit (MLAS's sigmoid, tanh, exp, softmax
# lane order and SGEMM kernels' summation orders, ``mlas.py``, ``attention.py``). A release
# or CPU whose kernels differ shows up as a mismatch in the tests and in ``check``; it is
# then measured and stated here, e.g.
# ``Tolerance("QAttention", ("1.33",), "1.33.0", 0, 2, "float activations: ...")``.
FLOAT_TOLERANCE: tuple[Tolerance, ...] = ()


def tolerance(op: str, output: int, release: str | None) -> Tolerance | None:
    """The stated tolerance of ``op``'s ``output`` on onnxruntime ``release`` ("1.32"); for
    a release not measured, the largest stated for any release (the check says so)."""
    rows = [t for t in FLOAT_TOLERANCE if t.op == op and t.output == output]
    exact = [t for t in rows if release in t.releases]
    if exact:
        return exact[0]
    return max(rows, key=lambda t: t.ulps) if rows else None


def has_cpu_kernel(op: str, release: str | None) -> bool | None:
    """False where measured absent, None for a release not measured."""
    releases = NO_CPU_KERNEL.get(op)
    if releases is None:
        return True
    return False if release in releases else None


def row_ulps(kernel: np.ndarray, runtime: np.ndarray) -> float:
    """The largest ``|kernel - runtime|`` in ulps of the row (see above); NaN against a
    number, or a shape mismatch, is infinite."""
    if kernel.shape != runtime.shape:
        return float("inf")
    k, r = np.asarray(kernel, np.float64), np.asarray(runtime, np.float32)
    if kernel.size == 0:
        return 0.0
    if (np.isnan(k) != np.isnan(r)).any():
        return float("inf")
    spacing = np.spacing(np.abs(np.nan_to_num(r)).max(axis=-1, keepdims=True)).astype(
        np.float64)
    diff = np.where(np.isnan(k), 0.0, np.abs(k - r))
    return float((diff / spacing).max())


def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise distance of two float32 arrays in units in the last place: how many
    float32 values lie between them (+0 and -0 are the same; NaN against anything counts
    as the largest distance)."""
    def ordered(x: np.ndarray) -> np.ndarray:
        i = np.ascontiguousarray(x, np.float32).view(np.int32).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFF), i)

    d = np.abs(ordered(a) - ordered(b))
    nan = np.isnan(a) != np.isnan(b)
    return np.where(nan, np.int64(2**32), np.where(np.isnan(a) & np.isnan(b), 0, d))
