"""Computing a folded value with dqtool's kernel, lazily and in row chunks.

Nothing is computed when a node is folded: the new constant is a ``FoldedTensor`` (an
``onnx_ir.LazyTensor``) that computes its value when the model is saved. Written as
external data, it streams: rows of the output are computed and written a chunk at a time,
so peak memory is a few chunks, not the tensor (and never the model). Only the rows of the
source a chunk needs are read, packed (4-bit, ...) sources included. Written inline, the
whole tensor is computed once and dropped after serialization.

The next chunk is computed on one helper thread while the saving thread writes this one
(two chunks alive at most): once float16 rounding stopped dominating, a fold's compute and
its writes were of the same order, and overlapping them measured faster (4 fused layers,
float16: 2.6 -> 1.6-2.5 s at load 1-3; an 8192 x 8192 int8 fold 0.68 -> 0.46 s, no more
CPU). An earlier measurement, with three chunks alive and a slower kernel, had found a
writer thread only added CPU time and page faults.

The values are the kernel's, which is bit-identical to onnxruntime (``ORT_DISABLE_ALL``).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from dqtool import types
from dqtool.folding import by_table, kernel_call
from dqtool.folding.kernel_call import KernelCall
from dqtool.kernel.parallel import num_threads
from dqtool.storage import MappedTensor, external_like, piecewise

# Output elements per chunk when streaming: 8 MiB of float32 stays under glibc's mmap
# ceiling, so a freed chunk is reused from the heap (docs/decisions.md, "Sizes the code holds").
CHUNK_ELEMENTS = 1 << 21


@dataclass
class Folding:
    """How to compute one folded value: a constant source and the kernel calls applied to it."""

    source: ir.TensorProtocol  # the quantized x, or the float weight of a Q→DQ pair
    calls: tuple[KernelCall, ...]
    shape: tuple[int, ...]  # the output's (logical) shape
    out_dtype: np.dtype  # the node's own output type
    store_dtype: np.dtype  # what is written (--dtype); a cast of the node's output
    _source_cache: np.ndarray | None = field(default=None, repr=False)
    # Each call's scale and zero point, read once per pass over the rows (a computed
    # parameter would otherwise be computed again for every chunk).
    _params: dict[int, tuple[np.ndarray, np.ndarray | None]] = field(
        default_factory=dict, repr=False)

    def row_align(self) -> int | None:
        if not self.shape:
            return None
        aligns = [s.row_align() for s in self.calls]
        if any(a is None for a in aligns):
            return None
        return int(np.lcm.reduce([a for a in aligns if a] or [1]))

    def chunks(self, elements: int | None = None) -> Iterator[tuple[int | None, int | None]]:
        elements = elements or CHUNK_ELEMENTS
        align = self.row_align()
        if align is None or not self.shape[0]:
            yield None, None
            return
        row = int(np.prod(self.shape[1:], dtype=np.int64)) or 1
        step = max(align, (max(elements // row, 1) // align) * align)
        for r0 in range(0, self.shape[0], step):
            yield r0, min(r0 + step, self.shape[0])

    def compute(self, r0: int | None = None, r1: int | None = None) -> np.ndarray:
        """The folded value (rows r0:r1 of it when given)."""
        x: np.ndarray | None = None
        rows = (self.shape[0] if r0 is None or r1 is None else r1 - r0) if self.shape else 0
        cols = self.shape[1] if len(self.shape) == 2 else 0
        if len(self.calls) == 1 and by_table.takes(  # a DequantizeLinear of narrow codes
                self.calls[0], self.source.dtype.numpy(), rows, cols):
            if 0 not in self._params:
                self._params[0] = self.calls[0].arrays()
            scale, zp = self.calls[0].params(r0, r1, self._params[0])
            codes = self._packed(r0, r1)
            if codes is None:
                codes = x = self._rows(r0, r1)
            y = by_table.dequantize(self.calls[0], codes, scale, zp, self.store_dtype)
            if y is not None:
                return y
        if x is None:
            x = self._rows(r0, r1)
        for i, s in enumerate(self.calls):
            if i not in self._params:
                self._params[i] = s.arrays()
            x = s.run(x, r0, r1, self._params[i])
        if x.dtype != self.out_dtype:  # a kernel returning another type would be a bug
            raise AssertionError(f"kernel returned {x.dtype}, the node outputs {self.out_dtype}")
        # --dtype: one cast of the node's output (exact when widening).
        return x if self.store_dtype == self.out_dtype else x.astype(self.store_dtype)

    def _packed(self, r0: int | None, r1: int | None) -> by_table.PackedRows | None:
        """Rows r0:r1 of 2- or 4-bit codes as they are packed (rows of whole bytes), for
        ``by_table``, which reads them without unpacking; None where they are not."""
        if r0 is None or r1 is None or len(self.shape) != 2:
            return None
        t = self.source
        packed_rows = getattr(t, "packed_rows", None)
        if callable(packed_rows):  # a fused weight's codes: transposed, still packed
            return packed_rows(r0, r1)
        et = types.from_ir(t.dtype)
        if not isinstance(t, (ir.ExternalTensor, MappedTensor)) or et is None \
                or not et.is_integer or et.bits not in (2, 4):
            return None
        dims = tuple(int(d) for d in t.shape.numpy())
        if len(dims) != 2 or dims[1] * et.bits % 8:
            return None
        row = dims[1] * et.bits // 8
        data = np.fromfile(t.path, dtype=np.uint8, count=(r1 - r0) * row,
                           offset=(t.offset or 0) + r0 * row)
        if data.size != (r1 - r0) * row:
            return None  # a short file: the usual path says so
        return by_table.PackedRows(data.reshape(r1 - r0, row), dims[1], et.bits, et.dtype)

    def _rows(self, r0: int | None, r1: int | None) -> np.ndarray:
        t = self.source
        if r0 is None or r1 is None:
            return kernel_call.load(t)
        # A source that computes a band of its rows itself (a fused weight's codes)
        rows_of = getattr(t, "rows", None)
        if callable(rows_of):
            return rows_of(r0, r1)
        et = types.from_ir(t.dtype)
        if isinstance(t, (ir.ExternalTensor, MappedTensor)) and et is not None:
            rows = _read_rows(t, et, r0, r1)
            if rows is not None:
                return rows
        if self._source_cache is None:  # in memory already, or unaligned packed rows
            self._source_cache = kernel_call.load(t)
        return self._source_cache[r0:r1]

    def release(self) -> None:
        self._source_cache = None
        self._params.clear()
        release_rows = getattr(self.source, "release_rows", None)
        if callable(release_rows):
            release_rows()

    def write(self, sink: Callable[[memoryview], object]) -> None:
        """Compute chunk by chunk and hand each chunk's bytes to ``sink``, in order; the
        next chunk is computed on a helper thread while this one is written."""
        def compute(r0: int | None, r1: int | None) -> np.ndarray:
            return np.ascontiguousarray(self.compute(r0, r1))

        spans = list(self.chunks())
        pending = None
        try:
            ahead = _helper() if len(spans) > 1 else None
            pending = ahead.submit(compute, *spans[0]) if ahead is not None else None
            for i, span in enumerate(spans):
                if pending is None:
                    chunk = compute(*span)
                else:
                    chunk = pending.result()
                    pending = ahead.submit(compute, *spans[i + 1]) if i + 1 < len(spans) \
                        else None
                sink(chunk.reshape(-1).view(np.uint8))  # in pieces: see Folding.tofile
                del chunk  # two chunks alive at most: this one and the next
        finally:
            if pending is not None:
                pending.cancel()  # or wait for it: the source is released below
                with contextlib.suppress(BaseException):  # the first error is raised
                    pending.result()
            self.release()


_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()
# onnx_ir's loading of an external tensor is not thread-safe ("The array should be loaded
# only once"): loads from the fold's threads take turns. A lazy tensor (another folded
# value, a fused weight's codes) is computed outside it: it guards itself, and computing
# one under this lock nested it (a folded scale of a folded weight hung on its own lock).
def _helper() -> ThreadPoolExecutor:
    """The threads computing chunks ahead: one per thread that writes the data file (each
    writes one folded tensor at a time and has one chunk computed ahead). With one for all,
    a float16 fold of the fused bench kept one core busy computing while the writers
    waited: 7 s of 8 at one core (``perf``)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max(1, num_threads()),
                                       thread_name_prefix="dqtool-fold-ahead")
        return _pool


