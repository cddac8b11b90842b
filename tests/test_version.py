"""``dqtool --version``: what it prints, and that it stays fast by importing nothing heavy
(the time itself is measured in bench/bench_startup.py, not here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from dqtool import __version__
from dqtool.cli import version

ROOT = Path(__file__).resolve().parents[1]


def _fresh(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_version_names_each_package_with_its_installed_version():
    out = subprocess.run([sys.executable, "-m", "dqtool", "--version"], capture_output=True,
                         text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines())
    assert list(lines) == ["dqtool", "onnx", "onnx_ir", "onnxruntime", "numpy", "python",
                           "native", "cpu"]
    # the CPU code path onnxruntime takes here, probed (docs/semantics.md)
    from dqtool.runtimes import cpu_path

    probed = cpu_path.probe()
    assert lines["cpu"] == f"{probed.name}: {probed.describe()}"
    # the compiled transpose: whether it is built (never built by --version itself; `make`
    # builds it when it installs)
    from dqtool import native

    if os.environ.get("DQTOOL_NATIVE") == "0":
        assert lines["native"] == "transpose off (DQTOOL_NATIVE=0)"
    else:
        assert native.transpose_fn() is not None
        path = native.describe()[len("on ("):-1]  # where this process found it
        assert lines["native"] == f"transpose built ({path})"
    assert lines["dqtool"] == __version__
    assert lines["onnx"] == metadata.version("onnx")
    assert lines["onnx_ir"] == metadata.version("onnx-ir")
    assert lines["onnxruntime"] == metadata.version("onnxruntime")
    assert lines["numpy"] == metadata.version("numpy")
    assert lines["python"] == ".".join(map(str, sys.version_info[:3]))


def test_version_imports_only_what_the_cpu_path_probe_needs():
    # onnxruntime (and the onnx helpers that build its one-node probe) are imported for the
    # "cpu" line; the graph layer and the terminal renderer are not.
    out = _fresh(
        "import sys, json\n"
        "from dqtool.cli import main\n"
        "try:\n"
        "    main(['--version'])\n"
        "except SystemExit as e:\n"
        "    assert e.code == 0, e.code\n"
        "heavy = ('onnx_ir', 'rich', 'dqtool.kernel', 'dqtool.families')\n"
        "print(json.dumps(sorted(m for m in heavy if m in sys.modules)))\n")
    assert json.loads(out.splitlines()[-1]) == []


def test_the_versions_match_what_the_imported_packages_say():
    # Metadata and the imported module agree for the packages dqtool depends on.
    import numpy
    import onnx
    import onnxruntime

    found = version.versions()
    assert found["onnx"] == ("onnx", onnx.__version__)
    assert found["numpy"] == ("numpy", numpy.__version__)
    assert found["onnxruntime"] == ("onnxruntime", onnxruntime.__version__)


def test_another_onnxruntime_distribution_is_named(monkeypatch: pytest.MonkeyPatch):
    # e.g. onnxruntime-gpu installed instead of onnxruntime: the line says which one.
    monkeypatch.setitem(version.PACKAGES, "onnxruntime",
                        ("no-such-distribution-dqtool-test", "onnx"))
    line = [x for x in version.text().splitlines() if x.startswith("onnxruntime ")]
    assert line == [f"onnxruntime {metadata.version('onnx')} (onnx)"]


def test_a_missing_package_says_not_installed(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(version.PACKAGES, "numpy", ("no-such-distribution-dqtool-test",))
    assert "numpy not installed" in version.text().splitlines()
    assert version.installed(("no-such-distribution-dqtool-test",)) is None
