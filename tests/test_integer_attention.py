"""com.microsoft QAttention: dqtool's kernel against onnxruntime (ORT_DISABLE_ALL) on random
cases (with and without mask_index of each layout, past, unidirectional; per-tensor and
per-column weights; uint8 and int8; head_size 1, one query and scale 1, where MLAS takes
its single-row and single-column SGEMM kernels): output and ``present`` bit-identical.
DQTOOL_SLOW=1 runs many more seeds."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from helpers import paths
from helpers.integer import run_ort
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import dqtool
from dqtool.families.integer import attention, kernel, mlas, ort_facts
from dqtool.runtimes.onnxruntime import installed_version, release_of

MS = "com.microsoft"
QATT = "com.microsoft:QAttention"
SEEDS = range(200 if os.environ.get("DQTOOL_SLOW") else 24)
RELEASE = release_of(installed_version() or "0.0")
ORDER = ["x", "w", "b", "xs", "ws", "mask", "xz", "wz", "past"]


def _case(seed: int, head_size: int | None = None) -> dict:
    r = np.random.default_rng(seed)
    batch, seq, heads = int(r.integers(1, 4)), int(r.integers(1, 8)), int(r.integers(1, 4))
    hs = head_size or int(r.integers(2, 9))
    din, hidden = int(r.integers(1, 20)), heads * hs
    signed = bool(seed % 2)
    dt, lo, hi = (np.int8, -128, 128) if signed else (np.uint8, 0, 256)
    per_col = bool(r.integers(0, 2))
    past_len = int(r.integers(0, 4)) if r.integers(0, 2) else None
    total = seq + (past_len or 0)
    kind = int(r.integers(0, 5))
    uni = int(r.integers(0, 2))
    mask = [None,
            r.integers(1, total + 1, batch),
            r.integers(0, 2, (batch, total)),
            np.concatenate([r.integers(total // 2 + 1, total + 1, batch),
                            r.integers(0, total // 2 + 1, batch)]),
            r.integers(0, 2, (batch, seq, total))][kind]
    return {
        "x": r.integers(0, 256, (batch, seq, din)).astype(np.uint8),
        "w": r.integers(lo, hi, (din, 3 * hidden)).astype(dt),
        "b": r.standard_normal(3 * hidden).astype(np.float32),
        "xs": np.array(np.float32(r.uniform(0.005, 0.03))),
        "ws": (r.uniform(0.005, 0.03, 3 * hidden) if per_col
               else np.array(r.uniform(0.005, 0.03))).astype(np.float32),
        "mask": None if mask is None else mask.astype(np.int32),
        "xz": np.array(np.uint8(r.integers(0, 256))),
        "wz": ((np.zeros(3 * hidden, dt) if signed
                else r.integers(90, 160, 3 * hidden).astype(dt)) if per_col
               else np.array(dt(0 if signed else r.integers(100, 156)))),
        "past": (r.standard_normal((2, batch, heads, past_len, hs)).astype(np.float32)
                 if past_len is not None else None),
        "heads": heads, "uni": uni,
    }


def _model(c: dict, **attrs):
    names = [k if c[k] is not None else "" for k in ORDER]
    inits = [numpy_helper.from_array(c[k], k) for k in ORDER[1:] if c[k] is not None]
    node = helper.make_node("QAttention", names, ["y", "present"], domain=MS,
                            num_heads=c["heads"], unidirectional=c["uni"], **attrs)
    g = helper.make_graph([node], "qattention", [helper.make_tensor_value_info(
        "x", TP.UINT8, list(c["x"].shape))], [helper.make_tensor_value_info(o, TP.FLOAT, None)
                                              for o in ("y", "present")], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13),
                                            helper.make_opsetid(MS, 1)])
    m.ir_version = 8
    return m


def _kernel(c: dict, **attrs):
    return attention.qattention(*(c[k] for k in ORDER), num_heads=c["heads"],
                                unidirectional=c["uni"], **attrs)


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.int32)


def _neon_qkv(x, w, bias, x_scale, w_scale, x_zp=None, w_zp=None) -> np.ndarray:
    """``attention.qkv`` with NEON's scale and bias fused (entry neon-attention)."""
    xz = np.asarray(0 if x_zp is None else int(np.asarray(x_zp).reshape(-1)[0]))
    wz = np.zeros((), np.int64) if w_zp is None else np.asarray(w_zp).astype(np.int64)
    acc = kernel.integer_matmul(x, xz, w, wz.reshape(()) if wz.size == 1 else wz)
    ws = np.asarray(w_scale, np.float32)
    scale = (ws.reshape(-1) if ws.size > 1 else ws.reshape(())) * np.float32(
        np.asarray(x_scale, np.float32).reshape(-1)[0])
    return mlas.neon_scale_bias(acc.astype(np.int32), scale.astype(np.float32), bias)


