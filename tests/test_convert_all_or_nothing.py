"""All or nothing: a conversion that refuses leaves the caller's model exactly as it was;
one that succeeds hands back a converted copy and leaves it as it was too."""

from __future__ import annotations

from pathlib import Path

import onnx_ir as ir
import pytest

import dqtool
from dqtool import graph, storage
from dqtool.convert.report import ConversionRefused
from dqtool.errors import DqtoolError

MODELS = Path(__file__).resolve().parent.parent / "models"
ALL = sorted(p.relative_to(MODELS).as_posix() for p in MODELS.rglob("*.onnx"))


def _bytes(model: ir.Model) -> bytes:
    return ir.to_proto(model).SerializeToString(deterministic=True)


def _attempts(name: str):
    """(opset, refused, model before, model after) for every opset but the model's own."""
    src = graph.opset_of(dict(ir.load(MODELS / name).opset_imports), "")
    for opset in range(1, storage.MAX_ONNX_OPSET + 1):
        if src is None or opset == src:
            continue
        model = ir.load(MODELS / name)
        before = _bytes(model)
        convert = dqtool.upgrade if opset > src else dqtool.downgrade
        try:
            report = convert(model, opset)
        except ConversionRefused:
            yield opset, True, before, _bytes(model)
        except DqtoolError:
            continue  # bad input or request: refused before any node is touched
        else:
            assert report.model is not model
            yield opset, False, before, _bytes(model)


@pytest.mark.parametrize("name", ALL)
def test_every_conversion_leaves_the_callers_model_alone(name):
    changed = [(opset, refused) for opset, refused, before, after in _attempts(name)
               if before != after]
    assert changed == []


def test_the_scan_sees_many_refusals():
    """Not vacuous: models/ has refused (model, opset) pairs in both dialect families, and
    before conversions worked on a copy, the first of these was left half-rewritten."""
    refused = {(name, opset) for name in ("dq19_float8e4m3fn_fp16_scale.onnx",
                                          "opmx_int4_packed.onnx", "ort_qdq_int16.onnx")
               for opset, was_refused, _, _ in _attempts(name) if was_refused}
    assert ("dq19_float8e4m3fn_fp16_scale.onnx", 13) in refused
    assert ("opmx_int4_packed.onnx", 10) in refused
    assert ("ort_qdq_int16.onnx", 20) in refused


def test_refused_float8_downgrade_keeps_nodes_and_initializers():
    model = ir.load(MODELS / "dq19_float8e4m3fn_fp16_scale.onnx")
    nodes = [n.name for n in model.graph]
    inits = sorted(model.graph.initializers)
    with pytest.raises(ConversionRefused) as info:
        dqtool.downgrade(model, 13)
    assert len(info.value.report.refusals) == 4 and not info.value.report.changes
    assert [n.name for n in model.graph] == nodes and len(nodes) == 9
    assert sorted(model.graph.initializers) == inits


def test_a_successful_conversion_returns_a_copy_sharing_tensors():
    model = ir.load(MODELS / "ms_qdq_contrib.onnx")
    before = _bytes(model)
    report = dqtool.upgrade(model, 21)
    assert _bytes(model) == before
    assert {n.domain for n in report.model.graph} <= {"", "ai.onnx"}
    assert any(n.domain == "com.microsoft" for n in model.graph)
    shared = [name for name, v in model.graph.initializers.items()
              if name in report.model.graph.initializers
              and report.model.graph.initializers[name].const_value is v.const_value]
    assert shared
