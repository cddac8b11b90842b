"""A family is one folder: no engine names a specific family's module (only the registry's
list of them does), an application names its own family only, and what inspect and check
show of a family comes from its hooks."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import onnx_ir as ir

import dqtool
from dqtool import registry
from dqtool.inspection import inspect
from dqtool.registry.family import Family, InspectSupport

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dqtool"
# Not a family: qdq (helpers the Q/DQ families share).
SHARED = {"qdq"}
# The registry's list of the families dqtool ships (``BUILTIN``) names them all; the
# applications built on one family's operators name that family; the package's public
# names include the fused operators' kernel.
ALLOWED = {PACKAGE / "registry" / "__init__.py": None,
           PACKAGE / "fused": {"fused"}, PACKAGE / "integer": {"integer"},
           PACKAGE / "__init__.py": {"fused"}}


def _family_names() -> set[str]:
    folders = {p.parent.name for p in (PACKAGE / "families").glob("*/__init__.py")}
    return folders | {m.rsplit(".", 1)[1] for m in registry.BUILTIN}


def named_families(source: str, names: set[str]) -> list[str]:
    """Every place ``source`` imports (or names, as a module string for importlib) a
    family's module: ``dqtool.families.<name>[...]`` or ``from dqtool.families import name``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        modules: list[str] = []
        if isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules = [node.module]
            if node.module == "dqtool.families":
                modules += [f"dqtool.families.{a.name}" for a in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            modules = [node.value] if node.value.startswith("dqtool.families.") else []
        for m in modules:
            parts = m.split(".")
            if parts[:2] == ["dqtool", "families"] and len(parts) > 2 and parts[2] in names:
                found.append(f"line {node.lineno}: {m}")
    return found


def test_the_checker_finds_every_way_of_naming_a_family():
    names = {"fused", "integer"}
    source = ("import dqtool.families.fused.kernel\n"
              "from dqtool.families.integer import describe\n"
              "from dqtool.families import fused\n"
              "API = {'f': 'dqtool.families.fused.kernel'}\n"
              "from dqtool.families import all_families\n"
              "from dqtool.registry.family import Family\n")
    assert named_families(source, names) == [
        "line 1: dqtool.families.fused.kernel", "line 2: dqtool.families.integer",
        "line 3: dqtool.families.fused", "line 4: dqtool.families.fused.kernel"]


def test_no_module_outside_the_families_names_one():
    names = _family_names() - SHARED
    assert {"fused", "integer", "qdq_onnx", "qdq_microsoft", "qdq_opmx"} <= names
    offenders = {}
    for path in PACKAGE.rglob("*.py"):
        if (PACKAGE / "families") in path.parents:
            continue
        place = next((a for a in ALLOWED if a == path or a in path.parents), None)
        if place is not None and ALLOWED[place] is None:
            continue
        own = ALLOWED[place] if place is not None else set()
        found = named_families(path.read_text(encoding="utf-8"), names - own)
        if found:
            offenders[str(path.relative_to(ROOT))] = found
    assert offenders == {}


def _family() -> Family:
    """A test family owning widget.test.Widget: inspect reports it in a section of its
    own."""

    class Report:
        def __init__(self, node: ir.Node) -> None:
            self.name = node.name

        def to_json(self) -> dict:
            return {"name": self.name}

    def node(n: ir.Node, opsets, graph_name: str):
        return Report(n) if n.op_type == "Widget" else None

    support = InspectSupport(node=node, section="widgets",
                             summary=lambda reports: {"widgets": len(reports)})
    return Family(name="widgets", keys=(("widget.test", "Widget", 1),),
                  inspect=lambda: support)


def _widget_model() -> ir.Model:
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([2]))
    node = ir.Node("widget.test", "Widget", [x], name="w0", num_outputs=1)
    node.outputs[0].name = "y"
    graph = ir.Graph([x], node.outputs, nodes=[node], opset_imports={"": 21, "widget.test": 1})
    return ir.Model(graph, ir_version=10)


def test_a_registered_family_reaches_inspect():
    family = registry.register(_family())
    try:
        report = inspect(_widget_model())
        assert [r.name for r in report.widgets] == ["w0"]
        doc = report.to_json()
        assert doc["widgets"] == [{"name": "w0"}] and doc["summary"]["widgets"] == 1
        assert list(doc)[-2:] == ["widgets", "summary"]
    finally:
        registry.unregister(family.name)
    assert "widgets" not in inspect(_widget_model()).to_json()


def test_family_api_names_stay_lazy_and_public():
    assert {"pack", "dequantize_matmul_nbits"} <= set(dqtool.__all__)
    assert callable(dqtool.pack)
    # Importing dqtool (what `dqtool --version` does) loads no family.
    code = ("import sys, dqtool, dqtool.cli; "
            "print(any(m.startswith('dqtool.families') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.stdout.strip() == "False", out.stderr