def _general_dot_rows(v, rows, c):
    """arm64's SGEMM has no single-row kernels: ``rows · v`` accumulated in order with
    fused multiply-adds, as its general kernel does, then ``c`` added (one rounding, as
    alpha 1 · acc + mask)."""
    out = attention._fma_matmul(rows, v[..., None])[..., 0]
    return out if c is None else (out + c).astype(np.float32)


def _through_path(monkeypatch) -> None:
    """The spec, or this CPU path's entries: u8s8-pair-saturation's emulation, or on arm64
    neon-attention's (the fused Q/K/V scaling, the 4-lane softmax, the general SGEMM
    kernel for single rows and columns) in the kernel's place for the test."""
    paths.patch_accumulation(monkeypatch)
    if paths.entry("neon-attention", QATT) is not None:
        monkeypatch.setattr(attention, "qkv", _neon_qkv)
        monkeypatch.setattr(attention, "softmax", mlas.neon_softmax)
        monkeypatch.setattr(attention, "_row_matmul", attention._fma_matmul)
        monkeypatch.setattr(attention, "_dot_rows", _general_dot_rows)


def _same(got, want, spec) -> None:
    """onnxruntime's outputs (``want``) against the kernel through this path's entries
    (``got``), bit for bit (or a float-routines entry's ulps); and against the kernel's
    own outputs (``spec``, computed before any emulation) within neon-attention's size
    where it applies."""
    dev = paths.entry("neon-attention", QATT)
    for g, w, k in zip(got, want, spec, strict=True):
        assert g.shape == w.shape
        paths.assert_float_routines(w, g, QATT)
        if dev is not None:
            assert ort_facts.row_ulps(k, w) <= dev.ulps, ort_facts.row_ulps(k, w)


@pytest.mark.parametrize("seed", SEEDS)
def test_bit_identical_to_onnxruntime(seed, monkeypatch):
    c = _case(seed)
    spec = _kernel(c)
    _through_path(monkeypatch)
    _same(_kernel(c), run_ort(_model(c), {"x": c["x"]}), spec)


@pytest.mark.parametrize("seed", range(40 if os.environ.get("DQTOOL_SLOW") else 10))
@pytest.mark.parametrize("scale", [None, 1.0])
def test_single_row_and_column_kernels_bit_identical(seed, scale, monkeypatch):
    """head_size 1 (probs·V one column wide), one query (one row), scale 1 (alpha 1 lets
    MLAS take those kernels for Q·Kᵀ too): each sums in its own order."""
    c = _case(seed, head_size=1 if seed % 2 else None)
    if seed % 3 == 0:  # one query
        c["x"] = c["x"][:, :1]
        total = 1 + (0 if c["past"] is None else c["past"].shape[3])
        if c["mask"] is not None and c["mask"].ndim == 3:
            c["mask"] = np.ascontiguousarray(c["mask"][:, :1, :total])
        elif c["mask"] is not None and c["mask"].ndim == 2:
            c["mask"] = np.ascontiguousarray(c["mask"][:, :total])
    attrs = {} if scale is None else {"scale": scale}
    spec = _kernel(c, **attrs)
    _through_path(monkeypatch)
    _same(_kernel(c, **attrs), run_ort(_model(c, **attrs), {"x": c["x"]}), spec)


def test_no_float_tolerance_is_stated_for_this_release():
    """Every float stage is reproduced: a tolerance in the table for this release would
    hide a difference the tests no longer see."""
    assert all(RELEASE not in t.releases for t in ort_facts.FLOAT_TOLERANCE)


def test_attributes_scale_and_mask_filter_value(monkeypatch):
    c = _case(5)
    c.update(mask=np.ones((c["x"].shape[0], c["x"].shape[1] + (
        0 if c["past"] is None else c["past"].shape[3])), np.int32))
    c["mask"][:, -1] = 0
    attrs = {"scale": 0.25, "mask_filter_value": -50.0}
    spec = _kernel(c, **attrs)
    _through_path(monkeypatch)
    _same(_kernel(c, **attrs), run_ort(_model(c, **attrs), {"x": c["x"]}), spec)


