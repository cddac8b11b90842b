"""com.microsoft MulInteger and QEmbedLayerNormalization: dqtool's kernels against
onnxruntime (ORT_DISABLE_ALL) bit for bit on random cases (QEmbedLayerNormalization
through the entry of ``dqtool.runtimes.code_paths`` for the CPU path they run on,
``helpers.paths``), through the reference evaluator (so a model holding them runs), and
against hand-computed values. DQTOOL_SLOW=1 runs many more seeds."""

from __future__ import annotations

import os

import numpy as np
import pytest
from helpers import paths
from helpers.integer import run_ort
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import dqtool
from dqtool.families.integer import embed, ort_facts
from dqtool.families.integer import kernel as K
from dqtool.families.integer.ort_facts import row_ulps
from dqtool.runtimes.onnxruntime import installed_version, release_of

MS = "com.microsoft"
SEEDS = range(60 if os.environ.get("DQTOOL_SLOW") else 10)
RELEASE = release_of(installed_version() or "0.0")


def _model(op: str, inputs: list[tuple[str, np.ndarray | None]], outs: list[tuple[str, int]],
           feeds: tuple[str, ...], **attrs):
    names, graph_in, inits = [], [], []
    for name, arr in inputs:
        if arr is None:
            names.append("")
            continue
        names.append(name)
        if name in feeds:
            graph_in.append(helper.make_tensor_value_info(
                name, helper.np_dtype_to_tensor_dtype(arr.dtype), list(arr.shape)))
        else:
            inits.append(numpy_helper.from_array(arr, name))
    node = helper.make_node(op, names, [o for o, _ in outs], domain=MS, **attrs)
    g = helper.make_graph([node], "t", graph_in,
                          [helper.make_tensor_value_info(o, e, None) for o, e in outs], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13),
                                            helper.make_opsetid(MS, 1)])
    m.ir_version = 8
    return m


def _same(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g.view(np.uint8), w.view(np.uint8))


# ---- MulInteger --------------------------------------------------------------------------

def test_mul_integer_hand_values():
    a = np.array([[0, 255], [10, 3]], np.uint8)
    b = np.array([255, 0], np.uint8)
    y = K.mul_integer(a, np.array(np.uint8(128)), b, np.array(np.uint8(1)))
    # (0-128)(255-1) = -32512; (255-128)(0-1) = -127; (10-128)(254) = -29972; (3-128)(-1) = 125
    assert y.dtype == np.int32 and y.tolist() == [[-32512, -127], [-29972, 125]]


@pytest.mark.parametrize("seed", SEEDS)
def test_mul_integer_matches_onnxruntime(seed):
    r = np.random.default_rng(seed)
    dt, lo, hi = (np.int8, -128, 128) if seed % 2 else (np.uint8, 0, 256)
    shape = tuple(int(v) for v in r.integers(1, 5, int(r.integers(1, 4))))
    bshape = shape[-int(r.integers(0, len(shape) + 1)):] if r.integers(0, 2) else shape
    a = r.integers(lo, hi, shape).astype(dt)
    b = r.integers(lo, hi, bshape).astype(dt)
    az = np.array(dt(r.integers(lo, hi))) if r.integers(0, 2) else None
    bz = np.array(dt(r.integers(lo, hi))) if r.integers(0, 2) else None
    m = _model("MulInteger", [("a", a), ("az", az), ("b", b), ("bz", bz)], [("y", TP.INT32)],
               ("a", "b"))
    # The schema's formula in Python integers, element by element.
    za = 0 if az is None else int(az)
    zb = 0 if bz is None else int(bz)
    ab, bb = np.broadcast_arrays(a.astype(object), b.astype(object))
    want = np.array([(int(x) - za) * (int(y) - zb) for x, y in zip(ab.ravel(), bb.ravel(),
                                                                   strict=True)],
                    np.int32).reshape(ab.shape)
    _same([K.mul_integer(a, az, b, bz)], [want])
    _same(dqtool.reference_evaluator(m).run(None, {"a": a, "b": b}), [want])
    if ort_facts.has_cpu_kernel("MulInteger", RELEASE) is not False:
        _same(run_ort(m, {"a": a, "b": b}), [want])


def test_mul_integer_on_onnxruntime_is_as_the_facts_say():
    """onnxruntime has MulInteger's schema; whether its CPU provider runs it is data keyed
    by release (``ort_facts``): where it is listed as absent, a session refuses it."""
    a = np.array([1, 2], np.uint8)
    zero = np.array(np.uint8(0))
    m = _model("MulInteger", [("a", a), ("az", zero), ("b", a), ("bz", zero)],
               [("y", TP.INT32)], ("a", "b"))
    fact = ort_facts.has_cpu_kernel("MulInteger", RELEASE)
    if fact is None:
        # A release not measured: whatever it does must be one of the two facts the table
        # can record: it runs MulInteger right, or it refuses it for want of a kernel.
        try:
            got = run_ort(m, {"a": a, "b": a})[0].tolist()
        except Exception as e:
            assert "implementation for MulInteger" in str(e)
        else:
            assert got == [1, 4]
    elif fact:
        assert run_ort(m, {"a": a, "b": a})[0].tolist() == [1, 4]
    else:
        with pytest.raises(Exception, match="implementation for MulInteger"):
            run_ort(m, {"a": a, "b": a})


