"""dequantize_matmul_nbits / dequantize_gather_block_quantized against onnxruntime, bit for bit.

An identity A makes every MatMulNBits output exactly one weight (all other products are
zeros), so the operator's output *is* its dequantized weight.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from helpers.fused import bits_of, gbq_model, nbits_inputs, nbits_model, run_ort

import dqtool
from dqtool.errors import KernelError
from dqtool.families.fused import packing


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize(("bits", "zp"), [(2, "packed"), (2, "none"), (2, "float"),
                                          (4, "packed"), (4, "none"), (4, "float"),
                                          (8, "packed"), (8, "none")])
@pytest.mark.parametrize(("k", "block"), [(64, 32), (100, 32), (48, 16), (128, 128)])
def test_matmul_nbits_weight_is_what_onnxruntime_multiplies(dtype, bits, zp, k, block):
    rng = np.random.default_rng(k * 31 + bits)
    n = 24
    inputs = nbits_inputs(rng, k, n, bits, block, dtype, zp)
    ours = dqtool.dequantize_matmul_nbits(inputs["B"], inputs["scales"], inputs["zero_points"],
                                          K=k, N=n, bits=bits, block_size=block)
    assert ours.shape == (k, n) and ours.dtype == np.dtype(dtype)
    (y,) = run_ort(nbits_model(k, n, bits, block, inputs, dtype=dtype),
                   {"A": np.eye(k, dtype=dtype)})
    assert np.array_equal(bits_of(y), bits_of(ours))


def test_float_zero_point_is_not_rounded_once():
    # Two roundings (q·s, then + (-zp·s)): the one-rounding formula differs for some elements,
    # so this is the case that tells the two apart.
    rng = np.random.default_rng(5)
    inputs = nbits_inputs(rng, 64, 16, 4, 32, np.float32, "float")
    ours = dqtool.dequantize_matmul_nbits(inputs["B"], inputs["scales"], inputs["zero_points"],
                                          K=64, N=16, bits=4, block_size=32)
    codes = packing.unpack(inputs["B"].reshape(16, -1), 4).astype(np.float32)
    zp = np.repeat(inputs["zero_points"].reshape(16, 2), 32, axis=1)
    s = np.repeat(inputs["scales"].reshape(16, 2), 32, axis=1)
    once = ((codes - zp) * s).T
    assert (bits_of(once) != bits_of(ours)).sum() > 0


def test_matmul_nbits_known_values():
    # K=4 in one block of 16 (ragged), N=1, 4-bit codes 0,1,2,15, zero point 8, scale 0.5
    b = packing.pack(np.array([[0, 1, 2, 15] + [8] * 12], np.uint8), 4).reshape(1, 1, 8)
    w = dqtool.dequantize_matmul_nbits(b, np.array([0.5], np.float32), None, K=4, N=1,
                                       bits=4, block_size=16)
    assert w.reshape(-1).tolist() == [-4.0, -3.5, -3.0, 3.5]


def test_matmul_nbits_g_idx_picks_each_rows_block():
    codes = np.full((1, 32), 9, np.uint8)
    b = packing.pack(codes, 4).reshape(1, 2, 8)
    scales = np.array([[1.0, 2.0]], np.float32)
    g = np.array([1] * 16 + [0] * 16, np.int32)
    w = dqtool.dequantize_matmul_nbits(b, scales, None, K=32, N=1, bits=4, block_size=16,
                                       g_idx=g)
    assert w[:16, 0].tolist() == [2.0] * 16 and w[16:, 0].tolist() == [1.0] * 16


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("zp", ["packed", "none", "float"])
@pytest.mark.parametrize(("bits", "k", "block"), [(4, 100, 32), (2, 64, 16), (8, 130, 64)])
def test_block_broadcast_is_a_scale_per_code(dtype, zp, bits, k, block):
    """Without g_idx the kernel broadcasts each block's scale over its codes; with the
    g_idx of plain blocks it takes a scale per code, the formula onnxruntime's is checked
    against above: the same bits, ragged last block and bfloat16 included."""
    rng = np.random.default_rng(k + bits)
    n = 20
    inputs = nbits_inputs(rng, k, n, bits, block, dtype, zp)
    args = (inputs["B"], inputs["scales"], inputs["zero_points"])
    plain = dqtool.dequantize_matmul_nbits(*args, K=k, N=n, bits=bits, block_size=block)
    per_code = dqtool.dequantize_matmul_nbits(*args, K=k, N=n, bits=bits, block_size=block,
                                              g_idx=np.arange(k, dtype=np.int32) // block)
    assert plain.dtype == per_code.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(bits_of(plain), bits_of(per_code))


def test_matmul_nbits_rejects_wrong_sizes():
    with pytest.raises(KernelError, match="B has"):
        dqtool.dequantize_matmul_nbits(np.zeros((2, 1, 8), np.uint8),
                                       np.ones(2, np.float32), K=16, N=3, block_size=16)
    with pytest.raises(KernelError, match="bits"):
        dqtool.dequantize_matmul_nbits(np.zeros((2, 1, 8), np.uint8),
                                       np.ones(2, np.float32), K=16, N=2, bits=3,
                                       block_size=16)


def _int4(rng, shape, signed):
    lo, hi = (-8, 8) if signed else (0, 16)
    return rng.integers(lo, hi, size=shape).astype(ml_dtypes.int4 if signed else ml_dtypes.uint4)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize(("kind", "zp"), [("int4", True), ("int4", False), ("uint4", True),
                                          ("uint8-4", True), ("uint8-4", False),
                                          ("uint8-8", True), ("uint8-8", False)])
def test_gather_block_quantized_matches_onnxruntime(dtype, kind, zp):
    rng = np.random.default_rng(7)
    rows, cols, block = 10, 80, 32  # ragged: 3 blocks of 32 over 80 columns
    kb = 3
    scales = (rng.random((rows, kb)) * 0.1 + 0.01).astype(dtype)
    if kind in ("int4", "uint4"):
        bits = 4
        table = _int4(rng, (rows, cols), kind == "int4")
        zps = _int4(rng, (rows, kb), kind == "int4") if zp else None
    else:
        bits = int(kind[-1])
        codes = rng.integers(0, 1 << bits, size=(rows, cols), dtype=np.uint8)
        table = packing.pack(codes, bits)
        zps = packing.pack(rng.integers(0, 1 << bits, size=(rows, kb), dtype=np.uint8), bits) \
            if zp else None
    indices = np.array([3, 0, 9, -1, 3], np.int64)
    (y,) = run_ort(gbq_model(table, scales, zps, block=block, bits=bits),
                   {"indices": indices})
    ours = dqtool.dequantize_gather_block_quantized(table, scales, zps, quantize_axis=1,
                                                    block_size=block, bits=bits,
                                                    indices=indices)
    assert ours.shape == y.shape == (5, cols)
    assert np.array_equal(bits_of(y), bits_of(ours))


def test_gather_block_quantized_out_of_range_index_gives_zeros():
    table = np.full((2, 16), 0x99, np.uint8)  # codes 9, zero point 8: every weight 1 * scale
    scales = np.array([[2.0], [3.0]], np.float32)
    y = dqtool.dequantize_gather_block_quantized(table, scales, None, block_size=32,
                                                 indices=np.array([1, 5]))
    assert y[0].tolist() == [3.0] * 32 and y[1].tolist() == [0.0] * 32


def test_gather_block_quantized_quantize_axis_0():
    rng = np.random.default_rng(3)
    table = _int4(rng, (40, 6), True)
    scales = (rng.random((2, 6)) + 0.5).astype(np.float32)
    (y,) = run_ort(gbq_model(table, scales, None, quantize_axis=0, gather_axis=1, block=32,
                             n_indices=3), {"indices": np.array([5, 0, 2], np.int64)})
    ours = dqtool.dequantize_gather_block_quantized(table, scales, None, quantize_axis=0,
                                                    block_size=32,
                                                    indices=np.array([5, 0, 2]), gather_axis=1)
    assert np.array_equal(bits_of(y), bits_of(ours))


def test_reference_evaluator_runs_both_ops():
    rng = np.random.default_rng(11)
    inputs = nbits_inputs(rng, 64, 8, 4, 32, np.float32, "packed")
    bias = rng.random(8).astype(np.float32)
    model = nbits_model(64, 8, 4, 32, inputs, m=3, bias=bias)
    a = rng.random((3, 64)).astype(np.float32)
    (y,) = dqtool.reference_evaluator(model).run(None, {"A": a})
    w = dqtool.dequantize_matmul_nbits(inputs["B"], inputs["scales"], inputs["zero_points"],
                                       K=64, N=8, bits=4, block_size=32)
    assert np.array_equal(y, a @ w + bias)
    (y_ort,) = run_ort(model, {"A": a})
    assert np.allclose(y, y_ort, rtol=1e-5, atol=1e-5)

    table = _int4(rng, (6, 32), True)
    scales = (rng.random((6, 1)) + 0.5).astype(np.float32)
    gmodel = gbq_model(table, scales, None, n_indices=2)
    idx = np.array([4, 1], np.int64)
    (g,) = dqtool.reference_evaluator(gmodel).run(None, {"indices": idx})
    (g_ort,) = run_ort(gmodel, {"indices": idx})
    assert np.array_equal(bits_of(g), bits_of(g_ort))


def test_reference_matmul_nbits_rounds_before_its_bias_in_bfloat16(tmp_path):
    # NumPy's matmul of bfloat16 gives float32: the bias was added to that, rounding once,
    # where MatMul then Add (the upgraded model) round twice; check failed exact upgrades.
    rng = np.random.default_rng(5)
    bf16 = ml_dtypes.bfloat16
    inputs = nbits_inputs(rng, 64, 8, 4, 32, bf16, "packed")
    bias = (rng.random(8) * 3).astype(bf16)
    model = nbits_model(64, 8, 4, 32, inputs, dtype=bf16, m=16, bias=bias)
    a = rng.standard_normal((16, 64)).astype(bf16)
    (y,) = dqtool.reference_evaluator(model).run(None, {"A": a})
    w = dqtool.dequantize_matmul_nbits(inputs["B"], inputs["scales"], inputs["zero_points"],
                                       K=64, N=8, bits=4, block_size=32)
    product = np.matmul(a, w.astype(bf16)).astype(bf16)
    assert y.dtype == bf16
    assert np.array_equal(bits_of(y), bits_of((product + bias).astype(bf16)))
    once = (np.matmul(a, w.astype(bf16)) + bias.astype(np.float32)).astype(bf16)
    assert not np.array_equal(bits_of(once), bits_of(y))  # the case tells them apart
    src, up = tmp_path / "m.onnx", tmp_path / "up.onnx"
    onnx.save(model, src)
    dqtool.upgrade(str(src), 21, str(up))
    (y_up,) = dqtool.reference_evaluator(onnx.load(up)).run(None, {"A": a})
    assert np.array_equal(bits_of(y_up), bits_of(y))


@pytest.mark.parametrize("dtype", [np.uint8, np.float16, ml_dtypes.int4, ml_dtypes.uint4,
                                   ml_dtypes.uint2, ml_dtypes.int2])
def test_external_tensors_read_without_a_map(tmp_path, dtype):
    import onnx_ir as ir

    from dqtool.storage import tensor_reads

    rng = np.random.default_rng(0)
    lo, hi = {np.dtype(ml_dtypes.int4): (-8, 8), np.dtype(ml_dtypes.uint4): (0, 16),
              np.dtype(ml_dtypes.uint2): (0, 4), np.dtype(ml_dtypes.int2): (-2, 2)}.get(
        np.dtype(dtype), (0, 100))
    arr = rng.integers(lo, hi, size=(5, 7)).astype(dtype)
    m = ir.Model(ir.Graph([], [], nodes=[], name="g"), ir_version=11)
    v = ir.Value(name="t", const_value=ir.tensor(arr, name="t"))
    m.graph.register_initializer(v)
    ir.save(m, tmp_path / "m.onnx", external_data="m.onnx.data", size_threshold_bytes=0)
    t = ir.load(tmp_path / "m.onnx").graph.initializers["t"].const_value
    assert isinstance(t, ir.ExternalTensor)
    got = tensor_reads.tensor_array(t)
    assert got.dtype == np.dtype(dtype) and np.array_equal(got.astype(np.float32),
                                                          arr.astype(np.float32))


@pytest.mark.parametrize("mapped", [False, True])
@pytest.mark.parametrize("offset", [0, 3, 4096 + 8])
def test_external_bytes_are_read_or_mapped_at_their_offset(tmp_path, monkeypatch, mapped,
                                                           offset):
    # Small tensors are read (pread), large ones mapped copy-on-write: the same values at
    # any offset, a writable array, and the file never changes.
    import mmap

    from dqtool.storage import tensor_reads

    monkeypatch.setattr(tensor_reads, "MAP_BYTES", 64 if mapped else 1 << 30)
    data = np.random.default_rng(offset).integers(0, 256, 9000, np.uint8).tobytes()
    path = tmp_path / "d.bin"
    path.write_bytes(data)
    got = tensor_reads.from_file(path, np.dtype(np.float16), 1000, offset)
    assert got.dtype == np.float16 and got.shape == (1000,)
    assert got.tobytes() == data[offset:offset + 2000]
    assert isinstance(getattr(got.base, "obj", None), mmap.mmap) == mapped
    got[:] = 0  # writable, the file as it was
    assert path.read_bytes() == data


def test_external_bytes_past_the_end_of_the_file_are_cut_short(tmp_path):
    # As np.fromfile: a file that ends early gives the whole items it has (never a map).
    from dqtool.storage import tensor_reads

    path = tmp_path / "d.bin"
    path.write_bytes(bytes(range(11)))
    got = tensor_reads.from_file(path, np.dtype(np.uint16), 100, 4)
    assert got.tolist() == np.frombuffer(bytes(range(4, 10)), np.uint16).tolist()
    assert tensor_reads.from_file(path, np.dtype(np.uint8), 5, 50).size == 0
