"""``dequantize_matmul_nbits``'s integer path (packed codes transposed in C, ``q - zp`` in
int8, one float32 multiply, the fast float16 cast) against the formula with a scale and
zero point per code, and against onnxruntime, bit for bit; and the NumPy path it falls
back to (no extension, N not a whole square of codes, 8-bit codes, float zero points)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from helpers.fused import bits_of, nbits_inputs, nbits_model, run_ort

import dqtool.native
from dqtool.families.fused import kernel
from dqtool.kernel import half


@pytest.fixture(autouse=True)
def _fast_cast(monkeypatch) -> None:
    monkeypatch.setattr(half, "WARM_UP_ELEMENTS", 0)  # onnxruntime's Cast where verified


def _formula(b: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None, k: int, n: int,
             bits: int, block: int) -> np.ndarray:
    """A scale and zero point per code, from the bytes by shifts: the operator's definition
    (integer zero points: one rounding; float ones: q·s + (-(zp·s)), as onnxruntime)."""
    kb = -(-k // block)
    raw = b.reshape(n, -1).astype(np.int64)
    per = 8 // bits
    codes = np.stack([(raw >> (bits * j)) & ((1 << bits) - 1) for j in range(per)], -1)
    codes = codes.reshape(n, -1)[:, :k]
    rows = np.arange(k) // block
    s = scales.reshape(n, kb).astype(np.float32)[:, rows]
    out_type = scales.dtype
    if zero_points is None:
        zp = np.full((n, k), 1 << (bits - 1), np.int64)
    elif zero_points.dtype == np.uint8:
        zraw = zero_points.reshape(n, -1).astype(np.int64)
        zc = np.stack([(zraw >> (bits * j)) & ((1 << bits) - 1) for j in range(per)], -1)
        zp = zc.reshape(n, -1)[:, :kb][:, rows]
    else:
        zf = zero_points.reshape(n, kb).astype(np.float32)[:, rows]
        with np.errstate(all="ignore"):
            return (codes.astype(np.float32) * s + -(zf * s)).astype(out_type).T
    with np.errstate(all="ignore"):
        return ((codes - zp).astype(np.float32) * s).astype(out_type).T


def _scales(rng: np.random.Generator, count: int, dtype, special: bool) -> np.ndarray:
    # magnitudes from float16 subnormal products to past 65504 (inf in float16)
    s = rng.standard_normal(count) * 10.0 ** rng.integers(-9, 5, count)
    s = s.astype(np.float32)
    if special:
        s[rng.integers(0, count, 4)] = [np.inf, -np.inf, np.nan, 0.0]
    with np.errstate(over="ignore"):
        return s.astype(dtype)


CASES = [  # (K, N, bits, block)
    (256, 64, 4, 128), (300, 48, 4, 64), (100, 32, 2, 32), (1000, 16, 4, 128),
    (129, 96, 2, 64), (64, 2048, 4, 16), (700, 80, 4, 256),
    (256, 24, 4, 128), (100, 36, 2, 32), (256, 64, 8, 128),  # NumPy's path
]


@pytest.mark.parametrize(("k", "n", "bits", "block"), CASES)
@pytest.mark.parametrize("zp_kind", ["none", "packed", "float"])
@pytest.mark.parametrize("out_type", [np.float16, np.float32, ml_dtypes.bfloat16])
def test_matches_the_formula(k, n, bits, block, zp_kind, out_type) -> None:
    rng = np.random.default_rng(k * 7 + n + bits + block)
    kb = -(-k // block)
    b = rng.integers(0, 256, (n, kb, block * bits // 8), dtype=np.uint8)
    scales = _scales(rng, n * kb, out_type, special=k % 3 == 0)
    if zp_kind == "none":
        zps = None
    elif zp_kind == "packed":
        zps = rng.integers(0, 256, (n, -(-kb * bits // 8)), dtype=np.uint8)
    else:
        zps = (rng.standard_normal((n, kb)) * 4).astype(out_type)
    with np.errstate(all="ignore"):
        got = kernel.dequantize_matmul_nbits(b, scales, zps, K=k, N=n, bits=bits,
                                             block_size=block)
    want = _formula(b, scales, zps, k, n, bits, block)
    assert got.dtype == want.dtype and got.shape == (k, n)
    assert np.array_equal(bits_of(got), bits_of(want))


@pytest.mark.parametrize("band_bytes", [1, 1 << 12, 1 << 21])
@pytest.mark.parametrize("group_bytes", [1, 1 << 10, 1 << 21])
def test_bands_and_groups_of_any_size(monkeypatch, band_bytes, group_bytes) -> None:
    # bands of one block or many, groups of rows that cut blocks anywhere
    monkeypatch.setattr(kernel, "BAND_BYTES", band_bytes)
    monkeypatch.setattr(kernel, "GROUP_BYTES", group_bytes)
    rng = np.random.default_rng(band_bytes + group_bytes)
    k, n, bits, block = 520, 64, 4, 32
    kb = -(-k // block)
    b = rng.integers(0, 256, (n, kb, block * bits // 8), dtype=np.uint8)
    scales = _scales(rng, n * kb, np.float16, special=True)
    zps = rng.integers(0, 256, (n, -(-kb * bits // 8)), dtype=np.uint8)
    with np.errstate(all="ignore"):
        got = kernel.dequantize_matmul_nbits(b, scales, zps, K=k, N=n, bits=bits,
                                             block_size=block)
    assert np.array_equal(bits_of(got), bits_of(_formula(b, scales, zps, k, n, bits, block)))


def test_without_the_extension_the_same_bits(monkeypatch) -> None:
    rng = np.random.default_rng(4)
    k, n, bits, block = 384, 128, 4, 128
    b = rng.integers(0, 256, (n, k // block, block * bits // 8), dtype=np.uint8)
    scales = _scales(rng, n * (k // block), np.float16, special=False)
    with_c = kernel.dequantize_matmul_nbits(b, scales, K=k, N=n, bits=bits, block_size=block)
    monkeypatch.setattr(dqtool.native, "_ext", None)
    assert dqtool.native.transpose_fn() is None
    without = kernel.dequantize_matmul_nbits(b, scales, K=k, N=n, bits=bits, block_size=block)
    assert np.array_equal(bits_of(with_c), bits_of(without))
    assert np.array_equal(bits_of(with_c), bits_of(_formula(b, scales, None, k, n, bits, block)))


@pytest.mark.parametrize(("bits", "zp"), [(4, "packed"), (4, "none"), (2, "packed"),
                                          (2, "none")])
@pytest.mark.parametrize(("k", "block"), [(256, 128), (100, 32)])
def test_onnxruntime_multiplies_this_weight(bits, zp, k, block) -> None:
    # N = 32: whole squares of codes, the C transpose's path
    rng = np.random.default_rng(k + bits)
    n = 32
    inputs = nbits_inputs(rng, k, n, bits, block, np.float16, zp)
    ours = kernel.dequantize_matmul_nbits(inputs["B"], inputs["scales"],
                                          inputs["zero_points"], K=k, N=n, bits=bits,
                                          block_size=block)
    (y,) = run_ort(nbits_model(k, n, bits, block, inputs, dtype=np.float16),
                   {"A": np.eye(k, dtype=np.float16)})
    assert np.array_equal(bits_of(y), bits_of(ours))


def test_llm_shape_in_bands() -> None:
    rng = np.random.default_rng(8)
    k, n, bits, block = 1024, 3072, 4, 128
    b = rng.integers(0, 256, (n, k // block, 64), dtype=np.uint8)
    scales = (rng.random(n * (k // block)) * 0.01).astype(np.float16)
    got = kernel.dequantize_matmul_nbits(b, scales, K=k, N=n, bits=bits, block_size=block)
    assert np.array_equal(bits_of(got), bits_of(_formula(b, scales, None, k, n, bits, block)))
