"""``dqtool check MODEL`` (alone) runs the com.microsoft DynamicQuantizeLSTM, QAttention,
QEmbedLayerNormalization and MulInteger with dqtool's kernels and compares them with
onnxruntime: bit-exact, or kernel-only where onnxruntime has no kernel (data in
``ort_facts``); a float tolerance stated for a release is applied and said."""

from __future__ import annotations

import numpy as np
import pytest
import test_integer_attention
import test_integer_lstm
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import dqtool
from dqtool.checking import path_deviations
from dqtool.families.integer import attention, ort_facts
from dqtool.runtimes.onnxruntime import installed_version, release_of

MS = "com.microsoft"
RELEASE = release_of(installed_version() or "0.0")


def _through_path(monkeypatch) -> None:
    """This CPU path's entries with an emulation put in the kernel's place, as the
    QAttention and DynamicQuantizeLSTM tests do (the spec where none applies)."""
    test_integer_attention._through_path(monkeypatch)
    test_integer_lstm._through_path(monkeypatch)


def _expected(op: str) -> set[str]:
    """check's status for a node of ``op`` once ``_through_path`` applied: bit-exact, or
    where an entry without an emulation here applies to ``op`` on this path
    (neon-layer-norm), the deviation it names (or bit-exact, where the model happens
    not to meet it)."""
    emulated = {"u8s8-pair-saturation", "neon-attention", "fma-lstm"}
    found = [d for d in path_deviations.for_op(f"{MS}:{op}") if d.key not in emulated]
    return {"bit-exact", "runtime-deviation"} if found else {"bit-exact"}


def _beyond_entries(op: str) -> float:
    """How far to move the kernel's output so that it is a real mismatch on every path:
    one ulp, or past the size of an entry that applies to ``op`` here (check passes a
    difference within it as that deviation)."""
    sizes = [d.ulps or 0 for d in path_deviations.for_op(f"{MS}:{op}")]
    return 1.0 + max(sizes, default=0)


def _model(nodes, inputs, outputs, inits):
    g = helper.make_graph(nodes, "m", inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13),
                                            helper.make_opsetid(MS, 1)])
    m.ir_version = 8
    return m


def _bert_block(head_size: int, seed: int = 0):
    """input_ids → QEmbedLayerNormalization → DynamicQuantizeLinear → QAttention."""
    r = np.random.default_rng(seed)
    heads, vocab, seq = 2, 11, 5
    hidden = heads * head_size

    def q(*shape):
        return r.integers(0, 256, shape).astype(np.uint8)

    def s(name):
        return numpy_helper.from_array(np.array(np.float32(r.uniform(0.01, 0.05))), name)

    def z(name):
        return numpy_helper.from_array(np.array(np.uint8(r.integers(100, 156))), name)

    inits = [numpy_helper.from_array(q(vocab, hidden), "word"),
             numpy_helper.from_array(q(seq, hidden), "pos"),
             numpy_helper.from_array(q(hidden), "gamma"),
             numpy_helper.from_array(q(hidden), "beta"),
             s("ws"), s("ps"), s("gs"), s("bs"), z("wz"), z("pz"), z("gz"), z("bz"),
             numpy_helper.from_array(r.integers(-128, 128, (hidden, 3 * hidden)).astype(
                 np.int8), "qkv_w"),
             numpy_helper.from_array(r.standard_normal(3 * hidden).astype(np.float32),
                                     "qkv_b"),
             numpy_helper.from_array(np.array(np.float32(0.02)), "qkv_s")]
    nodes = [
        helper.make_node("QEmbedLayerNormalization",
                         ["ids", "", "word", "pos", "", "gamma", "beta", "mask", "ws", "ps",
                          "", "gs", "bs", "wz", "pz", "", "gz", "bz"],
                         ["emb", "mask_index"], domain=MS, name="embed", epsilon=1e-5),
        helper.make_node("DynamicQuantizeLinear", ["emb"], ["emb_q", "emb_s", "emb_z"],
                         name="quant"),
        helper.make_node("QAttention", ["emb_q", "qkv_w", "qkv_b", "emb_s", "qkv_s",
                                        "mask_index", "emb_z"], ["attn"], domain=MS,
                         name="attention", num_heads=heads),
    ]
    inputs = [helper.make_tensor_value_info("ids", TP.INT32, [2, seq]),
              helper.make_tensor_value_info("mask", TP.INT32, [2, seq])]
    return _model(nodes, inputs, [helper.make_tensor_value_info("attn", TP.FLOAT,
                                                                [2, seq, hidden])],
                  inits), {"ids": r.integers(0, vocab, (2, seq)).astype(np.int32),
                           "mask": np.array([[1, 1, 1, 0, 0], [1] * 5], np.int32)}


