"""com.microsoft DynamicQuantizeLSTM: dqtool's kernel against onnxruntime (ORT_DISABLE_ALL)
bit for bit on random cases: every direction, with and without sequence_lens, initial
states, peepholes, bias and Y; per-tensor and per-column scales; uint8 and int8 weights;
one thread and two (onnxruntime groups batch rows by thread for the recurrent
quantization). DQTOOL_SLOW=1 runs many more seeds."""

from __future__ import annotations

import os

import numpy as np
import onnxruntime as ort
import pytest
from helpers import paths
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import dqtool
from dqtool.families.integer import kernel, lstm, mlas
from dqtool.families.integer.ort_facts import row_ulps

SEEDS = range(40 if os.environ.get("DQTOOL_SLOW") else 8)
MS = "com.microsoft"


def _case(seed: int, direction: str) -> dict:
    r = np.random.default_rng(seed)
    seq, batch, inp, hid = (int(v) for v in r.integers(1, [6, 7, 9, 9]))
    dirs = 2 if direction == "bidirectional" else 1
    signed = bool(seed % 2)
    dt, lo, hi = (np.int8, -128, 128) if signed else (np.uint8, 0, 256)
    per_col = bool(r.integers(0, 2))
    shp = (dirs, 4 * hid) if per_col else (dirs,)
    want_y = bool(r.integers(0, 4))
    lens = r.integers(0, seq + 1, batch).astype(np.int32) if r.integers(0, 2) else None
    if lens is not None and not want_y:
        # Without Y, onnxruntime leaves a zero-length row of its H buffer unwritten and
        # quantizes it with the other rows: its result is not deterministic there.
        lens = np.maximum(lens, 1).astype(np.int32)

    def opt(shape):
        return r.standard_normal(shape).astype(np.float32) if r.integers(0, 2) else None

    return {
        "x": r.standard_normal((seq, batch, inp)).astype(np.float32),
        "w": r.integers(lo, hi, (dirs, inp, 4 * hid)).astype(dt),
        "r": r.integers(lo, hi, (dirs, hid, 4 * hid)).astype(dt),
        "b": opt((dirs, 8 * hid)), "seq": lens, "h0": opt((dirs, batch, hid)),
        "c0": opt((dirs, batch, hid)), "p": opt((dirs, 3 * hid)),
        "ws": r.uniform(0.001, 0.02, shp).astype(np.float32),
        "wz": np.full(shp, 0 if signed else r.integers(100, 156), dt),
        "rs": r.uniform(0.001, 0.02, shp).astype(np.float32),
        "rz": np.full(shp, 0 if signed else r.integers(100, 156), dt),
        "hid": hid, "want_y": want_y, "direction": direction,
    }


ORDER = ["x", "w", "r", "b", "seq", "h0", "c0", "p", "ws", "wz", "rs", "rz"]


def _model(c: dict, **attrs):
    names = [k if c[k] is not None else "" for k in ORDER]
    inits = [numpy_helper.from_array(c[k], k) for k in ORDER[1:] if c[k] is not None]
    outs = ["Y" if c["want_y"] else "", "Y_h", "Y_c"]
    node = helper.make_node("DynamicQuantizeLSTM", names, outs, domain=MS,
                            hidden_size=c["hid"], direction=c["direction"], **attrs)
    g = helper.make_graph([node], "lstm", [helper.make_tensor_value_info(
        "x", TP.FLOAT, list(c["x"].shape))], [helper.make_tensor_value_info(o, TP.FLOAT, None)
                                              for o in outs if o], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13),
                                            helper.make_opsetid(MS, 1)])
    m.ir_version = 8
    return m


def _ort(model, feeds, threads: int):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = threads
    so.log_severity_level = 4
    return ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"]).run(None, feeds)


