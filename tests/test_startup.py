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


def test_a_submodule_imported_first_runs_once_and_the_package_reuses_it() -> None:
    out = _run("""
        from dqtool.deferred_imports import defer_sympy
        defer_sympy()
        import sympy
        from sympy.core.numbers import Integer   # the submodule runs; the package not yet
        before = type(sympy).__name__
        print(before, Integer(2) + sympy.Integer(3), sympy.Integer is Integer,
              type(sympy).__name__)
    """)
    assert out == "_Deferred 5 True module"


def test_threads_reading_sympy_first_at_once_all_get_the_finished_module() -> None:
    out = _run("""
        import threading
        from dqtool.deferred_imports import defer_sympy
        defer_sympy()
        import sympy
        barrier, errors = threading.Barrier(4), []
        def use(i):
            barrier.wait()
            try:
                if i % 2:
                    sympy.Symbol("x")
                else:
                    from sympy import Symbol
                    Symbol("y")
            except BaseException as e:
                errors.append(repr(e))
        threads = [threading.Thread(target=use, args=(i,)) for i in range(4)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        print(errors or "ok")
    """)
    assert out == "ok"


def test_a_failed_first_run_is_raised_and_retried_on_the_next_read() -> None:
    out = _run("""
        import sys
        sys.modules["mpmath"] = None   # sympy's import of mpmath fails
        from dqtool.deferred_imports import defer_sympy
        defer_sympy()
        import onnx_ir as ir
        try:
            ir.SymbolicDim("N") + 1
        except ImportError:
            print("ImportError")
        del sys.modules["mpmath"]
        print(ir.SymbolicDim("N") + 1)
    """)
    assert out.splitlines() == ["ImportError", "N + 1"]


def test_nothing_is_deferred_once_onnx_ir_is_loaded() -> None:
    out = _run("""
        import sys
        import onnx_ir
        from dqtool.deferred_imports import defer_sympy
        defer_sympy()
        print(type(sys.modules["sympy"]).__name__)
    """)
    assert out == "module"


def test_the_command_line_quiets_openblas_before_numpy_loads() -> None:
    """OPENBLAS_THREAD_TIMEOUT is read once, when numpy loads OpenBLAS: ``entry`` sets it
    before any import of numpy (none comes with ``dqtool.cli``), and a user's value wins."""
    out = _run("""
        import os, sys
        os.environ.pop("OPENBLAS_THREAD_TIMEOUT", None)
        import dqtool.cli
        assert "numpy" not in sys.modules
        dqtool.cli.quiet_blas()
        first = os.environ["OPENBLAS_THREAD_TIMEOUT"]
        os.environ["OPENBLAS_THREAD_TIMEOUT"] = "20"
        dqtool.cli.quiet_blas()
        print(first, os.environ["OPENBLAS_THREAD_TIMEOUT"])
    """)
    assert out == "4 20"



def test_entry_quiets_openblas_before_the_command_runs() -> None:
    out = _run("""
        import os, sys
        os.environ.pop("OPENBLAS_THREAD_TIMEOUT", None)
        import dqtool.cli as cli
        def main():  # what entry() runs: the command, numpy and all
            print(os.environ.get("OPENBLAS_THREAD_TIMEOUT"), "numpy" in sys.modules)
        cli.main = main
        cli.entry()
    """)
    assert out == "4 False"


def test_the_fused_converter_does_not_load_the_fold() -> None:
    """``upgrade`` imports the fused converter before its first weight is written; the fold
    (``dqtool.folding``, ~7 ms of imports) comes only with a fold's packed rows."""
    out = _run("""
        import sys
        from dqtool.deferred_imports import defer_sympy
        defer_sympy()
        import dqtool.families.fused.to_onnx
        before = "dqtool.folding" in sys.modules
        import numpy as np
        from dqtool.families.fused.code_rows import CodeRows
        import onnx_ir as ir
        b = np.arange(16, dtype=np.uint8).reshape(2, 1, 8)  # N=2, K=16, 4-bit
        t = CodeRows(lambda: b, 16, 2, 4, ir.DataType.UINT4)
        rows = t.packed_rows(0, 16)
        print(before, "dqtool.folding" in sys.modules, type(rows).__name__)
    """)
    assert out == "False True PackedRows"


def test_the_early_copy_starts_before_the_libraries_load() -> None:
    # upgrade starts copying a large input (storage.start_early_copy) before it imports
    # NumPy, onnx and onnx_ir, so that the copy overlaps their ~0.3 s.
    out = _run("""
        import sys
        from dqtool.storage import start_early_copy
        print(sorted(m for m in ("numpy", "onnx", "onnx_ir") if m in sys.modules))
    """)
    assert out.strip() == "[]"
