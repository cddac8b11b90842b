"""lint --target: fused ops flagged (DQ109) everywhere but onnxruntime, with the fix."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers.fused import gbq_model, nbits_inputs, nbits_model

import dqtool


@pytest.fixture
def fused_path(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "m.onnx"
    onnx.save(nbits_model(64, 8, 4, 32, nbits_inputs(rng, 64, 8, 4, 32)), path)
    return path


@pytest.mark.parametrize("target", ["onnx-opset-21", "onnx-opset-17", "directml-fl6.2",
                                    "onednn-graph", "opmx"])
def test_non_onnxruntime_targets_flag_fused_ops(fused_path, target):
    report = dqtool.lint(fused_path, target=target)
    found = [f for f in report.findings if f.code == "DQ109"]
    assert len(found) == 1 and found[0].node == "mm" and found[0].severity == "error"
    assert "`dqtool upgrade --opset 21`" in found[0].fix and "`dqtool fold`" in found[0].fix
    assert report.exit_code == 1


@pytest.mark.parametrize("target", ["onnxruntime", "onnxruntime-1.32"])
def test_onnxruntime_accepts_them(fused_path, target):
    report = dqtool.lint(fused_path, target=target)
    assert [f.code for f in report.findings if f.code == "DQ109"] == []


def test_onnxruntime_flags_what_its_cpu_kernel_rejects(tmp_path):
    rng = np.random.default_rng(1)
    path = tmp_path / "m.onnx"
    onnx.save(nbits_model(64, 8, 8, 32, nbits_inputs(rng, 64, 8, 8, 32, zp="float")), path)
    found = [f for f in dqtool.lint(path, target="onnxruntime").findings if f.code == "DQ109"]
    assert len(found) == 1 and "float zero points" in found[0].message


def test_after_upgrade_the_fused_finding_is_gone(fused_path, tmp_path):
    out = tmp_path / "u.onnx"
    dqtool.upgrade(fused_path, 21, out)
    report = dqtool.lint(out, target="onnx-opset-21")
    assert [f.code for f in report.findings if f.code == "DQ109"] == []


def test_gather_block_quantized_is_flagged_too(tmp_path):
    path = tmp_path / "g.onnx"
    onnx.save(gbq_model(np.zeros((4, 32), np.uint8), np.ones((4, 1), np.float32), None,
                        bits=8), path)
    found = [f for f in dqtool.lint(path, target="directml-fl6.2").findings
             if f.code == "DQ109"]
    assert len(found) == 1 and "GatherBlockQuantized" in found[0].message
    assert "DequantizeLinear + Gather" in found[0].fix
