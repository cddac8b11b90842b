"""The measurements ``docs/handwritten.md#measured`` reports, asserted on the installed
onnxruntime (ORT_DISABLE_ALL) and dqtool's reference evaluator: what the rules of
``dqtool/handwritten/forms.py`` rest on. Every code of a type times scales of every
magnitude (normal, tiny, huge, random bit patterns)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto as TP
from test_handwritten_models import H, differing, model, run_ort, run_ref

from dqtool.kernel import dequantize

RNG = np.random.default_rng(2026)


def scales(dt: type, n: int = 128) -> np.ndarray:
    """Normal, tiny (subnormal products), huge (overflowing products), and random bit
    patterns of the type (finite ones)."""
    parts = [RNG.standard_normal(n // 4) * 0.02, RNG.standard_normal(n // 4) * 1e-6,
             RNG.standard_normal(n // 4) * 300]
    width = np.dtype(dt).itemsize
    raw = RNG.integers(0, 1 << (8 * width), n - 3 * (n // 4), dtype=np.uint64)
    pattern = raw.astype(f"u{width}").view(dt)
    pattern = pattern[np.isfinite(pattern.astype(np.float32))]
    return np.concatenate([np.concatenate(parts).astype(dt), pattern])


def grid(codes_t: type, float_t: type) -> tuple[np.ndarray, np.ndarray]:
    info = np.iinfo(codes_t)
    codes = np.arange(info.min, info.max + 1)
    if codes.size > 4096:  # 16-bit: both ends and a random middle
        codes = np.concatenate([codes[:1024], codes[-1024:], RNG.choice(codes, 2048)])
    s = scales(float_t)
    return np.tile(codes.astype(codes_t)[:, None], (1, s.size)), s


def hand(x: np.ndarray, s: np.ndarray, ft: int, zp: float | None) -> list:
    nodes = [H("Cast", ["x"], ["c"], to=ft)]
    inits = {"x": x, "s": s.reshape(1, -1)}
    last = "c"
    if zp is not None:
        inits["zp"] = np.array(zp, dtype=s.dtype)
        nodes.append(H("Sub", ["c", "zp"], ["d"]))
        last = "d"
    nodes.append(H("Mul", [last, "s"], ["y"]))
    m = model(nodes, inits, "y", ft, opset=21, out_shape=list(x.shape))
    return [run_ort(m, {})[0], run_ref(m, {})[0]]


@pytest.mark.parametrize("codes_t", [np.int8, np.uint8])
@pytest.mark.parametrize("float_t,ft", [(np.float32, TP.FLOAT), (np.float16, TP.FLOAT16)])
@pytest.mark.parametrize("zp", [None, 3, 77])
def test_8_bit_codes_are_the_kernel_on_both_runtimes(codes_t, float_t, ft, zp) -> None:
    x, s = grid(codes_t, float_t)
    ort_out, ref_out = hand(x, s, ft, zp)
    k = dequantize(x, s, None if zp is None else np.full(s.shape, zp, codes_t), axis=1)
    assert differing(ort_out, k) == 0 and differing(ref_out, k) == 0


def test_int16_codes_in_float16_have_two_meanings() -> None:
    """onnxruntime computes the float16 Cast → Mul in float32 (codes exact); the reference
    evaluator rounds the codes to float16 first."""
    x, s = grid(np.int16, np.float16)
    ort_out, ref_out = hand(x, s, TP.FLOAT16, None)
    k = dequantize(x, s, axis=1)
    assert differing(ort_out, k) == 0
    assert differing(ref_out, k) > 0


def test_integer_sub_before_the_cast_wraps_on_both() -> None:
    x = np.arange(-128, 128, dtype=np.int8).reshape(1, -1)
    nodes = [H("Sub", ["x", "zp"], ["d"]), H("Cast", ["d"], ["c"], to=TP.FLOAT),
             H("Mul", ["c", "s"], ["y"])]
    m = model(nodes, {"x": x, "zp": np.int8(100), "s": np.float32(0.5)}, "y", TP.FLOAT)
    ort_out, ref_out = run_ort(m, {})[0], run_ref(m, {})[0]
    wrapped = np.subtract(x, np.int8(100), dtype=np.int8)
    assert differing(ort_out, ref_out) == 0
    assert differing(ort_out, dequantize(x, np.float32(0.5), np.int8(100))) == 100
    assert differing(ort_out, dequantize(wrapped, np.float32(0.5))) == 0


def test_float16_mul_then_cast_to_float_is_never_rounded_on_onnxruntime() -> None:
    x, s = grid(np.int8, np.float16)
    nodes = [H("Cast", ["x"], ["c"], to=TP.FLOAT16), H("Mul", ["c", "s"], ["m"]),
             H("Cast", ["m"], ["y"], to=TP.FLOAT)]
    m = model(nodes, {"x": x, "s": s.reshape(1, -1)}, "y", TP.FLOAT, opset=23)
    ort_out, ref_out = run_ort(m, {})[0], run_ref(m, {})[0]
    wide = dequantize(x, s, axis=1, output_dtype=np.float32)
    rounded = dequantize(x, s, axis=1).astype(np.float32)
    assert differing(ort_out, wide) == 0 and differing(ort_out, rounded) > 0
    assert differing(ref_out, rounded) == 0


def test_unpacked_nibbles_are_uint4_codes() -> None:
    p = np.arange(256, dtype=np.uint8).reshape(1, -1)
    nodes = [H("BitwiseAnd", ["p", "m"], ["lo"]),
             H("BitShift", ["p", "four"], ["hi"], direction="RIGHT"),
             H("Unsqueeze", ["lo", "ax"], ["lo1"]), H("Unsqueeze", ["hi", "ax"], ["hi1"]),
             H("Concat", ["lo1", "hi1"], ["n"], axis=-1), H("Reshape", ["n", "shp"], ["q"]),
             H("Cast", ["q"], ["c"], to=TP.FLOAT), H("Sub", ["c", "eight"], ["d"]),
             H("Mul", ["d", "s"], ["y"])]
    m = model(nodes, {"p": p, "m": np.uint8(15), "four": np.uint8(4),
                      "ax": np.array([-1], np.int64), "shp": np.array([1, 512], np.int64),
                      "eight": np.float32(8), "s": np.float32(0.37)}, "y", TP.FLOAT)
    codes = np.stack([p & 15, p >> 4], -1).reshape(1, 512).astype(ml_dtypes.uint4)
    k = dequantize(codes, np.float32(0.37), np.array(8, ml_dtypes.uint4))
    assert differing(run_ort(m, {})[0], k) == 0 and differing(run_ref(m, {})[0], k) == 0


def test_bfloat16_mul_has_no_onnxruntime_kernel() -> None:
    x, s = grid(np.int8, ml_dtypes.bfloat16)
    nodes = [H("Cast", ["x"], ["c"], to=TP.BFLOAT16), H("Mul", ["c", "s"], ["y"])]
    m = model(nodes, {"x": x, "s": s.reshape(1, -1)}, "y", TP.BFLOAT16)
    with pytest.raises(Exception, match="NOT_IMPLEMENTED"):
        run_ort(m, {})
    assert differing(run_ref(m, {})[0], dequantize(x, s, axis=1)) == 0
