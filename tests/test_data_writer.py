"""The data-file writer (``data_writer._Writer``): tensors written on several threads,
each at its own offset, give the same file as one thread; streamed tensors are written
band by band; an error in any tensor stops the save and nothing is left behind."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from dqtool import storage
from dqtool.families.fused.surgery import Streamed


def _model(tensors: list[ir.TensorProtocol]) -> ir.Model:
    graph = ir.Graph([], [], nodes=[], name="g", opset_imports={"": 21})
    for t in tensors:
        graph.register_initializer(ir.Value(name=t.name, const_value=t, type=ir.TensorType(
            t.dtype), shape=ir.Shape(t.shape)))
    return ir.Model(graph, ir_version=10)


def _streamed(name: str, data: np.ndarray, band: int = 1000, fail: bool = False,
              short: bool = False) -> Streamed:
    def write(file) -> int:
        raw = data.tobytes()
        for start in range(0, len(raw), band):
            if fail and start >= len(raw) // 2:
                raise OSError(f"{name}: the disk is full (test)")
            file.write(raw[start:start + band])
        return len(raw) - (1 if short else 0)

    return Streamed(lambda: ir.Tensor(data, name=name), write, ir.DataType.UINT8,
                    ir.Shape(data.shape), name)


def _tensors(seed: int = 0) -> list[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [(f"w{i}", rng.integers(0, 256, size, dtype=np.uint8))
            for i, size in enumerate([5000, 300, 70000, 1, 4096, 12345, 999, 65])]


@pytest.mark.parametrize("threads", ["1", "2", "5"])
def test_streamed_and_plain_tensors_on_any_number_of_threads(tmp_path, monkeypatch,
                                                             threads: str) -> None:
    monkeypatch.setenv("DQTOOL_THREADS", threads)
    tensors = [_streamed(n, a) if i % 2 else ir.Tensor(a, name=n)
               for i, (n, a) in enumerate(_tensors())]
    storage.save(_model(tensors), tmp_path / "m.onnx", external=True)
    back = storage.load(tmp_path / "m.onnx")
    for name, a in _tensors():
        assert np.array_equal(back.graph.initializers[name].const_value.numpy(), a), name
    assert (tmp_path / "m.onnx.data").exists()


def test_the_same_file_on_one_thread_and_on_two(tmp_path, monkeypatch) -> None:
    files = []
    for threads in ("1", "2"):
        monkeypatch.setenv("DQTOOL_THREADS", threads)
        out = tmp_path / threads / "m.onnx"
        out.parent.mkdir()
        storage.save(_model([_streamed(n, a) for n, a in _tensors(1)]), out, external=True)
        files.append((out.read_bytes(), out.with_name("m.onnx.data").read_bytes()))
    assert files[0] == files[1]


@pytest.mark.parametrize("threads", ["1", "2"])
def test_an_error_in_one_tensor_stops_the_save(tmp_path, monkeypatch, threads: str) -> None:
    monkeypatch.setenv("DQTOOL_THREADS", threads)
    tensors = [_streamed(n, a, fail=(n == "w2")) for n, a in _tensors()]
    with pytest.raises(OSError, match="the disk is full"):
        storage.save(_model(tensors), tmp_path / "m.onnx", external=True)
    assert list(tmp_path.iterdir()) == []  # no model, no data file, no temporary folder


def test_a_streamed_tensor_that_writes_too_little_is_an_error(tmp_path) -> None:
    tensors = [_streamed(n, a, short=(n == "w4")) for n, a in _tensors()]
    with pytest.raises(OSError, match="w4: wrote 4095 bytes, expected 4096"):
        storage.save(_model(tensors), tmp_path / "m.onnx", external=True)
    assert list(tmp_path.iterdir()) == []


def test_streamed_tensors_saved_inline(tmp_path) -> None:
    tensors = [_streamed(n, a) for n, a in _tensors()]
    storage.save(_model(tensors), tmp_path / "m.onnx", external=False)
    assert not (tmp_path / "m.onnx.data").exists()
    back = storage.load(tmp_path / "m.onnx")
    for name, a in _tensors():
        assert np.array_equal(back.graph.initializers[name].const_value.numpy(), a)


def test_a_full_disk_is_known_before_any_byte_is_written(tmp_path, monkeypatch) -> None:
    # The data file's bytes are reserved first (posix_fallocate): a disk that cannot hold
    # them fails the save at once, in one line, and leaves nothing behind.
    import errno

    from dqtool.storage import data_file

    calls = []

    def no_space(fd: int, offset: int, length: int) -> int:
        calls.append(offset + length)
        return errno.ENOSPC

    monkeypatch.setattr(data_file, "reserve", no_space)
    tensors = [_streamed(n, a) for n, a in _tensors()]
    with pytest.raises(OSError, match=r"No space left on device: .*m\.onnx\.data would "
                                      r"take \d+ bytes") as raised:
        storage.save(_model(tensors), tmp_path / "m.onnx", external=True)
    assert raised.value.errno == errno.ENOSPC
    assert calls and calls[0] >= sum(a.nbytes for _, a in _tensors())
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("answer", ["ok", "unsupported"])
def test_a_reservation_changes_no_byte(tmp_path, monkeypatch, answer: str) -> None:
    # Reserved or not (a file system without fallocate), the same files.
    import errno

    from dqtool.storage import data_file

    if answer == "unsupported":
        monkeypatch.setattr(data_file, "reserve", lambda fd, offset, length: errno.EOPNOTSUPP)
    storage.save(_model([_streamed(n, a) for n, a in _tensors(2)]), tmp_path / "m.onnx",
                 external=True)
    back = storage.load(tmp_path / "m.onnx")
    for name, a in _tensors(2):
        assert np.array_equal(back.graph.initializers[name].const_value.numpy(), a)


def _early(tmp_path, out_name: str = "m.onnx"):
    """An ``EarlyWriter`` for a save to ``tmp_path / out_name`` (as ``storage.start_early_writer``
    makes it)."""
    return storage.start_early_writer(_model([]), tmp_path / out_name)


def _submitted(early_writer, tensor):
    """``tensor``, handed to the early writer as a conversion's builder hands it."""
    early_writer.submit(tensor)
    return tensor


