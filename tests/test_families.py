"""The operator-family registry: one home per operator, and everything derived from it."""

from __future__ import annotations

import onnx_ir as ir
import pytest

import dqtool
from dqtool import cleanup, codecs, families
from dqtool.convert.registry import Outcome, Registry, default_registry
from dqtool.families.base import Family


def test_the_qdq_families_are_registered_and_own_their_operators():
    names = [f.name for f in families.all_families()]
    assert names[:3] == ["qdq_onnx", "qdq_microsoft", "qdq_opmx"]
    assert families.owner("", "DequantizeLinear").name == "qdq_onnx"
    assert families.owner("ai.onnx", "QuantizeLinear").name == "qdq_onnx"
    assert families.owner("com.microsoft", "QuantizeLinear").name == "qdq_microsoft"
    assert families.owner("pmx", "DequantizeLinear").name == "qdq_opmx"
    assert families.owner("opmx", "QuantizeLinear") is None
    assert families.owner("", "MatMul") is None


def test_codecs_come_from_the_families_and_match_their_keys():
    # (a family without codecs, e.g. the fused one, reads its nodes its own way)
    keys = {(d, o, v) for f in families.all_families() if f.codecs is not None
            for d, o, v in f.keys}
    assert set(codecs.REGISTRY) == keys
    assert ("ai.onnx", "DequantizeLinear", 21) in keys


def test_derived_sets():
    assert families.prunable_domains() == {"com.microsoft", "opmx", "pmx"}
    ops = {(op.op_domain, op.__name__) for op in families.evaluator_ops()}
    assert ops == {("", "DequantizeLinear"), ("", "QuantizeLinear"),
                   ("com.microsoft", "DequantizeLinear"), ("com.microsoft", "QuantizeLinear"),
                   ("opmx", "DequantizeLinear"), ("pmx", "DequantizeLinear"),
                   ("com.microsoft", "MatMulNBits"), ("com.microsoft", "GatherBlockQuantized")}
    assert families.is_fold_root("", "DequantizeLinear")
    assert families.is_fold_root("opmx", "DequantizeLinear")
    assert not families.is_fold_root("", "QuantizeLinear")
    assert not families.fold_kernel("opmx").sliceable and families.fold_kernel("dq").sliceable
    with pytest.raises(KeyError):
        families.fold_kernel("nope")
    assert families.lint_fact("pmx", "onnxruntime") == "onnxruntime has no pmx domain"
    assert families.lint_fact("com.microsoft", "onnxruntime") is None


def test_default_registry_holds_every_family_adapter():
    keys = default_registry().keys()
    assert ("com.microsoft", "DequantizeLinear", 1, "onnx") in keys
    assert ("pmx", "DequantizeLinear", 1, "onnx") in keys
    assert ("ai.onnx", "DequantizeLinear", 21, "down") in keys


def test_an_operator_has_one_home():
    dup = Family("dup", (("com.microsoft", "DequantizeLinear", 1),))
    with pytest.raises(ValueError, match="belongs to qdq_microsoft"):
        families.register(dup)
    assert families.owner("com.microsoft", "DequantizeLinear").name == "qdq_microsoft"
    assert "dup" not in [f.name for f in families.all_families()]


FOO = """
<ir_version: 8, opset_import: ["" : 17, "com.example" : 3]>
g (float[4] x) => (float[4] y) {
    y = com.example.Foo (x)
}
"""


def test_driver_dispatches_any_domain_op_and_version_through_the_registry():
    """An adapter registered for (com.example, Foo, 2) is found for a node at version 3, and
    its replacement is what the conversion returns."""
    calls = []
    reg = Registry()

    @reg.register("com.example", "Foo", 2, "onnx")
    def foo_to_onnx(node: ir.Node, step) -> Outcome:
        calls.append((node.op_type, step.src, step.dst))
        node.domain, node.op_type = "", "Relu"
        return Outcome("changed", "Foo → Relu", "test")

    report = dqtool.upgrade(ir.from_onnx_text(FOO), 19, registry=reg)
    assert calls == [("Foo", 3, 19)]  # ai.onnx has no Foo: dst is the target opset
    assert [n.op_type for n in report.model.graph] == ["Relu"]
    assert [c.how for c in report.changes] == ["Foo → Relu"]
    assert "com.example" in report.model.opset_imports  # not a family's prunable domain


def test_driver_leaves_a_node_without_adapter_alone():
    report = dqtool.upgrade(ir.from_onnx_text(FOO), 19, registry=Registry())
    assert [n.op_type for n in report.model.graph] == ["Foo"] and not report.changes


def test_cleanup_prunes_only_family_domains():
    m = ir.from_onnx_text(FOO)
    m.opset_imports["com.microsoft"] = 1
    before = cleanup.used_domains(m)
    before[None].add("com.microsoft")
    cleanup.prune_opsets(m, before)
    assert "com.microsoft" not in m.opset_imports and "com.example" in m.opset_imports
