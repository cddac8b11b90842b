"""Reading 2/4-bit codes from a file (``dqtool.storage.tensor_reads``): chunked unpacking,
signed codes, the array's bytes as onnx_ir's own, and widening to a byte type without a
second copy."""

from __future__ import annotations

import tracemalloc

import ml_dtypes
import numpy as np
import onnx_ir as ir
import pytest

from dqtool.storage import tensor_reads

_SUB = {"int2": (ir.DataType.INT2, ml_dtypes.int2, 2, True),
        "uint2": (ir.DataType.UINT2, ml_dtypes.uint2, 2, False),
        "int4": (ir.DataType.INT4, ml_dtypes.int4, 4, True),
        "uint4": (ir.DataType.UINT4, ml_dtypes.uint4, 4, False)}


def _external(tmp_path, name: str, codes: np.ndarray) -> ir.ExternalTensor:
    """``codes`` (int8 values) saved as an external tensor of type ``name``."""
    dtype, np_type = _SUB[name][:2]
    t = ir.Tensor(codes.astype(np_type), dtype=dtype, name="w")
    raw = t.tobytes()
    (tmp_path / "w.bin").write_bytes(b"\x07" * 3 + raw + b"\x09")  # not at offset 0
    return ir.ExternalTensor("w.bin", 3, len(raw), dtype, shape=ir.Shape(codes.shape),
                             name="w", base_dir=tmp_path)


CHUNK = tensor_reads.UNPACK_CHUNK


@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("n", [1, 7, CHUNK - 1, CHUNK * 2 + 5])
def test_unpack_across_chunks_gives_every_code_signed_or_not(monkeypatch, bits, n):
    p = np.random.default_rng(n + bits).integers(0, 256, n, dtype=np.uint8)
    per, mask = 8 // bits, (1 << bits) - 1
    want = np.stack([(p >> (bits * j)) & mask for j in range(per)], axis=-1).reshape(-1)
    got = tensor_reads.unpack(p, bits)
    assert got.dtype == np.uint8 and np.array_equal(got, want)
    signed = tensor_reads.unpack(p, bits, signed=True)
    assert signed.dtype == np.int8
    assert np.array_equal(signed, np.where(want >= 1 << (bits - 1), want.astype(np.int16)
                                           - (1 << bits), want))


def test_unpack_of_a_strided_array_reads_its_elements(monkeypatch):
    monkeypatch.setattr(tensor_reads, "UNPACK_CHUNK", 3)
    p = np.arange(40, dtype=np.uint8).reshape(5, 8)[:, ::2]
    assert np.array_equal(tensor_reads.unpack(p, 4),
                          tensor_reads.unpack(np.ascontiguousarray(p), 4))
    assert tensor_reads.unpack(p, 4).shape == (5, 8)


@pytest.mark.parametrize("name", sorted(_SUB))
@pytest.mark.parametrize("shape", [(5,), (3, 7), (64, 33)])
def test_codes_read_from_a_file_are_onnx_irs_array_byte_for_byte(tmp_path, name, shape):
    """The ml_dtypes array's bytes too, not only its values: a code is kept in the low bits
    of its byte, and an array whose bytes differ packs differently in some paths."""
    lo, hi = (-(1 << (_SUB[name][2] - 1)), 1 << (_SUB[name][2] - 1)) if _SUB[name][3] \
        else (0, 1 << _SUB[name][2])
    codes = np.random.default_rng(len(shape)).integers(lo, hi, shape, dtype=np.int8)
    t = _external(tmp_path, name, codes)
    got = tensor_reads.tensor_array(t)
    want = t.numpy()
    assert got.dtype == want.dtype and got.shape == shape
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8))
    assert np.array_equal(got.astype(np.int8), codes)
    # Widened to a byte type straight from the file: the same values
    wide = tensor_reads.int_array(t, np.int8 if _SUB[name][3] else np.uint8)
    assert wide.shape == shape and np.array_equal(wide.astype(np.int16), codes)
    # To a type of another kind or width it is the plain cast
    assert np.array_equal(tensor_reads.int_array(t, np.int32), codes.astype(np.int32))


def test_a_wide_int4_weight_is_read_with_one_array_of_its_size(tmp_path):
    """Before: the unpack's temporaries, its shifts, the cast to ml_dtypes' int4 and the
    widening to int8 each held a copy of the whole weight (~4x its int8 size at once)."""
    codes = np.random.default_rng(0).integers(-8, 8, (1024, 2048), dtype=np.int8)
    t = _external(tmp_path, "int4", codes)
    tracemalloc.start()
    try:
        wide = tensor_reads.int_array(t, np.int8)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert np.array_equal(wide, codes)
    assert peak < codes.nbytes * 1.2, (peak, codes.nbytes)
    tracemalloc.start()
    try:
        arr = tensor_reads.tensor_array(t)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert np.array_equal(arr.astype(np.int8), codes)
    assert peak < codes.nbytes * 1.2, (peak, codes.nbytes)


