"""OpenPPL OPMX (domain ``opmx``, older ``pmx``) DequantizeLinear.

Layout (``docs/semantics.md#opmx``): int4 data comes packed four nibbles per int16 along
dimension 0, ``packed[r, c] = sum_j (q[4r+j, c] & 0xF) << 4j``, nibbles unsigned. Scale shapes:

* scalar or ``(1,)``: per-tensor;
* ``group_size > 0``: the scale has q's shape except on ``quant_axis``, where it is
  ``q.shape[quant_axis] / group_size`` (exact division required);
* ``group_size == 0``: the scale has q's rank and each dimension is q's or 1 (per channel).

Arithmetic (dqtool's decision; OPMX documents only the formulas):

* integer or no zero point: ``y = round_out(float32(q - zp) * float32(scale))`` with the
  implicit zero point 8 for int4 and 0 for int8 — ``q - zp`` is exact, the product is one
  float32 rounding, then one rounding to the output (scale) type. For a float16 scale the
  float32 product of an (at most 9-bit) integer and a float16 is exact, so the float16 result
  is rounded exactly once.
* float zero point (``float_zeropoint``): ``y = round_out(scale * q + zero_point)`` with
  ``q = nibble - 8`` for int4 (the symmetric value the float zero point biases) and ``q = x``
  for int8. It is computed in float64: for float16 scale and zero point the sum is exact there
  (both terms are multiples of 2^-24 below 2^24), so it is rounded exactly once; for float32 it
  is rounded to float64 first (a relative error below 2^-53) and then to float32.
"""

from __future__ import annotations

import numpy as np

from ..errors import KernelError
from .layout import is_per_tensor
from .tables import F16, F32

_QUANT_TYPES = {"int4": np.dtype(np.int16), "int8": np.dtype(np.int8)}


def unpack_opmx_int4(packed: np.ndarray) -> np.ndarray:
    """int16 ``(R, ...)`` packed four nibbles along dim 0 -> uint8 nibbles ``(4R, ...)``."""
    packed = np.asarray(packed)
    if packed.dtype not in (np.int16, np.uint16):
        raise KernelError(f"opmx int4 data must be int16 (int4x4); got {packed.dtype}")
    if packed.ndim == 0:
        raise KernelError("opmx int4 data must have rank >= 1 (packed along dimension 0)")
    u = packed.view(np.uint16)
    q = np.empty((packed.shape[0], 4, *packed.shape[1:]), np.uint8)
    for j in range(4):
        q[:, j] = (u >> np.uint16(4 * j)) & np.uint16(0xF)
    return q.reshape(4 * packed.shape[0], *packed.shape[1:])