def _with_present(model):
    """The block's QAttention also gives ``present`` as a graph output."""
    node = next(n for n in model.graph.node if n.op_type == "QAttention")
    node.output.append("present")
    # (2, batch, heads, total, head_size) of _bert_block(head_size=4)
    model.graph.output.append(helper.make_tensor_value_info("present", TP.FLOAT,
                                                            [2, 2, 2, 5, 4]))
    return model


def _statuses(report):
    return {n.op.split(":")[1].split("-")[0]: n for n in report.nodes}


def test_check_runs_embed_and_attention_bit_exact(monkeypatch):
    _through_path(monkeypatch)
    model, feeds = _bert_block(head_size=4)
    report = dqtool.check(model, inputs=feeds)
    by_op = _statuses(report)
    assert set(by_op) == {"QEmbedLayerNormalization", "DynamicQuantizeLinear", "QAttention"}
    for op, n in by_op.items():
        assert n.status in _expected(op), n.to_json()
    assert report.passed


def test_check_runs_head_size_one_attention_bit_exact(monkeypatch):
    _through_path(monkeypatch)
    for seed in range(4):
        model, feeds = _bert_block(head_size=1, seed=seed)
        node = _statuses(dqtool.check(model, inputs=feeds))["QAttention"]
        assert node.status == "bit-exact", node.to_json()


def _moved_up(x: np.ndarray, ulps: float) -> np.ndarray:
    """``x`` one ulp up, or ``ulps`` ulps of each row (last axis) up."""
    if ulps == 1:
        return np.nextafter(x, np.float32(np.inf)).astype(np.float32)
    step = np.spacing(np.abs(x).max(axis=-1, keepdims=True)).astype(np.float32)
    return (x + step * np.float32(ulps)).astype(np.float32)


def _one_ulp_off(monkeypatch, ulps: float = 1.0):
    real = attention.qattention

    def off(*args, **kwargs):
        out, present = real(*args, **kwargs)
        return _moved_up(out, ulps), present

    monkeypatch.setattr(attention, "qattention", off)


def test_check_passes_a_stated_tolerance_and_says_so(monkeypatch):
    """The mechanism for a release whose float kernels dqtool does not reproduce: the
    kernel made one ulp off, and a one-ulp tolerance stated for this release."""
    _through_path(monkeypatch)
    model, feeds = _bert_block(head_size=4)
    _one_ulp_off(monkeypatch)
    monkeypatch.setattr(ort_facts, "FLOAT_TOLERANCE", (ort_facts.Tolerance(
        "QAttention", (RELEASE,), "test", 0, 1, "float activations: test"),))
    report = dqtool.check(model, inputs=feeds)
    node = _statuses(report)["QAttention"]
    assert node.status == "within-tolerance" and node.passed and report.passed
    assert node.reason.startswith("within 1 ulps (float activations): stated tolerance 1 ")
    assert report.to_json()["summary"]["within-tolerance"] == 1


def test_check_fails_past_the_stated_tolerance(monkeypatch):
    _through_path(monkeypatch)
    model, feeds = _bert_block(head_size=4)
    _one_ulp_off(monkeypatch, _beyond_entries("QAttention"))
    report = dqtool.check(model, inputs=feeds)  # no tolerance stated: bit for bit
    node = _statuses(report)["QAttention"]
    assert node.status == "mismatch" and not report.passed


def test_check_compares_every_output_of_a_node(monkeypatch):
    """The first output decides the status; every other output (QAttention's present,
    QEmbedLayerNormalization's mask_index, an LSTM's Y_h and Y_c, DynamicQuantizeLinear's
    scale and zero point) must be bit-identical too."""
    _through_path(monkeypatch)
    model, feeds = _bert_block(head_size=4)
    model = _with_present(model)
    assert _statuses(dqtool.check(model, inputs=feeds))["QAttention"].status == "bit-exact"
    real = attention.qattention

    def present_off(*args, **kwargs):
        out, present = real(*args, **kwargs)
        return out, _moved_up(present, _beyond_entries("QAttention"))

    monkeypatch.setattr(attention, "qattention", present_off)
    node = _statuses(dqtool.check(model, inputs=feeds))["QAttention"]
    assert node.status == "mismatch"
    assert node.reason.startswith("output 1 ('present') differs from onnxruntime's in ")


