"""The CLI shell: help, version, lazy commands."""

from __future__ import annotations

import subprocess
import sys

import pytest
from click.testing import CliRunner

from dqtool import __version__
from dqtool.cli import COMMANDS, _unavailable, cli


def test_help_lists_every_command():
    result = CliRunner().invoke(cli, ["--help"], env={"NO_COLOR": "1", "COLUMNS": "80"})
    assert result.exit_code == 0
    for name in ("inspect", "upgrade", "downgrade", "fold", "check", "lint"):
        assert f"  {name} " in result.output
    assert "Exit codes" in result.output


def test_every_command_imports_and_has_help():
    for name in COMMANDS:
        result = CliRunner().invoke(cli, [name, "--help"])
        assert result.exit_code == 0, (name, result.output)
        assert "not available" not in result.output, name


def test_unavailable_command_says_why_and_exits_2():
    cmd = _unavailable("frobnicate", "No module named 'x'")
    result = CliRunner().invoke(cmd, ["a"], obj=None)
    assert result.exit_code == 2


def test_python_m_and_version():
    r = subprocess.run([sys.executable, "-m", "dqtool", "--version"], capture_output=True,
                       text=True)
    assert r.returncode == 0 and __version__ in r.stdout


def test_unknown_command_is_a_usage_error():
    result = CliRunner().invoke(cli, ["frobnicate"])
    assert result.exit_code == 2


@pytest.mark.parametrize("args, message", [
    (["upgrade", "models/dq10_uint8_per_tensor.onnx", "--opset", "abc"],
     "Invalid value for '--opset': 'abc' is not a valid integer. (see 'dqtool upgrade --help')"),
    (["inspect"], "Missing argument 'MODEL'. (see 'dqtool inspect --help')"),
    (["nosuch"], "No such command 'nosuch'. (see 'dqtool --help')"),
])
def test_usage_errors_are_one_line(args, message):
    """A value click rejects is a bad request like any other: one line, exit 2."""
    r = subprocess.run([sys.executable, "-m", "dqtool", *args], capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr == f"dqtool: error: {message}\n"
    assert r.stdout == ""