def pack_opmx_int4(nibbles: np.ndarray) -> np.ndarray:
    """Inverse of ``unpack_opmx_int4``: values 0..15, dim 0 a multiple of 4 -> int16."""
    q = np.asarray(nibbles).astype(np.uint16)
    if q.ndim == 0 or q.shape[0] % 4:
        raise KernelError(f"opmx int4 packing needs dim 0 a multiple of 4; got shape {q.shape}")
    if q.size and (q.max() > 15):
        raise KernelError("opmx int4 nibbles must be in 0..15")
    q4 = q.reshape(q.shape[0] // 4, 4, *q.shape[1:])
    out = q4[:, 0] | (q4[:, 1] << 4) | (q4[:, 2] << 8) | (q4[:, 3] << 12)
    return out.astype(np.uint16).view(np.int16)


def _check_scale(q: np.ndarray, scale: np.ndarray, quant_axis: int, group_size: int) -> None:
    shapes = f"(q shape {q.shape}, scale shape {scale.shape})"
    if is_per_tensor(scale):
        return
    if scale.ndim != q.ndim:
        raise KernelError(f"opmx: the scale must be per-tensor or have q's rank {shapes}")
    if group_size > 0:
        d = q.shape[quant_axis]
        if d % group_size:
            raise KernelError(
                f"opmx: q.shape[quant_axis={quant_axis}]={d} must be a multiple of "
                f"group_size={group_size} {shapes}"
            )
        want = list(q.shape)
        want[quant_axis] = d // group_size
        if list(scale.shape) != want:
            raise KernelError(
                f"opmx grouped (group_size={group_size}, quant_axis={quant_axis}): the scale "
                f"shape must be {tuple(want)} {shapes}"
            )
        return
    for a, b in zip(scale.shape, q.shape, strict=True):
        if a not in (1, b):
            raise KernelError(
                f"opmx per-channel (group_size=0): every scale dimension must be 1 or q's "
                f"{shapes}"
            )


def _expand(a: np.ndarray, q: np.ndarray, quant_axis: int, group_size: int) -> np.ndarray:
    if is_per_tensor(a):
        return a.reshape(())
    if group_size > 0:
        return np.repeat(a, group_size, axis=quant_axis)
    return a


def dequantize_opmx(
    x: np.ndarray,
    scale: np.ndarray,
    zero_point: np.ndarray | None = None,
    *,
    quant_data_type: str = "int8",
    quant_axis: int = 1,
    group_size: int = 128,
    has_zeropoint: bool = False,
    float_zeropoint: bool = False,
) -> np.ndarray:
    """OPMX DequantizeLinear; see the module docstring for layout and arithmetic."""
    x, scale = np.asarray(x), np.asarray(scale)
    zp = None if zero_point is None else np.asarray(zero_point)
    if quant_data_type not in _QUANT_TYPES:
        raise KernelError(f"opmx quant_data_type must be int4 or int8; got {quant_data_type!r}")
    want = _QUANT_TYPES[quant_data_type]
    if x.dtype != want and not (quant_data_type == "int4" and x.dtype == np.uint16):
        raise KernelError(f"opmx {quant_data_type} data must be {want}; got {x.dtype}")
    if scale.dtype not in (F32, F16):
        raise KernelError(f"opmx scale must be float32 or float16; got {scale.dtype}")
    if quant_axis not in (0, 1):
        raise KernelError(f"opmx quant_axis must be 0 or 1; got {quant_axis}")
    if group_size < 0:
        raise KernelError(f"opmx group_size must be >= 0; got {group_size}")
    if has_zeropoint != (zp is not None):
        raise KernelError(
            "opmx: has_zeropoint must be set exactly when a zero point is given "
            f"(has_zeropoint={bool(has_zeropoint)}, zero point given: {zp is not None})"
        )
    q = unpack_opmx_int4(x) if quant_data_type == "int4" else x
    if q.ndim and quant_axis >= q.ndim and not is_per_tensor(scale):
        raise KernelError(f"opmx quant_axis={quant_axis} out of range for q of rank {q.ndim}")
    _check_scale(q, scale, quant_axis, group_size)
    if zp is not None and zp.shape != scale.shape:
        raise KernelError(
            f"opmx: zero point shape {zp.shape} must equal scale shape {scale.shape}"
        )
    s = _expand(scale, q, quant_axis, group_size)
    implicit = 8 if quant_data_type == "int4" else 0
    with np.errstate(over="ignore", invalid="ignore"):
        if float_zeropoint:
            if zp is None or zp.dtype not in (F32, F16):
                raise KernelError("opmx float_zeropoint needs a float16/float32 zero point")
            z = _expand(zp, q, quant_axis, group_size).astype(np.float64)
            v = q.astype(np.float64) - implicit
            return (v * s.astype(np.float64) + z).astype(scale.dtype)
        if zp is None:
            d = q.astype(np.float32) - np.float32(implicit)
        else:
            if zp.dtype.kind not in "iu":
                raise KernelError(
                    f"opmx integer zero point must be an integer type; got {zp.dtype} "
                    "(a float zero point needs float_zeropoint=True)"
                )
            z = _expand(zp, q, quant_axis, group_size)
            d = q.astype(np.float32) - z.astype(np.float32)
        return (d * s.astype(np.float32)).astype(scale.dtype)