def _kernel(c: dict, threads: int = 1, **attrs):
    out = lstm.dynamic_quantize_lstm(*(c[k] for k in ORDER), hidden_size=c["hid"],
                                     direction=c["direction"], want_y=c["want_y"],
                                     threads=threads, **attrs)
    return list(out) if c["want_y"] else list(out[1:])


F32 = np.float32
LSTM = "com.microsoft:DynamicQuantizeLSTM"


def _neon_direction(x, w, r, w_zp, r_zp, w_scale, r_scale, bias, peep, h0, c0, lens,
                    reverse, acts, clip, input_forget, want_y, threads):
    """``lstm._direction`` as onnxruntime's aarch64 build computes it (entry fma-lstm):
    the same steps, with three multiply-adds fused into one rounding each: the recurrent
    product's scaling into its sum with X·W, a peephole product into its gate, and
    ``C_prev·f + i·g`` (measured bit for bit under qemu-aarch64 -cpu neoverse-n1)."""
    def qgemm(a, m, zp, scale):
        qa, sa, za = kernel.dynamic_quantize_linear(a)
        acc = kernel.integer_matmul(qa, za, m, np.asarray(zp)).astype(np.int32)
        return acc.astype(F32), (F32(sa) * np.asarray(scale, F32)).astype(F32)

    batch, hidden = x.shape[1], r.shape[0]
    if reverse:
        x = lstm._reverse(x, lens)
    steps = int(lens.max()) if lens.size else 0
    y = np.zeros((x.shape[0], batch, hidden), F32)
    iofc = np.zeros((0, batch, 4 * hidden), F32)
    if steps:
        acc, mult = qgemm(x[:steps].reshape(steps * batch, -1), w, w_zp, w_scale)
        iofc = (acc * mult).astype(F32).reshape(steps, batch, 4 * hidden)
    fused_b = None if bias is None else (
        bias[:4 * hidden] + bias[4 * hidden:]).astype(F32).reshape(4, hidden)
    c, h_final = c0.astype(F32).copy(), np.zeros_like(h0, F32)
    c_final, lim = np.zeros_like(c), F32(clip)

    def gate(v, k, peep_c, pk, act):
        if peep_c is not None:
            v = mlas.fma(peep_c, np.broadcast_to(peep[pk], v.shape), v)
        if fused_b is not None:
            v = (v + fused_b[k]).astype(F32)
        return act(np.minimum(np.maximum(v, -lim), lim).astype(F32))

    for lo, hi in lstm._groups(batch, hidden, threads):
        prev = h0[lo:hi].astype(F32)
        for t in range(steps):
            acc, mult = qgemm(prev, r, r_zp, r_scale)
            pre = mlas.fma(acc, np.broadcast_to(mult, acc.shape), iofc[t, lo:hi])
            live = t < lens[lo:hi]
            i_pre, o_pre, f_pre, c_pre = (pre[:, k * hidden:(k + 1) * hidden] for k in range(4))
            cp = c[lo:hi]
            pc = cp if peep is not None else None
            i = gate(i_pre, 0, pc, 0, acts[0])
            f = (F32(1) - i).astype(F32) if input_forget else gate(f_pre, 2, pc, 2, acts[0])
            g = gate(c_pre, 3, None, 0, acts[1])
            c_new = mlas.fma(cp, f, (i * g).astype(F32))
            o = gate(o_pre, 1, c_new if peep is not None else None, 1, acts[0])
            h = (acts[2](c_new) * o).astype(F32)
            c[lo:hi] = np.where(live[:, None], c_new, cp)
            for b in np.nonzero(live & (lens[lo:hi] == t + 1))[0]:
                c_final[lo + b] = c_new[b]
            keep = F32(0) if want_y else h_final[lo:hi]
            prev = np.where(live[:, None], h, keep).astype(F32)
            if want_y:
                y[t, lo:hi] = prev
            h_final[lo:hi] = np.where(live[:, None], h, h_final[lo:hi])
    h_final[lens == 0] = 0
    c_final[lens == 0] = 0
    return (lstm._reverse(y, lens) if reverse else y), h_final, c_final


