"""Fused weights of an inline model read from the model file as external data is: each on its
own map, released with what was read. Read through the tensor itself, the whole file was
mapped and every weight kept (4-bit codes unpacked to a byte each) while the model lived:
a 1 GB inline model's ``pack`` peaked at 2.7 GB of RSS, ``upgrade`` and ``fold`` at 1.4 GB."""

from __future__ import annotations

import tracemalloc

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
import pytest
from helpers.fused import gbq_model, nbits_inputs, nbits_model
from onnx import helper

import dqtool
from dqtool import graph, storage
from dqtool.storage import inline_read, inline_write, tensor_reads

LAYERS, K, N, BLOCK = 6, 512, 1024, 32


def _model(path) -> None:
    """A GatherBlockQuantized embedding (int4 table), then LAYERS MatMulNBits (4-bit, zero
    points packed) in a chain, K and N alternating: saved inline."""
    rng = np.random.default_rng(7)
    table = rng.integers(-8, 8, (64, K), dtype=np.int8).astype(ml_dtypes.int4)
    embed = gbq_model(table, (rng.random((64, K // BLOCK)) * 0.1 + 0.01).astype(np.float32),
                      None, block=BLOCK).graph
    nodes, inits, x = list(embed.node), list(embed.initializer), embed.output[0].name
    k, n = K, N
    for i in range(LAYERS):
        layer = nbits_model(k, n, 4, BLOCK, nbits_inputs(rng, k, n, 4, BLOCK)).graph
        for t in layer.initializer:
            t.name = f"l{i}.{t.name}"
        inits.extend(layer.initializer)
        (node,) = layer.node
        node.input[:] = [x, *(f"l{i}.{name}" for name in node.input[1:])]
        node.output[:] = [x := f"l{i}.Y"]
        node.name = f"l{i}.mm"
        nodes.append(node)
        k, n = n, k
    graph = helper.make_graph(
        nodes, "g", list(embed.input),
        [helper.make_tensor_value_info(x, onnx.TensorProto.FLOAT, [5, k])], inits)
    onnx.save(helper.make_model(graph, ir_version=10, opset_imports=[
        helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]), path)


@pytest.fixture
def lean(monkeypatch):
    """Every tensor of at least 4 KiB left in the model file, however small the file, and
    every save streamed (as a large model's are)."""
    monkeypatch.setattr(inline_write, "STREAM_MIN_BYTES", 1)
    monkeypatch.setattr(inline_read, "MIN_FILE_BYTES", 0)
    monkeypatch.setattr(inline_read, "MIN_TENSOR_BYTES", 4096)


def test_reading_a_weight_left_in_the_file_keeps_nothing(tmp_path, lean):
    _model(tmp_path / "m.onnx")
    model = storage.load(tmp_path / "m.onnx")
    mapped = [v.const_value for v in model.graph.initializers.values()
              if isinstance(v.const_value, inline_read.MappedTensor)]
    assert len(mapped) >= LAYERS + 1  # the codes and scales of every weight, the table
    proto = {t.name: t for t in onnx.load(str(tmp_path / "m.onnx")).graph.initializer}
    for t in mapped:
        expected = onnx.numpy_helper.to_array(proto[t.name])
        assert tensor_reads.raw_bytes(t).tobytes() == proto[t.name].raw_data
        got = graph.tensor_values(t)
        if t.dtype == ir.DataType.INT4:
            expected = expected.astype(np.int8)
        np.testing.assert_array_equal(got, expected)
        flat = tensor_reads.same_bytes(t, ir.DataType.UINT8, (len(proto[t.name].raw_data),))
        assert isinstance(flat, inline_read.MappedTensor)  # saved inline, from the file
        assert flat.tobytes() == proto[t.name].raw_data
        # Nothing was loaded into the tensor: no map of the whole file, no values kept.
        assert t._file._array is None  # onnx_ir caches what it loaded there


def _step(step: str, model: ir.Model | str, out) -> None:
    if step == "upgrade":
        dqtool.upgrade(model, 21, str(out))
    elif step == "pack":
        dqtool.pack(model, str(out))
    else:
        dqtool.fold(model, str(out), dtype="float16")


@pytest.mark.parametrize("step", ["upgrade", "pack", "fold"])
def test_a_step_on_an_inline_model_leaves_its_weights_in_the_file(tmp_path, lean, step):
    src = tmp_path / "m.onnx"
    _model(src)
    if step == "pack":
        dqtool.upgrade(str(src), 21, str(tmp_path / "up.onnx"))
        src = tmp_path / "up.onnx"
    _step(step, str(src), tmp_path / "warm.onnx")  # imports and caches, not measured
    loaded = storage.load(src)
    mapped = [v.const_value for v in loaded.graph.initializers.values()
              if isinstance(v.const_value, inline_read.MappedTensor)]
    assert len(mapped) >= LAYERS
    tracemalloc.start()
    try:
        _step(step, loaded, tmp_path / "out.onnx")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # No code tensor was loaded whole (a fold reads its float scales whole, as any fold).
    codes = [t for t in mapped if t.dtype in (ir.DataType.UINT8, ir.DataType.INT4,
                                              ir.DataType.UINT4)]
    assert len(codes) >= LAYERS
    assert all(t._file._array is None for t in codes)
    warm, out = (onnx.load(str(tmp_path / f)) for f in ("warm.onnx", "out.onnx"))
    assert [(t.name, t.raw_data) for t in out.graph.initializer] == \
        [(t.name, t.raw_data) for t in warm.graph.initializer]
    # Python's allocations (NumPy's are traced): a few weights at once, not all of them
    # (pack held every one, unpacked: two bytes a packed byte).
    if step == "pack":
        assert peak < 4 * (K * N // 2), peak


def test_check_compares_weights_without_keeping_them(tmp_path, lean):
    """``check --against``'s weight comparison reads both models' weights as the steps do
    (a 1 GB model's check grew by 2 GB, every upgraded weight kept unpacked)."""
    from dqtool.families.fused import weights

    _model(tmp_path / "m.onnx")
    dqtool.upgrade(str(tmp_path / "m.onnx"), 21, str(tmp_path / "up.onnx"))
    original, upgraded = storage.load(tmp_path / "m.onnx"), storage.load(tmp_path / "up.onnx")
    found = weights.compare_weights(upgraded, original)
    assert [c.status for c in found] == ["bit-identical"] * (LAYERS + 1)
    for model in (original, upgraded):
        codes = [v.const_value for v in model.graph.initializers.values()
                 if isinstance(v.const_value, inline_read.MappedTensor)
                 and v.const_value.dtype in (ir.DataType.UINT8, ir.DataType.INT4,
                                             ir.DataType.UINT4)]
        assert len(codes) >= LAYERS
        assert all(t._file._array is None for t in codes)


def test_check_loads_no_weight_whole(tmp_path, lean, monkeypatch):
    """``check MODEL`` (every fused node on onnxruntime against the kernel) reads the codes
    of every weight on their own maps: onnx_ir loads none of them (it would map the whole
    file and keep what it read)."""
    from dqtool.checking import models

    monkeypatch.setattr(models, "IN_FILE_BYTES", 1024)  # the weights stay in the file
    _model(tmp_path / "m.onnx")
    loads: list[ir.DataType] = []
    load = ir.ExternalTensor._load

    def spy(self):
        loads.append(self.dtype)
        return load(self)

    monkeypatch.setattr(ir.ExternalTensor, "_load", spy)
    report = dqtool.check(str(tmp_path / "m.onnx"))
    assert report.passed
    assert not [t for t in loads if t in (ir.DataType.UINT8, ir.DataType.INT4,
                                          ir.DataType.UINT4)], loads


def test_bounds_read_weight_columns_without_keeping_them(tmp_path, lean):
    """``check --against`` bounds onnxruntime's differences from some columns of each
    weight: read on their own maps too, the same values as the whole weight's."""
    from dqtool.families.fused import bound, kernel

    _model(tmp_path / "m.onnx")
    model = storage.load(tmp_path / "m.onnx")
    cols = np.array([0, 3, 17])
    nodes = [n for n in model.graph if n.op_type == "MatMulNBits"]
    for node in nodes:
        a = {k: v.as_int() for k, v in node.attributes.items()}
        whole = kernel.dequantize_matmul_nbits(
            *(graph.constant_array(v) for v in node.inputs[1:3]),
            graph.constant_array(node.inputs[3]), K=a["K"], N=a["N"], bits=4,
            block_size=a["block_size"])
        np.testing.assert_array_equal(bound._weight_columns(node, cols), whole[:, cols])
    codes = [n.inputs[1].const_value for n in nodes]
    assert all(isinstance(t, inline_read.MappedTensor) for t in codes)
    assert all(t._file._array is None for t in codes)
