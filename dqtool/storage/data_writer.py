"""Writing a model's tensors to one external-data file, copying unchanged ones in the kernel.

A conversion rewrites a few tensors of a multi-GB model and keeps the rest. onnx_ir's saver
reads every kept tensor through a memory map and writes it back from user space; the
kernel's ``copy_file_range`` does the same copy without the round trip, in half the time
(docs/decisions.md, "2026-11-28: sizes the code holds"). New tensors are written as onnx_ir
would (``tofile`` when the tensor streams itself, as fold's lazily computed tensors do).
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import onnx_ir as ir

from dqtool.kernel.parallel import num_threads
from dqtool.storage.data_file import TakingTurns, reserve_or_fail
from dqtool.storage.write_pieces import write_in_pieces, write_tensor

# onnx_ir's default: smaller tensors stay in the protobuf.
SIZE_THRESHOLD = 256
ALIGNMENT = 64  # keeps every tensor's data aligned for memory-mapped NumPy views
# A copy of the input's data file (``DataFileCopy``) is kept as the output's only where at most
# 1/this of it is bytes the output no longer uses (docs/decisions.md, "Sizes the code holds").
COPY_MAX_UNUSED = 8


def _copy_range(src: str, offset: int, length: int, dst, dst_offset: int) -> None:
    with open(src, "rb") as fin:
        done = 0
        try:
            if not hasattr(os, "copy_file_range"):  # not Linux
                raise OSError(errno.ENOSYS, "no copy_file_range")
            while done < length:
                n = os.copy_file_range(fin.fileno(), dst.fileno(), length - done,
                                       offset + done, dst_offset + done)
                if n == 0:
                    raise OSError(f"{src}: ended before {length} bytes at offset {offset}")
                done += n
        except OSError as e:
            if done or getattr(e, "errno", None) is None:
                raise
            # A file system or kernel without copy_file_range: copy through user space.
            fin.seek(offset)
            dst.seek(dst_offset)
            remaining = length
            while remaining:
                block = fin.read(min(remaining, 64 << 20))
                if not block:
                    raise OSError(f"{src}: ended before {length} bytes") from None
                write_in_pieces(dst.write, block)
                remaining -= len(block)
    dst.seek(dst_offset + length)


def _write(tensor: ir.TensorProtocol, f, offset: int) -> int:
    """Write ``tensor`` at ``offset``; return its length in bytes."""
    f.seek(offset)
    if isinstance(tensor, ir.ExternalTensor):
        length = tensor.length if tensor.length is not None else tensor.nbytes
        _copy_range(tensor.path, tensor.offset or 0, length, f, offset)
    else:
        write_tensor(tensor, f)  # in pieces (dqtool.storage.write_pieces)
    return f.tell() - offset


def _length(tensor: ir.TensorProtocol) -> int:
    if isinstance(tensor, ir.ExternalTensor) and tensor.length is not None:
        return tensor.length
    return tensor.nbytes


def _align(offset: int) -> int:
    return -(-offset // ALIGNMENT) * ALIGNMENT


def _initializers(model: ir.Model) -> list[ir.Value]:
    return [v for g in model.graphs() for v in g.initializers.values()
            if v.const_value is not None]


class _Writer:
    """Writes the planned tensors, each at its own offset, on ``threads`` threads that take
    the next tensor in order; the first error, if any, is raised by ``finish``.

    Why several: a tensor that streams itself (a fused weight repacked band by band)
    costs CPU for its bands and for write()'s copy into the page cache, on the thread
    that writes it; with two threads one computes a band while the other writes one.
    The writes themselves take turns (``_io``; an unchanged tensor's copy in the kernel is
    one write): the kernel lets one write() into a file at a time anyway, and a thread
    waiting on it in the kernel spins, where one waiting here sleeps (docs/decisions.md,
    "2026-11-28: sizes the code holds"). Tensors that do not stream are computed one at a
    time (under ``_compute``): their ``make`` may read a tensor through onnx_ir, whose loading of an
    external tensor is not thread-safe."""

    def __init__(self, path: Path, plan: list[tuple[ir.TensorProtocol, int, int]],
                 callback: Callable | None, append: bool = False, threads: int = 1,
                 open_ended: bool = False) -> None:
        """``open_ended``: more tensors may be ``add``-ed until ``close`` (the threads wait
        for them); otherwise the plan is all there is."""
        self.path, self.plan, self.callback = path, list(plan), callback
        self.error: BaseException | None = None
        self.cancelled = threading.Event()
        self._taken = 0  # plan items handed to a thread
        self._closed = not open_ended
        self._reserved = 0  # bytes reserved ahead by ``add``
        self._reserving = None  # the file, open for ``add``'s reservations
        self._lock = threading.Condition()  # the queue, the callback and the error
        self._compute = threading.Lock()
        # reentrant: a copy through user space writes within its own turn
        self._io = threading.RLock()
        if not append:  # append: past a data-file copy's bytes, the file exists
            with open(path, "wb") as f:
                reserve_or_fail(f, path, 0, max((o + n for _, o, n in plan), default=0))
        count = max(1, threads if open_ended else min(threads, len(plan)))
        self._threads = [threading.Thread(target=self._run, daemon=True,
                                          name=f"dqtool-external-data-{i}")
                         for i in range(count)]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    # An open-ended writer reserves the file's bytes this far past the last tensor at a time
    # (not one reservation a tensor: docs/decisions.md, "Sizes the code holds"), and cuts the
    # file back to its last tensor when it is done.
    RESERVE_AHEAD = 64 << 20

    def add(self, items: list[tuple[ir.TensorProtocol, int, int]], last: bool = False
            ) -> None:
        """More tensors to write (an open-ended writer), their bytes reserved first;
        ``last``: no more will come (nothing is reserved ahead)."""
        if not items:
            return
        end = max(o + n for _, o, n in items)
        if end > self._reserved:
            if self._reserving is None:
                self._reserving = open(self.path, "r+b")  # noqa: SIM115 - closed by finish()
            # What the tensors need, surely (a full disk is an error); the bytes ahead if
            # the disk has them (a save that fits must not fail on them).
            reserve_or_fail(self._reserving, self.path, self._reserved, end - self._reserved)
            self._reserved = end
            if not last:
                with contextlib.suppress(OSError):
                    reserve_or_fail(self._reserving, self.path, end, self.RESERVE_AHEAD)
                    self._reserved = end + self.RESERVE_AHEAD
        with self._lock:
            self.plan.extend(items)
            self._lock.notify_all()

    def fail(self, error: BaseException) -> None:
        """Stop the threads with ``error`` (raised by ``finish``), found by their caller."""
        with self._lock:
            if self.error is None:
                self.error = error
            self._lock.notify_all()

    def close(self) -> None:
        """No more tensors: the threads end once the plan is written."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()

    def _next(self) -> tuple[int, tuple[ir.TensorProtocol, int, int]] | None:
        with self._lock:
            while True:
                if self.cancelled.is_set() or self.error is not None:
                    return None
                if self._taken < len(self.plan):
                    break
                if self._closed:
                    return None
                self._lock.wait()
            index = self._taken
            self._taken += 1
            t, offset, _ = self.plan[index]
            if self.callback is not None:
                self.callback(t, ir.external_data.CallbackInfo(
                    total=len(self.plan), index=index, offset=offset,
                    filename=self.path.name))
            return index, self.plan[index]

    def _run(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDWR)  # not inherited (PEP 446)
            try:
                f = TakingTurns(fd, self._io)
                while (item := self._next()) is not None:
                    t, offset, length = item[1]
                    if isinstance(t, ir.ExternalTensor):  # a copy in the kernel: one write
                        turn = self._io
                    else:  # a tensor that streams writes in turns; others compute alone
                        turn = nullcontext() if getattr(t, "streams", False) else self._compute
                    with turn:
                        written = _write(t, f, offset)
                    if written != length:  # the reference already says `length`
                        raise OSError(f"{t.name}: wrote {written} bytes, expected {length}")
            finally:
                os.close(fd)
        except BaseException as e:  # handed to the caller's thread
            with self._lock:
                if self.error is None:
                    self.error = e
                self._lock.notify_all()

    def finish(self, cancel: bool = False) -> None:
        if cancel:
            self.cancelled.set()
        self.close()
        for t in self._threads:
            if t.ident is not None:
                t.join()
        if self._reserving is not None:
            with self._reserving as f:  # the reserved bytes past the last tensor go
                end = max((o + n for _, o, n in self.plan), default=0)
                if not cancel and self.error is None and f.seek(0, os.SEEK_END) > end:
                    f.truncate(end)
            self._reserving = None
        if self.error is not None and not cancel:
            raise self.error


