"""Start-up: defer running sympy until something actually uses it.

onnx_ir imports sympy at module level (for symbolic shape arithmetic, which dqtool never
does), and importing sympy costs about 0.4 s, half of a command's start-up. The command line
therefore registers ``sympy`` (and onnx_ir's small ``_symbolic_shapes`` module, which reads
sympy attributes at import) as *deferred* modules: ``import sympy`` binds the module object
at once and its code runs the first time one of its attributes is read. Nothing changes for
code that uses them, which only sees a module load a little later.

The standard library's ``importlib.util.LazyLoader`` cannot do this on Python 3.11: its
module loads on *any* attribute read, and the import statement itself reads ``__spec__``.
A deferred module here keeps its import metadata (``__spec__``, ``__path__`` …) and runs on
the first read of an attribute it lacks, under a lock: another thread reading one meanwhile
waits for the finished module. A submodule imported first (``import sympy.core``) runs on
its own, once, and the package later reuses it, as with any package whose ``__init__`` has
not run yet. If running the module fails, the error is raised and the next read tries
again. Known limit: ``onnx_ir._symbolic_shapes`` is not set as an attribute of ``onnx_ir``
(``from onnx_ir import _symbolic_shapes`` and ``sys.modules`` work).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import threading
import types

_LOCK = threading.RLock()
_RUNNING: set[str] = set()  # modules whose code is running now (in the lock's owner)


class _Deferred(types.ModuleType):
    """A module whose code runs when an attribute it does not have yet is first read."""

    def __getattr__(self, attr: str) -> object:
        name = self.__spec__.name
        with _LOCK:  # another thread running this module: wait for it to finish
            if type(self) is _Deferred and name not in _RUNNING:
                _RUNNING.add(name)
                try:
                    self.__spec__.loader.exec_module(self)
                    self.__class__ = types.ModuleType  # only once it ran to the end
                finally:
                    _RUNNING.discard(name)
        if type(self) is _Deferred:  # read while its own code runs: partly initialized
            raise AttributeError(f"partially initialized module {name!r} has no attribute "
                                 f"{attr!r} (its code is still running)")
        return getattr(self, attr)


def _defer(name: str, spec: importlib.machinery.ModuleSpec | None) -> None:
    if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
        return
    module = importlib.util.module_from_spec(spec)
    module.__class__ = _Deferred
    sys.modules[name] = module


def defer_sympy() -> None:
    """Make ``sympy`` and ``onnx_ir._symbolic_shapes`` run on first use, if neither is
    loaded yet. Only the command line calls this; a library import of dqtool leaves the
    interpreter's imports alone."""
    if "sympy" in sys.modules or "onnx_ir" in sys.modules:
        return
    try:
        _defer("sympy", importlib.util.find_spec("sympy"))
        # onnx_ir's spec is found without running it (it is a top-level package); the
        # submodule is then found on its path, again without running onnx_ir.
        package = importlib.util.find_spec("onnx_ir")
        if package is not None and package.submodule_search_locations:
            _defer("onnx_ir._symbolic_shapes", importlib.machinery.PathFinder.find_spec(
                "onnx_ir._symbolic_shapes", list(package.submodule_search_locations)))
    except (ImportError, ValueError):  # any surprise: import eagerly, as without this
        for name in ("sympy", "onnx_ir._symbolic_shapes"):
            sys.modules.pop(name, None)
