"""The kernel's fast paths at their edges: many small chunks on the thread pool, chunk edges
that cut blocks, odd offsets (the paired 4-bit float gather), zero points subtracted in
integers, sub-byte bytes with stray upper bits, and recycled output buffers.

The chunk budget is shrunk so that small arrays take the same code paths as large ones.
Every result is compared bit for bit with a float64 computation rounded once.
"""

from __future__ import annotations

import functools
import gc
import importlib

import ml_dtypes
import numpy as np
import pytest
from helpers import assert_bits_equal

from dqtool.kernel import dequantize, outputs, parallel

INT_TYPES = [
    ml_dtypes.int2, ml_dtypes.uint2, ml_dtypes.int4, ml_dtypes.uint4,
    np.int8, np.uint8, np.int16, np.uint16, np.int32,
]
FLOAT_TYPES = [ml_dtypes.float4_e2m1fn, ml_dtypes.float8_e4m3fn, ml_dtypes.float6_e2m3fn]


@pytest.fixture(params=[7, 1001], ids=lambda b: f"budget{b}")
def small_chunks(request, monkeypatch):
    """Chunks of ``budget`` elements (odd ones start at odd offsets), always threaded."""
    monkeypatch.setattr(parallel, "plan", functools.partial(parallel.plan, budget=request.param))
    monkeypatch.setattr(parallel, "PARALLEL_MIN", 0)
    return request.param


def codes(rng: np.random.Generator, dtype, shape) -> np.ndarray:
    dtype = np.dtype(dtype)
    if dtype.name.startswith("float"):
        n = 1 << ml_dtypes.finfo(dtype).bits
        return rng.integers(0, n, size=shape, dtype=np.uint8).view(dtype)
    info = ml_dtypes.iinfo(dtype)
    return rng.integers(int(info.min), int(info.max) + 1, size=shape).astype(dtype)


def expand(a: np.ndarray, x_shape: tuple[int, ...], axis: int, block: int) -> np.ndarray:
    """A scale or zero point broadcastable against x."""
    if a.ndim == 0 or a.size == 1:
        return a.reshape(())
    if block == 0:
        shape = [1] * len(x_shape)
        shape[axis] = -1
        return a.reshape(shape)
    return np.take(np.repeat(a, block, axis=axis), np.arange(x_shape[axis]), axis=axis)


def oracle(x, scale, zp, axis, block) -> np.ndarray:
    """``float32(x - zp)`` (int32 wraps, as onnxruntime), times the scale in float64 (exact
    for two float32 values), rounded once to float32."""
    if np.dtype(x.dtype).name.startswith("float"):
        v = x.astype(np.float32)
    else:
        d = x.astype(np.int64)
        if zp is not None:
            d = d - expand(zp.astype(np.int64), x.shape, axis, block)
        if x.dtype == np.int32:
            d = d.astype(np.int32)
        v = d.astype(np.float32)
    s = expand(scale.astype(np.float64), x.shape, axis, block)
    with np.errstate(all="ignore"):
        return (v.astype(np.float64) * s).astype(np.float32)


LAYOUTS = [
    ("per-tensor", 1, 0),
    ("per-axis", 0, 0),
    ("per-axis", -1, 0),
    ("blocked", 0, 5),
    ("blocked", 1, 4),
    ("blocked", -1, 7),
]


