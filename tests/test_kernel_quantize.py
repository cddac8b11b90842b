"""quantize vs onnxruntime's QuantizeLinear, bit for bit."""

from __future__ import annotations

import math
import os
from importlib import metadata

import ml_dtypes
import numpy as np
import pytest
from helpers import assert_bits_equal, node_model, ort_quantize, run_ort_node
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import helper

from dqtool.kernel import dequantize, quantize, to_float8
from dqtool.runtimes import deviations

SLOW = os.environ.get("DQTOOL_SLOW") == "1"
ORT_VERSION = metadata.version("onnxruntime")
INT_OUT = [np.int8, np.uint8, np.int16, np.uint16, ml_dtypes.int4, ml_dtypes.uint4]
F8 = [ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, ml_dtypes.float8_e4m3fnuz,
      ml_dtypes.float8_e5m2fnuz]


def _float_bits_sample() -> np.ndarray:
    """Every float32 exponent x 4096 leading mantissa patterns x a few tails, both signs."""
    e = np.arange(256, dtype=np.uint32)
    top = np.arange(1 << 12, dtype=np.uint32)
    low = np.array([0, 1, 0x3FF, 0x5A5], dtype=np.uint32)
    b = (e[:, None, None] << 23) | (top[None, :, None] << 11) | low[None, None, :]
    b = b.ravel()
    return np.concatenate([b, b | 0x80000000]).view(np.float32)


@pytest.mark.parametrize("saturate", [1, 0])
@pytest.mark.parametrize("dtype", F8, ids=lambda t: np.dtype(t).name)
def test_float8_conversion_matches_onnxruntime_everywhere(dtype, saturate) -> None:
    v = _float_bits_sample()
    m = node_model("QuantizeLinear", {"x": v, "s": np.array(1, np.float32),
                                      "zp": np.array(0, dtype)}, np.dtype(dtype), opset=21,
                   saturate=saturate)
    # onnxruntime's Python API cannot return every float8 type: cast to float32 in the graph.
    g = m.graph
    g.node[0].output[0] = "q"
    g.node.append(helper.make_node("Cast", ["q"], ["y"], to=1))
    g.output[0].type.tensor_type.elem_type = 1
    want = run_ort_node(m)
    got = to_float8(v, np.dtype(dtype), bool(saturate)).astype(np.float32)
    assert_bits_equal(got, want, f"{np.dtype(dtype).name} saturate={saturate}")


@st.composite
def qconfigs(draw):
    out = np.dtype(draw(st.sampled_from(INT_OUT + F8)))
    rank = draw(st.integers(0, 3))
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=rank, max_size=rank)))
    kind = draw(st.sampled_from(["t", "a", "b"] if rank else ["t"]))
    axis = draw(st.integers(-rank, rank - 1)) if rank else 1
    block, sshape = 0, ()
    if kind == "a":
        sshape = (shape[axis],)
    elif kind == "b":
        block = draw(st.integers(1, shape[axis] + 1))
        sshape = tuple(math.ceil(n / block) if i == axis % rank else n
                       for i, n in enumerate(shape))
    xt = np.dtype(draw(st.sampled_from([np.float32, np.float16])))
    return out, shape, axis, block, sshape, xt, draw(st.booleans()), draw(st.integers(0, 2**32 - 1))


