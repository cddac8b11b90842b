"""The fused rewrites' builder (``dqtool.building.Builder`` with their names, constants
computed ahead and written in pieces or in bands, and replacing one node by a chain that
takes over its output: name, type, shape, consumers, graph outputs)."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np
import onnx_ir as ir

from dqtool import types
from dqtool.building import Builder, Made, checked
from dqtool.names import Names
from dqtool.storage import write_tensor

if TYPE_CHECKING:
    from dqtool.storage import EarlyWriter


class _Lazy(ir.LazyTensor):
    """A lazily computed constant that writes itself in pieces (``dqtool.storage.write_pieces``: one
    write of a whole weight, as ndarray.tofile does, was ~10x slower here)."""

    def tofile(self, file) -> None:
        write_tensor(self._evaluate(), file)


class Streamed(_Lazy):
    """A lazily computed constant that writes itself band by band (``write(file)``) when
    saved to a file; as a whole (``numpy()``, an inline save) it is ``make()``. Its bands
    are computed on the thread that writes it, so a save may write several at once."""

    streams = True  # read by the data-file writer (dqtool.storage.data_writer)

    def __init__(self, make: Callable[[], ir.TensorProtocol], write: Callable[[object], int],
                 dtype: ir.DataType, shape: ir.Shape, name: str) -> None:
        super().__init__(make, dtype=dtype, shape=shape, name=name)
        self._write = write

    def tofile(self, file) -> None:
        written = self._write(file)
        if written != self.nbytes:  # the reference to it already says nbytes
            raise OSError(f"{self.name}: wrote {written} bytes, expected {self.nbytes}")


class _ComputedAhead:
    """One large constant computed ahead of its use.

    A save writes the lazily computed weights one after another, in the order they were
    built (their initializers' order). Each weight is read, repacked (CPU) and then written
    (I/O): computing the next one on a background thread while this one is written keeps
    both busy. Only the very next weight is computed ahead, and only one at a time, so at
    most one extra weight is in memory; a weight asked for out of order (or twice) is
    simply computed where it is asked for. The values are the same either way.
    """

    # Weights smaller than this gain nothing; larger ones would double the peak memory.
    MIN_BYTES = 1 << 20
    MAX_BYTES = 1 << 26

    _lock = threading.Lock()
    # Weak (as the links between slots): a model that is gone, with its weights, must not
    # be kept alive by another.
    _last: weakref.ref[_ComputedAhead] | None = None  # the latest built: the next one links to it
    _pending: weakref.ref[_ComputedAhead] | None = None
    _pool: ThreadPoolExecutor | None = None

    def __init__(self, make: Callable[[], object]) -> None:
        self.make = make
        self.next: weakref.ref[_ComputedAhead] | None = None
        self.future: Future | None = None
        with _ComputedAhead._lock:
            last = _ComputedAhead._last() if _ComputedAhead._last is not None else None
            if last is not None:
                last.next = weakref.ref(self)
            _ComputedAhead._last = weakref.ref(self)

    def __call__(self) -> object:
        with _ComputedAhead._lock:
            future, self.future = self.future, None
            stale = _ComputedAhead._pending() if _ComputedAhead._pending is not None else None
            if stale is self:
                stale = _ComputedAhead._pending = None
            nxt = self.next() if self.next is not None else None
            if stale is not None and stale is not nxt:  # asked for out of order
                if stale.future is not None:
                    stale.future.cancel()  # or, already running, its result is dropped
                stale.future = None
                _ComputedAhead._pending = None
            if stale is None or stale is not nxt:
                _ComputedAhead._pending = None  # a computation whose weight is gone is dropped
            if nxt is not None and nxt.future is None and _ComputedAhead._pending is None:
                if _ComputedAhead._pool is None:
                    _ComputedAhead._pool = ThreadPoolExecutor(1, thread_name_prefix="dqtool-ahead")
                nxt.future = _ComputedAhead._pool.submit(nxt.make)
                _ComputedAhead._pending = weakref.ref(nxt)
        if future is not None:
            return future.result()  # re-raises its error here, where the value is needed
        return self.make()


class FusedBuilder(Builder):
    """The nodes that replace one fused node (or the pattern pack packs into one): the
    names are ``<base>/<role>``, large constants are computed ahead (``_ComputedAhead``)
    and written in pieces, and ``finish`` puts the new nodes where the node was."""

    def __init__(self, node: ir.Node, names: Names, in_function: bool = False,
                 home: ir.Value | None = None, early: EarlyWriter | None = None) -> None:
        """``home``: the stored weight the new constants stand for; they go where it is
        stored (an If's or a Loop's outer graph: the new weight stays in the scope the
        original was in, and a round trip gives it back there), else in ``node``'s graph.
        ``early``: the save's writer, when it writes the data file while the model is
        converted: each streamed constant is handed to it as it is made."""
        stored = home.graph if home is not None and home.is_initializer() else None
        super().__init__(node, names, in_function=in_function, home=stored, early=early)
        self.base = node.name or node.outputs[0].name or node.op_type

    def node_name(self, base: str) -> str:
        """``base``, or a variant no node of the model has."""
        return self.names.node(base)

    def constant_node_name(self, name: str, role: str) -> str | None:
        return self.node_name(f"{self.base}/{name}")

    def lazy(self, name: str, dtype: ir.DataType, shape: Sequence[int],
             compute: Callable[[], Made]) -> ir.TensorProtocol:
        nbytes = int(np.prod(tuple(shape), dtype=np.int64)) * ir.DataType(dtype).bitwidth // 8
        if _ComputedAhead.MIN_BYTES <= nbytes <= _ComputedAhead.MAX_BYTES and not self.in_function:
            compute = _ComputedAhead(compute)
        return _Lazy(checked(compute, dtype, shape, name), dtype=dtype, shape=ir.Shape(shape),
                     name=name)

    def constant(self, role: str, dtype: ir.DataType, shape: Sequence[int],
                 make: Callable[[], Made]) -> ir.Value:
        """A constant computed only when the model is saved."""
        name = self.names.fresh(f"{self.base}/{role}")
        shape = tuple(int(d) for d in shape)
        return self.place(self.lazy(name, dtype, shape, make), name, role)

    def streamed(self, role: str, dtype: ir.DataType, shape: Sequence[int],
                 make: Callable[[], ir.TensorProtocol], write: Callable[[object], int]
                 ) -> ir.Value:
        """A constant like ``constant``'s that a save to a data file writes in bands
        (``write(file)`` returns the bytes written); ``make()`` gives it whole."""
        if self.in_function:  # a Constant node holds its tensor, lazily made whole
            return self.constant(role, dtype, shape, make)
        name = self.names.fresh(f"{self.base}/{role}")
        shape = tuple(int(d) for d in shape)
        lazy = Streamed(checked(make, dtype, shape, name), write, dtype, ir.Shape(shape), name)
        if self.early is not None:
            self.early.submit(lazy)  # written at once, while the conversion goes on
        return self.place(lazy, name, role)

    def existing(self, tensor: ir.TensorProtocol, role: str) -> ir.Value:
        """A constant holding an already made tensor (e.g. another view of stored bytes)."""
        return self.place(tensor, self.names.fresh(f"{self.base}/{role}"), role)

    def small(self, role: str, arr: np.ndarray) -> ir.Value:
        arr = np.asarray(arr)
        return self.constant(role, types.from_dtype(arr.dtype).ir_type, arr.shape, lambda: arr)

    def op(self, op_type: str, inputs: Sequence[ir.Value | None], role: str,
           attributes: dict | None = None, dtype: ir.DataType | None = None,
           shape: Sequence[int | str | None] | None = None) -> ir.Value:
        n = ir.node(op_type, list(inputs), attributes or {},
                    name=self.node_name(f"{self.base}/{role}"))
        out = n.outputs[0]
        out.name = self.names.fresh(f"{self.base}/{role}")
        if dtype is not None:
            out.dtype = dtype
        if shape is not None:
            out.shape = ir.Shape(list(shape))
        self.add_node(n)
        return out

    def finish(self, result: ir.Value) -> None:
        """Put the new nodes where ``node`` was; ``result`` takes over its output."""
        old = self.node.outputs[0]
        name, dtype, shape, doc = old.name, old.dtype, old.shape, old.doc_string
        meta = dict(old.metadata_props)
        old.name = self.names.fresh(f"{name}/replaced")
        ir.convenience.replace_nodes_and_values(
            self.graph, self.node, [self.node], self.nodes, [old], [result])
        result.name = name
        if dtype is not None:
            result.dtype = dtype
        if shape is not None:
            result.shape = shape
        result.doc_string = doc
        result.metadata_props.update(meta)
