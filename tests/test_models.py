"""models/ is reproducible: `make models` rebuilds the committed files byte for byte."""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import onnx

MODELS = Path(__file__).resolve().parent.parent / "models"


def _digests(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and (p.suffix == ".onnx" or p.name.endswith(".onnx.data"))
    }


def _locked_onnxruntime() -> str:
    lock = (MODELS.parent / "requirements.lock").read_text()
    return re.search(r"^onnxruntime==(\S+)", lock, re.M).group(1)


def _structure(path: Path) -> tuple:
    m = onnx.load(str(path), load_external_data=False)
    # Initializer names are the quantizer's to choose (1.31 names a transposed weight
    # "fc.weight_Transposed_quantized", 1.32 "fc.weight_quantized").
    return ([(n.domain, n.op_type) for n in m.graph.node],
            sorted((i.data_type, tuple(i.dims)) for i in m.graph.initializer))


def test_build_reproduces_committed_models(tmp_path):
    """Byte for byte with the locked onnxruntime (whose quantizer made the ``ort_*`` models).
    With another release the quantizer's own output may change: those models then keep the
    same operators and initializer types and shapes, and everything dqtool writes is still
    byte-identical."""
    subprocess.run([sys.executable, str(MODELS / "build.py"), "--out", str(tmp_path),
                    "--no-verify"], check=True, capture_output=True)
    committed = _digests(MODELS)
    assert len(committed) >= 30
    built = _digests(tmp_path)
    assert built.keys() == committed.keys()
    differ = {name for name in committed if built[name] != committed[name]}
    if metadata.version("onnxruntime") == _locked_onnxruntime():
        assert not differ
        return
    assert all(name.startswith("ort_") for name in differ), differ
    for name in differ:
        assert _structure(tmp_path / name) == _structure(MODELS / name), name
