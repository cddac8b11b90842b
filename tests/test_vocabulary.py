"""One vocabulary across reports: ``input`` (the path read), ``files`` (what was written),
``model`` (the resulting model, Python only) and ``op`` as ``domain:OpType-version``."""

from __future__ import annotations

import json
import re
from pathlib import Path

from click.testing import CliRunner

import dqtool
from dqtool.cli import cli

MODELS = Path(__file__).resolve().parent.parent / "models"
SRC = MODELS / "ms_qdq_contrib.onnx"
OP = re.compile(r"^(ai\.onnx|com\.microsoft|opmx|pmx):[A-Za-z]+-\d+$")


def _json(*args: str) -> dict:
    r = CliRunner().invoke(cli, list(args))
    assert r.exit_code in (0, 1), r.output
    return json.loads(r.stdout)


def test_fold_and_convert_reports_share_field_names(tmp_path):
    fold = dqtool.fold(SRC, tmp_path / "f.onnx")
    conv = dqtool.upgrade(SRC, 21, tmp_path / "c.onnx")
    for report in (fold, conv):
        assert report.input == str(SRC)
        assert report.model is not None and report.model.graph is not None
        assert report.files and all(Path(f).exists() for f in report.files)
    assert {n.op for n in fold.folded} == {"com.microsoft:DequantizeLinear-1"}
    assert {c.op for c in conv.changes} == {"com.microsoft:DequantizeLinear-1",
                                            "com.microsoft:QuantizeLinear-1"}


def test_json_of_every_command_says_input(tmp_path):
    docs = {
        "fold": _json("fold", str(SRC), "-o", str(tmp_path / "f.onnx"), "--json"),
        "upgrade": _json("upgrade", str(SRC), "--opset", "21", "-o",
                         str(tmp_path / "c.onnx"), "--json"),
        "check": _json("check", str(SRC), "--json"),
        "inspect": _json("inspect", str(SRC), "--json"),
    }
    for name, doc in docs.items():
        assert doc["input"] == str(SRC), name
        assert "model" not in doc and "source" not in doc, name
    for name in ("fold", "upgrade"):
        assert docs[name]["files"] and "written" not in docs[name]
    ops = [n["op"] for n in docs["fold"]["folded"]] + \
        [c["op"] for c in docs["upgrade"]["changed"]] + \
        [n["op"] for n in docs["check"]["nodes"]]
    assert ops and all(OP.match(op) for op in ops), ops
    lint = _json("lint", str(MODELS / "invalid_ort_axis_opset11.onnx"), "--json")
    assert lint["inputs"] == [str(MODELS / "invalid_ort_axis_opset11.onnx")]
    assert lint["findings"] and all(f["input"] == lint["inputs"][0] and OP.match(f["op"])
                                    for f in lint["findings"] if f["op"])