def test_check_runs_mul_integer_with_the_kernel_alone_where_onnxruntime_has_none():
    a = helper.make_tensor_value_info("a", TP.UINT8, [3, 4])
    zp = numpy_helper.from_array(np.array(np.uint8(128)), "zp")
    b = numpy_helper.from_array(np.arange(4, dtype=np.uint8), "b")
    model = _model([helper.make_node("MulInteger", ["a", "zp", "b", ""], ["y"], domain=MS,
                                     name="mul")],
                   [a], [helper.make_tensor_value_info("y", TP.INT32, [3, 4])], [zp, b])
    node = _statuses(dqtool.check(model))["MulInteger"]
    if ort_facts.has_cpu_kernel("MulInteger", RELEASE) is False:
        assert node.status == "kernel-only" and "onnxruntime cannot run" in node.reason
    else:
        assert node.status == "bit-exact"


def test_check_compares_an_lstm_without_y_on_its_final_state(monkeypatch):
    _through_path(monkeypatch)
    r = np.random.default_rng(0)
    hid, inp = 3, 4
    inits = [numpy_helper.from_array(r.integers(0, 256, (1, inp, 4 * hid)).astype(np.uint8),
                                     "W"),
             numpy_helper.from_array(r.integers(0, 256, (1, hid, 4 * hid)).astype(np.uint8),
                                     "R"),
             numpy_helper.from_array(np.float32([0.01]), "ws"),
             numpy_helper.from_array(np.uint8([128]), "wz"),
             numpy_helper.from_array(np.float32([0.02]), "rs"),
             numpy_helper.from_array(np.uint8([120]), "rz")]
    node = helper.make_node("DynamicQuantizeLSTM",
                            ["x", "W", "R", "", "", "", "", "", "ws", "wz", "rs", "rz"],
                            ["", "h", "c"], domain=MS, name="lstm", hidden_size=hid)
    model = _model([node], [helper.make_tensor_value_info("x", TP.FLOAT, [5, 2, inp])],
                   [helper.make_tensor_value_info(o, TP.FLOAT, [1, 2, hid]) for o in "hc"],
                   inits)
    report = dqtool.check(model)
    (n,) = report.nodes
    assert n.status == "bit-exact", n.to_json()


def _qlinear_add() -> tuple[object, dict[str, np.ndarray]]:
    a = helper.make_tensor_value_info("a", TP.UINT8, [1, 64])
    y = helper.make_tensor_value_info("y", TP.UINT8, [1, 64])
    rng = np.random.default_rng(7)
    inits = [numpy_helper.from_array(np.asarray(v), n) for n, v in (
        ("a_s", np.float32(0.02)), ("a_zp", np.uint8(120)),
        ("b", rng.integers(0, 256, (1, 64), dtype=np.uint8)), ("b_s", np.float32(0.03)),
        ("b_zp", np.uint8(130)), ("c_s", np.float32(0.05)), ("c_zp", np.uint8(128)))]
    node = helper.make_node("QLinearAdd", ["a", "a_s", "a_zp", "b", "b_s", "b_zp", "c_s",
                                           "c_zp"], ["y"], domain="com.microsoft")
    model = helper.make_model(
        helper.make_graph([node], "g", [a], [y], inits),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
        ir_version=8)
    return model, {"a": rng.integers(0, 256, (1, 64), dtype=np.uint8)}


@pytest.mark.parametrize("off, passes", [(1, True), (2, False)])
def test_check_passes_integer_codes_within_a_path_entry_s_steps(monkeypatch, off, passes):
    """The mechanism behind arm64-dotprod's QLinearAdd ties (``steps=1``), run on any
    machine: the kernel made ``off`` codes away from onnxruntime, and an entry of one step
    for this CPU's path; one step is that deviation, two are a mismatch."""
    from dqtool.families.integer import kernel
    from dqtool.runtimes import cpu_path
    from dqtool.runtimes.code_paths import PathDeviation

    real = kernel.qlinear_binary
    monkeypatch.setattr(kernel, "qlinear_binary", lambda *a: np.clip(
        real(*a).astype(np.int64) + off, 0, 255).astype(np.uint8))
    entry = PathDeviation(
        key="test-steps", runtime="onnxruntime", releases=(RELEASE,), measured="test",
        paths=(cpu_path.probe().name,), ops=("com.microsoft:QLinearAdd",), spec="test",
        runtime_gives="test", steps=1)
    monkeypatch.setattr(path_deviations, "for_op", lambda op: (
        (entry,) if op == "com.microsoft:QLinearAdd" else ()))
    model, feeds = _qlinear_add()
    report = dqtool.check(model, inputs=feeds)
    node = _statuses(report)["QLinearAdd"]
    assert (node.status == "runtime-deviation") is passes and report.passed is passes
    assert node.status == ("runtime-deviation" if passes else "mismatch")