class DataFileCopy(threading.Thread):
    """Copies an input model's data file, whole, to become the output's data file while
    the model is still being converted: the copy (most of a large conversion's time) then
    overlaps the conversion. The save keeps every unchanged tensor at its input offset and
    appends the others; if that would leave more than an eighth of the copy unused (the
    replaced tensors' old bytes) it cancels the copy and lays the file out compactly
    instead. ``folder`` is the save's temporary folder."""

    CHUNK = 64 << 20  # cancellation is checked between chunks

    def __init__(self, src: Path, folder: Path, data_name: str) -> None:
        super().__init__(name="dqtool-data-copy", daemon=True)
        self.src, self.folder, self.path = src, folder, folder / data_name
        self.temp = None  # the save's ``commit.Temp``, set by ``saving.start_data_copy``
        self.size = src.stat().st_size
        self.error: BaseException | None = None
        self.cancelled = threading.Event()
        self.path.touch()

    def run(self) -> None:
        try:
            with open(self.path, "r+b") as fout:
                done = 0
                while done < self.size and not self.cancelled.is_set():
                    n = min(self.CHUNK, self.size - done)
                    # in the kernel where it can; across file systems, through user space
                    _copy_range(str(self.src), done, n, fout, done)
                    done += n
        except BaseException as e:  # handed to the caller's thread
            self.error = e

    def finish(self, cancel: bool = False) -> None:
        if cancel:
            self.cancelled.set()
        if self.is_alive() or self.ident is not None:
            self.join()
        if self.error is not None and not cancel:
            raise self.error


