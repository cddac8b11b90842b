"""The committed lock covers what pyproject asks for, with hashes, and the drift report
says what differs."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent


def _drift_module():
    spec = importlib.util.spec_from_file_location("lock_drift", ROOT / "tools/lock_drift.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~ ;\[]", r, maxsplit=1)[0].lower().replace("_", "-")
            for r in requirements}


def test_lock_pins_every_dependency_with_hashes():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    wanted = (_names(project["project"]["dependencies"])
              | _names(project["project"]["optional-dependencies"]["dev"])
              | _names(project["dependency-groups"]["build"]))
    text = (ROOT / "requirements.lock").read_text()
    pins = _drift_module().locked(ROOT / "requirements.lock")
    assert wanted <= set(pins), wanted - set(pins)
    blocks = re.split(r"\n(?=[a-z0-9])", text)
    pinned = [b for b in blocks if "==" in b.split("\n")[0]]
    assert len(pinned) == len(pins)
    assert all("--hash=sha256:" in b for b in pinned)


def test_drift_lists_what_differs_and_ignores_what_is_absent():
    drift = _drift_module().drift
    lock = {"onnxruntime": "1.32.0", "numpy": "2.4.6", "hatchling": "1.33.0"}
    have = {"onnxruntime": "1.31.1", "numpy": "2.4.6"}
    assert drift(lock, have) == ["  onnxruntime: locked 1.32.0, installed 1.31.1"]
    assert drift(lock, {**have, "onnxruntime": "1.32.0"}) == []