@settings(max_examples=300 if SLOW else 60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(qconfigs())
def test_quantize_matches_onnxruntime(cfg) -> None:
    out, shape, axis, block, sshape, xt, saturate, seed = cfg
    rng = np.random.default_rng(seed)
    with np.errstate(over="ignore"):
        x = (rng.standard_normal(shape) * 10.0 ** rng.integers(-2, 5, size=shape)).astype(xt)
        scale = (rng.random(sshape) * 10.0 ** rng.integers(-3, 2, size=sshape) + 1e-3
                 ).astype(xt)
    is_f8 = out.name.startswith("float")
    specials = [np.inf, -np.inf, 0.5, 2.5, -1.5, np.nan, 1e4]
    if x.size:
        flat = x.reshape(-1)
        flat[rng.integers(0, x.size)] = rng.choice(specials)
    zp = np.zeros(sshape, out) if is_f8 else (
        rng.integers(ml_dtypes.iinfo(out).min, ml_dtypes.iinfo(out).max + 1, size=sshape
                     ).astype(out))
    attrs = {"axis": axis}
    if block and not (len(sshape) <= 1 and math.prod(sshape) == 1):
        # onnxruntime refuses block_size with a per-tensor (scalar or (1,)) scale
        attrs["block_size"] = block
    if is_f8:
        attrs["saturate"] = int(saturate)
    got = quantize(x, scale, zp, axis=axis, block_size=block, saturate=saturate)
    if is_f8:
        m = node_model("QuantizeLinear", {"x": x, "s": scale, "zp": zp}, out, opset=21, **attrs)
        g = m.graph
        g.node[0].output[0] = "q"
        g.node.append(helper.make_node("Cast", ["q"], ["y"], to=1))
        g.output[0].type.tensor_type.elem_type = 1
        assert_bits_equal(got.astype(np.float32), run_ort_node(m), str(cfg))
        return
    _assert_spec_saturation(x, got, out)
    _assert_as_this_release(x, got, quantize(np.zeros_like(x), scale, zp, axis=axis,
                                             block_size=block), out,
                            ort_quantize(x, scale, zp, opset=21, **attrs), str(cfg))


def _assert_spec_saturation(x: np.ndarray, got: np.ndarray, out: np.dtype) -> None:
    """The kernel follows the spec: ±inf saturates; NaN (left open) gives the minimum."""
    info = ml_dtypes.iinfo(out)
    xs = x.astype(np.float32)
    assert np.all(got[np.isposinf(xs)] == info.max)
    assert np.all(got[np.isneginf(xs) | np.isnan(xs)] == info.min)


def _assert_as_this_release(x: np.ndarray, got: np.ndarray, zp_each: np.ndarray,
                            out: np.dtype, ort: np.ndarray, msg: str) -> None:
    """The installed onnxruntime gives the kernel's (the spec's) values, except where a
    deviation of its release is listed: there, that table's emulation (or, for a
    position-dependent one, either value). Scales here are >= 1e-3 and finite, so only
    non-finite x leave int32's range."""
    want, either = got.copy(), np.zeros(x.shape, bool)
    alt = got.copy()
    for d in deviations.applicable("onnxruntime", ORT_VERSION):
        mask = d.affected(x, out) & ~np.isfinite(x.astype(np.float32))
        if mask.any():
            info = ml_dtypes.iinfo(out)
            emulated = d.emulate(x.astype(np.float32)[mask], zp_each[mask], int(info.min),
                                 int(info.max)).astype(out)
            if d.position_dependent:
                alt[mask], either[mask] = emulated, True
            else:
                want[mask] = emulated
    ok = np.where(either, (ort == want) | (ort == alt), True)
    assert ok.all(), f"{msg}: a listed deviation's values expected, got {ort[~ok]}"
    assert_bits_equal(np.where(either, ort, want).astype(out), ort, msg)


@pytest.mark.parametrize("xt", [np.float16, np.float32], ids=["float16", "float32"])
def test_infinity_saturates_and_known_deviations_are_what_the_release_gives(xt) -> None:
    x = np.array([np.inf, -np.inf, np.nan, 1.0, 7e4 if xt == np.float32 else 6e4], xt)
    for out, zps in ((np.uint8, (0, 10, 255)), (np.int8, (0, -5, 5)), (np.int16, (0, -3))):
        for z in zps:
            zp = np.array(z, out)
            got = quantize(x, np.array(1, xt), zp)
            info = np.iinfo(out)
            assert got.tolist() == [info.max, info.min, info.min, min(1 + z, info.max),
                                    info.max], (out, z)
            _assert_as_this_release(x, got, np.full(x.shape, z, out), np.dtype(out),
                                    ort_quantize(x, np.array(1, xt), zp, opset=21),
                                    f"{np.dtype(xt).name} {np.dtype(out).name} zp {z}")


def test_the_deviation_table_names_measured_releases() -> None:
    for d in deviations.DEVIATIONS:
        assert d.releases and all(r.count(".") == 1 for r in d.releases)
        assert d.measured.startswith(d.releases), d
    old, old4 = deviations.applicable("onnxruntime", "1.31.1")
    assert not old.position_dependent and old4.position_dependent
    assert not deviations.applicable("onnxruntime", "1.32.0")
    v = np.array([np.inf, -np.inf, np.nan, 3.0], np.float32)
    assert old.emulate(v, None, 0, 255).tolist() == [0, 0, 0, 3]
    assert old.emulate(v, np.array([-5, -5, -5, -5]), -128, 127).tolist() == [127, 127, 127,
                                                                            -2]


def test_round_half_even_and_saturation() -> None:
    x = np.array([0.5, 1.5, 2.5, -0.5, -2.5, 1e9, -1e9, np.nan], np.float32)
    q = quantize(x, np.array(1, np.float32), np.array(0, np.int8))
    assert q.tolist() == [0, 2, 2, 0, -2, 127, -128, -128]


def test_quantize_dequantize_roundtrip_int4_blocked() -> None:
    rng = np.random.default_rng(0)
    q = rng.integers(-8, 8, size=(4, 10)).astype(ml_dtypes.int4)
    s = rng.random((4, 3)).astype(np.float32) + 0.1
    y = dequantize(q, s, axis=1, block_size=4)
    assert np.array_equal(quantize(y, s, np.zeros((4, 3), ml_dtypes.int4), axis=1,
                                   block_size=4), q)


def test_float4_quantize_saturates() -> None:
    x = np.array([100.0, -100.0, 0.25, 0.75], np.float32)
    q = quantize(x, np.array(1, np.float32), output_dtype=ml_dtypes.float4_e2m1fn)
    assert q.astype(np.float32).tolist() == [6.0, -6.0, 0.0, 1.0]