def _through_path(monkeypatch) -> None:
    """The spec, or this CPU path's entries in the kernel's place for the test
    (u8s8-pair-saturation's emulation; fma-lstm's on arm64)."""
    paths.patch_accumulation(monkeypatch)
    if paths.entry("fma-lstm", LSTM) is not None:
        monkeypatch.setattr(lstm, "_direction", _neon_direction)
        # Affine and HardSigmoid's alpha·x + beta are fused too
        monkeypatch.setitem(lstm._PLAIN, "affine", _neon_affine)
        monkeypatch.setitem(lstm._PLAIN, "hardsigmoid", lambda x, a, b: np.minimum(
            F32(1), np.maximum(F32(0), _neon_affine(x, a, b))).astype(F32))


def _neon_affine(x, a, b):
    return mlas.fma(np.broadcast_to(a, x.shape), x, np.broadcast_to(b, x.shape))


def _same_bits(kernel, runtime, spec=None):
    """Bit for bit, or through this CPU path's entries (helpers.paths; fma-lstm's
    emulation in place): and where fma-lstm applies, the kernel's own outputs (``spec``,
    computed before any emulation) within its recorded size."""
    assert len(kernel) == len(runtime)
    dev = paths.entry("fma-lstm", LSTM)
    for k, r in zip(kernel, runtime, strict=True):
        assert k.dtype == np.float32
        paths.assert_float_routines(r, k, LSTM)
    if dev is not None and spec is not None:
        for k, r in zip(spec, runtime, strict=True):
            assert row_ulps(k, r) <= dev.ulps, row_ulps(k, r)


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("threads", [1, 2])
def test_bit_identical_to_onnxruntime(direction, seed, threads, monkeypatch):
    c = _case(seed, direction)
    spec = _kernel(c, threads)
    _through_path(monkeypatch)
    _same_bits(_kernel(c, threads), _ort(_model(c), {"x": c["x"]}, threads), spec)


@pytest.mark.parametrize("seed", range(4))
def test_input_forget_and_clip(seed, monkeypatch):
    c = _case(seed, "forward")
    spec = _kernel(c, input_forget=1, clip=0.5)
    _through_path(monkeypatch)
    got = _kernel(c, input_forget=1, clip=0.5)
    _same_bits(got, _ort(_model(c, input_forget=1, clip=0.5), {"x": c["x"]}, 1), spec)


def test_reference_evaluator_runs_it(monkeypatch):
    _through_path(monkeypatch)
    c = _case(3, "bidirectional")
    c["want_y"] = True
    c["seq"] = None
    got = dqtool.reference_evaluator(_model(c)).run(None, {"x": c["x"]})
    _same_bits(got, _ort(_model(c), {"x": c["x"]}, 1))
    assert got[0].shape == (c["x"].shape[0], 2, c["x"].shape[1], c["hid"])


def test_thread_grouping_changes_the_numbers(monkeypatch):
    """Batch rows quantized in two groups (two threads) are not the one-group result: the
    grouping is part of onnxruntime's semantics, so the kernel takes it as a parameter."""
    r = np.random.default_rng(1)
    c = _case(0, "forward")
    c.update(x=r.standard_normal((3, 6, 4)).astype(np.float32), seq=None, h0=None, c0=None)
    c["x"][:, 3:] *= 20  # the second half of the batch has a much wider range
    c.update(w=r.integers(0, 256, (1, 4, 4 * c["hid"])).astype(np.uint8), want_y=True)
    one, two = _kernel(c, 1), _kernel(c, 2)
    assert not np.array_equal(one[0], two[0])
    _through_path(monkeypatch)
    _same_bits(_kernel(c, 2), _ort(_model(c), {"x": c["x"]}, 2), two)
    _same_bits(_kernel(c, 1), _ort(_model(c), {"x": c["x"]}, 1), one)