def test_tensors_written_early_come_first_and_read_back(tmp_path) -> None:
    # Streamed tensors handed to a save that writes early go to the data file at once, in
    # the order they are made; the save puts the others after them.
    early_writer = _early(tmp_path)
    data = _tensors(3)
    early = [_submitted(early_writer, _streamed(n, a, band=777)) for n, a in data[:4]]
    late = [ir.Tensor(a, name=n) for n, a in data[4:]]
    assert next(iter(early_writer.placed.values()))[0] == 0 and early_writer.end > 0
    model = _model([*late, *early])  # the model's own order differs
    storage.save(model, tmp_path / "m.onnx", external=True, early=early_writer)
    back = storage.load(tmp_path / "m.onnx")
    for name, a in data:
        assert np.array_equal(back.graph.initializers[name].const_value.numpy(), a), name
    offsets = {v.name: v.const_value.offset for v in back.graph.initializers.values()
               if isinstance(v.const_value, ir.ExternalTensor)}
    assert max(offsets[n] for n, a in data[:4] if a.nbytes > 256) \
        < min(offsets[n] for n, a in data[4:] if a.nbytes > 256)
    # the bytes reserved ahead of the early writes are cut back: the file ends with its
    # last tensor
    ends = [v.const_value.offset + v.const_value.nbytes for v in back.graph.initializers.values()
            if isinstance(v.const_value, ir.ExternalTensor)]
    assert (tmp_path / "m.onnx.data").stat().st_size == max(ends)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "m.onnx.data"]


def test_a_tensor_written_early_but_not_saved_starts_the_file_over(tmp_path) -> None:
    # A tensor written early that the saved model does not hold would leave dead bytes:
    # the save writes the file again, compactly (the same file as with no early writes).
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    early_writer = _early(tmp_path / "a")
    data = _tensors(4)
    kept = [_submitted(early_writer, _streamed(n, a)) for n, a in data]
    _submitted(early_writer, _streamed("dropped", np.arange(9000, dtype=np.uint8) % 251))
    storage.save(_model(kept), tmp_path / "a" / "m.onnx", external=True, early=early_writer)
    storage.save(_model([_streamed(n, a) for n, a in data]), tmp_path / "b" / "m.onnx",
                 external=True)
    assert (tmp_path / "a" / "m.onnx.data").read_bytes() == \
        (tmp_path / "b" / "m.onnx.data").read_bytes()


