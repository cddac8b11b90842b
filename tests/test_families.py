"""The operator-family registry: one home per operator, and everything derived from it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir
import pytest
from onnx.reference.op_run import OpRun

import dqtool
from dqtool import cleanup, codecs, reference_evaluator, registry
from dqtool.convert.registry import Outcome, Registry, default_registry
from dqtool.linting import targets
from dqtool.registry.family import Family
from dqtool.spec import QuantSpec


def test_the_qdq_families_are_registered_and_own_their_operators():
    names = [f.name for f in registry.all_families()]
    assert names[:3] == ["qdq_onnx", "qdq_microsoft", "qdq_opmx"]
    assert registry.owner("", "DequantizeLinear").name == "qdq_onnx"
    assert registry.owner("ai.onnx", "QuantizeLinear").name == "qdq_onnx"
    assert registry.owner("com.microsoft", "QuantizeLinear").name == "qdq_microsoft"
    assert registry.owner("pmx", "DequantizeLinear").name == "qdq_opmx"
    assert registry.owner("opmx", "QuantizeLinear") is None
    assert registry.owner("", "MatMul") is None


def test_codecs_come_from_the_families_and_match_their_keys():
    # (a family without codecs, e.g. the fused or the integer one, reads its nodes its own
    # way)
    keys = {(d, o, v) for f in registry.all_families() if f.codecs is not None
            for d, o, v in f.keys}
    assert set(codecs.REGISTRY) == keys
    assert ("ai.onnx", "DequantizeLinear", 21) in keys


def test_derived_sets():
    assert registry.prunable_domains() == {"com.microsoft", "opmx", "pmx"}
    ops = {(op.op_domain, op.__name__) for op in registry.evaluator_ops()}
    qdq = {("", "DequantizeLinear"), ("", "QuantizeLinear"),
           ("com.microsoft", "DequantizeLinear"), ("com.microsoft", "QuantizeLinear"),
           ("opmx", "DequantizeLinear"), ("pmx", "DequantizeLinear"),
           ("com.microsoft", "MatMulNBits"), ("com.microsoft", "GatherBlockQuantized")}
    integer = {(op.op_domain, op.__name__) for op in registry.owner(
        "com.microsoft", "QGemm").evaluator_ops()}
    assert ops == qdq | integer
    assert {("", "QLinearConv"), ("com.microsoft", "QGemm")} <= integer
    assert registry.is_fold_root("", "DequantizeLinear")
    assert registry.is_fold_root("opmx", "DequantizeLinear")
    assert not registry.is_fold_root("", "QuantizeLinear")
    assert not registry.fold_kernel("opmx").sliceable and registry.fold_kernel("dq").sliceable
    with pytest.raises(KeyError):
        registry.fold_kernel("nope")
    assert registry.lint_fact("pmx", "onnxruntime") == "onnxruntime has no pmx domain"
    assert registry.lint_fact("com.microsoft", "onnxruntime") is None


def test_default_registry_holds_every_family_adapter():
    keys = default_registry().keys()
    assert ("com.microsoft", "DequantizeLinear", 1, "onnx") in keys
    assert ("pmx", "DequantizeLinear", 1, "onnx") in keys
    assert ("ai.onnx", "DequantizeLinear", 21, "down") in keys


def test_an_operator_has_one_home():
    dup = Family("dup", (("com.microsoft", "DequantizeLinear", 1),))
    with pytest.raises(ValueError, match="belongs to qdq_microsoft"):
        registry.register(dup)
    assert registry.owner("com.microsoft", "DequantizeLinear").name == "qdq_microsoft"
    assert "dup" not in [f.name for f in registry.all_families()]


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



@dataclass(frozen=True)
class TwiceCodec:
    """A toy codec: what it reads is beside the point, that it is found is."""

    op: str = "Twice"
    since_version: int = 1
    domain: str = "com.example"

    def read(self, node: ir.Node, version: int) -> QuantSpec:
        return QuantSpec(op=self.op, domain=self.domain, version=version, since_version=1,
                         quant_type=None, scale_type=None, float_type=None, granularity=None)


class Twice(OpRun):
    op_domain = "com.example"

    def _run(self, x):
        return (x * 2,)


def test_a_family_registered_later_reaches_every_derived_table(tmp_path, monkeypatch):
    """A plugin's family, registered after dqtool is in use: its codec reads its nodes, the
    evaluator runs them, lint knows its target and facts, cleanup prunes its domain; and
    all of it goes again when the family is removed."""
    (tmp_path / "toy_lint.py").write_text(
        "from dqtool.linting.targets.base import Profile, fixed\n"
        "TARGETS = [fixed(Profile('toy-npu', 'a toy NPU', lambda spec, opset: []), 99)]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    toy = Family("toy", (("com.example", "Twice", 1),), codecs=lambda: [TwiceCodec()],
                 evaluator_ops=lambda: [Twice], prunable=frozenset({"com.example"}),
                 lint_facts={"onnxruntime": "onnxruntime has no {domain} domain"},
                 lint_modules=("toy_lint",))
    m = ir.from_onnx_text("""
        <ir_version: 8, opset_import: ["" : 17, "com.example" : 3]>
        g (float[2] x) => (float[2] y) { y = com.example.Twice (x) }""")
    node = next(iter(m.graph))
    assert codecs.read_node(node, {"com.example": 3}).since_version == 0  # unknown yet
    before = registry.generation()
    registry.register(toy)
    try:
        assert registry.generation() != before
        assert registry.owner("com.example", "Twice") is toy
        assert codecs.read_node(node, {"com.example": 3}).since_version == 1
        assert ("com.example", "Twice", 1) in codecs.REGISTRY
        got = reference_evaluator(m).run(None, {"x": np.array([1.5, -2], np.float32)})[0]
        assert got.tolist() == [3.0, -4.0]
        assert "toy-npu" in targets.names()
        assert registry.lint_fact("com.example", "onnxruntime") == \
            "onnxruntime has no com.example domain"
        assert "com.example" in registry.prunable_domains()
    finally:
        registry.unregister("toy")
    assert registry.owner("com.example", "Twice") is None
    assert codecs.lookup("com.example", "Twice", 3) is None
    assert "toy-npu" not in targets.names()
    assert "com.example" not in registry.prunable_domains()


def test_an_ai_onnx_op_of_a_family_without_version_adapters_converts_generically():
    """A family may own an ai.onnx op (the integer family's QLinearMatMul) without version
    adapters: the driver then moves it as any ai.onnx op, and no codec judges it."""
    fam = Family("qlinear_test", (("ai.onnx", "QLinearMatMul", 10),))
    m = ir.from_onnx_text("""
        <ir_version: 8, opset_import: ["" : 13]>
        g (uint8[2,2] a, float as, uint8 az, uint8[2,2] b, float bs, uint8 bz, float ys,
           uint8 yz) => (uint8[2,2] y) {
            y = QLinearMatMul (a, as, az, b, bs, bz, ys, yz)
        }""")
    registry.register(fam)
    try:
        report = dqtool.upgrade(m, 21)
    finally:
        registry.unregister("qlinear_test")
    assert report.ok and [n.op_type for n in report.model.graph] == ["QLinearMatMul"]
    assert report.model.opset_imports[""] == 21


@dataclass(frozen=True)
class ScaledMatMulCodec:
    """A toy fused weight-only op: ``Y = A @ (Wq * scale)``, Wq int8, scale per-tensor."""

    op: str = "ScaledMatMul"
    since_version: int = 1
    domain: str = "com.example"

    def read(self, node: ir.Node, version: int) -> QuantSpec:
        from dqtool import graph

        w, s = graph.input_value(node, 1), graph.input_value(node, 2)
        return QuantSpec(op=self.op, domain=self.domain, version=version, since_version=1,
                         quant_type="int8", scale_type="float", float_type="float",
                         granularity="per-tensor", x_shape=graph.shape_of(w),
                         x_constant=graph.constant_tensor(w) is not None,
                         scale_constant=graph.constant_tensor(s) is not None)


class ScaledMatMul(OpRun):
    op_domain = "com.example"

    def _run(self, a, w, s):
        return (a @ (w.astype(np.float32) * s),)


def _scaled_call(node: ir.Node, spec: QuantSpec, out):
    from dqtool import graph
    from dqtool.folding.kernel_call import KernelCall

    return KernelCall(kind="scaled", scale=graph.constant_tensor(graph.input_value(node, 2)),
                zero_point=None, axis=0, block_size=0, granularity="per-tensor",
                norm_axis=None, output_dtype=out)


def _fold_support():
    from dqtool.registry.family import FoldSupport, Kernel

    return FoldSupport(
        roots=frozenset({"ScaledMatMul"}),
        kernels={"scaled": Kernel(lambda x, s, zp, call: x.astype(np.float32) * s)},
        call=_scaled_call, weight_input=1,
        replace=lambda node, w: [ir.node("MatMul", [node.inputs[0], w], name=node.name)])


SCALED = """
    <ir_version: 8, opset_import: ["" : 17, "com.example" : 1]>
    g (float[2,3] a) => (float[2,4] y) {
        w = Constant <value = int8[3,4] {1, -2, 3, -4, 5, -6, 7, -8, 9, -10, 11, -12}> ()
        s = Constant <value = float {0.5}> ()
        y = com.example.ScaledMatMul (a, w, s)
    }"""


def test_a_fused_family_folds_through_its_fold_support(tmp_path):
    """A fused weight-only op in its own family: fold turns its weight into a float constant
    and the op into the MatMul the family names, with the same outputs."""
    toy = Family("scaled", (("com.example", "ScaledMatMul", 1),),
                 codecs=lambda: [ScaledMatMulCodec()], evaluator_ops=lambda: [ScaledMatMul],
                 fold=_fold_support, prunable=frozenset({"com.example"}))
    a = np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5
    registry.register(toy)
    try:
        want = reference_evaluator(ir.from_onnx_text(SCALED)).run(None, {"a": a})[0]
        report = dqtool.fold(ir.from_onnx_text(SCALED), tmp_path / "f.onnx",
                             prepack_guard=False)
    finally:
        registry.unregister("scaled")
    (folded,) = report.folded
    assert folded.op == "com.example:ScaledMatMul-1" and folded.output == "y"
    ops = [(n.domain, n.op_type) for n in report.model.graph]
    assert ops == [("", "MatMul")]
    weight = report.model.graph.initializers[next(iter(report.model.graph.initializers))]
    assert weight.const_value.numpy().tolist() == \
        (np.arange(1, 13).reshape(3, 4) * np.array([1, -1, 1, -1]) * 0.5).tolist()
    assert "com.example" not in report.model.opset_imports
    got = reference_evaluator(tmp_path / "f.onnx").run(None, {"a": a})[0]
    assert got.tobytes() == want.tobytes() and got.shape == (2, 4)
