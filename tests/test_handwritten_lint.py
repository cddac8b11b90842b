"""DQ113 (``dqtool/linting/rules/handwritten.py``): a hand-written dequantization with an
exact DequantizeLinear form, reported as information for targets that fuse
DequantizeLinear; none left after the rewrite."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from test_handwritten_models import S12, X8, cast_mul

from dqtool.handwritten import rewrite
from dqtool.linting import registry
from dqtool.linting.context import ModelContext
from dqtool.linting.rules import handwritten as rule


def findings(m: ir.Model, target: str) -> list:
    return list(rule.target_findings(ModelContext("m.onnx", m), target))


def test_registered_as_an_info_target_rule() -> None:
    rules = registry.load()
    assert rules["DQ113"].severity == "info" and rules["DQ113"].name == \
        "handwritten-dequantization"


@pytest.mark.parametrize("target", ["onnxruntime", "onnxruntime-1.32", "qnn-htp",
                                    "qnn-htp-2.7", "onednn-graph"])
def test_reported_for_targets_that_fuse(target: str) -> None:
    m = ir.from_proto(cast_mul(X8, S12.reshape(1, 12), consumer="MatMul", opset=17))
    [f] = findings(m, target)
    assert (f.code, f.severity, f.target, f.graph) == ("DQ113", "info", target, "main")
    assert "Cast → Mul dequantizes 'w' (int8 per-axis)" in f.message
    assert "DequantizeLinear-13+ int8 per-axis axis 1" in (f.fix or "")


@pytest.mark.parametrize("target", ["openvino", "directml-fl6.2", "onnx-opset-21", "opmx"])
def test_not_for_other_targets(target: str) -> None:
    m = ir.from_proto(cast_mul(X8, S12.reshape(1, 12), consumer="MatMul"))
    assert findings(m, target) == []


def test_a_form_above_the_model_opset_is_named() -> None:
    m = ir.from_proto(cast_mul(X8, S12.astype(np.float16).reshape(1, 12), ft="float16",
                               opset=21))
    [f] = findings(m, "onnxruntime")
    assert "at opset 23" in (f.fix or "")


def test_nothing_without_an_exact_form_and_clean_after_the_rewrite() -> None:
    m = ir.from_proto(cast_mul(X8, np.float32(0.5), zp=np.float32(0.5)))
    assert findings(m, "onnxruntime") == []
    done = rewrite(ir.from_proto(cast_mul(X8, S12.reshape(1, 12), consumer="MatMul")))
    assert findings(ir.from_proto(cast_mul(X8, S12.reshape(1, 12))), "onnxruntime")
    assert findings(done.model, "onnxruntime") == []
