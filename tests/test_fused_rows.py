"""``CodeRows``: bands of rows of MatMulNBits' transposed codes, as a fold reads them,
against the whole weight transposed the simple way (unpack, transpose)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from dqtool.families.fused import packing
from dqtool.families.fused.code_rows import CodeRows

_TYPE = {2: ir.DataType.UINT2, 4: ir.DataType.UINT4, 8: ir.DataType.UINT8}


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize(("k", "n", "block"), [(64, 48, 16), (100, 40, 32), (33, 16, 16),
                                               (256, 24, 128), (130, 7, 64), (31, 3, 32),
                                               (200, 96, 64)])
def test_bands_match_the_simple_transpose(bits: int, k: int, n: int, block: int) -> None:
    kb = -(-k // block)
    rng = np.random.default_rng(k * n + bits)
    b = rng.integers(0, 256, (n, kb, block * bits // 8), dtype=np.uint8)
    reads = []
    t = CodeRows(lambda: reads.append(1) or b, k, n, bits, _TYPE[bits])
    want = packing.unpack(b.reshape(n, -1), bits)[:, :k].T  # (K, N)
    for step in (block, 8, 5, k):  # aligned bands, bands off a byte, one band
        for r0 in range(0, k, step):
            r1 = min(k, r0 + step)
            got = t.rows(r0, r1)
            assert got.shape == (r1 - r0, n) and got.dtype == _TYPE[bits].numpy()
            assert np.array_equal(got.view(np.uint8), want[r0:r1])
    assert len(reads) == 1  # B read once until released
    t.release_rows()
    assert np.array_equal(t.numpy().view(np.uint8), want)
    assert len(reads) == 2


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("shape", [(1,), (5,), (3, 7), (2, 3, 5), (4, 0)])
def test_unpack_gives_every_code_in_order(bits: int, shape: tuple[int, ...]) -> None:
    p = np.random.default_rng(sum(shape) + bits).integers(0, 256, shape, dtype=np.uint8)
    per = 8 // bits
    want = np.stack([(p >> (bits * j)) & ((1 << bits) - 1) for j in range(per)], axis=-1)
    got = packing.unpack(p, bits)
    assert got.dtype == np.uint8
    assert np.array_equal(got, want.reshape(*shape[:-1], shape[-1] * per))
