"""Sub-byte integers (int4/uint4/int2/uint2) against a reference that decodes the raw bytes.

Without a zero point the kernel converts these codes with ml_dtypes' own cast
(``dequantize._direct_cast``); with one it unpacks them with uint8 arithmetic. The reference
here trusts neither: it reads the low bits of every byte with NumPy integer operations (bytes
with stray upper bits included), expands the scale along the axis with ``np.repeat`` and cuts
the ragged last block, and multiplies in float64 (exact for a small integer times a float32
value) before rounding once to float32.
"""

from __future__ import annotations

import functools
import importlib

import ml_dtypes
import numpy as np
import pytest
from helpers import assert_bits_equal

from dqtool.kernel import dequantize, parallel

dq = importlib.import_module("dqtool.kernel.dequantize")

# (type, bits, signed)
SUB_BYTE = [
    (ml_dtypes.int4, 4, True),
    (ml_dtypes.uint4, 4, False),
    (ml_dtypes.int2, 2, True),
    (ml_dtypes.uint2, 2, False),
]
# (x shape, axis, block_size): blocked on the last axis of a rank-3 x (by its positive and
# its negative index) with a ragged last block, blocked on a middle axis, per-axis with a
# negative axis, per-tensor (block 0 and a scalar scale).
LAYOUTS = [
    ((3, 5, 70), 2, 32),
    ((3, 5, 70), -1, 32),
    ((4, 9, 6), 1, 4),
    ((2, 7, 33), -1, 0),
    ((6, 45), 0, 0),
]
SCALE_TYPES = [np.float32, np.float16]


@pytest.fixture(params=[None, 7, 1001], ids=lambda b: f"budget{b}")
def chunks(request, monkeypatch):
    """The default plan, or chunks of ``budget`` elements that cut blocks, always threaded."""
    if request.param is not None:
        plan = functools.partial(parallel.plan, budget=request.param)
        monkeypatch.setattr(parallel, "plan", plan)
        monkeypatch.setattr(parallel, "PARALLEL_MIN", 0)
    return request.param


def raw_codes(rng: np.random.Generator, dtype, shape) -> np.ndarray:
    """Random bytes (upper bits included) viewed as the sub-byte type."""
    return rng.integers(0, 256, size=shape, dtype=np.uint8).view(dtype)


def decode(a: np.ndarray, bits: int, signed: bool) -> np.ndarray:
    """The value of each code: its low ``bits`` bits, two's complement if signed (int64)."""
    lo = (a.view(np.uint8) & ((1 << bits) - 1)).astype(np.int64)
    if signed:
        lo = np.where(lo >= 1 << (bits - 1), lo - (1 << bits), lo)
    return lo


def along_axis(a: np.ndarray, shape: tuple[int, ...], axis: int, block: int) -> np.ndarray:
    """A scale or zero point spread over x's shape: repeated block_size times along the axis
    and cut to x's length there (the ragged last block), or reshaped per-axis/per-tensor."""
    if a.ndim == 0:
        return a
    axis %= len(shape)
    if block == 0:
        return a.reshape([-1 if i == axis else 1 for i in range(len(shape))])
    return np.repeat(a, block, axis=axis).take(np.arange(shape[axis]), axis=axis)


def reference(x, scale, zp, axis, block, bits, signed) -> np.ndarray:
    d = decode(x, bits, signed)
    if zp is not None:
        d = d - along_axis(decode(zp, bits, signed), x.shape, axis, block)
    s = along_axis(scale.astype(np.float64), x.shape, axis, block)
    with np.errstate(all="ignore"):
        return (d.astype(np.float64) * s).astype(np.float32)


def param_shape(shape: tuple[int, ...], axis: int, block: int) -> tuple[int, ...]:
    axis %= len(shape)
    if block == 0:
        return (shape[axis],)
    return tuple(-(-n // block) if i == axis else n for i, n in enumerate(shape))


@pytest.mark.parametrize("spec", SUB_BYTE, ids=lambda s: np.dtype(s[0]).name)
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda lay: f"{lay[0]}-ax{lay[1]}-b{lay[2]}")
@pytest.mark.parametrize("scale_type", SCALE_TYPES, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("with_zp", [False, True], ids=["nozp", "zp"])
def test_sub_byte_against_byte_decoding(chunks, spec, layout, scale_type, with_zp) -> None:
    dtype, bits, signed = spec
    shape, axis, block = layout
    rng = np.random.default_rng(abs(hash((bits, signed, shape, axis, block))) % 2**32)
    x = raw_codes(rng, dtype, shape)
    sshape = param_shape(shape, axis, block)
    if len(shape) == 2 and axis == 0 and block == 0:
        sshape = ()  # the per-tensor entry: a scalar scale (axis is then ignored)
    # Magnitudes over 2**±12: float16 scales with subnormal entries, products near its max.
    mag = 2.0 ** rng.integers(-12, 12, sshape)
    scale = ((rng.random(sshape) * 4 - 2) * mag).astype(scale_type)
    zp = raw_codes(rng, dtype, sshape) if with_zp else None
    # The path under test: ml_dtypes' cast exactly when there is no zero point.
    assert dq._direct_cast(np.dtype(dtype), zp) is (not with_zp)
    got = dequantize(x, scale, zp, axis=axis, block_size=block)
    assert got.dtype == np.dtype(scale_type)
    with np.errstate(over="ignore"):  # float16 products may round to ±inf, in both
        want = reference(x, scale, zp, axis, block, bits, signed).astype(scale_type)
    assert_bits_equal(got, want, f"{np.dtype(dtype).name} {layout} {np.dtype(scale_type).name}")


@pytest.mark.parametrize("spec", SUB_BYTE, ids=lambda s: np.dtype(s[0]).name)
def test_every_byte_every_block(chunks, spec) -> None:
    """All 256 bytes in every block position of a ragged last-axis layout, float32 output
    from a float16 scale with subnormal, zero, signed-zero and infinite entries."""
    dtype, bits, signed = spec
    row = np.concatenate([np.arange(256), np.arange(26)]).astype(np.uint8)  # 9 blocks, last 26
    x = np.ascontiguousarray(np.broadcast_to(row, (3, 2, row.size))).view(dtype)
    specials = np.array([1.5, -0.0, 0.0, 6e-8, -np.inf, 65504, -3.25, np.nan], np.float16)
    scale = np.resize(specials, (3, 2, 9)).astype(np.float16)
    got = dequantize(x, scale, axis=-1, block_size=32, output_dtype=np.float32)
    assert_bits_equal(got, reference(x, scale, None, -1, 32, bits, signed))
