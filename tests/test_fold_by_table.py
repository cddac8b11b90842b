"""A fold's DequantizeLinear of 2- and 4-bit codes by table (dqtool.folding.by_table): the
kernel's values, bit for bit, for every granularity, type, block and input form."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from dqtool import native, types
from dqtool.families.fused import packing
from dqtool.folding import by_table
from dqtool.folding.kernel_call import KernelCall
from dqtool.registry import fold_kernel

pytestmark = pytest.mark.skipif(native.transpose_fn() is None,
                                reason="the compiled helper is off: no table path")

CODES = {"int4": ml_dtypes.int4, "uint4": ml_dtypes.uint4, "int2": ml_dtypes.int2,
         "uint2": ml_dtypes.uint2}


@pytest.fixture(params=["select", "rows"], autouse=True)
def lookups(request):
    """Every test runs with the AVX-512 lookups (``lut_select``, where the CPU has them)
    and with the scalar ones (``lut_rows``): the same bits either way."""
    native.set_wide(request.param == "select")
    yield request.param
    native.set_wide(True)


def _has_avx512bw() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return " avx512bw" in f.read()
    except OSError:
        return False


def _step(granularity: str, axis: int, block: int, scale: np.ndarray,
          output_dtype=None) -> KernelCall:
    return KernelCall(kind="dq", scale=None, zero_point=None, axis=axis,  # type: ignore[arg-type]
                block_size=block, granularity=granularity, norm_axis=axis,
                output_dtype=output_dtype, kernel=fold_kernel("dq"))


def _params(rng, gran: str, axis: int, block: int, shape, scale_dtype, zp_type):
    rows, cols = shape
    if gran == "per-tensor":
        pshape: tuple[int, ...] = ()
    elif gran == "per-axis":
        pshape = (shape[axis],)
    else:
        pshape = (-(-rows // block), cols) if axis == 0 else (rows, -(-cols // block))
    scale = (rng.standard_normal(pshape) * 0.05).astype(scale_dtype)
    flat = scale.reshape(-1)
    if flat.size >= 4:  # the values a table must carry through as the kernel makes them
        flat[:4] = [np.inf, -np.inf, np.nan, 1e-8]
    zp = None
    if zp_type is not None:
        et = types.by_name(zp_type)
        zp = rng.integers(int(et.min), int(et.max) + 1, pshape).astype(et.dtype)
    return scale.reshape(pshape), zp


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint8)


@pytest.mark.parametrize("code", sorted(CODES))
@pytest.mark.parametrize(("gran", "axis", "block"), [
    ("blocked", 0, 32), ("blocked", 0, 128), ("blocked", 1, 32), ("blocked", 1, 64),
    ("per-axis", 0, 0), ("per-axis", 1, 0), ("per-tensor", 0, 0)])
@pytest.mark.parametrize(("scale_dtype", "store"), [
    (np.float32, np.float32), (np.float32, np.float16), (np.float16, np.float16),
    (ml_dtypes.bfloat16, np.float32), (np.float16, ml_dtypes.bfloat16)])
@pytest.mark.parametrize("zp", [False, True])
def test_the_table_gives_the_kernels_bits(code, gran, axis, block, scale_dtype, store, zp):
    rng = np.random.default_rng(hash((code, gran, axis, block)) % 2**32)
    et = types.by_name(code)
    shape = (200, 96)  # a ragged last block along either axis for blocks of 64 and 128
    x = rng.integers(int(et.min), int(et.max) + 1, shape).astype(et.dtype)
    scale, zero_point = _params(rng, gran, axis, block, shape, scale_dtype,
                                code if zp else None)
    step = _step(gran, axis, block, scale)
    want = step._kernel()(x, scale, zero_point, step).astype(store)
    got = by_table.dequantize(step, x, scale, zero_point, np.dtype(store))
    assert got is not None and got.dtype == want.dtype
    assert np.array_equal(_bits(got), _bits(want))
    # the same rows packed (two or four codes a byte, as a transpose leaves them)
    raw = (x.view(np.uint8) & ((1 << et.bits) - 1)).astype(np.uint8)
    packed = by_table.PackedRows(packing.pack(raw, et.bits).reshape(shape[0], -1), shape[1],
                                 et.bits, et.dtype)
    got_packed = by_table.dequantize(step, packed, scale, zero_point, np.dtype(store))
    assert got_packed is not None and np.array_equal(_bits(got_packed), _bits(want))


def test_what_it_does_not_take_is_left_to_the_kernel():
    rng = np.random.default_rng(0)
    scale = np.ones((4, 16), np.float32)
    i8 = rng.integers(-8, 8, (128, 16)).astype(np.int8)
    step = _step("blocked", 0, 32, scale)
    assert by_table.dequantize(step, i8, scale, None, np.dtype(np.float32)) is None  # 8-bit
    small = _step("blocked", 0, 16, np.ones((8, 16), np.float32))  # 16 codes a table
    i4 = i8.astype(ml_dtypes.int4)
    assert by_table.dequantize(small, i4, np.ones((8, 16), np.float32), None,
                               np.dtype(np.float32)) is None
    q = KernelCall(kind="q", scale=None, zero_point=None, axis=0,  # type: ignore[arg-type]
             block_size=32, granularity="blocked", norm_axis=0, kernel=fold_kernel("q"))
    assert by_table.dequantize(q, i4, scale, None, np.dtype(np.float32)) is None
    assert by_table.dequantize(step, i4.reshape(2, 64, 16), scale, None,
                               np.dtype(np.float32)) is None  # three dimensions


def test_a_bad_call_into_c_is_an_error_not_a_crash():
    codes = np.zeros((4, 8), np.uint8)
    out = np.empty((4, 8), np.float32)
    tables = np.zeros((4, 8, 16), np.float32)
    assert native.lut_rows(codes, 8, 8, 1, 1, tables, out)  # fits
    bad = [  # each would read or write past an array
        (codes, 8, 8, 1, 1, np.zeros((4, 8, 3), np.float32), out),  # 3 levels
        (codes, 7, 4, 1, 1, np.zeros((4, 7, 16), np.float32), np.empty((4, 7), np.float32)),
        (codes, 8, 8, 1, 8, np.zeros((1, 1, 16), np.float32), out),  # 1 row group for 4 rows
        (codes, 8, 8, 4, 1, np.zeros((1, 4, 16), np.float32), out),  # 4 column groups for 8
        (np.zeros((2, 1), np.uint8), 8, 4, 1, 1, tables, out),  # 1 byte for 8 4-bit codes
        (codes, 8, 8, 1, 1, tables, np.empty((4, 8), np.float16)),  # out of another type
        (codes, 8, 8, 1, 1, tables, np.empty((8, 8), np.float32)[::2]),  # not contiguous
    ]
    for args in bad:
        with pytest.raises(ValueError, match="dq_lut_rows"):
            native.lut_rows(*args)


@pytest.mark.parametrize("source", ["matmulnbits", "int4_dq"])
def test_a_streamed_fold_by_table_writes_the_bytes_of_one_without(tmp_path, monkeypatch,
                                                                 source):
    import onnx
    from helpers.fused import nbits_inputs, nbits_model
    from onnx import helper, numpy_helper

    import dqtool
    from dqtool.folding import compute

    monkeypatch.setattr(compute, "CHUNK_ELEMENTS", 2048)  # many chunks, read packed
    rng = np.random.default_rng(8)
    src = tmp_path / "m.onnx"
    if source == "matmulnbits":
        proto = nbits_model(256, 96, 4, 64, nbits_inputs(rng, 256, 96, 4, 64, np.float16),
                            dtype=np.float16)
    else:
        q = rng.integers(-8, 8, (256, 96)).astype(ml_dtypes.int4)
        s = (rng.random((4, 96)) * 0.1).astype(np.float32)
        node = helper.make_node("DequantizeLinear", ["q", "s"], ["W"], axis=0, block_size=64)
        mm = helper.make_node("MatMul", ["A", "W"], ["Y"])
        graph = helper.make_graph(
            [node, mm], "g", [helper.make_tensor_value_info("A", 1, [1, 256])],
            [helper.make_tensor_value_info("Y", 1, [1, 96])],
            [numpy_helper.from_array(q, "q"), numpy_helper.from_array(s, "s")])
        proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)],
                                  ir_version=10)
    onnx.save(proto, src, save_as_external_data=True, location="m.data", size_threshold=0)
    calls = []
    real = by_table.dequantize

    def counted(step, x, *args):
        y = real(step, x, *args)
        calls.append((isinstance(x, by_table.PackedRows), y is not None))
        return y

    monkeypatch.setattr(by_table, "dequantize", counted)
    outs = {}
    for label in ("table", "kernel"):
        if label == "kernel":
            monkeypatch.setattr(native, "lut_rows", lambda *a: False)
            monkeypatch.setattr(native, "lut_select", lambda *a: False)
        out = tmp_path / label / "f.onnx"
        out.parent.mkdir()
        dqtool.fold(str(src), str(out), dtype="float16", external_data=True)
        outs[label] = (out.parent / "f.onnx.data").read_bytes()
        if label == "table":
            assert len(calls) > 4 and all(c == (True, True) for c in calls), calls
    assert outs["table"] == outs["kernel"] and len(outs["table"]) == 256 * 96 * 2


@pytest.mark.parametrize(("bits", "width", "levels"), [
    (4, 2, 16), (4, 4, 16), (2, 2, 4), (2, 4, 4), (8, 2, 16), (8, 4, 16), (8, 2, 4)])
@pytest.mark.parametrize(("rows", "cols", "rows_per_group"), [
    (1, 8, 1), (5, 8, 2), (130, 40, 128), (64, 104, 7), (17, 1000, 16), (3, 264, 128)])
def test_select_picks_what_the_row_lookups_pick(bits, width, levels, rows, cols,
                                                rows_per_group, lookups):
    # lut_select (tables [group][level][column], AVX-512) against lut_rows (the same
    # tables [group][column][level], scalar): columns not a multiple of the 16 or 32 a
    # vector holds, a last row group cut short, codes packed 4 or 2 a byte or one a byte
    # (masked to the levels), every bit of the entries
    rng = np.random.default_rng(rows * cols + bits)
    groups = -(-rows // rows_per_group)
    dtype = np.uint16 if width == 2 else np.uint32
    tables = rng.integers(0, 1 << (8 * width), (groups, levels, cols), np.uint64).astype(dtype)
    codes = rng.integers(0, 256, (rows, cols * bits // 8), np.uint8)
    want = np.empty((rows, cols), dtype)
    assert native.lut_rows(codes, cols, bits, rows_per_group, 1,
                           np.ascontiguousarray(tables.transpose(0, 2, 1)), want)
    got = np.full((rows, cols), 0xAB, dtype)
    ran = native.lut_select(codes, cols, bits, rows_per_group, tables, got)
    assert ran == (lookups == "select" and _has_avx512bw()) == native.select_on()
    if ran:
        assert np.array_equal(got, want)


def test_a_bad_call_into_select_is_an_error_not_a_crash(lookups):
    codes = np.zeros((4, 4), np.uint8)
    out = np.empty((4, 8), np.float32)
    assert native.lut_select(codes, 8, 4, 2, np.zeros((2, 16, 8), np.float32), out) \
        == (lookups == "select" and _has_avx512bw())
    bad = [  # each would read or write past an array
        (codes, 8, 4, 2, np.zeros((2, 3, 8), np.float32), out),  # 3 levels
        (codes, 8, 4, 2, np.zeros((1, 16, 8), np.float32), out),  # 1 row group for 4 rows
        (codes, 8, 4, 2, np.zeros((2, 16, 7), np.float32), out),  # tables of 7 columns
        (codes[:, :2], 8, 4, 2, np.zeros((2, 16, 8), np.float32), out),  # 2 bytes a row
        (codes, 8, 4, 2, np.zeros((2, 16, 8), np.float32), np.empty((4, 8), np.float16)),
        (codes, 8, 4, 2, np.zeros((2, 16, 8), np.float32), np.empty((8, 8), np.float32)[::2]),
    ]
    for args in bad:
        with pytest.raises(ValueError, match="dq_lut_select"):
            native.lut_select(*args)
