"""Writes into a file's pages go in pieces of ``write_pieces.WRITE_PIECE`` (64 KiB): the Python
writers (the data-file writer's threads, an inline save, lazily computed weights, the
fold) and a streamed repack's bands alike; the bytes are those of one write."""

from __future__ import annotations

import errno
import io
import os
import threading
from contextlib import contextmanager

import numpy as np
import onnx_ir as ir
import pytest

from dqtool import storage
from dqtool.storage import write_pieces


class _Raw(io.RawIOBase):
    """An in-memory raw file that notes the size of every write it is given."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.sizes: list[int] = []

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        b = memoryview(b).cast("B")
        self.sizes.append(len(b))
        self.data += b
        return len(b)


@pytest.mark.parametrize("size", [0, 1, 7, 64, 65, 200])
def test_write_in_pieces_splits_and_keeps_every_byte(size: int, monkeypatch) -> None:
    monkeypatch.setattr(write_pieces, "WRITE_PIECE", 64)
    data = np.arange(size, dtype=np.float32)  # a buffer of another item size
    raw = _Raw()
    assert write_pieces.write_in_pieces(raw.write, data) == data.nbytes
    assert bytes(raw.data) == data.tobytes()
    assert all(s <= 64 for s in raw.sizes)
    assert len(raw.sizes) == -(-data.nbytes // 64)


def test_a_buffered_file_in_pieces_writes_no_more_than_a_piece_at_once(monkeypatch) -> None:
    # As the inline save opens its file: buffered to one piece, wrapped in Pieces; big
    # writes go through in pieces, small ones are gathered up to one.
    monkeypatch.setattr(write_pieces, "WRITE_PIECE", 64)
    raw = _Raw()
    f = write_pieces.Pieces(io.BufferedWriter(raw, buffer_size=64))
    f.write(b"a" * 10)
    f.write(b"b" * 300)
    f.write(b"c" * 5)
    f.flush()  # the file's own, through the wrapper
    assert bytes(raw.data) == b"a" * 10 + b"b" * 300 + b"c" * 5
    assert max(raw.sizes) <= 64


@contextmanager
def _data_file(path, lock, content: bytes = b"", flags: int = os.O_RDWR):
    """The data-file writer's file (``data_file.TakingTurns``) over ``path``, which
    holds ``content`` first; its descriptor is closed after."""
    from dqtool.storage import data_file

    path.write_bytes(content)
    fd = os.open(path, flags)
    try:
        yield data_file.TakingTurns(fd, lock)
    finally:
        os.close(fd)


def _pwrites(monkeypatch) -> list[tuple[int, int]]:
    """(size, offset) of every os.pwrite from now on (still written)."""
    calls: list[tuple[int, int]] = []
    real = os.pwrite

    def noting(fd: int, data, offset: int) -> int:
        calls.append((len(memoryview(data).cast("B")), offset))
        return real(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", noting)
    return calls


def test_the_data_file_writer_writes_in_pieces_in_turns(tmp_path, monkeypatch) -> None:
    # The data-file writer's file: a write's pieces in one turn on the writers' lock
    # (the others wait once, not between pieces), at the file's position, which moves
    # past it.

    monkeypatch.setattr(write_pieces, "WRITE_PIECE", 100)
    turns = []

    class Lock:
        def __enter__(self) -> None:
            turns.append(threading.get_ident())

        def __exit__(self, *exc: object) -> None:
            pass

    path = tmp_path / "d.bin"
    calls = _pwrites(monkeypatch)
    with _data_file(path, Lock(), b"0123456789") as f:
        assert f.seek(3) == 3 and f.write(b"x" * 250) == 250 and f.tell() == 253
    assert calls == [(100, 3), (100, 103), (50, 203)] and len(turns) == 1
    assert path.read_bytes() == b"012" + b"x" * 250


def test_the_data_file_writers_file_keeps_its_own_position(tmp_path) -> None:
    # seek / tell without a syscall (each would hand the GIL on); SEEK_END asks the file;
    # a strided array is written as its bytes in order; flush has nothing to do.

    path = tmp_path / "d.bin"
    with _data_file(path, threading.RLock(), b"abcdef") as f:
        fd = f.fileno()
        assert f.tell() == 0
        assert f.seek(0, os.SEEK_END) == 6 and f.seek(-2, os.SEEK_CUR) == 4
        a = np.arange(12, dtype=np.uint8).reshape(3, 4)[:, ::2]  # not contiguous
        assert f.write(a) == 6 and f.tell() == 10
        f.flush()
        with pytest.raises(OSError):
            f.seek(-1)
        assert os.lseek(fd, 0, os.SEEK_CUR) == 0  # the descriptor's own never moved
    assert path.read_bytes() == b"abcd" + bytes([0, 2, 4, 6, 8, 10])


def test_an_inline_save_writes_through_pieces(tmp_path, monkeypatch) -> None:
    # The inline save wraps its file in Pieces (a tensor written whole, as onnx_ir's
    # tofile does, still reaches the file a piece at a time); the model reads back.
    from dqtool.storage import inline_write

    monkeypatch.setattr(write_pieces, "WRITE_PIECE", 4096)
    sizes: list[int] = []

    class Noting(write_pieces.Pieces):
        def write(self, data) -> int:
            return write_pieces.write_in_pieces(lambda p: sizes.append(len(p)) or
                                                self.file.write(p), data)

    monkeypatch.setattr(inline_write, "Pieces", Noting)
    w = np.random.default_rng(0).standard_normal((300, 100)).astype(np.float32)
    graph = ir.Graph([], [], nodes=[], name="g", opset_imports={"": 21})
    graph.register_initializer(ir.Value(name="w", const_value=ir.Tensor(w, name="w"),
                                        type=ir.TensorType(ir.DataType.FLOAT),
                                        shape=ir.Shape(w.shape)))
    out = tmp_path / "m.onnx"
    storage.save(ir.Model(graph, ir_version=10), out, external=False)
    assert not (tmp_path / "m.onnx.data").exists()
    back = storage.load(out).graph.initializers["w"].const_value.numpy()
    assert np.array_equal(back, w)
    assert sizes and max(sizes) <= 4096 and sum(sizes) >= w.nbytes


@pytest.mark.parametrize("kind", ["float32", "float16", "packed", "uint4-unpacked", "bool",
                                  "bfloat16", "strided", "lazy"])
def test_write_tensor_writes_what_tobytes_gives_in_pieces(kind: str, monkeypatch) -> None:
    # In-memory tensors are written from their arrays where those hold the stored bytes
    # (no copy), else from tobytes(); never by onnx_ir's tofile, which writes a file with
    # a descriptor in one call.
    import ml_dtypes

    monkeypatch.setattr(write_pieces, "WRITE_PIECE", 16)
    rng = np.random.default_rng(1)
    a = rng.standard_normal((9, 7)).astype(np.float32)
    t = {
        "float32": lambda: ir.Tensor(a),
        "float16": lambda: ir.Tensor(a.astype(np.float16)),
        "packed": lambda: ir.PackedTensor(rng.integers(0, 256, 50, np.uint8),
                                          ir.DataType.INT4, shape=(100,)),
        "uint4-unpacked": lambda: ir.Tensor(rng.integers(0, 16, 31, np.uint8).view(
            ml_dtypes.uint4), dtype=ir.DataType.UINT4),
        "bool": lambda: ir.Tensor(a > 0),
        "bfloat16": lambda: ir.Tensor(a.astype(ml_dtypes.bfloat16)),
        "strided": lambda: ir.Tensor(a[:, ::2]),
        "lazy": lambda: ir.LazyTensor(lambda: ir.Tensor(a), dtype=ir.DataType.FLOAT,
                                      shape=ir.Shape(a.shape)),  # onnx_ir's own lazy one
    }[kind]()
    raw = _Raw()
    raw.fileno = lambda: 1 / 0  # a descriptor would be used by onnx_ir's tofile: not here
    write_pieces.write_tensor(t, raw)
    assert bytes(raw.data) == t.tobytes()
    assert max(raw.sizes) <= 16


@pytest.mark.parametrize("size", [10, 64 << 10, (64 << 10) + 1, 300_000])
def test_the_data_file_writer_writes_large_buffers_in_pieces(size: int, tmp_path,
                                                            monkeypatch) -> None:
    # A buffer larger than a piece is written in pieces at the file's position, which
    # then moves past it, as a write does. Same bytes.
    data = np.random.default_rng(size).integers(0, 256, size, np.uint8)
    path = tmp_path / "d.bin"
    calls = _pwrites(monkeypatch)
    with _data_file(path, threading.RLock()) as f:
        f.write(b"head")
        assert f.writes_in_pieces and f.write(data) == size
        assert f.tell() == 4 + size
        f.write(b"tail")
    assert path.read_bytes() == b"head" + data.tobytes() + b"tail"
    piece = write_pieces.WRITE_PIECE
    assert len(calls) == 2 + -(-size // piece) and max(n for n, _ in calls) <= piece


def test_a_failed_write_is_an_os_error(tmp_path) -> None:
    # read-only: the write fails (EBADF)
    with _data_file(tmp_path / "d.bin", threading.RLock(), flags=os.O_RDONLY) as f, \
            pytest.raises(OSError) as e:
        f.write(np.zeros(200_000, np.uint8))
    assert e.value.errno == errno.EBADF  # pwrite's own error


@pytest.mark.parametrize("wrap", ["turns", "pieces"])
def test_arrays_of_types_buffers_cannot_name_are_written_as_their_bytes(wrap: str, tmp_path,
                                                                        monkeypatch) -> None:
    # bfloat16 and float8 arrays (ml_dtypes) have no buffer format: dqtool's file
    # wrappers take them as their bytes, in pieces, as a plain file.write would.
    import ml_dtypes


    monkeypatch.setattr(write_pieces, "WRITE_PIECE", 64)
    a = np.arange(100, dtype=np.float32).astype(ml_dtypes.bfloat16)
    b = np.arange(50, dtype=np.float32).astype(ml_dtypes.float8_e4m3fn)
    if wrap == "pieces":
        raw = _Raw()
        f = write_pieces.Pieces(raw)
        assert f.write(a) == a.nbytes and f.write(b) == b.nbytes
        assert bytes(raw.data) == a.tobytes() + b.tobytes()
        assert max(raw.sizes) <= 64
        return
    path = tmp_path / "d.bin"
    calls = _pwrites(monkeypatch)
    with _data_file(path, threading.RLock()) as f:
        assert f.write(a) == a.nbytes and f.write(b) == b.nbytes
    assert path.read_bytes() == a.tobytes() + b.tobytes()
    assert max(size for size, _ in calls) <= 64


def test_a_write_that_takes_less_is_given_the_rest(monkeypatch) -> None:
    monkeypatch.setattr(write_pieces, "WRITE_PIECE", 10)
    got = bytearray()

    def short(data) -> int:  # takes at most 3 bytes, as a raw file may
        got.extend(bytes(data[:3]))
        return min(3, len(data))

    assert write_pieces.write_in_pieces(short, bytes(range(25))) == 25
    assert bytes(got) == bytes(range(25))


def test_a_copy_without_copy_file_range_goes_in_pieces(tmp_path, monkeypatch) -> None:
    # Where the kernel cannot copy (no copy_file_range), a tensor's byte range is copied
    # through user space, still a piece at a time.
    import os

    from dqtool.storage import data_writer

    monkeypatch.delattr(os, "copy_file_range", raising=False)
    monkeypatch.setattr(write_pieces, "WRITE_PIECE", 4096)
    src = tmp_path / "src.bin"
    data = np.random.default_rng(3).integers(0, 256, 50_000, np.uint8).tobytes()
    src.write_bytes(b"x" * 100 + data)
    buffered = io.BytesIO()
    sizes: list[int] = []

    class Dst:
        def write(self, d) -> int:
            sizes.append(memoryview(d).nbytes)
            return buffered.write(d)

        def seek(self, *a) -> int:
            return buffered.seek(*a)

        def fileno(self) -> int:
            raise io.UnsupportedOperation("fileno")

    data_writer._copy_range(str(src), 100, len(data), Dst(), 0)
    assert buffered.getvalue() == data and max(sizes) <= 4096


def test_a_data_file_that_takes_nothing_is_an_error(tmp_path, monkeypatch) -> None:
    # A pwrite that writes nothing (a regular file never does) stops the write, rather
    # than being given the rest forever.

    monkeypatch.setattr(os, "pwrite", lambda fd, data, offset: 0)
    with _data_file(tmp_path / "d.bin", threading.RLock()) as f, pytest.raises(OSError) as e:
        f.write(b"abc")
    assert e.value.errno == errno.EIO and f.tell() == 0


@pytest.mark.parametrize("kernel_copy", [True, False])
def test_onnx_irs_external_tensor_writes_itself_into_the_data_file(tmp_path, monkeypatch,
                                                                  kernel_copy: bool) -> None:
    # An inline-loaded model's tensors write themselves with onnx_ir's
    # ExternalTensor.tofile: the kernel copy at the writer's position (fileno, flush, tell,
    # seek), or, where the kernel cannot, its writes of 1 MiB, in pieces.
    data = np.random.default_rng(7).integers(0, 256, 3 << 20, np.uint8)
    src = tmp_path / "src.bin"
    src.write_bytes(b"x" * 100 + data.tobytes())
    t = ir.ExternalTensor(src.name, 100, data.size, ir.DataType.UINT8,
                          shape=ir.Shape([data.size]), name="t", base_dir=tmp_path)
    if not kernel_copy:
        def refuse(*args, **kwargs):
            raise OSError(errno.EXDEV, "no copy across file systems")

        monkeypatch.setattr(os, "copy_file_range", refuse)
    calls = _pwrites(monkeypatch)
    path = tmp_path / "d.bin"
    with _data_file(path, threading.RLock(), b"head") as f:
        f.seek(4)
        t.tofile(f)
        assert f.tell() == 4 + data.size
    assert path.read_bytes() == b"head" + data.tobytes()
    assert bool(calls) != kernel_copy and all(size <= write_pieces.WRITE_PIECE for size, _ in calls)