@pytest.mark.parametrize("name", sorted(_SUB))
@pytest.mark.parametrize("band", [4, 12, 1 << 20])
def test_widened_codes_write_band_by_band_the_codes_of_the_whole(tmp_path, monkeypatch,
                                                                  name, band):
    monkeypatch.setattr(tensor_reads.WidenedCodes, "BAND", band)
    bits, signed = _SUB[name][2], _SUB[name][3]
    lo, hi = (-(1 << (bits - 1)), 1 << (bits - 1)) if signed else (0, 1 << bits)
    codes = np.random.default_rng(band).integers(lo, hi, (7, 9), dtype=np.int8)
    t = _external(tmp_path, name, codes)
    target = np.int8 if signed else np.uint8
    assert tensor_reads.widened(t, np.int16) is None and tensor_reads.widened(
        t, np.uint8 if signed else np.int8) is None  # not a byte of the codes' own sign
    wide = tensor_reads.widened(t, target)
    assert wide.dtype == (ir.DataType.INT8 if signed else ir.DataType.UINT8)
    assert np.array_equal(wide.numpy(), codes.astype(target))
    with open(tmp_path / "out.bin", "wb") as f:
        wide.tofile(f)
    assert (tmp_path / "out.bin").read_bytes() == codes.astype(target).tobytes()
    flat = tensor_reads.same_bytes(wide, wide.dtype, (63,))
    assert isinstance(flat, tensor_reads.WidenedCodes)
    assert np.array_equal(flat.numpy(), codes.astype(target).reshape(63))


def test_a_downgrade_widens_an_int4_weight_without_holding_it(tmp_path, monkeypatch):
    """int4 → int8 below opset 21: the int8 codes are written a band at a time from the
    file (a weight's 4 MB, then 2-3x that in temporaries, were held before)."""
    import dqtool
    from dqtool.checking import check

    monkeypatch.setattr(tensor_reads.WidenedCodes, "BAND", 1 << 16)
    rng = np.random.default_rng(5)
    q = rng.integers(-8, 8, (2048, 2048)).astype(ml_dtypes.int4)
    x = ir.Value(name="X", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([1, 2048]))
    qv = ir.Value(name="q", const_value=ir.tensor(q))
    sv = ir.Value(name="s", const_value=ir.tensor((rng.random(2048) + 0.01).astype(
        np.float32)))
    dq = ir.node("DequantizeLinear", [qv, sv], {"axis": 1}, name="dq")
    mm = ir.node("MatMul", [x, dq.outputs[0]], name="mm")
    y = mm.outputs[0]
    y.name, y.dtype, y.shape = "Y", ir.DataType.FLOAT, ir.Shape([1, 2048])
    g = ir.Graph([x], [y], nodes=[dq, mm], initializers=[qv, sv], opset_imports={"": 21},
                 name="g")
    src = tmp_path / "m.onnx"
    ir.save(ir.Model(g, ir_version=10), src, external_data="m.onnx.data",
            size_threshold_bytes=1024)
    tracemalloc.start()
    try:
        dqtool.downgrade(str(src), 19, str(tmp_path / "out.onnx"))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2048 * 2048 // 2, peak  # less than the int4 codes' own bytes
    import onnx

    out = {t.name: t for t in onnx.load(str(tmp_path / "out.onnx")).graph.initializer}
    (wq,) = [t for t in out.values() if t.data_type == onnx.TensorProto.INT8]
    assert wq.raw_data == q.astype(np.int8).tobytes()
    assert check(str(tmp_path / "out.onnx"), against=str(src)).passed


def test_codes_widened_from_an_inline_models_file_keep_it_open(tmp_path, monkeypatch):
    """A large inline model's tensors name their file by a descriptor (/proc/self/fd/N)
    its source holds open. The widened codes keep that source: once the narrow tensor was
    replaced, the descriptor was closed and the save read whatever file took the number
    (a downgrade failed with 'Is a directory', or wrote wrong codes; found by a review)."""
    import gc
    import os

    import onnx
    from onnx import helper, numpy_helper

    import dqtool
    from dqtool.storage import inline_read

    monkeypatch.setattr(inline_read, "MIN_FILE_BYTES", 0)
    monkeypatch.setattr(inline_read, "MIN_TENSOR_BYTES", 256)
    x = np.random.default_rng(0).integers(-8, 8, (4, 4096)).astype(ml_dtypes.int4)
    g = helper.make_graph(
        [helper.make_node("DequantizeLinear", ["x", "s"], ["y"], axis=0)], "g", [],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4, 4096])],
        [numpy_helper.from_array(x, "x"),
         numpy_helper.from_array(np.array([0.5, 0.25, 1, 2], np.float32), "s")])
    src = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)],
                                ir_version=10), src)
    report = dqtool.downgrade(str(src), 19)
    (wide,) = [v.const_value for v in report.model.graph.initializers.values()
               if isinstance(v.const_value, tensor_reads.WidenedCodes)]
    gc.collect()
    assert str(wide.path).startswith("/proc/self/fd/") and os.path.exists(wide.path)
    with open(tmp_path / "other.bin", "wb") as other:  # would take a freed descriptor
        other.write(b"\xff" * 65536)
        other.flush()
        assert np.array_equal(wide.numpy(), x.astype(np.int8))
