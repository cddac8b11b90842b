"""Exact integer semantics of the integer operators, in NumPy.

Integer accumulation is exact: products of 8/16-bit integers summed in float64 are exact
integers below 2**53, so a float64 matmul or convolution gives the int32 accumulator
exactly (wrapped to int32 as runtimes do). Requantization is one float32 multiply by the
multiplier ``(x_scale * w_scale) / y_scale`` (float32, in that order, as onnxruntime
computes it), rounding half to even, adding the zero point, and saturating: the formula of
``docs/integer-ops.md``. Where the specification leaves the order of float operations
open, the kernel follows onnxruntime's CPU kernels, measured bit for bit in the tests.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import numpy as np

from dqtool.families.integer.mlas import fma
from dqtool.kernel.quantize import quantize

F32 = np.float32


def _i64(x: np.ndarray) -> np.ndarray:
    return np.asarray(x).astype(np.int64)


def _wrap_int32(acc: np.ndarray) -> np.ndarray:
    """int64 → int32 wrapping, as an int32 accumulator does on overflow."""
    return acc.astype(np.int64).astype(np.int32)


def _zp(zp: np.ndarray | None) -> np.ndarray:
    return np.zeros((), np.int64) if zp is None else _i64(zp)


def _exact_sum(f, *args: np.ndarray) -> np.ndarray:
    """An integer accumulation done in float64, exact while every partial sum stays below
    2**53 (8- and 16-bit operands with fewer than 2**21 terms)."""
    return np.rint(f(*(np.asarray(a, np.float64) for a in args))).astype(np.int64)


def saturate(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    info = np.iinfo(dtype)
    return np.clip(values, info.min, info.max).astype(dtype)


def requantize(acc: np.ndarray, multiplier: np.ndarray, zero_point: np.ndarray | None,
               dtype: np.dtype) -> np.ndarray:
    """``saturate(round_half_even(float32(acc) * multiplier) + zero_point)``."""
    scaled = np.asarray(acc).astype(np.float32) * np.asarray(multiplier, np.float32)
    rounded = np.rint(scaled)
    with np.errstate(invalid="ignore"):
        out = np.clip(rounded, -2.0**40, 2.0**40).astype(np.int64) + _zp(zero_point)
    return saturate(out, dtype)


def multiplier(*scales: np.ndarray, divide_by: np.ndarray | None = None) -> np.ndarray:
    """The float32 product of ``scales`` left to right, then divided by ``divide_by``."""
    out = np.asarray(scales[0], np.float32)
    for s in scales[1:]:
        out = (out * np.asarray(s, np.float32)).astype(np.float32)
    if divide_by is not None:
        out = (out / np.asarray(divide_by, np.float32)).astype(np.float32)
    return out


def _out_dtype(zero_point: np.ndarray | None, default: Any = np.uint8) -> np.dtype:
    return np.dtype(default) if zero_point is None else np.asarray(zero_point).dtype


# ---- MatMul ------------------------------------------------------------------------------

def _row_zp(a_zp: np.ndarray | None, a: np.ndarray) -> np.ndarray:
    """MatMulInteger's a_zero_point: a scalar, or one per row of A (length M)."""
    zp = _zp(a_zp)
    if zp.ndim == 1 and zp.size > 1 and a.ndim >= 2:
        return zp.reshape(-1, 1)
    return zp


def integer_matmul(a: np.ndarray, a_zero_point: np.ndarray | None, b: np.ndarray,
                   b_zero_point: np.ndarray | None) -> np.ndarray:
    """The family's one integer GEMM: int64 ``(a - a_zp) @ (b - b_zp)`` of raw codes, exact
    (a per-tensor or per-row a_zp, a per-tensor or per-column b_zp). A runtime that
    accumulates otherwise on some CPU path is emulated in ``dqtool.runtimes.code_paths``,
    never here."""
    return _exact_sum(np.matmul, _i64(a) - _row_zp(a_zero_point, a),
                      _i64(b) - _zp(b_zero_point))


def matmul_integer(a: np.ndarray, b: np.ndarray, a_zero_point: np.ndarray | None = None,
                   b_zero_point: np.ndarray | None = None) -> np.ndarray:
    """MatMulInteger: int32 ``(a - a_zp) @ (b - b_zp)`` (per-row a_zp, per-column b_zp)."""
    return _wrap_int32(integer_matmul(a, a_zero_point, b, b_zero_point))


