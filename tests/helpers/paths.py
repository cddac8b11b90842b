"""The CPU code path these tests run on, and how a test asserts onnxruntime through it.

A test asserts bit-identity with onnxruntime against the spec (the kernel) where no entry of
``dqtool.runtimes.code_paths`` applies to the installed release on the probed path, and
through the entry where one does: ``u8s8-pair-saturation`` by its emulation
(``patch_accumulation`` puts it in the kernel's place for the test), and ``float-routines``
within its measured ulps. Nothing is skipped for an unknown path: there
the spec decides, and a difference is a new deviation to measure and record.
"""

from __future__ import annotations

from importlib import metadata
from typing import Any

import numpy as np

from dqtool.checking import path_deviations
from dqtool.families.integer import kernel as K
from dqtool.families.integer.ort_facts import row_ulps
from dqtool.runtimes import code_paths, cpu_path

ORT_VERSION = metadata.version("onnxruntime")


def path() -> cpu_path.CpuPath:
    return cpu_path.probe()


def entry(key: str, op: str | None = None) -> code_paths.PathDeviation | None:
    return next((d for d in path_deviations.for_op(op) if d.key == key), None)


def patch_accumulation(monkeypatch: Any) -> bool:
    """Where ``u8s8-pair-saturation`` applies, the kernel's integer GEMM and QLinearConv's
    convolution are replaced (for this test) by the entry's emulation for u8 × s8
    operands (ConvInteger stays exact, as measured); True then."""
    if entry("u8s8-pair-saturation") is None:
        return False
    from dqtool.families.integer.selfcheck import emulations

    for name, fn in emulations().items():
        monkeypatch.setattr(K, name, fn)
    return True


def assert_float_routines(got: np.ndarray, want: np.ndarray, op: str, what: str = "") -> None:
    """onnxruntime's output of an operator with MLAS float routines against the kernel's:
    bit for bit, or within the ``float-routines`` entry's ulps where it applies."""
    dev = entry("float-routines", op)
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, what
    if dev is None or dev.ulps is None:
        assert np.array_equal(got, want, equal_nan=True), what
        return
    assert row_ulps(want, got) <= dev.ulps, (what, row_ulps(want, got))


def ort_follows_spec(*models: Any) -> bool:
    """No entry applies to the installed onnxruntime on this path for an operator that one
    of ``models`` (onnx.ModelProto, or a path) holds: its outputs are the spec's."""
    import onnx

    protos = [m if isinstance(m, onnx.ModelProto) else onnx.load(str(m)) for m in models]
    return not path_deviations.applicable(*protos)
