"""float32 -> float8 conversion exactly as onnxruntime's ``Float8*(float, saturate)``.

onnxruntime rounds to nearest even like ml_dtypes, and differs only at the edges, which are
patched here (transcribed from onnxruntime's ``core/framework/float8.h``, and verified over
every float32 exponent against onnxruntime 1.31.1 and 1.32.0 in ``tests/test_kernel_quantize.py``):

* NaN -> the type's NaN; ±inf -> ±max when saturating, else the type's inf or NaN;
* finite overflow -> ±max when saturating, else inf (e5m2) or NaN;
* e5m2 without saturation: ``61440 <= |x| < 65536`` (rounds up past the maximum) gives NaN,
  not inf (onnxruntime ORs the inf code into the maximal code);
* e4m3fn without saturation: ``480 <= |x| < 496`` gives ±448 (onnxruntime clears the
  mantissa's low bit when truncation lands on the NaN code), where exact rounding gives NaN.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

_E4M3FN = np.dtype(ml_dtypes.float8_e4m3fn)
_E4M3FNUZ = np.dtype(ml_dtypes.float8_e4m3fnuz)
_E5M2 = np.dtype(ml_dtypes.float8_e5m2)
_E5M2FNUZ = np.dtype(ml_dtypes.float8_e5m2fnuz)


def to_float8(v: np.ndarray, dtype: np.dtype, saturate: bool) -> np.ndarray:
    """Convert float32 ``v`` to float8 ``dtype`` as onnxruntime does."""
    v = np.asarray(v, np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        codes = v.astype(dtype).view(np.uint8).copy()
    sign = (v.view(np.uint32) >> 24).astype(np.uint8) & 0x80
    mag = np.abs(v)
    fnuz = dtype in (_E4M3FNUZ, _E5M2FNUZ)
    max_code = np.uint8(0x7F if fnuz else (0x7E if dtype == _E4M3FN else 0x7B))
    nan_code = None if fnuz else (sign | 0x7F)
    # What exact rounding sends beyond the largest finite value (it overflows).
    rounded = codes.view(dtype).astype(np.float32)
    overflow = np.isfinite(v) & ~np.isfinite(rounded)
    inf = np.isinf(v)
    if saturate:
        codes[overflow | inf] = (sign | max_code)[overflow | inf]
    else:
        if dtype == _E5M2:
            codes[inf] = (sign | 0x7C)[inf]
            # onnxruntime ORs the inf code into an already-maximal 0x7B: NaN, below 2^16.
            quirk = overflow & (mag < 65536)
            codes[quirk] = (sign | 0x7F)[quirk]
        elif fnuz:
            codes[inf | overflow] = 0x80
        else:
            codes[inf] = nan_code[inf]
            quirk = (mag >= 480) & (mag < 496)
            codes[quirk] = (sign | max_code)[quirk]
    nan = np.isnan(v)
    if fnuz:
        codes[nan] = 0x80
    else:
        codes[nan] = nan_code[nan]
    return codes.view(dtype)
