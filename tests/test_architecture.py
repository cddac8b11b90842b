"""The house's plan holds: the import rules of ``.importlinter`` are kept (import-linter,
the field's usual tool), and docs/architecture.md's table of layers is the contract's."""

from __future__ import annotations

import configparser
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _contract_layers() -> list[list[str]]:
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter")
    rows = config["importlinter:contract:layers"]["layers"].strip().splitlines()
    return [sorted(m.strip() for m in row.split("|")) for row in rows]


def _doc_layers() -> list[list[str]]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text[text.index("## The layers"):]
    section = section[:section.index("\n## ", 3)] if "\n## " in section[3:] else section
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or cells[0] in ("layer", "---"):
            continue
        paths = re.findall(r"`(dqtool/[^`]+)`", cells[1])
        rows.append(sorted(p.removesuffix("/").removesuffix(".py").replace("/", ".")
                           for p in paths))
    return rows


def test_the_import_rules_hold():
    lint = Path(sys.executable).with_name("lint-imports")
    res = subprocess.run([str(lint), "--config", str(ROOT / ".importlinter")], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert "0 broken" in res.stdout


def test_the_documented_layers_are_the_contracts():
    assert _doc_layers() == _contract_layers()


def test_every_module_has_a_layer():
    layered = {m for row in _contract_layers() for m in row}
    package = ROOT / "dqtool"
    top = {f"dqtool.{p.stem}" for p in package.glob("*.py") if p.stem != "__init__"}
    top |= {f"dqtool.{p.parent.name}" for p in package.glob("*/__init__.py")}
    assert top - layered == set()


MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80


def _sizes() -> tuple[dict[str, int], dict[str, int]]:
    import ast

    modules, functions = {}, {}
    for path in sorted((ROOT / "dqtool").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        where = str(path.relative_to(ROOT))
        modules[where] = len(text.splitlines())
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions[f"{where}:{node.lineno} {node.name}"] = \
                    node.end_lineno - node.lineno + 1
    return modules, functions


def test_sizes_a_reader_can_hold():
    """No module over 500 lines, no function over 80 (docs/architecture.md)."""
    modules, functions = _sizes()
    assert len(modules) > 100 and len(functions) > 1000  # the scan saw the package
    assert {m: n for m, n in modules.items() if n > MAX_MODULE_LINES} == {}
    assert {f: n for f, n in functions.items() if n > MAX_FUNCTION_LINES} == {}


def test_no_public_name_is_shadowed_by_a_module():
    """A lazily imported public name (``dqtool.load``, ``dqtool.reference_evaluator``) is
    no submodule's name: importing the module would set the package attribute to it, and
    ``dqtool.reference_evaluator(model)`` would then call a module."""
    import importlib.util

    import dqtool

    clashes = [name for name in dir(dqtool) if not name.startswith("_")
               and importlib.util.find_spec(f"dqtool.{name}") is not None
               and name in dqtool._API]
    assert clashes == []
    import dqtool.evaluator

    assert callable(dqtool.reference_evaluator)


def test_the_storage_interface_loads_each_name_from_its_module():
    """``dqtool.storage``'s names are its interface (``.importlinter``); importing it loads
    none of its modules, so ``dqtool --version`` may name it without NumPy or onnx_ir."""
    code = ("import sys, dqtool.storage as s; "
            "print(sorted(m for m in sys.modules if m.startswith('dqtool.storage.') "
            "or m in ('numpy', 'onnx_ir')))")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"
    import dqtool.storage as storage

    assert sorted(storage.__all__) == sorted(storage._WHERE)
    assert all(getattr(storage, name) is not None for name in storage.__all__)