# ---- QEmbedLayerNormalization ------------------------------------------------------------

EMBED_ORDER = ["ids", "seg", "word", "pos", "segemb", "gamma", "beta", "mask", "ws", "ps",
               "ss", "gs", "bs", "wz", "pz", "sz", "gz", "bz"]


def _embed_case(seed: int) -> dict[str, np.ndarray | None]:
    r = np.random.default_rng(seed)
    batch, seq, hidden = int(r.integers(1, 4)), int(r.integers(1, 9)), int(r.integers(2, 40))
    vocab, npos, nseg = int(r.integers(2, 30)), seq + int(r.integers(0, 4)), 2
    dt, lo, hi = (np.int8, -128, 128) if seed % 2 else (np.uint8, 0, 256)
    with_seg, with_mask = bool(r.integers(0, 2)), bool(r.integers(0, 2))

    def q(*shape):
        return r.integers(lo, hi, shape).astype(dt)

    def s():
        return np.array(np.float32(r.uniform(0.001, 0.05)))

    def z():
        return np.array(dt(r.integers(lo // 2, hi // 2)))

    return {
        "ids": r.integers(0, vocab, (batch, seq)).astype(np.int32),
        "seg": r.integers(0, nseg, (batch, seq)).astype(np.int32) if with_seg else None,
        "word": q(vocab, hidden), "pos": q(npos, hidden),
        "segemb": q(nseg, hidden) if with_seg else None,
        "gamma": q(hidden), "beta": q(hidden),
        "mask": r.integers(0, 2, (batch, seq)).astype(np.int32) if with_mask else None,
        "ws": s(), "ps": s(), "ss": s() if with_seg else None, "gs": s(), "bs": s(),
        "wz": z(), "pz": z(), "sz": z() if with_seg else None, "gz": z(), "bz": z(),
    }


def _embed_model(c, **attrs):
    return _model("QEmbedLayerNormalization", [(k, c[k]) for k in EMBED_ORDER],
                  [("y", TP.FLOAT), ("mask_index", TP.INT32)], ("ids", "seg", "mask"), **attrs)


def _feeds(c):
    return {k: c[k] for k in ("ids", "seg", "mask") if c[k] is not None}


@pytest.mark.parametrize("seed", SEEDS)
def test_qembed_layer_norm_matches_onnxruntime(seed):
    c = _embed_case(seed)
    eps = float(np.random.default_rng(seed).choice([1e-12, 1e-5, 0.1]))
    m = _embed_model(c, epsilon=eps)
    spec = list(embed.qembed_layer_norm(*(c[k] for k in EMBED_ORDER), epsilon=eps))
    _same(dqtool.reference_evaluator(m).run(None, _feeds(c)), spec)
    _same_through_path(run_ort(m, _feeds(c)), spec)


def _same_through_path(runtime: list[np.ndarray], spec: list[np.ndarray]) -> None:
    """onnxruntime's (y, mask_index) against the kernel's: bit for bit where no entry
    applies on this CPU's path; where ``neon-layer-norm`` does (not emulated), y no
    farther than the entry's recorded size in ulps of the row, mask_index still equal."""
    dev = paths.entry("neon-layer-norm", f"{MS}:QEmbedLayerNormalization")
    if dev is None:
        _same(runtime, spec)
        return
    assert dev.ulps is not None, dev.key
    (y, index), (want_y, want_index) = runtime, spec
    assert y.dtype == want_y.dtype == np.float32 and y.shape == want_y.shape
    assert row_ulps(want_y, y) <= dev.ulps, (dev.key, row_ulps(want_y, y))
    _same([index], [want_index])


def test_qembed_layer_norm_hand_values():
    # hidden 2: rows [1, 3] → mean 2, a = [-1, 1], var 1, e = sqrt(1 + 0) = 1;
    # gamma 2, beta 0.5 → [-1.5, 2.5]. mask [1, 0, 1] counts 2.
    one = np.array(np.float32(1))
    word = np.array([[1, 3]], np.uint8)
    pos = np.zeros((3, 2), np.uint8)
    y, idx = embed.qembed_layer_norm(
        np.zeros((1, 3), np.int32), None, word, pos, None, np.array([2, 2], np.uint8),
        np.array([1, 1], np.uint8), np.array([[1, 0, 1]], np.int32), one, one, None, one,
        np.array(np.float32(0.5)), epsilon=0.0)
    assert y[0, 0].tolist() == [-1.5, 2.5] and idx.tolist() == [2]


def test_qembed_layer_norm_sums_left_to_right():
    """The mean is a left-to-right float32 sum, as onnxruntime's loop: NumPy's pairwise sum
    gives another float32 for these values."""
    x = np.float32([1e8, 1, 1, 1, 1, 1, 1, 1, 1, -1e8, 3, 3, 3, 3, 3, 3])
    assert embed._row_sum(x[None])[0] != np.sum(x, dtype=np.float32)
    assert embed._row_sum(x[None])[0] == np.float32(18)  # the 1s vanish into 1e8, the 3s stay