def qlinear_matmul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale,
                   y_zero_point) -> np.ndarray:
    """QLinearMatMul: int32 accumulation, then one requantization by
    ``(a_scale * b_scale) / y_scale``."""
    acc = integer_matmul(a, _zp(a_zero_point), b, b_zero_point)
    m = multiplier(a_scale, b_scale, divide_by=y_scale)
    return requantize(_wrap_int32(acc), m, y_zero_point, _out_dtype(y_zero_point))


def matmul_integer_to_float(a, b, a_scale, b_scale, a_zero_point=None, b_zero_point=None,
                            bias=None) -> np.ndarray:
    """com.microsoft MatMulIntegerToFloat: ``float32(acc) * (a_scale * b_scale) + bias``."""
    acc = matmul_integer(a, b, a_zero_point, b_zero_point)
    scale = multiplier(a_scale, b_scale)
    y = (acc.astype(np.float32) * scale).astype(np.float32)
    if bias is not None:
        y = (y + np.asarray(bias, np.float32)).astype(np.float32)
    return y


def mul_integer(a: np.ndarray, a_zero_point: np.ndarray | None, b: np.ndarray,
                b_zero_point: np.ndarray | None) -> np.ndarray:
    """com.microsoft MulInteger: int32 ``(a - a_zp) * (b - b_zp)``, broadcast (exact: the
    product of two 9-bit differences fits in int32)."""
    return ((_i64(a) - _zp(a_zero_point)) * (_i64(b) - _zp(b_zero_point))).astype(np.int32)


