"""dqtool lint on the command line: formats, exit codes, pyproject configuration."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from dqtool.cli import cli

ENV = {"NO_COLOR": "1", "COLUMNS": "80"}
MODELS = Path("models").resolve()
BAD = str(MODELS / "invalid_ort_axis_opset11.onnx")
NNCF = str(MODELS / "invalid_nncf_uint4_opset17.onnx")
HEALTHY = str(MODELS / "qdq_conv_int8.onnx")


def run(*args: str):
    return CliRunner(env=ENV).invoke(cli, list(args))


def test_exit_codes_and_text():
    result = run("lint", BAD, NNCF)
    assert result.exit_code == 1
    assert "DQ011 error:" in result.output and "DQ010 error:" in result.output
    assert "2 model(s): 3 errors" in result.output
    assert run("lint", HEALTHY).exit_code == 0


def test_json_is_one_document():
    result = run("lint", BAD, "--format", "json")
    doc = json.loads(result.output)
    assert doc["passed"] is False and doc["counts"]["error"] == 2
    assert {f["code"] for f in doc["findings"]} == {"DQ011", "DQ012"}


GITHUB = re.compile(r"^::(error|warning|notice) file=[^,:]+,title=DQ\d{3}::[^\n]+$")


def test_github_annotations_well_formed():
    result = run("lint", BAD, HEALTHY, "--format", "github")
    lines = result.output.splitlines()
    assert lines and all(GITHUB.match(line) for line in lines), lines
    assert any(line.startswith("::error") and "title=DQ011" in line for line in lines)
    assert any(line.startswith("::notice") for line in lines)  # DQ030 info


def test_sarif_structure():
    result = run("lint", BAD, HEALTHY, "--format", "sarif", "--target", "onnxruntime")
    doc = json.loads(result.output)
    assert doc["version"] == "2.1.0" and "sarif-2.1.0" in doc["$schema"]
    (run_,) = doc["runs"]
    rules = run_["tool"]["driver"]["rules"]
    ids = [r["id"] for r in rules]
    assert len(ids) == len(set(ids)) and "DQ001" in ids and "DQ101" in ids
    assert all(r["shortDescription"]["text"] for r in rules)
    assert run_["results"]
    for res in run_["results"]:
        assert res["ruleId"] in ids and ids[res["ruleIndex"]] == res["ruleId"]
        assert res["level"] in ("error", "warning", "note", "none")
        assert res["message"]["text"]
        uri = res["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
        assert uri.startswith("file://") and uri.endswith(".onnx")


def test_targets_on_the_command_line():
    dml = run("lint", HEALTHY, "--target", "directml-fl1.0", "--select", "DQ1")
    assert dml.exit_code == 1 and "DQ101" in dml.output and "int8" in dml.output
    ort = run("lint", str(MODELS / "dq23_float4e2m1_output_dtype.onnx"), "--target",
              "onnxruntime")
    assert ort.exit_code == 1 and "float4e2m1" in ort.output and "fix:" in ort.output
    assert run("lint", HEALTHY, "--target", "onnxruntime").exit_code == 0
    old = run("lint", str(MODELS / "ort_int4_blocked_qdq.onnx"), "--target", "onnx-opset-13")
    assert old.exit_code == 1 and "DQ103" in old.output


@pytest.mark.parametrize("args", [["lint", "missing.onnx"],
                                  ["lint", HEALTHY, "--target", "coreml"],
                                  ["lint", str(MODELS)]])
def test_bad_input_exits_2_with_one_line(args):
    result = run(*args)
    assert result.exit_code == 2
    assert result.output.startswith("dqtool: error:") and result.output.count("\n") == 1


def test_pyproject_config_and_flag_override(tmp_path, monkeypatch):
    project = tmp_path / "proj"
    (project / "sub").mkdir(parents=True)
    (project / "pyproject.toml").write_text(
        '[tool.dqtool.lint]\ntarget = "directml-fl1.0"\nignore = ["DQ03"]\n')
    shutil.copy(HEALTHY, project / "sub" / "m.onnx")
    monkeypatch.chdir(project / "sub")
    result = run("lint", "m.onnx", "--format", "json")
    doc = json.loads(result.output)
    assert doc["target"] == "directml-fl1.0" and result.exit_code == 1
    assert doc["config"].endswith("pyproject.toml")
    assert not any(f["code"].startswith("DQ03") for f in doc["findings"])
    result = run("lint", "m.onnx", "--format", "json", "--target", "onnxruntime")
    assert json.loads(result.output)["target"] == "onnxruntime" and result.exit_code == 0


def test_bad_pyproject_is_exit_2(tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text('[tool.dqtool.lint]\nselect = 3\n')
    monkeypatch.chdir(tmp_path)
    assert run("lint", HEALTHY).exit_code == 2


def test_a_pyproject_that_is_not_utf8_is_one_line_and_exit_2(tmp_path, monkeypatch):
    # An editor's UTF-16 file: it ended in a UnicodeDecodeError traceback.
    (tmp_path / "pyproject.toml").write_bytes(
        '[tool.dqtool.lint]\ntarget = "onnxruntime"\n'.encode("utf-16"))
    monkeypatch.chdir(tmp_path)
    _one_line_error(run("lint", HEALTHY), "pyproject.toml: cannot read (not UTF-8 text")


def test_pre_commit_hook_file():
    text = Path(".pre-commit-hooks.yaml").read_text()
    for needle in ("id: dqtool-lint", "entry: dqtool lint", "language: python",
                   r"files: \.onnx$"):
        assert needle in text


def _one_line_error(result, *needles: str) -> str:
    assert result.exit_code == 2, result.output
    assert result.stdout == "" and "Traceback" not in result.output
    err = result.stderr
    assert err.startswith("dqtool: error:") and err.count("\n") == 1, err
    for needle in needles:
        assert needle in err, err
    return err


@pytest.mark.parametrize("args", [["--select", "XX999"], ["--select", "DQ0,DQ9"],
                                  ["--ignore", "DQ011,DQ05"]])
def test_unknown_codes_exit_2_listing_valid_codes(args):
    bad = [c for c in args[1].split(",") if c not in ("DQ0", "DQ011")]
    _one_line_error(run("lint", HEALTHY, *args), args[0], *bad, "DQ001", "DQ108")


def test_prefixes_and_lowercase_codes_still_select():
    result = run("lint", BAD, "--select", "dq0", "--format", "json")
    assert result.exit_code == 1
    assert {f["code"] for f in json.loads(result.stdout)["findings"]} == {"DQ011", "DQ012"}
    assert run("lint", BAD, "--select", "DQ01", "--ignore", "DQ011,DQ012").exit_code == 0


def test_selections_that_run_nothing_are_refused():
    # Target rules without a target, or ignoring every rule, would pass doing nothing.
    _one_line_error(run("lint", HEALTHY, "--select", "DQ101"), "DQ101", "--target")
    _one_line_error(run("lint", HEALTHY, "--ignore", "DQ,FU"), "no rule")
    assert run("lint", HEALTHY, "--select", "DQ101", "--target", "onnxruntime").exit_code == 0
    _one_line_error(run("lint", HEALTHY, "--target", ""), "--target")


@pytest.mark.parametrize("table,needles", [
    ('select = ["DQ0", "DQ99"]', ["pyproject.toml", "select", "DQ99", "DQ001"]),
    ('ignore = ["XX"]', ["pyproject.toml", "ignore", "XX", "DQ001"]),
    ('target = "coreml"', ["pyproject.toml", "target", "coreml"]),
])
def test_pyproject_typos_exit_2_naming_the_file(tmp_path, monkeypatch, table, needles):
    (tmp_path / "pyproject.toml").write_text(f"[tool.dqtool.lint]\n{table}\n")
    monkeypatch.chdir(tmp_path)
    _one_line_error(run("lint", HEALTHY), *needles)
    if "target" not in table:
        # A typo in the configuration is reported even when an option overrides it.
        _one_line_error(run("lint", HEALTHY, "--select", "DQ0", "--ignore", "DQ03"), *needles)


def test_pyproject_target_only_selection_is_fine_with_a_target(tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text('[tool.dqtool.lint]\nselect = ["DQ0", "DQ1"]\n')
    monkeypatch.chdir(tmp_path)
    assert run("lint", HEALTHY).exit_code == 0  # DQ1 waits for a --target
    assert run("lint", HEALTHY, "--target", "directml-fl1.0").exit_code == 1


@pytest.mark.parametrize("fmt", ["text", "json", "github", "sarif"])
@pytest.mark.parametrize("bad", ["missing.onnx", "DIR"])
def test_one_bad_path_among_several_exits_2_with_no_partial_output(fmt, bad):
    bad = str(MODELS) if bad == "DIR" else bad
    result = run("lint", HEALTHY, bad, NNCF, "--format", fmt)
    _one_line_error(result, bad)
