"""com.microsoft QLinearAveragePool and QLinearGlobalAveragePool as onnxruntime's CPU
kernels compute them (``contrib_ops/cpu/quantization/qlinear_pool.cc`` and MLAS's
``qlgavgpool.cpp``), which is not "dequantize, the float AveragePool, quantize":

- A window covering the whole image with no pads (and every global pool) is summed in
  integers, ``sum(x) - x_zp·n``, times ``x_scale / (y_scale·n)`` in float32, clamped to the
  output's range less ``y_zp``, rounded half to even, and ``y_zp`` added.
- Any other window dequantizes each code (``x_scale·(x - x_zp)``), sums the window's
  codes in float32 in row-major order, divides by its size, and quantizes as
  ``round(y / y_scale + y_zp)``: the zero point added before rounding, so a tie with an
  odd zero point lands one code away from QuantizeLinear's. With ``count_include_pad``
  the size is the whole kernel's, also where ``ceil_mode`` lets a window run past the
  input and its pads (the ONNX operator counts only the pads there).

Measured bit for bit against onnxruntime in the tests (1-, 2- and 3-D, both layouts,
ceil_mode, pads, count_include_pad, int8 and uint8).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from dqtool.families.integer.kernel import first_f32, saturate, to_codes

F32 = np.float32


def _zp(v: Any) -> int:
    return 0 if v is None else int(np.asarray(v).reshape(-1)[0])


def global_average_pool(x: np.ndarray, x_scale: Any, x_zero_point: Any, y_scale: Any,
                        y_zero_point: Any) -> np.ndarray:
    """QLinearGlobalAveragePool, NCHW (any number of spatial axes): MLAS's integer sum."""
    x = np.asarray(x)
    n = int(math.prod(x.shape[2:]))
    zx, zy = _zp(x_zero_point), _zp(y_zero_point)
    info = np.iinfo(x.dtype)
    scale = F32(first_f32(x_scale) / F32(first_f32(y_scale) * F32(n)))
    acc = x.reshape(x.shape[0], x.shape[1], -1).astype(np.int64).sum(axis=-1) - zx * n
    acc = acc.astype(np.int32).astype(F32)  # (an int32 accumulator)
    with np.errstate(invalid="ignore", over="ignore"):
        v = np.clip((acc * scale).astype(F32), F32(info.min - zy), F32(info.max - zy))
    y = to_codes(v, np.dtype(np.int32)).astype(np.int64) + zy
    out = saturate(y, x.dtype)
    return out.reshape(*x.shape[:2], *([1] * (x.ndim - 2)))


def _pads(attrs: Mapping[str, Any], shape: Sequence[int], kernel: Sequence[int],
          strides: Sequence[int]) -> list[int]:
    """Begin and end pads, ``auto_pad`` resolved as onnxruntime's pool attributes do."""
    rank = len(kernel)
    auto = attrs.get("auto_pad", "NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for size, k, s in zip(shape, kernel, strides, strict=True):
            out = -(-size // s)
            # Negative where the kernel is shorter than the stride: onnxruntime keeps it
            # (its windows then start later), halved as C divides, toward zero.
            total = (out - 1) * s + k - size
            head = int((total + (auto == "SAME_LOWER")) / 2)
            begin.append(head)
            end.append(total - head)
        return begin + end
    if auto == "VALID":
        return [0] * (2 * rank)
    return list(attrs.get("pads") or [0] * (2 * rank))


def pooled_size(size: int, k: int, s: int, begin: int, end: int, ceil: bool) -> int:
    """Windows along one axis, as onnxruntime's pool attributes count them: with
    ``ceil_mode``, rounded up, less one where the last window would start past the input
    and its begin pad."""
    span = size + begin + end - k
    out = (-(-span // s) if ceil else span // s) + 1
    if ceil and (out - 1) * s >= size + begin:
        out -= 1
    return out


def average_pool(x: np.ndarray, x_scale: Any, x_zero_point: Any, y_scale: Any,
                 y_zero_point: Any, attrs: Mapping[str, Any]) -> np.ndarray:
    """QLinearAveragePool, NCHW."""
    x = np.asarray(x)
    kernel = [int(k) for k in attrs["kernel_shape"]]
    rank = len(kernel)
    spatial = list(x.shape[2:])
    strides = [int(s) for s in (attrs.get("strides") or [1] * rank)]
    pads = _pads(attrs, spatial, kernel, strides)
    if spatial == kernel and not any(pads):  # onnxruntime takes its global pool then
        return global_average_pool(x, x_scale, x_zero_point, y_scale, y_zero_point)
    ceil = bool(attrs.get("ceil_mode", 0))
    include_pad = bool(attrs.get("count_include_pad", 0))
    out_shape, starts, ends = [], [], []
    same = attrs.get("auto_pad", "NOTSET") in ("SAME_UPPER", "SAME_LOWER", b"SAME_UPPER",
                                               b"SAME_LOWER")
    for i, (size, k, s) in enumerate(zip(spatial, kernel, strides, strict=True)):
        out = pooled_size(size, k, s, pads[i], pads[i + rank], ceil and not same)
        first = np.arange(out) * s - pads[i]
        out_shape.append(out)
        starts.append(first)
        ends.append(np.minimum(first + k, size))
    zx, zy = _zp(x_zero_point), _zp(y_zero_point)
    with np.errstate(invalid="ignore", over="ignore"):
        xf = (first_f32(x_scale) * (x.astype(np.int64) - zx).astype(F32)).astype(F32)
    total = np.zeros((*x.shape[:2], *out_shape), F32)
    for offset in itertools.product(*(range(k) for k in kernel)):
        # each window's element at ``offset``, added where it lies in the input: the
        # windows' sums run in the kernel's row-major order, as onnxruntime's loops do
        index, valid = [], None
        for axis, o in enumerate(offset):
            pos = starts[axis] + o
            ok = (pos >= 0) & (pos < ends[axis])
            shape = [1] * rank
            shape[axis] = -1
            index.append(np.clip(pos, 0, spatial[axis] - 1).reshape(shape))
            ok = ok.reshape(shape)
            valid = ok if valid is None else valid & ok
        picked = xf[(slice(None), slice(None), *index)]
        total = (total + np.where(valid, picked, F32(0))).astype(F32)
    if include_pad:
        count = F32(math.prod(kernel))
    else:
        count = np.ones([1] * rank, F32)
        for axis in range(rank):
            shape = [1] * rank
            shape[axis] = -1
            size = (ends[axis] - np.maximum(starts[axis], 0)).reshape(shape)
            count = count * size.astype(F32)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        mean = (total / count).astype(F32)
        v = ((mean / first_f32(y_scale)).astype(F32) + F32(zy)).astype(F32)
    return to_codes(v, x.dtype)