def dynamic_quantize_linear(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """DynamicQuantizeLinear: uint8, scale ``(max(0, x_max) - min(0, x_min)) / 255``, zero
    point ``saturate(round_half_even(0 - x_min / scale))``, then QuantizeLinear.

    NaN elements are left out of the range and quantize to 0, as onnxruntime's vectorized
    min/max does in most placements (not all: its lanes' comparison order lets a NaN
    replace a lane's extreme, depending on position and data; the specification says
    nothing of NaN; docs/integer-ops.md)."""
    x = np.asarray(x, np.float32)
    seen = x[~np.isnan(x)]
    lo = np.float32(min(0.0, float(seen.min()))) if seen.size else np.float32(0)
    hi = np.float32(max(0.0, float(seen.max()))) if seen.size else np.float32(0)
    scale = np.float32(1.0) if hi == lo else np.float32((hi - lo) / np.float32(255))
    zp_float = np.float32(np.float32(0) - lo / scale)
    zp = np.uint8(np.rint(np.clip(zp_float, 0, 255)))
    y = quantize(x, np.array(scale, np.float32), np.array(zp, np.uint8))
    return y, np.array(scale, np.float32), np.array(zp, np.uint8)


def dynamic_quantize_matmul(a, b, b_scale, b_zero_point=None, bias=None) -> np.ndarray:
    """com.microsoft DynamicQuantizeMatMul: A quantized as DynamicQuantizeLinear does, then
    MatMulIntegerToFloat."""
    qa, sa, za = dynamic_quantize_linear(a)
    return matmul_integer_to_float(qa, b, sa, b_scale, za, b_zero_point, bias)


# ---- Conv --------------------------------------------------------------------------------

@lru_cache(maxsize=64)
def _one_node(op: str, domain: str, opset: int, attrs: tuple, n_inputs: int, elem: int):
    """onnx's reference evaluator for one float node (Conv, AveragePool, ...), cached."""
    import onnx
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    names = [f"i{k}" for k in range(n_inputs)]
    node = helper.make_node(op, names, ["y"], domain=domain, **dict(attrs))
    g = helper.make_graph([node], "one", [helper.make_tensor_value_info(n, elem, None)
                                          for n in names],
                          [helper.make_tensor_value_info("y", elem, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    del onnx  # imported for helper's side of the package only
    return ReferenceEvaluator(m)


def run_float_op(op: str, inputs: list[np.ndarray], attrs: Mapping[str, Any],
                 opset: int = 19, elem_double: bool = False) -> np.ndarray:
    """One float operator through onnx's reference evaluator."""
    key = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in attrs.items()
                       if v is not None))
    elem = 11 if elem_double else 1
    sess = _one_node(op, "", opset, key, len(inputs), elem)
    return sess.run(None, {f"i{k}": v for k, v in enumerate(inputs)})[0]


def _conv_attrs(attrs: Mapping[str, Any]) -> dict[str, Any]:
    keep = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")
    out = {}
    for k in keep:
        v = attrs.get(k)
        if v is None:
            continue
        if isinstance(v, bytes):
            v = v.decode()
        if isinstance(v, np.ndarray):
            v = [int(i) for i in v]
        out[k] = list(v) if isinstance(v, (list, tuple)) else v
    return out


def _channel(v: np.ndarray | None, rank: int) -> np.ndarray:
    """A per-channel parameter shaped to broadcast over an NCHW... tensor of ``rank``."""
    v = _zp(v) if v is None or np.asarray(v).dtype.kind in "iu" else np.asarray(v)
    if np.ndim(v) == 1 and np.size(v) > 1:
        return np.reshape(v, (1, -1) + (1,) * (rank - 2))
    return v


def conv_integer(x, w, x_zero_point=None, w_zero_point=None, **attrs: Any) -> np.ndarray:
    """ConvInteger: int32 convolution of ``x - x_zp`` with ``w - w_zp`` (w_zp per output
    channel allowed)."""
    return _wrap_int32(integer_conv(x, x_zero_point, w, w_zero_point, _conv_attrs(attrs)))


def integer_conv(x: np.ndarray, x_zero_point: np.ndarray | None, w: np.ndarray,
                 w_zero_point: np.ndarray | None, attrs: Mapping[str, Any]) -> np.ndarray:
    """The family's one integer convolution: int64, exact (see ``integer_matmul``)."""
    w = _i64(w)
    wz = _zp(w_zero_point)
    if wz.ndim == 1 and wz.size > 1:
        wz = wz.reshape((-1,) + (1,) * (w.ndim - 1))
    xc = (_i64(x) - _zp(x_zero_point)).astype(np.float64)
    wc = (w - wz).astype(np.float64)
    acc = run_float_op("Conv", [xc, wc], dict(attrs), elem_double=True)
    return np.rint(acc).astype(np.int64)


def qlinear_conv(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point,
                 bias=None, **attrs: Any) -> np.ndarray:
    """QLinearConv: int32 convolution plus the int32 bias, then one requantization by
    ``(x_scale * w_scale[c]) / y_scale`` per output channel."""
    acc = _wrap_int32(integer_conv(x, x_zero_point, w, w_zero_point, _conv_attrs(attrs)))
    acc = acc.astype(np.int64)
    if bias is not None:
        acc = acc + _channel(_i64(bias), acc.ndim)
    m = _channel(multiplier(x_scale, w_scale, divide_by=y_scale), acc.ndim)
    return requantize(_wrap_int32(acc), m, y_zero_point, _out_dtype(y_zero_point))


# ---- com.microsoft QGemm -----------------------------------------------------------------

def qgemm(a, a_scale, a_zero_point, b, b_scale, b_zero_point, c=None, y_scale=None,
          y_zero_point=None, *, alpha: float = 1.0, transA: int = 0, transB: int = 0
          ) -> np.ndarray:
    """com.microsoft QGemm: int32 ``A' @ B'`` plus the int32 C (scale a_scale·b_scale),
    then requantized by ``alpha·a_scale·b_scale / y_scale`` or, without y_scale, scaled to
    float by ``alpha·a_scale·b_scale``. b's scale and zero point may be per column (per
    row of B when transB)."""
    bs = np.asarray(b_scale, np.float32)
    a_t = np.asarray(a).T if transA else np.asarray(a)
    b_t = np.asarray(b).T if transB else np.asarray(b)
    # (b's per-column zero point applies after the transpose)
    acc = integer_matmul(a_t, _zp(a_zero_point), b_t, b_zero_point)
    if c is not None:
        acc = acc + _i64(c)
    m = multiplier(np.float32(alpha), a_scale, bs,
                   divide_by=None if y_scale is None else y_scale)
    acc32 = _wrap_int32(acc)
    if y_scale is None:
        return (acc32.astype(np.float32) * m).astype(np.float32)
    return requantize(acc32, m, y_zero_point, _out_dtype(y_zero_point, np.asarray(a).dtype))


# ---- element-wise and the rest: dequantize, the float op, quantize ----------------------

def _dq(x, scale, zp) -> np.ndarray:
    return ((_i64(x) - _zp(zp)).astype(np.float32) * np.asarray(scale, np.float32)).astype(
        np.float32)


def qlinear_binary(op: str, a, a_scale, a_zero_point, b, b_scale, b_zero_point, c_scale,
                   c_zero_point) -> np.ndarray:
    """com.microsoft QLinearAdd / QLinearMul, as onnxruntime's MLAS kernels compute them on
    x86-64 (read from MLAS; every pair of 8-bit codes compared bit for bit in the tests,
    rounding ties included, which the float order decides):

    - Add (the AVX2 kernel): with ``r_a = a_scale/c_scale``, ``r_b = b_scale/c_scale`` and
      ``fixed = c_zp - fma(r_1, zp_1, r_2·zp_2)``, ``fma(x_1, r_1, fma(x_2, r_2,
      fixed))``, where input 1 is the one onnxruntime passes first: ``a``, or ``b`` where
      ``a`` is one value over the broadcast's innermost run (onnxruntime swaps them);
    - Mul: ``(a - a_zp)·(b - b_zp)`` (exact) times ``a_scale·b_scale/c_scale``, plus
      ``c_zp``, each step rounded to float32;
    then rounded half to even (the sum with ``c_zp`` first: ``round(x) + c_zp`` differs
    from it on ties where ``c_zp`` is odd) and saturated.
    """
    dtype = np.asarray(a).dtype
    a, b = np.asarray(a), np.asarray(b)
    za, zb, zc = (F32(_zp(z)) for z in (a_zero_point, b_zero_point, c_zero_point))
    sa, sb, sc = (first_f32(s) for s in (a_scale, b_scale, c_scale))
    af, bf = a.astype(F32), b.astype(F32)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        if op == "Mul":
            prod = ((_i64(a) - _zp(a_zero_point)) * (_i64(b) - _zp(b_zero_point))).astype(F32)
            v = (prod * F32(F32(sa * sb) / sc)).astype(F32) + zc
        else:
            ra, rb = F32(sa / sc), F32(sb / sc)
            first, second = ((bf, rb, zb), (af, ra, za)) if _scalar_first(a.shape, b.shape) \
                else ((af, ra, za), (bf, rb, zb))
            fixed = F32(zc - fma(first[1], first[2], F32(second[1] * second[2])))
            v = fma(first[0], first[1], fma(second[0], second[1], fixed))
    return to_codes(np.asarray(v, F32), dtype)


def _scalar_first(a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> bool:
    """Whether onnxruntime runs a QLinearAdd with ``a`` as the one value of each run of
    the output (its broadcaster's "scalar input 0"): ``a`` has one element, or (``b``
    having more) ``a`` is broadcast along the output's innermost axis longer than 1."""
    a_n, b_n = math.prod(a_shape), math.prod(b_shape)
    if a_n == 1 or b_n == 1:
        return a_n == 1
    out = np.broadcast_shapes(a_shape, b_shape)
    rank = len(out)
    a_full = (1,) * (rank - len(a_shape)) + tuple(a_shape)
    for axis in range(rank - 1, -1, -1):
        if out[axis] > 1:
            return a_full[axis] == 1
    return False


def first_f32(v: Any) -> np.float32:
    """A one-element scale (scalar or 1-D of one) as float32."""
    return F32(np.asarray(v, F32).reshape(-1)[0])


def to_codes(v: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """float32 → the output's codes as the kernels convert: rounded half to even (SSE's
    conversion; NaN and what int32 cannot hold become its minimum), saturated."""
    r = np.rint(v).astype(np.float64)
    r = np.where(np.isnan(r) | (np.abs(r) >= 2.0**31), -(2.0**31), r)
    return saturate(r.astype(np.int64), dtype)


def qlinear_lookup(op: str, x, x_scale, x_zero_point, y_scale, y_zero_point,
                   attrs: Mapping[str, Any]) -> np.ndarray:
    """An element-wise QLinear op (Sigmoid, LeakyRelu) as onnxruntime runs it: a table of
    every input code, each dequantized, passed through the float op and quantized."""
    dtype = np.asarray(x).dtype
    info = np.iinfo(dtype)
    codes = np.arange(info.min, info.max + 1).astype(dtype)
    fx = _dq(codes, x_scale, x_zero_point)
    fy = run_float_op(op, [fx], attrs)
    table = quantize(fy, np.asarray(y_scale, np.float32),
                     np.asarray(y_zero_point if y_zero_point is not None else 0, dtype))
    return table[_i64(x) - info.min]


def qlinear_via_float(op: str, xs: list[tuple[Any, Any, Any]], y_scale, y_zero_point,
                      attrs: Mapping[str, Any], opset: int = 19) -> np.ndarray:
    """Dequantize every input, run the float op, quantize: the definition of the QLinear
    pooling, softmax, reduce and concat ops (their QDQ form)."""
    dtype = np.asarray(xs[0][0]).dtype
    fy = run_float_op(op, [_dq(*x) for x in xs], attrs, opset)
    zp = np.asarray(y_zero_point if y_zero_point is not None else 0, dtype)
    return quantize(np.asarray(fy, np.float32), np.asarray(y_scale, np.float32), zp)