def test_zero_length_rows_are_zero_and_keep_nothing():
    c = _case(2, "forward")
    c.update(want_y=True, seq=np.array([0] + [c["x"].shape[0]] * (c["x"].shape[1] - 1),
                                       np.int32))
    y, yh, yc = _kernel(c)
    assert not y[:, :, 0].any() and not yh[:, 0].any() and not yc[:, 0].any()


def test_differing_per_column_zero_points_are_refused():
    c = _case(0, "forward")
    c["wz"] = np.arange(4 * c["hid"], dtype=np.uint8).reshape(1, -1) + 100
    c["ws"] = np.full((1, 4 * c["hid"]), 0.01, np.float32)
    with pytest.raises(ValueError, match="one value"):
        _kernel(c)


def test_mlas_activations_hand_values():
    # Saturation bounds: logistic clamps its input to ±18 and its output to [0, 1];
    # tanh clamps to ±9. At 0 both give exactly their centre.
    assert mlas.logistic(np.float32([0.0]))[0] == np.float32(0.5)
    assert mlas.tanh(np.float32([0.0]))[0] == 0.0
    big = mlas.logistic(np.float32([100.0, -100.0]))
    assert big.tolist() == mlas.logistic(np.float32([18.0, -18.0])).tolist()
    assert 0.0 <= big[1] < 1e-7 and 1 - 1e-6 < big[0] <= 1.0
    assert abs(float(mlas.tanh(np.float32([0.5]))[0]) - np.tanh(0.5)) < 1e-6


@pytest.mark.parametrize("op", ["Sigmoid", "Tanh"])
def test_mlas_activations_match_onnxruntime_bit_for_bit(op):
    """onnxruntime's Sigmoid and Tanh run the same MLAS routines as its LSTM gates."""
    r = np.random.default_rng(7)
    x = np.concatenate([r.standard_normal(50001).astype(np.float32) * 4,
                        r.uniform(-30, 30, 20001).astype(np.float32),
                        np.float32([0, -0.0, 9, -9, 18, -18, 1e-30])])
    g = helper.make_graph([helper.make_node(op, ["x"], ["y"])], "act",
                          [helper.make_tensor_value_info("x", TP.FLOAT, [x.size])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    want = _ort(m, {"x": x}, 1)[0]
    got = (mlas.logistic if op == "Sigmoid" else mlas.tanh)(x)
    np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))


@pytest.mark.parametrize(("acts", "alphas", "betas"), [
    (["HardSigmoid", "Affine", "LeakyRelu"], [0.3, 0.7, 0.05], [0.4, 0.1]),
    (["Relu", "Softsign", "ThresholdedRelu"], [0.2], []),
    (["HardSigmoid", "Tanh", "Affine"], [], []),  # defaults: 0.2/0.5, then 0/0
    (["Sigmoid", "ScaledTanh", "Elu"], [1.5, 0.8], [0.7]),
    (["Sigmoid", "Elu", "Tanh"], [], []),
])
def test_other_activations_with_alpha_and_beta(acts, alphas, betas, monkeypatch):
    _through_path(monkeypatch)
    c = _case(5, "forward")
    attrs = {"activations": acts}
    if alphas:
        attrs["activation_alpha"] = alphas
    if betas:
        attrs["activation_beta"] = betas
    got = _kernel(c, activations=acts, activation_alpha=alphas, activation_beta=betas)
    _same_bits(got, _ort(_model(c, **attrs), {"x": c["x"]}, 1))


@pytest.mark.parametrize("name", ["Gelu", "Softplus"])
def test_unimplemented_activation_is_refused_by_name(name):
    c = _case(1, "forward")
    with pytest.raises(NotImplementedError, match=f"'{name}'"):
        _kernel(c, activations=["Sigmoid", name, "Tanh"])