class EarlyWriter:
    """The output's data file written while the model is still being converted.

    A conversion that rewrites most of a model's bytes (a fused weight repacked band by
    band) builds each new weight as a tensor that streams itself (``Streamed``); the
    weight's bytes depend on its input alone. The conversion holds this writer (an explicit
    argument, down to the builder that makes the tensors) and hands it each such tensor as
    it is made (``submit``): writer threads write it at once, at the next place in the
    data file, and written while the conversion goes on with the next node, the save
    prepares and the model is serialized: the start-up's single-threaded tail overlaps
    the writes (docs/decisions.md, "2026-11-28: sizes the code holds"). The save then places the
    other tensors after these (``externalized``). If a tensor written early is not in the
    saved model after all, the save starts the file over, compactly.

    The bytes of each tensor are those a save after the conversion would write; only
    their order in the file differs (early ones first)."""

    def __init__(self, folder: Path, data_name: str, callback: Callable | None = None
                 ) -> None:
        self.path = folder / data_name
        self.temp = None  # the save's ``commit.Temp``, set by ``saving.start_early_writer``
        self.placed: dict[int, tuple[int, int]] = {}  # id(tensor) → (offset, length)
        self.end = 0  # where the next tensor goes
        self._tensors: list[ir.TensorProtocol] = []  # alive: their ids stay theirs
        self.writer = _Writer(self.path, [], callback, threads=num_threads(),
                              open_ended=True)
        try:
            self.writer.start()
        except BaseException:
            self.writer.finish(cancel=True)
            raise

    def submit(self, tensor: ir.TensorProtocol) -> None:
        length = _length(tensor)
        if length <= SIZE_THRESHOLD or id(tensor) in self.placed:
            return  # (small ones stay in the protobuf)
        if self.writer.error is not None:
            return  # the save raises it
        offset = self.end
        try:
            self.writer.add([(tensor, offset, length)])
        except OSError as e:  # e.g. a full disk: the save raises it, as its own
            self.writer.fail(e)
            return
        self.end = _align(offset + length)
        self.placed[id(tensor)] = (offset, length)
        self._tensors.append(tensor)

    def finish(self, cancel: bool = False) -> None:
        self.writer.finish(cancel)


