"""OPMX DequantizeLinear against a direct transcription of its formulas."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import assert_bits_equal

from dqtool.errors import KernelError
from dqtool.kernel import dequantize_opmx, pack_opmx_int4, unpack_opmx_int4


def transcribe(q, scale, zp, quant_axis, group_size, implicit, float_zp):
    """Element by element, straight from the OPMX text (float64, one final rounding)."""
    out = np.empty(q.shape, np.float64)
    for idx in np.ndindex(*q.shape):
        if scale.size == 1:
            sidx = (0,) * scale.ndim
        elif group_size:
            sidx = tuple(i // group_size if a == quant_axis else i for a, i in enumerate(idx))
        else:
            sidx = tuple(0 if n == 1 else i for n, i in zip(scale.shape, idx, strict=True))
        s = float(scale[sidx])
        if float_zp:
            out[idx] = s * (int(q[idx]) - implicit) + float(zp[sidx])
        else:
            z = implicit if zp is None else int(zp[sidx])
            out[idx] = (int(q[idx]) - z) * s
    return out.astype(np.float32).astype(scale.dtype) if not float_zp else out.astype(
        scale.dtype)


def test_pack_layout_is_four_nibbles_along_dim0() -> None:
    q = np.array([[1, 2], [3, 4], [5, 6], [15, 0]], np.uint8)
    packed = pack_opmx_int4(q)
    assert packed.shape == (1, 2)
    assert packed.view(np.uint16).tolist() == [[1 | 3 << 4 | 5 << 8 | 15 << 12,
                                               2 | 4 << 4 | 6 << 8 | 0 << 12]]
    assert np.array_equal(unpack_opmx_int4(packed), q)


@pytest.mark.parametrize("qtype", ["int4", "int8"])
@pytest.mark.parametrize("sdtype", [np.float32, np.float16])
@pytest.mark.parametrize("quant_axis", [0, 1])
@pytest.mark.parametrize("mode", ["grouped", "channel", "tensor"])
@pytest.mark.parametrize("zpmode", ["none", "int", "float"])
def test_against_transcription(qtype, sdtype, quant_axis, mode, zpmode) -> None:
    rng = np.random.default_rng(hash((qtype, quant_axis, mode, zpmode)) % 2**32)
    n, k, g = 8, 12, 4
    if qtype == "int4":
        q = rng.integers(0, 16, size=(n, k)).astype(np.uint8)
        x = pack_opmx_int4(q)
        implicit = 8
    else:
        x = rng.integers(-128, 128, size=(n, k)).astype(np.int8)
        q = x
        implicit = 0
    if mode == "grouped":
        sshape = (n // g, k) if quant_axis == 0 else (n, k // g)
        group = g
    elif mode == "channel":
        sshape, group = ((n, 1) if quant_axis == 1 else (1, k)), 0
    else:
        sshape, group = (1,), 0
    scale = (rng.random(sshape) * 0.1 + 0.001).astype(sdtype)
    zp = None
    if zpmode == "int":
        zp = rng.integers(0, 16 if qtype == "int4" else 10, size=sshape).astype(np.int8)
    elif zpmode == "float":
        zp = (rng.standard_normal(sshape)).astype(sdtype)
    got = dequantize_opmx(x, scale, zp, quant_data_type=qtype, quant_axis=quant_axis,
                          group_size=group, has_zeropoint=zp is not None,
                          float_zeropoint=zpmode == "float")
    want = transcribe(q, scale, zp, quant_axis, group, implicit, zpmode == "float")
    assert_bits_equal(got, want, f"{qtype} {sdtype} {quant_axis} {mode} {zpmode}")


def test_group_size_must_divide() -> None:
    x = np.zeros((4, 10), np.int8)
    with pytest.raises(KernelError, match="multiple of group_size"):
        dequantize_opmx(x, np.ones((4, 3), np.float32), group_size=4)


def test_has_zeropoint_must_agree() -> None:
    x = np.zeros((4, 8), np.int8)
    with pytest.raises(KernelError, match="has_zeropoint"):
        dequantize_opmx(x, np.ones((4, 2), np.float32), group_size=4, has_zeropoint=True)
