"""The fused family's faster check paths give the slow paths' bits.

- ``dequantize_matmul_nbits`` in bands of transposed codes against the scale-per-code
  formula (``_by_rows``, the kernel's form before 2026-11-28), for every bits/zero-point
  kind, ragged K, odd N, float16/float32/bfloat16 and non-finite scales;
- ``dequantize_gather_block_quantized`` gathered first, or in bands of rows, against the
  whole table (``_gather_table``);
- the reference MatMulNBits through ``half_matmul`` against ``np.matmul``.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from dqtool.families.fused import evaluator_ops, kernel, packing


def _bits(x: np.ndarray) -> bytes:
    return np.ascontiguousarray(x).tobytes()


def _nbits(rng: np.random.Generator, k: int, n: int, bits: int, block: int, dtype: type,
           zp: str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    kb = -(-k // block)
    b = rng.integers(0, 256, (n, kb, block * bits // 8), dtype=np.uint8)
    s = (rng.standard_normal((n, kb)) * 0.3).astype(dtype)
    if zp == "packed":
        z = packing.pack(rng.integers(0, 1 << bits, (n, kb), dtype=np.uint8), bits)
    elif zp == "float":
        z = (rng.standard_normal((n, kb)) * 4).astype(dtype)
    else:
        z = None
    return b, s, z


@pytest.mark.parametrize("dtype", [np.float16, np.float32, ml_dtypes.bfloat16])
@pytest.mark.parametrize(("bits", "zp"), [(2, "packed"), (4, "none"), (4, "packed"),
                                          (4, "float"), (8, "packed"), (8, "none")])
@pytest.mark.parametrize(("k", "n", "block"), [(256, 40, 32), (100, 7, 32), (48, 3, 16),
                                               (384, 1100, 128)])
def test_banded_matmul_nbits_is_the_per_code_formula(dtype, bits, zp, k, n, block):
    rng = np.random.default_rng(k * 7 + n + bits)
    b, s, z = _nbits(rng, k, n, bits, block, dtype, zp)
    got = kernel.dequantize_matmul_nbits(b, s, z, K=k, N=n, bits=bits, block_size=block)
    kb = -(-k // block)
    zp_codes, float_zp = kernel.matmul_nbits_zero_points(z, n, kb, bits)
    want = kernel._by_rows(b, s.reshape(n, kb).astype(np.float32), zp_codes, float_zp, k, n,
                           bits, block, kb, None, np.dtype(dtype))
    assert got.shape == (k, n) and got.dtype == np.dtype(dtype) and got.flags.c_contiguous
    assert _bits(got) == _bits(want)


def test_banded_matmul_nbits_with_nonfinite_scales_and_several_bands(monkeypatch):
    # Bands of one block (a tiny budget), tiles narrower than N, and scales that leave the
    # fast cast's proven domain (inf, NaN, subnormal, the largest float16).
    monkeypatch.setattr(kernel, "BAND_BYTES", 1)
    monkeypatch.setattr(kernel, "TILE", 5)
    rng = np.random.default_rng(3)
    k, n, block = 96, 23, 32
    b, s, z = _nbits(rng, k, n, 4, block, np.float16, "packed")
    s.reshape(-1)[:4] = [np.inf, np.nan, np.float16(6e-8), np.float16(65504)]
    got = kernel.dequantize_matmul_nbits(b, s, z, K=k, N=n, bits=4, block_size=block)
    zp_codes, _ = kernel.matmul_nbits_zero_points(z, n, 3, 4)
    want = kernel._by_rows(b, s.astype(np.float32), zp_codes, False, k, n, 4, block, 3, None,
                           np.dtype(np.float16))
    assert _bits(got) == _bits(want)
    assert np.isnan(got).any() and np.isinf(got).any()


def _gbq(rng: np.random.Generator, shape: tuple[int, ...], qa: int, block: int, zp: bool
         ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    data = rng.integers(0, 256, (*shape[:-1], shape[-1] // 2), dtype=np.uint8)
    s_shape = list(shape)
    s_shape[qa] = -(-shape[qa] // block)
    s = (rng.standard_normal(s_shape) * 0.1).astype(np.float16)
    z = None
    if zp:
        z_codes = rng.integers(0, 16, s_shape, dtype=np.uint8)
        z = packing.pack(z_codes, 4)
    return data, s, z


@pytest.mark.parametrize("zp", [False, True])
@pytest.mark.parametrize("indices", [[[0, 5, 2]], [3, -1, 9, 0], [[1, 99], [-100, 4]]])
def test_gathered_first_is_the_whole_table_gathered(zp, indices):
    rng = np.random.default_rng(len(indices) + zp)
    data, s, z = _gbq(rng, (10, 64), 1, 16, zp)
    idx = np.array(indices, np.int64)
    got = kernel.dequantize_gather_block_quantized(data, s, z, quantize_axis=1, block_size=16,
                                                   indices=idx)
    want = kernel._gather_table(data, s, z, 1, 16, 4, idx, 0, np.dtype(np.float16))
    assert got.shape == want.shape == (*idx.shape, 64)
    assert _bits(got) == _bits(want)


@pytest.mark.parametrize("zp", [False, True])
def test_table_in_bands_is_the_whole_table(zp, monkeypatch):
    monkeypatch.setattr(kernel, "GATHER_BAND_BYTES", 64)  # bands of two rows, a ragged last
    rng = np.random.default_rng(11 + zp)
    data, s, z = _gbq(rng, (9, 128), 1, 32, zp)
    got = kernel.dequantize_gather_block_quantized(data, s, z, quantize_axis=1, block_size=32)
    want = kernel._gather_table(data, s, z, 1, 32, 4, None, 0, np.dtype(np.float16))
    assert _bits(got) == _bits(want)


@pytest.mark.parametrize("a_shape", [(1, 256), (3, 256), (2, 5, 256)])
@pytest.mark.parametrize("bias", [False, True])
def test_reference_matmul_nbits_is_numpys_matmul(a_shape, bias):
    rng = np.random.default_rng(a_shape[0] * 3 + bias)
    k, n, block = 256, 48, 32
    b, s, z = _nbits(rng, k, n, 4, block, np.float16, "packed")
    a = (rng.standard_normal(a_shape) * 20).astype(np.float16)
    bias_v = (rng.standard_normal(n)).astype(np.float16) if bias else None
    (got,) = evaluator_ops.MatMulNBits._run(None, a, b, s, z, None, bias_v, K=k, N=n, bits=4,
                                            block_size=block)
    w = kernel.dequantize_matmul_nbits(b, s, z, K=k, N=n, bits=4, block_size=block)
    want = np.asarray(np.matmul(a, w), dtype=np.float16)
    if bias:
        want = np.asarray(want + bias_v, dtype=np.float16)
    assert got.dtype == np.float16 and _bits(got) == _bits(want)