class PlacedTensor(ir.ExternalTensor):
    """The reference a save gives a tensor in its data file (serialized as that), which
    reads as the tensor it stands for, ``source``, until the save is done.

    Why: a save repoints every initializer of the model at the data file before writing
    it, and tensors computed while it writes (a repacked weight, a folded one) read other
    initializers of the same model, e.g. a weight shared with a node left as it is (a tied
    LM head). Read through the file, those bytes may not be written yet; read through the
    source, they are the input's. ``graph.constant_tensor`` gives the source."""

    def __init__(self, source: ir.TensorProtocol, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.placed_source = source

    def numpy(self):
        return self.placed_source.numpy()

    def tobytes(self) -> bytes:
        return self.placed_source.tobytes()


class Resolver(dict):
    """``Path(path).resolve()`` once per path for one save: a model's thousands of external
    tensors name one or two files (each resolve is a system call per path component)."""

    def __missing__(self, path: str) -> Path:
        self[path] = Path(path).resolve()
        return self[path]


def _reusable(t: ir.TensorProtocol, copy: DataFileCopy | None, paths: Resolver) -> bool:
    return (copy is not None and isinstance(t, ir.ExternalTensor)
            and paths[str(t.path)] == copy.src)


@contextmanager
def externalized(model: ir.Model, folder: Path, data_name: str,
                 callback: Callable | None = None,
                 early: DataFileCopy | EarlyWriter | None = None) -> Iterator[None]:
    """Write the model's large tensors to ``folder/data_name`` and, while the context is
    open, point its initializers there (saving the model then writes references only).
    Small external tensors are read into memory. The model is restored on exit.

    Every tensor's place is known from its size before any byte is written, so the data is
    written by a worker thread while the caller serializes the model: the copy runs in the
    kernel and NumPy without the GIL. The context waits for the data before it exits and
    raises the writer's error, if any."""
    values = _initializers(model)
    # Strings have no external-data form (ONNX stores them as string_data): they stay inline.
    big = [v for v in values if v.const_value.nbytes > SIZE_THRESHOLD
           and v.const_value.dtype != ir.DataType.STRING]
    originals = {id(v): v.const_value for v in values}
    try:
        _materialize_small(values)
        copy, early_writer = _still_worth_it(early, big, Resolver())
        plan = _place(big, folder, data_name, copy, early_writer)

        if early_writer is not None:  # its threads write the rest too
            writer = early_writer.writer
            writer.callback = callback
        else:
            writer = _Writer(folder / data_name, plan, callback, append=copy is not None,
                             threads=num_threads())
        try:
            if early_writer is not None:
                writer.add(plan, last=True)
                writer.close()
            else:
                writer.start()
            yield
            writer.finish()
            if copy is not None:
                copy.finish()
        except BaseException:  # also Ctrl-C while waiting: stop the writers before leaving
            writer.finish(cancel=True)
            if copy is not None:
                copy.finish(cancel=True)
            raise
    finally:
        for v in values:
            v.const_value = originals[id(v)]


def _materialize_small(values: list[ir.Value]) -> None:
    """Small tensors stay in the protobuf. Those read from a file or computed on demand
    are materialized now, before the writer starts: a lazy tensor may read the same input
    tensor as one the writer computes, and onnx_ir's loading of an external tensor is not
    thread-safe ("The array should be loaded only once"). (Writers started early,
    ``EarlyWriter``, only write tensors that stream themselves; those read their inputs
    through ``dqtool.storage.tensor_reads``, never through onnx_ir's loading.)"""
    for v in values:
        t = v.const_value
        if t.nbytes <= SIZE_THRESHOLD and isinstance(t, (ir.ExternalTensor, ir.LazyTensor)):
            v.const_value = ir.Tensor(t.numpy(), name=t.name, doc_string=t.doc_string)


def _still_worth_it(early: DataFileCopy | EarlyWriter | None, big: list[ir.Value],
                    paths: Resolver) -> tuple[DataFileCopy | None, EarlyWriter | None]:
    """The copy of the input's data file, kept only while little of it would be left
    unused; the writers started early, kept only while every tensor they wrote is saved."""
    early_writer = early if isinstance(early, EarlyWriter) else None
    copy = early if isinstance(early, DataFileCopy) else None
    saved = {id(v.const_value) for v in big}
    if early_writer is not None and not early_writer.placed.keys() <= saved:
        early_writer.finish(cancel=True)  # one written early was dropped: start over
        early_writer = None
    if copy is not None:
        kept = sum(_length(v.const_value) for v in big
                   if _reusable(v.const_value, copy, paths))
        if (copy.size - kept) * COPY_MAX_UNUSED > copy.size:
            copy.finish(cancel=True)
            copy = None
    return copy, early_writer


def _place(big: list[ir.Value], folder: Path, data_name: str, copy: DataFileCopy | None,
           early_writer: EarlyWriter | None) -> list[tuple[ir.TensorProtocol, int, int]]:
    """Point each large initializer at its place in the data file; the tensors still to
    write, with their offsets. With a copy of the input's data file, unchanged tensors stay
    where the copy puts them (their input offsets) and the others follow the copied bytes;
    with tensors written early, the others follow them; else all are packed in order."""
    paths = Resolver()
    offset = _align(copy.size) if copy is not None else \
        early_writer.end if early_writer is not None else 0
    plan = []
    for v in big:
        t = v.const_value
        length = _length(t)
        if early_writer is not None and id(t) in early_writer.placed:
            place = early_writer.placed[id(t)][0]  # written (or being written) there
        elif _reusable(t, copy, paths):
            place = t.offset or 0  # the copy already holds its bytes there
        else:
            place = offset
            plan.append((t, offset, length))
            offset = _align(offset + length)
        v.const_value = PlacedTensor(
            t, data_name, place, length, t.dtype, shape=t.shape, name=t.name,
            doc_string=t.doc_string, base_dir=folder)
    return plan
