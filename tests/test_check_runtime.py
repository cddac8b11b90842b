"""``check --runtime``: a deployment runtime (QNN's HTP through onnxruntime-qnn, OpenVINO's
CPU plugin) run beside the reference evaluator, its outputs measured in quantization steps
and reported, never judged. The figures are held to the runtimes' own outputs, run here
directly."""

from __future__ import annotations

import json
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

import dqtool
from dqtool.checking import deployed, inputs
from dqtool.cli import cli

MODELS = Path(__file__).resolve().parents[1] / "models"
QDQ = MODELS / "ort_qdq_per_channel.onnx"


def _feeds(path: Path, seed: int = 0) -> dict[str, np.ndarray]:
    feeds, _ = inputs.generate(onnx.load(path), seed=seed)
    return feeds


def _runs_here(runtime: str) -> bool:
    """The runtime must be there (the lock installs both). Only off x86-64 may it offer no
    device (onnxruntime-qnn offered no QNN device under ARM64 emulation, 2026-11-28): there
    the check must refuse it in one line, exit 2, which is asserted, and the caller's
    comparison with the runtime cannot be made (False)."""
    try:
        deployed.refuse_unknown(runtime)
    except dqtool.errors.UsageError as e:
        if runtime == "qnn-htp" and "no QNN device" in str(e) \
                and platform.machine() not in ("x86_64", "AMD64"):
            r = CliRunner().invoke(cli, ["check", str(QDQ), "--runtime", runtime])
            assert r.exit_code == 2 and "no QNN device" in r.output
            assert len(r.output.strip().splitlines()) == 1, r.output
            return False
        pytest.fail(str(e))
    return True


def _folded(tmp_path: Path) -> Path:
    out = tmp_path / "folded.onnx"
    dqtool.fold(QDQ, out)
    return out


@pytest.mark.parametrize("runtime", ["openvino", "qnn-htp"])
def test_alone_the_runtime_is_measured_against_the_reference(runtime):
    if not _runs_here(runtime):
        return
    report = dqtool.check(QDQ, runtime=runtime)
    [c] = report.comparisons
    assert (c.runtime, c.judged, c.skipped) == (runtime, False, None)
    assert report.runtimes[0].name == runtime
    [out] = c.outputs
    feeds = _feeds(QDQ)
    theirs = deployed.run(runtime, onnx.load(QDQ), feeds, None)["logits"]
    ours = dqtool.reference_evaluator(onnx.load(QDQ)).run(None, feeds)[0]
    assert out.max_abs == float(np.max(np.abs(theirs - ours)))
    assert out.step is not None and out.max_steps == round(out.max_abs / out.step)
    assert report.passed  # the per-node checks decide; the runtime is reported


def test_against_a_deployment_runtime_reports_and_the_reference_decides(tmp_path):
    if not _runs_here("qnn-htp"):
        return
    folded = _folded(tmp_path)
    report = dqtool.check(folded, against=QDQ, runtime="qnn-htp")
    qnn, ref = report.comparisons
    assert (qnn.runtime, qnn.judged, ref.runtime, ref.judged) == ("qnn-htp", False,
                                                                  "reference", True)
    feeds = _feeds(QDQ)
    got = deployed.run("qnn-htp", onnx.load(folded), feeds, None)["logits"]
    want = deployed.run("qnn-htp", onnx.load(QDQ), feeds, None)["logits"]
    [out] = qnn.outputs
    assert out.max_abs == float(np.max(np.abs(got - want)))
    # The folded model runs in float where the QDQ one requantizes on the HTP: a step
    # apart here, measured and shown, while the reference evaluator finds them identical.
    assert ref.passed and all(o.max_abs == 0 for o in ref.outputs)
    assert report.passed and report.exit_code == 0


def test_json_stays_one_document_when_qnn_prints(tmp_path):
    # QNN's library prints a line on standard output as a session starts.
    if not _runs_here("qnn-htp"):
        return
    r = subprocess.run([sys.executable, "-m", "dqtool", "check", str(_folded(tmp_path)),
                        "--against", str(QDQ), "--runtime", "qnn-htp", "--json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["comparisons"][0]["judged"] is False


def test_an_unknown_runtime_is_one_line_exit_2():
    r = CliRunner().invoke(cli, ["check", str(QDQ), "--runtime", "coreml"])
    assert r.exit_code == 2
    with pytest.raises(dqtool.errors.UsageError, match="--runtime must be one of"):
        dqtool.check(QDQ, runtime="coreml")


def test_a_missing_package_says_which_extra(monkeypatch):
    real = __import__

    def no_openvino(name, *a, **k):
        if name == "openvino":
            raise ImportError("No module named 'openvino'")
        return real(name, *a, **k)

    monkeypatch.setattr("builtins.__import__", no_openvino)
    with pytest.raises(dqtool.errors.UsageError, match=r"dqtool\[openvino\]"):
        deployed.refuse_unknown("openvino")


def test_a_model_with_external_data_runs_from_a_copy(tmp_path):
    if not _runs_here("openvino"):
        return
    src = tmp_path / "m.onnx"
    m = onnx.load(QDQ)
    onnx.save(m, src, save_as_external_data=True, all_tensors_to_one_file=True,
              location="m.onnx.data", size_threshold=0)
    before = sorted(p.name for p in tmp_path.iterdir())
    report = dqtool.check(src, runtime="openvino")
    assert report.comparisons[0].skipped is None
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written beside
    shutil.rmtree(tmp_path)
