"""The command line defers sympy (onnx_ir imports it; dqtool never uses it): each case runs
in a fresh interpreter, since the deferral only applies before onnx_ir is imported."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_a_command_runs_without_executing_sympy(tmp_path: Path) -> None:
    out = _run(f"""
        import sys
        from dqtool.cli import main
        try:
            main(["upgrade", "models/ort_qdq_contrib.onnx", "--opset", "21",
                  "-o", {str(tmp_path / "out.onnx")!r}, "--json"])
        except SystemExit as e:
            assert e.code == 0, e.code
        sympy = sys.modules["sympy"]
        print(type(sympy).__name__, "Symbol" in vars(sympy))
    """)
    assert out.splitlines()[-1] == "_Deferred False"
    assert (tmp_path / "out.onnx").stat().st_size > 0


def test_sympy_still_works_when_used() -> None:
    out = _run("""
        from dqtool.deferred_imports import defer_sympy
        defer_sympy()
        import onnx_ir as ir
        import sympy
        assert type(sympy).__name__ == "_Deferred"
        dim = ir.SymbolicDim("N") * 2 + 1      # onnx_ir's symbolic arithmetic loads sympy
        print(dim, type(sympy).__name__, sympy.Max(sympy.Symbol("a"), 3))
    """)
    assert out == "2*N + 1 module Max(3, a)"


def test_a_submodule_import_runs_the_package_first() -> None:
    out = _run("""
        from dqtool.deferred_imports import defer_sympy
        defer_sympy()
        import sympy
        from sympy.core.numbers import Integer   # needs sympy.__path__: loads sympy first
        print(type(sympy).__name__, Integer(2) + sympy.Integer(3))
    """)
    assert out == "module 5"


def test_nothing_is_deferred_once_onnx_ir_is_loaded() -> None:
    out = _run("""
        import sys
        import onnx_ir
        from dqtool.deferred_imports import defer_sympy
        defer_sympy()
        print(type(sys.modules["sympy"]).__name__)
    """)
    assert out == "module"