def test_reference_evaluator_runs_it(monkeypatch):
    c = _case(8)
    spec = dqtool.reference_evaluator(_model(c)).run(None, {"x": c["x"]})
    _through_path(monkeypatch)
    got = dqtool.reference_evaluator(_model(c)).run(None, {"x": c["x"]})
    _same(got, run_ort(_model(c), {"x": c["x"]}), spec)


@pytest.mark.parametrize("seed", range(6))
def test_causal_mask_is_the_lowest_float_not_the_filter_value(seed, monkeypatch):
    """onnxruntime masks the future with float32's lowest value, set (not added to the
    padding mask): a query whose every key is padded or in the future still attends its
    padded keys. Padding from start and end positions (a 2·batch mask_index) with
    unidirectional=1 and fully padded rows are checked bit for bit."""
    c = _case(seed)
    batch, seq = c["x"].shape[:2]
    if seq < 2:
        c["x"] = np.concatenate([c["x"]] * 3, axis=1)
        batch, seq = c["x"].shape[:2]
    total = seq + (0 if c["past"] is None else c["past"].shape[3])
    c["uni"] = 1
    c["mask"] = np.array([total] * batch + [min(2, total)] * batch, np.int32)
    spec = _kernel(c)
    _through_path(monkeypatch)
    _same(_kernel(c), run_ort(_model(c), {"x": c["x"]}), spec)


def test_hand_computed_single_head():
    # One token, one head of size 2: softmax over one key is 1, so the output is V; V is
    # float32(acc)·(w_scale·x_scale) + bias with acc = (x - 0)·w exactly.
    x = np.array([[[2, 3]]], np.uint8)
    w = np.array([[1, 0, 0, 1, 1, 0], [0, 1, 1, 0, 0, 2]], np.int8)
    out, present = attention.qattention(
        x, w, np.zeros(6, np.float32), np.array(np.float32(0.5)), np.array(np.float32(1)),
        None, None, None, None, num_heads=1)
    # V columns 4, 5: (2·1 + 3·0, 2·0 + 3·2) · 0.5 = (1, 3)
    assert out.tolist() == [[[1.0, 3.0]]]
    assert present[1].tolist() == [[[[1.0, 3.0]]]]


@pytest.mark.parametrize("d", [1, 2, 3, 7, 8, 9, 16, 17, 33, 100])
def test_mlas_softmax_matches_onnxruntime_softmax(d):
    """onnxruntime's Softmax runs the same MLAS routine as QAttention's."""
    x = (np.random.default_rng(d).standard_normal((64, d)) * 3).astype(np.float32)
    g = helper.make_graph([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], "sm",
                          [helper.make_tensor_value_info("x", TP.FLOAT, list(x.shape))],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    got = run_ort(m, {"x": x})[0]
    dev = paths.entry("neon-softmax", "ai.onnx:Softmax")
    if dev is None:
        paths.assert_float_routines(got, mlas.softmax(x), "ai.onnx:Softmax")
    else:  # through the entry: its emulation bit for bit, the kernel within its size
        np.testing.assert_array_equal(_bits(got), _bits(mlas.neon_softmax(x)))
        assert ort_facts.row_ulps(mlas.softmax(x), got) <= dev.ulps


def test_row_ulps():
    runtime = np.float32([[4.0, 1.0], [0.5, -0.25]])
    kernel = runtime.copy()
    kernel[0, 1] = np.nextafter(np.float32(1), np.float32(2))  # 1 ulp at 1 = 1/4 ulp at 4
    kernel[1, 1] += np.spacing(np.float32(0.5)) * 3
    assert ort_facts.row_ulps(kernel, runtime) == 3.0
    assert ort_facts.row_ulps(kernel[:1], runtime[:1]) == 0.25
    assert ort_facts.row_ulps(np.float32([np.nan]), np.float32([1])) == float("inf")


def test_ulp_distance():
    a = np.float32([1.0, -0.0, 0.0, np.nan])
    b = np.array([np.nextafter(np.float32(1), np.float32(2)), 0.0, np.float32(1e-45), 1.0],
                 np.float32)
    assert ort_facts.ulp_distance(a, b).tolist() == [1, 0, 1, 2**32]


def test_check_skips_an_attribute_the_kernel_does_not_implement(tmp_path):
    # do_rotary is refused by the kernel: check says so and skips the node (not an error)
    path = tmp_path / "rotary.onnx"
    onnx.save(_model(_case(3), do_rotary=1), path)
    (node,) = dqtool.check(path).nodes
    assert node.status == "skipped" and node.passed
    assert "do_rotary=1: dqtool's kernel does not implement it" in node.reason