def _read_rows(t: ir.ExternalTensor | MappedTensor, et: types.ElemType, r0: int,
               r1: int) -> np.ndarray | None:
    """Rows r0:r1 of an external tensor, read from its file; None when the rows do not
    start and end on byte boundaries (packed types with odd rows).

    Reads just these rows: a memory map of the whole tensor would keep every page it
    touched resident, and a packed tensor would be unpacked whole for every pass over it.
    """
    dims = tuple(int(d) for d in t.shape.numpy())
    row = 1
    for d in dims[1:]:
        row *= d
    start, count = r0 * row * et.bits, (r1 - r0) * row * et.bits
    if start % 8 or (count % 8 and r1 != dims[0]):
        return None
    offset = (t.offset or 0) + start // 8
    if et.bits >= 8:
        arr = np.fromfile(t.path, dtype=et.dtype, count=(r1 - r0) * row, offset=offset)
        return arr.reshape((r1 - r0, *dims[1:]))
    if et.bits == 4:
        # Low nibble first, as ONNX packs; two passes written in place (onnx_ir's unpacking
        # takes five). The codes are viewed as the 4-bit type, as onnx_ir views them.
        packed = np.fromfile(t.path, dtype=np.uint8, count=(count + 7) // 8, offset=offset)
        codes = np.empty(2 * packed.size, dtype=np.uint8)
        np.bitwise_and(packed, 0x0F, out=codes[0::2])
        np.right_shift(packed, 4, out=codes[1::2])
        elements = (r1 - r0) * row
        return codes[:elements].view(t.dtype.numpy()).reshape((r1 - r0, *dims[1:]))
    # onnx_ir unpacks a tensor of just these rows into a new array (not a view of its
    # memory map), so the map can be released at once.
    part = external_like(t, offset, (count + 7) // 8, t.dtype, ir.Shape((r1 - r0, *dims[1:])))
    try:
        return part.numpy()
    finally:
        part.release()


class FoldedTensor(ir.LazyTensor):
    """A folded constant: computed when saved, streamed in chunks into external data."""

    # Read by the data-file writer (dqtool.storage.data_writer): written in turns, chunk by
    # chunk, and safe to compute beside another (its loads through onnx_ir take turns on
    # ``kernel_call.load``), so the writer's threads fold two weights at once
    # (docs/decisions.md, "Sizes the code holds"). One folded value
    # may also be read by another's folding (a folded scale): each computation of it
    # (written, or read whole) holds its own lock, so two threads never share its
    # Folding's state; the chunks computed ahead for a write run under the writer's hold.
    streams = True

    def __init__(self, folding: Folding, name: str | None = None) -> None:
        self.folding = folding
        self._computing = threading.RLock()
        et = types.from_dtype(folding.store_dtype)
        super().__init__(self._whole, dtype=et.ir_type, shape=ir.Shape(folding.shape),
                         name=name)

    def _whole(self) -> ir.TensorProtocol:
        with self._computing:
            try:
                return ir.Tensor(self.folding.compute(), name=self.name)
            finally:
                self.folding.release()

    def tofile(self, file) -> None:
        with self._computing:
            self.folding.write(piecewise(file))  # in pieces (dqtool.storage.write_pieces)
