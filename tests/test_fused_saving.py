"""Saving what the fused conversions make: weights written as they are made
(``data_writer.EarlyWriter``) read their inputs as the input had them, whatever the save has
repointed; a disk that fills is one error line; scales of every float type are written.
(Found by an independent review: each test failed before its fix.)"""

from __future__ import annotations

import errno
import threading
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

import dqtool
from dqtool import native, storage
from dqtool.cli import cli


def _save_external(m: onnx.ModelProto, path: Path) -> Path:
    onnx.save(m, str(path), save_as_external_data=True, location=path.name + ".data",
              size_threshold=0)
    return path


def _model(nodes, inputs, outputs, inits, opsets=(("", 21), ("com.microsoft", 1))):
    g = helper.make_graph(nodes, "g", inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    m.ir_version = 10
    return m


def _tensors(path: Path) -> dict[str, bytes]:
    return {t.name: numpy_helper.to_array(t).tobytes()
            for t in onnx.load(str(path)).graph.initializer}


def _tied_lm_head(tmp_path: Path) -> Path:
    """MatMulNBits(B, S) and GatherBlockQuantized(Reshape(B), ids, S): the table is
    computed, so B and S stay in the upgraded model beside the new weight made from them."""
    k, n, block = 512, 2048, 32
    kb, blob = k // block, block // 2
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(rng.integers(0, 256, (n, kb, blob), dtype=np.uint8), "B"),
             numpy_helper.from_array((rng.random((n, kb)) + .5).astype(np.float32), "S"),
             numpy_helper.from_array(np.array([n, kb * blob], np.int64), "shape")]
    nodes = [helper.make_node("Reshape", ["B", "shape"], ["table"]),
             helper.make_node("GatherBlockQuantized", ["table", "ids", "S"], ["emb"],
                              domain="com.microsoft", block_size=block, gather_axis=0,
                              quantize_axis=1, bits=4),
             helper.make_node("MatMulNBits", ["emb", "B", "S"], ["logits"],
                              domain="com.microsoft", K=k, N=n, bits=4, block_size=block)]
    return _save_external(_model(
        nodes, [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 3])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, None)], inits),
        tmp_path / "src.onnx")


def test_weights_written_late_read_the_inputs_the_save_kept(tmp_path, monkeypatch):
    # The writers held back until the save has repointed every kept initializer at the
    # output's data file (as on a large model, where they run behind the conversion): the
    # new weight and scale are still made from the input's B and S, not from bytes of the
    # output not written yet (they read as zeros once the file is reserved).
    from dqtool.families.fused.surgery import Streamed

    src = _tied_lm_head(tmp_path)
    saving = threading.Event()
    tofile = Streamed.tofile

    def late(self, file):
        assert saving.wait(30)
        return tofile(self, file)

    save = ir.save
    monkeypatch.setattr(Streamed, "tofile", late)
    monkeypatch.setattr(ir, "save", lambda *a, **k: (saving.set(), save(*a, **k))[1])
    dqtool.upgrade(src, 21, tmp_path / "up.onnx")
    monkeypatch.undo()
    want = {v.name: v.const_value.numpy().tobytes()
            for v in dqtool.upgrade(storage.load(src), 21).model.graph.initializers.values()}
    got = _tensors(tmp_path / "up.onnx")
    assert "B" in got and "S" in got  # kept, beside what was made from them
    assert [k for k in want if got[k] != want[k]] == []


