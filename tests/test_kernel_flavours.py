"""Flavours onnxruntime lacks, against an independent float64 computation rounded once."""

from __future__ import annotations

import math
import os

import ml_dtypes
import numpy as np
from helpers import assert_bits_equal
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dqtool.kernel import dequantize

SLOW = os.environ.get("DQTOOL_SLOW") == "1"
EXAMPLES = 300 if SLOW else 60

X_TYPES = [
    np.int8, np.uint8, np.int16, np.uint16, ml_dtypes.int4, ml_dtypes.uint4, ml_dtypes.int2,
    ml_dtypes.uint2, ml_dtypes.float4_e2m1fn, ml_dtypes.float6_e2m3fn, ml_dtypes.float6_e3m2fn,
    ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2,
]
SCALE_TYPES = [ml_dtypes.bfloat16, ml_dtypes.float8_e8m0fnu, np.float32, np.float16]
OUT_TYPES = [None, np.float32, np.float16, ml_dtypes.bfloat16]


def oracle(x, scale, zp, axis, block):
    """Straightforward float64: broadcast the scale by np.repeat, one product, one rounding.

    ``(x - zp) * scale`` is exact in float64 for these types (at most 17 + 24 bits), so
    rounding it to float32 gives float32's correctly rounded product.
    """
    xf = x.astype(np.float64)
    s = scale.astype(np.float64)
    z = np.zeros_like(s) if zp is None else zp.astype(np.float64)
    if s.ndim == 0 or s.shape == (1,):
        s, z = s.reshape(()), z.reshape(())
    elif block == 0:
        shape = [1] * x.ndim
        shape[axis] = -1
        s, z = s.reshape(shape), z.reshape(shape)
    else:
        n = x.shape[axis]
        s = np.take(np.repeat(s, block, axis=axis), np.arange(n), axis=axis)
        z = np.take(np.repeat(z, block, axis=axis), np.arange(n), axis=axis)
    with np.errstate(all="ignore"):
        return ((xf - z) * s).astype(np.float32)


def codes(rng, dtype, shape):
    dtype = np.dtype(dtype)
    if dtype.name.startswith("float"):
        n = 1 << ml_dtypes.finfo(dtype).bits
        return rng.integers(0, n, size=shape, dtype=np.uint8).view(dtype)
    info = ml_dtypes.iinfo(dtype)
    return rng.integers(int(info.min), int(info.max) + 1, size=shape).astype(dtype)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    xt=st.sampled_from(X_TYPES), st_=st.sampled_from(SCALE_TYPES), ot=st.sampled_from(OUT_TYPES),
    rank=st.integers(0, 3), seed=st.integers(0, 2**32 - 1), kind=st.integers(0, 2),
    with_zp=st.booleans(),
)
def test_against_float64(xt, st_, ot, rank, seed, kind, with_zp) -> None:
    rng = np.random.default_rng(seed)
    shape = tuple(int(n) for n in rng.integers(1, 7, size=rank))
    x = codes(rng, xt, shape)
    axis = int(rng.integers(-rank, rank)) if rank else 1
    block = 0
    if kind == 0 or rank == 0:
        sshape: tuple[int, ...] = ()
    elif kind == 1:
        sshape = (shape[axis],)
    else:
        block = int(rng.integers(1, shape[axis] + 2))
        sshape = tuple(math.ceil(n / block) if i == axis % rank else n
                       for i, n in enumerate(shape))
    if np.dtype(st_) == np.dtype(ml_dtypes.float8_e8m0fnu):
        scale = rng.integers(0, 256, size=sshape, dtype=np.uint8).view(st_)
    else:
        with np.errstate(over="ignore"):
            scale = (rng.standard_normal(sshape) * 10.0 ** rng.integers(-6, 6, size=sshape)
                     ).astype(np.float32).astype(st_)
    zp = None
    if with_zp:
        zp = np.zeros(sshape, xt) if np.dtype(xt).name.startswith("float") else codes(
            rng, xt, sshape)
    got = dequantize(x, scale, zp, axis=axis, block_size=block, output_dtype=ot)
    want32 = oracle(x, scale, zp, axis % max(rank, 1), block)
    out = np.dtype(ot) if ot is not None else (
        np.dtype(np.float32) if np.dtype(st_) == np.dtype(ml_dtypes.float8_e8m0fnu)
        else np.dtype(st_))
    with np.errstate(all="ignore"):
        assert_bits_equal(got, want32.astype(out), f"{np.dtype(xt)} {scale.dtype} -> {out}")


def test_e8m0_scale_values() -> None:
    s = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e8m0fnu)
    got = dequantize(np.ones(256, np.int8), s, axis=0)
    with np.errstate(over="ignore"):
        want = np.ldexp(np.float64(1), np.arange(256) - 127).astype(np.float32)
    assert np.isnan(got[255])
    assert_bits_equal(got[:255], want[:255], "e8m0")