def make_case(rng, dtype, kind, axis, block, with_zp, shape=(3, 37, 29)):
    x = codes(rng, dtype, shape)
    is_float = np.dtype(dtype).name.startswith("float")
    if kind == "per-tensor":
        sshape: tuple[int, ...] = ()
    elif kind == "per-axis":
        sshape = (shape[axis],)
    else:
        sl = list(shape)
        sl[axis] = -(-shape[axis] // block)
        sshape = tuple(sl)
    scale = (rng.random(sshape) * 4 - 2).astype(np.float32)
    zp = None
    if with_zp and not is_float:
        zp = codes(rng, dtype, sshape)
        if np.dtype(dtype) == np.int32:
            zp = (zp // 4).astype(np.int32)  # some differences wrap, most don't
    return x, scale, zp


@pytest.mark.parametrize("dtype", INT_TYPES + FLOAT_TYPES, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda lay: f"{lay[0]}-{lay[1]}-{lay[2]}")
@pytest.mark.parametrize("with_zp", [False, True], ids=["nozp", "zp"])
def test_chunked_paths_exact(small_chunks, dtype, layout, with_zp) -> None:
    kind, axis, block = layout
    rng = np.random.default_rng(hash((np.dtype(dtype).name, layout, with_zp)) % 2**32)
    x, scale, zp = make_case(rng, dtype, kind, axis, block, with_zp)
    got = dequantize(x, scale, zp, axis=axis, block_size=block)
    assert_bits_equal(got, oracle(x, scale, zp, axis, block))


@pytest.mark.parametrize("dtype", [ml_dtypes.float4_e2m1fn, ml_dtypes.int4, np.uint8])
@pytest.mark.parametrize("out_dtype", [np.float16, ml_dtypes.bfloat16])
def test_low_precision_outputs(small_chunks, dtype, out_dtype) -> None:
    """float16/bfloat16 outputs: the float32 product rounded once more."""
    rng = np.random.default_rng(5)
    for kind, axis, block in LAYOUTS:
        x, scale, zp = make_case(rng, dtype, kind, axis, block, with_zp=True)
        got = dequantize(x, scale, zp, axis=axis, block_size=block, output_dtype=out_dtype)
        want = oracle(x, scale, zp, axis, block).astype(out_dtype)
        assert_bits_equal(got, want)


@pytest.mark.parametrize("offset", [0, 1, 2, 3])
def test_nibble_pairs_at_any_offset(small_chunks, offset) -> None:
    """The paired float4 gather on an x view that starts at any byte offset."""
    rng = np.random.default_rng(offset)
    buf = codes(rng, ml_dtypes.float4_e2m1fn, 4 * 301 + 3)
    x = buf[offset : offset + 4 * 301].reshape(4, 301)
    scale = np.float32(0.75)
    for got in (
        dequantize(x, scale),
        dequantize(x, np.full((4, 301), scale), axis=1, block_size=1),
        dequantize(x, np.full(4, scale), axis=0),
    ):
        assert_bits_equal(got, oracle(x, scale, None, 0, 0))


@pytest.mark.parametrize(
    "dtype", [ml_dtypes.int4, ml_dtypes.uint4, ml_dtypes.int2, ml_dtypes.uint2]
)
def test_sub_byte_ignores_upper_bits(small_chunks, dtype) -> None:
    """Like ml_dtypes, only the low bits of a sub-byte element's byte count."""
    raw = np.arange(256, dtype=np.uint8).repeat(3)
    x = raw.view(dtype).reshape(48, 16)
    want_vals = x.astype(np.float32)  # ml_dtypes' reading of every byte
    for scale, zp, axis, block in [
        (np.float32(2.0), None, 1, 0),
        (np.full((48, 4), 2.0, np.float32), np.ones((48, 4), np.uint8).view(dtype), 1, 4),
    ]:
        got = dequantize(x, scale, zp, axis=axis, block_size=block)
        shift = 0 if zp is None else 1
        assert_bits_equal(got, ((want_vals - shift) * np.float32(2.0)).astype(np.float32))


@pytest.fixture
def recycle_small(monkeypatch):
    """Recycle outputs of any size (the default threshold is 16 MiB), starting empty."""
    monkeypatch.setattr(outputs, "RECYCLE_MIN", 1)
    monkeypatch.setattr(outputs, "_spare", None)
    monkeypatch.delenv("DQTOOL_RECYCLE", raising=False)


def test_recycled_output_reused_only_when_unreferenced(recycle_small) -> None:
    x = np.arange(-64, 64, dtype=np.int8).reshape(8, 16)
    first = dequantize(x, np.float32(2))
    address = first.ctypes.data
    view = first[::2].T  # a view keeps the memory in use
    del first
    gc.collect()
    second = dequantize(x, np.float32(3))
    assert second.ctypes.data != address
    assert_bits_equal(view, (x[::2].T * np.float32(2)).astype(np.float32))
    del view
    gc.collect()
    third = dequantize(x, np.float32(5))  # now the first buffer is free: reused
    assert third.ctypes.data == address
    assert third.flags.writeable
    assert_bits_equal(third, (x * np.float32(5)).astype(np.float32))
    assert_bits_equal(second, (x * np.float32(3)).astype(np.float32))


def test_recycling_needs_the_same_size_and_can_be_disabled(recycle_small, monkeypatch) -> None:
    x = np.ones((8, 16), np.int8)
    address = dequantize(x, np.float32(1)).ctypes.data  # dropped at once: the spare
    gc.collect()
    assert dequantize(x[:4], np.float32(1)).ctypes.data != address  # other size: fresh
    monkeypatch.setenv("DQTOOL_RECYCLE", "0")
    assert dequantize(x, np.float32(1)).base is None  # plain np.empty


# Edge scales for the signed sub-byte codes (converted by ml_dtypes' cast, see
# dequantize._direct_cast): tiny and subnormal ones, signed zeros, infinities, NaN.
EDGE_SCALES = np.array(
    [1.0, 0.75, -3.5, 0.0, -0.0, np.inf, -np.inf, np.nan, 2.0**-149, 3 * 2.0**-140,
     2.0**-126, 2.0**-120, 2.0**-119, 1.5 * 2.0**-122, 3.4e38],
    np.float32,
)


@pytest.mark.parametrize("dtype", [ml_dtypes.int4, ml_dtypes.int2])
@pytest.mark.parametrize("positive", [False, True], ids=["edges", "positive"])
def test_signed_sub_byte_edge_scales(small_chunks, dtype, positive) -> None:
    """Every layout, with edge scales (and only normal positive ones): bit-exact."""
    rng = np.random.default_rng(7)
    scales = EDGE_SCALES[EDGE_SCALES > 2.0**-119] if positive else EDGE_SCALES
    for kind, axis, block in LAYOUTS:
        x, scale, _ = make_case(rng, dtype, kind, axis, block, with_zp=False)
        scale = rng.choice(scales, size=scale.shape).astype(np.float32)
        got = dequantize(x, scale, axis=axis, block_size=block)
        assert_bits_equal(got, oracle(x, scale, None, axis, block), f"{kind} {axis} {block}")
    for s in EDGE_SCALES:  # per-tensor, one edge scale at a time
        x = codes(rng, dtype, (6, 40))
        got = dequantize(x, np.float32(s))
        assert_bits_equal(got, oracle(x, np.float32(s), None, 0, 0), f"scale {s}")


@pytest.mark.parametrize("dtype", [ml_dtypes.int4, ml_dtypes.uint4, np.int8])
@pytest.mark.parametrize("block", [0, 2, 3])
def test_long_rows_with_small_ufunc_buffer(small_chunks, dtype, block) -> None:
    """Axis 0 with rows of 1024..8191 elements runs with a smaller ufunc buffer (one row);
    results are unchanged and the caller's buffer size is restored."""
    rng = np.random.default_rng(block)
    before = np.getbufsize()
    for q in (1024, 1040, 1999):
        kind = "blocked" if block else "per-axis"
        x, scale, zp = make_case(rng, dtype, kind, 0, block, with_zp=True, shape=(7, q))
        got = dequantize(x, scale, zp, axis=0, block_size=block)
        assert_bits_equal(got, oracle(x, scale, zp, 0, block), f"q={q}")
        assert np.getbufsize() == before
    assert parallel.ufunc_bufsize(1999) == 1984
    assert parallel.ufunc_bufsize(1023) is None
    assert parallel.ufunc_bufsize(8192) is None


def test_blocked_layouts_use_larger_chunks(monkeypatch) -> None:
    """Blocked layouts plan chunks of BLOCKED_CHUNK_FACTOR x the budget; results unchanged,
    including chunk edges that cut blocks at the larger size."""
    dq_module = importlib.import_module("dqtool.kernel.dequantize")  # the name is the function
    assert parallel.plan(5, 40, 3, align=4, budget=50, factor=2) == parallel.plan(
        5, 40, 3, align=4, budget=100
    )
    factors = []
    real_plan = parallel.plan

    def spy(*args, **kwargs):
        factors.append(kwargs.get("factor", 1))
        return real_plan(*args, **{**kwargs, "budget": 61})

    monkeypatch.setattr(parallel, "plan", spy)
    monkeypatch.setattr(parallel, "PARALLEL_MIN", 0)
    rng = np.random.default_rng(11)
    for kind, axis, block in LAYOUTS:
        factors.clear()
        x, scale, zp = make_case(rng, ml_dtypes.int4, kind, axis, block, with_zp=axis == 0)
        got = dequantize(x, scale, zp, axis=axis, block_size=block)
        assert_bits_equal(got, oracle(x, scale, zp, axis, block), f"{kind} {axis} {block}")
        want = dq_module.BLOCKED_CHUNK_FACTOR if kind == "blocked" else 1
        assert factors == [want], kind