def test_pack_of_a_weight_shared_with_a_node_left_as_it_is(tmp_path):
    # x feeds a MatMul alone (packed: its B is made from x) and a DequantizeLinear with two
    # uses (left as it is): x stays, and B is made from its bytes, not the output's.
    k, n, block = 1024, 512, 32
    rng = np.random.default_rng(0)
    x = rng.integers(-8, 8, (k, n)).astype(np.int8)
    inits = [helper.make_tensor("x", TensorProto.INT4, [k, n], x.ravel().tolist()),
             numpy_helper.from_array((rng.random((k // block, n)) + .5).astype(np.float32),
                                     "s")]
    nodes = [helper.make_node("DequantizeLinear", ["x", "s"], ["w1"], axis=0, block_size=block),
             helper.make_node("MatMul", ["a", "w1"], ["y1"]),
             helper.make_node("DequantizeLinear", ["x", "s"], ["w2"], axis=0, block_size=block),
             helper.make_node("MatMul", ["a", "w2"], ["y2"]),
             helper.make_node("Relu", ["w2"], ["r2"])]
    f = TensorProto.FLOAT
    src = _save_external(_model(nodes, [helper.make_tensor_value_info("a", f, [1, k])],
                                [helper.make_tensor_value_info(o, f, None)
                                 for o in ("y1", "y2", "r2")], inits, (("", 21),)),
                         tmp_path / "src.onnx")
    report = dqtool.pack(src, tmp_path / "packed.onnx")
    assert len(report.packed) == 1
    in_memory = dqtool.pack(storage.load(src)).model
    want = {v.name: v.const_value.numpy().tobytes()
            for v in in_memory.graph.initializers.values()}
    got = _tensors(tmp_path / "packed.onnx")
    assert "x" in got and [k for k in want if got[k] != want[k]] == []


def _nbits_model(tmp_path: Path, layers: list[tuple[int, int]]) -> Path:
    rng = np.random.default_rng(2)
    nodes, inits, x = [], [], "x"
    for i, (k, n) in enumerate(layers):
        kb = k // 32
        inits += [numpy_helper.from_array(rng.integers(0, 256, (n, kb, 16), dtype=np.uint8),
                                          f"B{i}"),
                  numpy_helper.from_array((rng.random((n, kb)) + .5).astype(np.float32),
                                          f"S{i}")]
        nodes.append(helper.make_node("MatMulNBits", [x, f"B{i}", f"S{i}"], [f"y{i}"],
                                      domain="com.microsoft", K=k, N=n, bits=4,
                                      block_size=32))
        x = f"y{i}"
    (tmp_path / "src").mkdir()
    return _save_external(_model(
        nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, layers[0][0]])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, None)], inits),
        tmp_path / "src" / "src.onnx")


def _disk_of(monkeypatch, capacity: int) -> None:
    """``data_file.reserve`` as on a file system with ``capacity`` bytes free."""
    def reserve(fd: int, offset: int, length: int) -> int:
        return errno.ENOSPC if offset + length > capacity else 0

    from dqtool.storage import data_file

    monkeypatch.setattr(data_file, "reserve", reserve)


def test_a_save_that_fits_is_not_failed_by_reserving_ahead(tmp_path, monkeypatch):
    # ~10 MiB of data, 40 MiB free: the writers reserve ahead of the weights as they come
    # (64 MiB) where the disk has room, never as a condition.
    src = _nbits_model(tmp_path, [(4096, 2048), (2048, 4096)])
    _disk_of(monkeypatch, 40 << 20)
    dqtool.upgrade(src, 21, tmp_path / "up.onnx")
    assert (tmp_path / "up.onnx.data").stat().st_size < 12 << 20


