"""Property tests: dequantize is bit-identical to onnxruntime (CPU, ORT_DISABLE_ALL)."""

from __future__ import annotations

import math
import os

import ml_dtypes
import numpy as np
import pytest
from helpers import assert_bits_equal, ort_dequantize
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dqtool.kernel import dequantize

SLOW = os.environ.get("DQTOOL_SLOW") == "1"
EXAMPLES = 400 if SLOW else 60

ORT_TYPES = [
    np.int8, np.uint8, np.int16, np.uint16, np.int32, ml_dtypes.int4, ml_dtypes.uint4,
    ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, ml_dtypes.float8_e4m3fnuz,
    ml_dtypes.float8_e5m2fnuz,
]


def random_x(rng: np.random.Generator, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    if dtype.itemsize == 1 and dtype.name.startswith("float"):
        return rng.integers(0, 256, size=shape, dtype=np.uint8).view(dtype)
    info = ml_dtypes.iinfo(dtype)
    return rng.integers(int(info.min), int(info.max) + 1, size=shape).astype(dtype)


def random_scale(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype,
                 wild: bool) -> np.ndarray:
    s = (rng.standard_normal(shape) * 10.0 ** rng.integers(-4, 3, size=shape)).astype(np.float32)
    if wild:  # overflow to inf in float16, subnormals, zeros
        pick = rng.integers(0, 5, size=shape)
        s = np.where(pick == 0, np.float32(3e4), s)
        s = np.where(pick == 1, np.float32(1e-7), s)
        s = np.where(pick == 2, np.float32(0), s)
    return s.astype(dtype)


@st.composite
def configs(draw, types=ORT_TYPES):
    dtype = np.dtype(draw(st.sampled_from(types)))
    rank = draw(st.integers(0, 4))
    shape = tuple(draw(st.lists(st.integers(1, 7), min_size=rank, max_size=rank)))
    kinds = ["per-tensor", "per-tensor-1"] + (["per-axis", "blocked"] if rank else [])
    kind = draw(st.sampled_from(kinds))
    axis = draw(st.integers(-rank, rank - 1)) if rank else 1
    block = 0
    if kind == "per-tensor":
        sshape: tuple[int, ...] = ()
    elif kind == "per-tensor-1":
        sshape = (1,)
    elif kind == "per-axis":
        sshape = (shape[axis],)
    else:
        block = draw(st.integers(1, shape[axis] + 2))
        sshape = tuple(
            math.ceil(n / block) if i == axis % rank else n for i, n in enumerate(shape)
        )
    sdtype = np.dtype(draw(st.sampled_from([np.float32, np.float16])))
    out = draw(st.sampled_from([None, None, np.float32, np.float16]))
    with_zp = draw(st.booleans())
    seed = draw(st.integers(0, 2**32 - 1))
    wild = draw(st.booleans())
    return dtype, shape, kind, axis, block, sshape, sdtype, out, with_zp, seed, wild


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(configs())
def test_dequantize_matches_onnxruntime(cfg) -> None:
    dtype, shape, _kind, axis, block, sshape, sdtype, out, with_zp, seed, wild = cfg
    rng = np.random.default_rng(seed)
    x = random_x(rng, dtype, shape)
    scale = random_scale(rng, sshape, sdtype, wild)
    zp = None
    if with_zp:
        zp = (np.zeros(sshape, dtype) if dtype.name.startswith("float")
              else random_x(rng, dtype, sshape))
    attrs = {"axis": axis}
    if block and not (len(sshape) <= 1 and math.prod(sshape) == 1):
        # onnxruntime refuses block_size with a per-tensor (scalar or (1,)) scale
        attrs["block_size"] = block
    out_dtype = np.dtype(out) if out is not None and np.dtype(out) != sdtype else None
    want = ort_dequantize(x, scale, zp, opset=23 if out_dtype is not None else 21,
                          out_dtype=out_dtype, **attrs)
    got = dequantize(x, scale, zp, axis=axis, block_size=block, output_dtype=out_dtype)
    assert_bits_equal(got, want, f"{cfg}")


@pytest.mark.parametrize("zp", [None, 123456789, -(2**31), 2**31 - 1])
def test_int32_wraps_like_onnxruntime(zp) -> None:
    rng = np.random.default_rng(1)
    x = rng.integers(-(2**31), 2**31, size=(3, 4099), dtype=np.int64).astype(np.int32)
    x[0, :4] = [-(2**31), 2**31 - 1, 0, -1]
    for scale in (np.array(1.7e-3, np.float32), rng.random(4099).astype(np.float32),
                  np.array(3.0e-3, np.float16)):
        z = None if zp is None else np.full(scale.shape, zp, np.int32)
        want = ort_dequantize(x, scale, z, opset=21)
        got = dequantize(x, scale, z)
        assert_bits_equal(got, want, f"int32 zp={zp} scale {scale.dtype}{scale.shape}")


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, ml_dtypes.float8_e4m3fn, ml_dtypes.int4])
@pytest.mark.parametrize("sdtype", [np.float32, np.float16])
def test_large_arrays_use_fast_paths_exactly(dtype, sdtype) -> None:
    # Big enough for pair tables, several chunks and both threads; odd length on purpose.
    rng = np.random.default_rng(2)
    x = random_x(rng, np.dtype(dtype), (3, 700_001))
    for scale, kw in [
        (random_scale(rng, (), np.dtype(sdtype), True), {}),
        (random_scale(rng, (3,), np.dtype(sdtype), True), {"axis": 0}),
        (random_scale(rng, (3, 21_876), np.dtype(sdtype), True), {"axis": 1, "block_size": 32}),
    ]:
        zp = None
        if np.dtype(dtype).kind in "iu" or np.dtype(dtype) == np.dtype(ml_dtypes.int4):
            zp = random_x(rng, np.dtype(dtype), scale.shape)
        want = ort_dequantize(x, scale, zp, opset=21, **kw)
        got = dequantize(x, scale, zp, **kw)
        assert_bits_equal(got, want, f"{np.dtype(dtype)} {scale.shape} {kw}")
