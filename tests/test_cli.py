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


@pytest.mark.parametrize("held", [True, False])
def test_imports_run_without_the_collector_until_a_command_starts(held: bool) -> None:
    # The `dqtool` script turns the cyclic collector off while it imports; the command's
    # body freezes what the imports made and turns it back on. Without the script's
    # request (a library caller, a test), a command leaves the collector alone.
    import gc
    from pathlib import Path

    from dqtool.cli import app

    model = Path(__file__).resolve().parents[1] / "models" / "ort_qdq_contrib.onnx"
    frozen = gc.get_freeze_count()
    try:
        if held:
            app.imports_without_gc()
            assert not gc.isenabled()
        result = CliRunner().invoke(cli, ["inspect", str(model), "--json"])
        assert result.exit_code == 0, result.output
        assert gc.isenabled()
        assert (gc.get_freeze_count() > frozen) is held
        assert not app._GC_HELD
    finally:
        gc.unfreeze()
        gc.enable()
        app._GC_HELD = False


def test_the_script_leaves_the_collector_on_for_its_command() -> None:
    # End to end, through `entry` in a process of its own: the command's work (here the
    # inspection) runs with the collector on and the imported objects frozen.
    from pathlib import Path

    code = ("import gc, sys; import dqtool.inspection as i; real = i.inspect\n"
            "def spy(*a, **k):\n"
            "    print('gc', gc.isenabled(), gc.get_freeze_count() > 1000, file=sys.stderr)\n"
            "    return real(*a, **k)\n"
            "i.inspect = spy\n"
            "from dqtool.cli import entry\n"
            "sys.argv = ['dqtool', 'inspect', sys.argv[1], '--json']; entry()")
    model = Path(__file__).resolve().parents[1] / "models" / "ort_qdq_contrib.onnx"
    proc = subprocess.run([sys.executable, "-c", code, str(model)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "gc True True" in proc.stderr


@pytest.mark.parametrize("data_name", ["weights.bin", "m.onnx.data"])
def test_in_place_says_which_data_files_it_left(tmp_path, data_name):
    """--in-place removes only the data files dqtool named for the model; others the
    replaced model read (maybe another model's too) stay, and the command says so."""
    import numpy as np
    import onnx_ir as ir

    rng = np.random.default_rng(0)
    x = ir.Value(name="X", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([1, 64]))
    q = ir.Value(name="q", const_value=ir.tensor(rng.integers(-8, 8, (64, 32), dtype=np.int8)))
    s = ir.Value(name="s", const_value=ir.tensor((rng.random(32) + 0.1).astype(np.float32)))
    dq = ir.node("DequantizeLinear", [q, s], {"axis": 1}, name="dq")
    mm = ir.node("MatMul", [x, dq.outputs[0]], name="mm")
    mm.outputs[0].name, mm.outputs[0].dtype = "Y", ir.DataType.FLOAT
    g = ir.Graph([x], [mm.outputs[0]], nodes=[dq, mm], initializers=[q, s],
                 opset_imports={"": 19}, name="g")
    model = tmp_path / "m.onnx"
    ir.save(ir.Model(g, ir_version=9), model, external_data=data_name, size_threshold_bytes=0)
    r = CliRunner().invoke(cli, ["upgrade", str(model), "--opset", "21", "--in-place"])
    assert r.exit_code == 0, r.output
    left = "the replaced model's data files weights.bin"
    if data_name == "weights.bin":
        assert left in r.output and "are left in place" in r.output
        assert (tmp_path / "weights.bin").exists()
    else:
        assert "left in place" not in r.output
        files = sorted(p.name for p in tmp_path.iterdir())  # the old data removed
        assert len(files) == 2 and files[0] == "m.onnx" and files[1].startswith("m.onnx.")