def test_a_full_disk_found_while_writing_early_is_one_error_line(tmp_path, monkeypatch):
    src = _nbits_model(tmp_path, [(1024, 512)])
    _disk_of(monkeypatch, 0)
    r = CliRunner().invoke(cli, ["upgrade", str(src), "--opset", "21", "-o",
                                 str(tmp_path / "up.onnx")])
    assert r.exit_code != 0 and isinstance(r.exception, SystemExit), repr(r.exception)
    lines = [line for line in r.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "No space left on device" in lines[0], r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


@pytest.mark.parametrize("path", ["c", "numpy"])
@pytest.mark.parametrize("k", [96, 128])  # 3 blocks (not a whole word of scales), 4
def test_bfloat16_scales_are_written(tmp_path, monkeypatch, path, k):
    if path == "numpy":
        monkeypatch.setattr(native, "_ext", None)
    n, block = 64, 32
    kb = k // block
    rng = np.random.default_rng(0)
    scales = (rng.random((n, kb)) + .5).astype(ml_dtypes.bfloat16)
    inits = [numpy_helper.from_array(rng.integers(0, 256, (n, kb, block // 2),
                                                  dtype=np.uint8), "B"),
             numpy_helper.from_array(scales, "S")]
    bf = TensorProto.BFLOAT16
    m = _model([helper.make_node("MatMulNBits", ["a", "B", "S"], ["y"],
                                 domain="com.microsoft", K=k, N=n, bits=4, block_size=block)],
               [helper.make_tensor_value_info("a", bf, [1, k])],
               [helper.make_tensor_value_info("y", bf, [1, n])], inits)
    onnx.save(m, str(tmp_path / "src.onnx"))
    dqtool.upgrade(tmp_path / "src.onnx", 21, tmp_path / "up.onnx", external_data=True)
    up = onnx.load(str(tmp_path / "up.onnx"))
    [scale] = [t for t in up.graph.initializer if t.name.endswith("/scale")]
    got = numpy_helper.to_array(scale)
    assert got.view(np.uint16).tolist() == scales.T.view(np.uint16).tolist()


def test_progress_counts_every_tensor_written_early_too(tmp_path, monkeypatch):
    # The progress callback is the writers' from their first tensor: each tensor of the
    # data file is reported once, the early ones included (here every early one is taken
    # by a writer before the save begins, as on a model whose conversion is slower).
    import time

    from dqtool.convert import pipeline

    src = _nbits_model(tmp_path, [(1024, 512), (512, 1024), (1024, 512)])
    early_writers = []
    from dqtool.storage import driver

    start = driver.start_early_writer
    monkeypatch.setattr(driver, "start_early_writer", lambda *a: early_writers.append(start(*a))
                        or early_writers[-1])
    run = pipeline.run

    def slow(*args, **kwargs):
        report = run(*args, **kwargs)
        writer = early_writers[-1].writer
        deadline = time.monotonic() + 30
        while writer._taken < len(writer.plan) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert writer.plan and writer._taken == len(writer.plan)
        return report

    monkeypatch.setattr(pipeline, "run", slow)
    seen: list[int] = []
    dqtool.upgrade(src, 21, tmp_path / "up.onnx",
                   progress=lambda tensor, info: seen.append(info.index))
    external = [t for t in onnx.load(str(tmp_path / "up.onnx"), load_external_data=False)
                .graph.initializer if t.data_location == TensorProto.EXTERNAL]
    assert sorted(seen) == list(range(len(external)))


def test_an_error_after_the_conversion_stops_the_early_writers(tmp_path, monkeypatch):
    # A conversion that wrote early and then fails before its save (here: at its last step,
    # the IR version) stops its writers and leaves no temporary folder or file behind.
    import sys

    from dqtool.storage import data_writer

    src = _nbits_model(tmp_path, [(1024, 512)])
    started = []
    real = data_writer.EarlyWriter.__init__

    def spy(self, *a, **k):
        started.append(self)
        real(self, *a, **k)

    monkeypatch.setattr(data_writer.EarlyWriter, "__init__", spy)

    def refuse(model):
        raise OSError(errno.EIO, "cannot decide (test)")

    monkeypatch.setattr(storage, "lowest_ir_version", refuse)
    interval = sys.getswitchinterval()
    with pytest.raises(OSError, match="cannot decide"):
        dqtool.upgrade(src, 21, tmp_path / "up.onnx")
    assert len(started) == 1  # it did write early
    assert not any(t.is_alive() for t in started[0].writer._threads)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]
    assert sys.getswitchinterval() == interval


def test_an_inline_save_streams_fused_weights_in_c(tmp_path, monkeypatch):
    # Saved inline, a repacked weight is still streamed band by band by the compiled
    # kernels (the inline save's file is wrapped in pieces, whose descriptor the bands are
    # written to), and the bytes are those of the NumPy path.
    from dqtool.families.fused import packing

    if not native.transpose_fn():
        assert __import__("os").environ.get("DQTOOL_NATIVE") == "0", native.describe()
        return
    src = _nbits_model(tmp_path, [(1024, 512)])
    calls = []
    real = packing._stream_c
    monkeypatch.setattr(packing, "_stream_c", lambda *a: calls.append(1) or real(*a))
    dqtool.upgrade(src, 21, tmp_path / "c.onnx", external_data=False)
    assert calls
    monkeypatch.setattr(native, "_ext", None)
    dqtool.upgrade(src, 21, tmp_path / "np.onnx", external_data=False)
    assert (tmp_path / "c.onnx").read_bytes() == (tmp_path / "np.onnx").read_bytes()


@pytest.mark.parametrize("as_json", [False, True])
def test_upgrade_check_of_an_external_data_model_gives_its_verdict(tmp_path, as_json):
    """--check of a model read from its files runs once the save wrote it: the fused
    weights' counterparts are read from the data file (onnx's evaluator, given a model
    in memory, cannot follow a file reference; this raised a traceback), and the verdict
    is printed after the writing (it came before it, and was lost)."""
    src = _nbits_model(tmp_path, [(64, 96), (96, 64)])
    out = tmp_path / "up.onnx"
    args = ["upgrade", str(src), "--opset", "21", "-o", str(out), "--check"]
    result = CliRunner().invoke(cli, args + (["--json"] if as_json else []))
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    if as_json:
        import json

        check = json.loads(result.output)["check"]
        assert check["ok"] is True, check
    else:
        assert "check (bit-identical outputs on random inputs):" in result.output
        assert "2 fused weight(s) (MatMulNBits / GatherBlockQuantized) bit-identical" \
            in result.output
        assert result.output.index("check (") < result.output.index("wrote ")
    assert out.exists() and (tmp_path / "up.onnx.data").exists()
