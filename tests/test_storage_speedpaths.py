"""``storage.unpack``'s vectorized passes (multiplies for shifts, two's complement by xor and
subtraction) against the plain formula: code j of byte b is ``(b >> bits·j) & mask``."""

from __future__ import annotations

import numpy as np
import pytest

from dqtool.storage import tensor_reads, unpack


def _formula(packed: np.ndarray, bits: int, signed: bool) -> np.ndarray:
    per = 8 // bits
    p = packed.astype(np.int16)
    codes = np.stack([(p >> (bits * j)) & ((1 << bits) - 1) for j in range(per)], axis=-1)
    codes = codes.reshape(*packed.shape[:-1], packed.shape[-1] * per)
    if signed:
        return np.where(codes >= 1 << (bits - 1), codes - (1 << bits), codes).astype(np.int8)
    return codes.astype(np.uint8)


SHAPES = [(1,), (7,), (3, 5), (300, 101), (2, 3, 4), (0,), (5, 0), (4097,)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("signed", [False, True])
def test_unpack_is_the_formula(shape, bits, signed) -> None:
    rng = np.random.default_rng(len(shape) * 31 + bits + signed)
    packed = rng.integers(0, 256, shape, dtype=np.uint8)
    got = unpack(packed, bits, signed)
    want = _formula(packed, bits, signed)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert np.array_equal(got, want)


@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("signed", [False, True])
def test_every_byte_in_chunks_of_any_length(monkeypatch, bits, signed) -> None:
    # all 256 bytes, several times, through chunks that end anywhere (and a last short one)
    monkeypatch.setattr(tensor_reads, "UNPACK_CHUNK", 37)
    packed = np.tile(np.arange(256, dtype=np.uint8), 3)[:-5]
    assert np.array_equal(unpack(packed, bits, signed), _formula(packed, bits, signed))


def test_strided_input_and_full_range_of_codes() -> None:
    rng = np.random.default_rng(7)
    packed = rng.integers(0, 256, (64, 300), dtype=np.uint8)[::2, 1::3]
    for bits in (2, 4):
        got = unpack(packed, bits, signed=True)
        assert np.array_equal(got, _formula(packed, bits, True))
        assert got.min() == -(1 << (bits - 1)) and got.max() == (1 << (bits - 1)) - 1


def test_eight_bits_are_the_bytes() -> None:
    packed = np.arange(256, dtype=np.uint8)
    assert unpack(packed, 8) is packed or np.array_equal(unpack(packed, 8), packed)
    assert np.array_equal(unpack(packed, 8, signed=True), packed.view(np.int8))
