"""models/ is reproducible: `make models` rebuilds the committed files byte for byte."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

MODELS = Path(__file__).resolve().parent.parent / "models"


def _digests(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and (p.suffix == ".onnx" or p.name.endswith(".onnx.data"))
    }


def test_build_reproduces_committed_models(tmp_path):
    subprocess.run([sys.executable, str(MODELS / "build.py"), "--out", str(tmp_path),
                    "--no-verify"], check=True, capture_output=True)
    committed = _digests(MODELS)
    assert len(committed) >= 30
    assert _digests(tmp_path) == committed
