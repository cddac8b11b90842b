"""ONNX QuantizeLinear (the twin of ``dequantize``), as the specification defines it.

``q = saturate(round_half_even(float32(x) / float32(scale)) + zero_point)``, bit-identical to
onnxruntime (1.31.1 and 1.32.0 measured) except where ``dqtool.runtimes.deviations`` lists a
release that deviates from the spec:

* the division is one float32 division (also for float16/bfloat16 x and scale: onnxruntime
  widens to float32; it does not multiply by a reciprocal);
* integers: rounding half to even, then the zero point, then clamping to the type's range,
  for float32, float16 and bfloat16 x alike: ``±inf`` and values past the range saturate, as
  ``saturate(...)`` says; NaN, which the spec leaves open, gives the type's minimum (what
  onnxruntime's vectorized code gives);
* float8: rounding to nearest even with the ``saturate`` attribute's rules, including
  onnxruntime's edge behaviour (see ``float8.py``);
* float4e2m1/float6 (no onnxruntime kernel): ml_dtypes' round-to-nearest-even conversion,
  which saturates (these types have no inf/NaN), as onnx's reference implementation.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import KernelError
from .float8 import to_float8
from .layout import AxisView, resolve
from .tables import (
    BF16,
    E8M0,
    F16,
    F32,
    FLOAT8_TYPES,
    FLOAT_QUANT_TYPES,
    INT_TYPES,
    int_range,
)

_QUANT_OUT = (INT_TYPES - {np.dtype(np.int32)}) | FLOAT_QUANT_TYPES
_X_TYPES = frozenset({F32, F16, BF16})


def _expand(a: np.ndarray, lay: AxisView, shape: tuple[int, ...]) -> np.ndarray:
    """The per-element operand (broadcastable to x) for a per-axis/blocked scale."""
    a3 = lay.scale3(a)
    if lay.bs > 1:
        a3 = np.repeat(a3, lay.bs, axis=1)[:, : lay.d, :]
    return np.broadcast_to(a3, (lay.p, lay.d, lay.q)).reshape(shape)


def _output_type(zp: np.ndarray | None, output_dtype: Any) -> np.dtype:
    out = None if output_dtype is None else np.dtype(output_dtype)
    if zp is not None:
        if out is not None and out != zp.dtype:
            raise KernelError(
                f"output_dtype {out} must equal the zero point's type {zp.dtype}"
            )
        out = zp.dtype
    out = out or np.dtype(np.uint8)
    if out not in _QUANT_OUT:
        names = ", ".join(sorted(str(t) for t in _QUANT_OUT))
        raise KernelError(f"the quantized type must be one of {names}; got {out}")
    return out


def quantize(
    x: np.ndarray,
    scale: np.ndarray,
    zero_point: np.ndarray | None = None,
    *,
    axis: int = 1,
    block_size: int = 0,
    output_dtype: Any = None,
    saturate: bool = True,
) -> np.ndarray:
    """ONNX QuantizeLinear; see the module docstring for the exact arithmetic."""
    x, scale = np.asarray(x), np.asarray(scale)
    zp = None if zero_point is None else np.asarray(zero_point)
    if x.dtype not in _X_TYPES:
        raise KernelError(f"x type must be float, float16 or bfloat16; got {x.dtype}")
    if scale.dtype not in _X_TYPES | {E8M0}:
        raise KernelError(
            f"scale type must be float, float16, bfloat16 or float8e8m0; got {scale.dtype}"
        )
    out = _output_type(zp, output_dtype)
    lay = resolve(x, scale, zp, int(axis), int(block_size))
    s = scale.astype(np.float32)
    z = None if zp is None else zp
    if lay.kind == "per-tensor":
        s = s.reshape(())
        z = None if z is None else z.reshape(())
    elif x.size:
        s = _expand(s, lay, x.shape)
        z = None if z is None else _expand(z, lay, x.shape)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        v = x.astype(np.float32) / s
        if out in FLOAT_QUANT_TYPES:
            if z is not None and np.any(z.astype(np.float32) != 0):
                raise KernelError(f"a {out} zero point must be zero")
            if out in FLOAT8_TYPES:
                return to_float8(v, out, bool(saturate)).reshape(x.shape)
            return v.astype(out)
        lo, hi = int_range(out)
        r = np.rint(v)
        if z is not None:
            r = r + z.astype(np.float32)  # exact: |r| <= 2^24 matters only inside the range
        r = np.where(np.isnan(r), lo, np.clip(r, lo, hi))
        return r.astype(np.int32).astype(out)
