"""Lint rules and targets come from registries their modules fill: --target help, the list
of known names and the docs' tables derive from them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from dqtool.cli import cli
from dqtool.errors import UsageError
from dqtool.linting import registry, targets
from dqtool.linting.targets import directml

MODELS = Path(__file__).resolve().parent.parent / "models"


def test_target_names_come_from_the_modules():
    names = targets.names()
    assert names[:2] == ("onnx-opset-N", "onnxruntime")
    assert [n for n in names if n.startswith("directml-")] == \
        [f"directml-fl{lv}" for lv in directml.LEVELS]
    assert names == targets.NAMES
    assert {"onednn-graph", "opmx"} <= set(names)
    assert all(t.summary for t in targets.table())


@pytest.mark.parametrize("value, name", [("onnx-opset-13", "onnx-opset-13"),
                                         ("directml-fl6.3", "directml-fl6.3"),
                                         ("onnxruntime", "onnxruntime"),
                                         ("onnxruntime-1.31", "onnxruntime-1.31"),
                                         ("onnxruntime-1.32", "onnxruntime-1.32"),
                                         ("opmx", "opmx")])
def test_parse(value, name):
    assert targets.parse(value).name == name


def test_unknown_and_bad_targets():
    with pytest.raises(UsageError, match=r"known: onnx-opset-N, onnxruntime, "
                       r"onnxruntime-1\.31, onnxruntime-1\.32, directml-fl1\.0"):
        targets.parse("coreml")
    with pytest.raises(UsageError, match="opset must be 10 to"):
        targets.parse("onnx-opset-9")
    with pytest.raises(UsageError, match="unknown"):
        targets.parse("directml-fl9.9")
    with pytest.raises(UsageError, match="unknown"):
        targets.parse("onnxruntime-1.9")  # no fixed profile for that release


def test_target_help_lists_every_target():
    out = CliRunner().invoke(cli, ["lint", "--help"]).output
    text = " ".join(out.split()).replace("- ", "-")  # unwrapped (click breaks at hyphens)
    help_text = text[text.index("--target T"):text.index("--select")]
    for name in targets.names():
        assert name in help_text


def test_rules_are_found_not_listed():
    rules = registry.load()
    assert {"DQ001", "DQ100", "DQ106"} <= set(rules)
    assert all(codes for codes, _ in registry.CHECKS)


def test_lint_json_flag_is_format_json():
    run = CliRunner().invoke
    bad = str(MODELS / "invalid_ort_axis_opset11.onnx")
    a = run(cli, ["lint", bad, "--json"])
    b = run(cli, ["lint", bad, "--format", "json"])
    assert a.exit_code == b.exit_code == 1
    assert json.loads(a.output)["findings"] == json.loads(b.output)["findings"]
    c = run(cli, ["lint", bad, "--json", "--format", "sarif"])
    assert c.exit_code == 2 and "two formats" in c.output


def test_all_rules_survives_the_rule_modules_being_imported():
    from dqtool import linting

    first = linting.all_rules()
    assert "DQ100" in first and "DQ030" in first
    assert linting.all_rules() == first  # the rules subpackage is imported by now
