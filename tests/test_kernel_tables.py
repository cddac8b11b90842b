"""The kernel's type sets agree with dqtool.types (the kernel keeps its own copies so that
importing it does not load onnx_ir; see dqtool/kernel/tables.py)."""

from __future__ import annotations

import subprocess
import sys

from dqtool import types
from dqtool.kernel import tables


def _dtypes(names) -> frozenset:
    return frozenset(types.by_name(n).dtype for n in names)


def test_float_sets_match_dqtool_types() -> None:
    assert _dtypes(types.FLOAT8) == tables.FLOAT8_TYPES
    assert _dtypes(types.FLOAT_QUANT) == tables.FLOAT_QUANT_TYPES
    assert _dtypes(types.OUTPUT_FLOATS) == tables.OUTPUT_TYPES


def test_int_types_are_the_narrow_onnx_integers() -> None:
    ints = {t.name for t in types.TYPES.values() if t.is_integer and t.bits <= 32}
    ints -= {"uint32", "bool"}  # no (De)QuantizeLinear takes them
    assert _dtypes(ints) == tables.INT_TYPES


def test_importing_the_kernel_does_not_load_onnx_ir() -> None:
    code = "import sys, dqtool.kernel; print('onnx_ir' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "False"