def test_an_error_while_writing_early_stops_the_save(tmp_path) -> None:
    early_writer = _early(tmp_path)
    tensors = [_submitted(early_writer, _streamed(n, a, fail=(n == "w2"))) for n, a in _tensors()]
    with pytest.raises(OSError, match="the disk is full"):
        storage.save(_model(tensors), tmp_path / "m.onnx", external=True, early=early_writer)
    assert list(tmp_path.iterdir()) == []  # no model, no data file, no temporary folder


def test_writing_early_discarded_leaves_nothing(tmp_path) -> None:
    early_writer = _early(tmp_path)
    for n, a in _tensors():
        _submitted(early_writer, _streamed(n, a))
    storage.discard_early(early_writer)
    assert list(tmp_path.iterdir()) == []


def test_nothing_is_written_early_but_what_the_conversion_hands_over(tmp_path) -> None:
    early_writer = _early(tmp_path)
    _streamed("w", np.zeros(5000, np.uint8))  # made, never submitted: a streamed tensor
    assert early_writer.placed == {}  # does not hand itself to any writer
    _submitted(early_writer, _streamed("v", np.zeros(5000, np.uint8)))
    assert len(early_writer.placed) == 1
    storage.discard_early(early_writer)


@pytest.mark.parametrize("external", [True, False])
def test_while_writing_runs_before_anything_is_in_place(tmp_path, external: bool) -> None:
    # A command prints its summary while the data is written: the callback runs once the
    # model file is written, while a writer is still at work (external data: the weight
    # below waits for the callback), and before the output is in place.
    import threading

    told = threading.Event()
    data = np.arange(70000, dtype=np.uint8) % 253

    def write(file) -> int:
        if external and not told.wait(30):
            raise OSError("the callback did not run while the data was written")
        file.write(data.tobytes())
        return data.nbytes

    weight = Streamed(lambda: ir.Tensor(data, name="w"), write, ir.DataType.UINT8,
                      ir.Shape(data.shape), "w")
    out = tmp_path / "m.onnx"

    def while_writing() -> None:
        assert not out.exists()
        told.set()

    storage.save(_model([weight]), out, external=external, while_writing=while_writing)
    assert told.is_set()
    back = storage.load(out)
    assert np.array_equal(back.graph.initializers["w"].const_value.numpy(), data)


@pytest.mark.parametrize("fail", [False, True])
def test_writers_leave_the_interpreters_settings_alone(tmp_path, fail: bool) -> None:
    # No process-wide setting changes while writers run (two at once here: a save while
    # another writes early), nor after the save, failed or not: the switch interval the
    # caller set stays.
    import sys

    seen: list[float] = []
    data = np.arange(5000, dtype=np.uint8)

    def write(file) -> int:
        seen.append(sys.getswitchinterval())
        if fail:
            raise OSError("the disk is full (test)")
        file.write(data.tobytes())
        return data.nbytes

    before = sys.getswitchinterval()
    sys.setswitchinterval(0.004)
    try:
        (tmp_path / "early").mkdir()
        early_writer = _early(tmp_path / "early")
        weight = Streamed(lambda: ir.Tensor(data, name="w"), write, ir.DataType.UINT8,
                          ir.Shape(data.shape), "w")
        if fail:
            with pytest.raises(OSError, match="the disk is full"):
                storage.save(_model([weight]), tmp_path / "m.onnx", external=True)
        else:
            storage.save(_model([weight]), tmp_path / "m.onnx", external=True)
        storage.discard_early(early_writer)
        assert seen == [0.004] and sys.getswitchinterval() == 0.004
    finally:
        sys.setswitchinterval(before)


def test_reserve_allocates_the_bytes_or_says_why(tmp_path) -> None:
    # posix_fallocate: the size is there, read as zeros; a descriptor open for reading
    # only is EBADF, nothing else
    import errno

    from dqtool.storage import data_file

    path = tmp_path / "reserved.bin"
    with open(path, "wb") as f:
        err = data_file.reserve(f.fileno(), 0, 3 << 20)
    if err == 0:
        assert path.stat().st_size == 3 << 20 and path.read_bytes() == bytes(3 << 20)
    else:  # a system without the call
        assert err == errno.EOPNOTSUPP and path.stat().st_size == 0
    with open(path, "rb") as f:
        assert data_file.reserve(f.fileno(), 0, 1 << 20) in (errno.EBADF, errno.EOPNOTSUPP)
