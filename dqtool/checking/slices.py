"""A weight DequantizeLinear checked slice by slice: which slices, and reading each one.

A large DequantizeLinear of constants is checked a band of rows (along axis 0) at a time,
each band a DequantizeLinear of its own: x's rows with the scale and zero point of those
rows (the whole of them for a per-tensor node or one quantized along another axis; the
matching entries or blocks for one quantized along axis 0). Elementwise, so each band's
output is exactly those rows of the whole output. A band still too large (whole blocks of
rows of a wide weight) is cut along its last axis the same way (``parts``).

Why rows: they are one run of bytes in x's file, so a band is read from the file on its
own map (``storage.from_file`` / ``file_codes``), released with the band, and a check
holds one band at a time. x read whole through onnx_ir kept every page of its memory map
that a slice touched resident to the end: checking an int8[2^31] weight (a sparse 2 GiB
file) took 2.42 GB of RSS (docs/benchmarks.md, 2026-11-28).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator, Sequence

import numpy as np
import onnx_ir as ir

from dqtool import graph, storage, types
from dqtool.spec import QuantSpec


class Weight:
    """x of a DequantizeLinear of constants, read a band of rows at a time: from its file
    where it has one, else sliced from memory."""

    def __init__(self, tensor: ir.TensorProtocol, shape: tuple[int, ...]) -> None:
        self.tensor, self.shape = tensor, shape
        self.row = math.prod(shape[1:])  # elements in one row (along axis 0)
        self.type = types.from_ir(tensor.dtype)
        self._whole: np.ndarray | None = None

    @property
    def bits(self) -> int:
        return self.type.bits if self.type is not None else 8

    def _in_file(self) -> tuple[str, int] | None:
        where = storage.file_range(self.tensor)
        et = self.type
        # As ``storage.tensor_array`` reads them: whole little-endian items, or
        # integer codes.
        if where is None or et is None or not (et.is_integer or et.bits >= 8) or (
                et.bits > 8 and sys.byteorder != "little"):
            return None
        return str(where[0]), where[1]

    def rows(self, r0: int, r1: int) -> np.ndarray:
        """Rows r0:r1, contiguous; ``r0 * row`` codes must end on a byte (``parts``)."""
        where, et = self._in_file(), self.type
        if where is None or et is None:
            if self._whole is None:  # in memory already, or a type read whole
                self._whole = storage.tensor_array(self.tensor)
            return np.ascontiguousarray(self._whole[r0:r1])
        path, offset = where
        count = (r1 - r0) * self.row
        if et.bits >= 8:
            arr = storage.from_file(path, et.dtype, count,
                                         offset + r0 * self.row * et.dtype.itemsize)
        else:
            start = r0 * self.row
            arr = storage.file_codes(path, offset, start, start + count,
                                          et.bits).view(et.dtype)
        return arr.reshape((r1 - r0, *self.shape[1:]))


def weight(node: ir.Node, spec: QuantSpec, piece_bytes: int) -> Weight | None:
    """x of ``node`` when it is checked in parts: an ai.onnx DequantizeLinear whose inputs
    are all constants and whose output passes ``piece_bytes`` (as float32); else None."""
    x = graph.input_value(node, 0)
    t = graph.constant_tensor(x)
    if (spec.domain != "ai.onnx" or spec.packing != "none" or t is None
            or graph.input_value(node, 1) is None
            or any(v is not None and graph.constant_tensor(v) is None for v in node.inputs)):
        return None
    shape = tuple(int(d) for d in t.shape)
    if not shape or math.prod(shape) * 4 <= piece_bytes:
        return None
    if spec.granularity not in ("per-tensor", "per-axis", "blocked") or (
            spec.granularity != "per-tensor" and spec.axis is None) or (
            spec.granularity == "blocked" and not spec.block_size):
        return None
    return Weight(t, shape)


def _cuts(length: int, unit_bytes: int, budget: int, align: int) -> list[tuple[int, int]]:
    """(start, stop) runs of ``length`` units of ``unit_bytes`` each, about ``budget`` bytes
    a run, each starting on a multiple of ``align``."""
    step = max(1, budget // max(unit_bytes, 1))
    step = max(align, step // align * align)
    return [(s0, min(s0 + step, length)) for s0 in range(0, length, step)]


def _align(spec: QuantSpec, axis: int) -> int:
    """Runs along ``axis`` hold whole blocks when blocks run along it."""
    return (spec.block_size or 1) if spec.granularity == "blocked" and spec.axis == axis \
        else 1


def parts(spec: QuantSpec, w: Weight, others: Sequence[np.ndarray | None], budget: int
          ) -> Iterator[tuple[str, list[np.ndarray | None]]]:
    """(where, the node's inputs) for each part of the node to check, its output about
    ``budget`` bytes of float32: bands of rows read from the file (whole bytes of packed
    codes), each cut along its last axis too when one band is still larger (a block of
    rows of a wide weight: 128 rows of a 128256-wide head were 65 MB). ``others``: the
    node's scale and zero point (whole)."""
    last = len(w.shape) - 1
    row_align = _align(spec, 0)
    if w.bits < 8:
        row_align = math.lcm(row_align, 8)
    for r0, r1 in _cuts(w.shape[0], w.row * 4, budget, row_align):
        rows = w.rows(r0, r1)
        band = [params(v, spec, 0, r0, r1) for v in others]
        where = f"axis 0 elements {r0}:{r1}"
        if last == 0 or rows.size * 4 <= budget:
            yield where, [rows, *band]
            continue
        column = rows.size // rows.shape[-1] * 4
        for c0, c1 in _cuts(rows.shape[-1], column, budget, _align(spec, last)):
            yield (f"{where}, axis {last} elements {c0}:{c1}",
                   [np.ascontiguousarray(rows[..., c0:c1]),
                    *(params(v, spec, last, c0, c1) for v in band)])


def params(v: np.ndarray | None, spec: QuantSpec, axis: int, s0: int, s1: int
           ) -> np.ndarray | None:
    """A scale or zero point for elements s0:s1 of x along ``axis``."""
    if v is None or v.ndim == 0 or spec.granularity == "per-tensor" or (
            spec.granularity == "per-axis" and spec.axis != axis):
        return v
    if spec.granularity == "per-axis":
        return v[s0:s1]
    index = [slice(None)] * v.ndim  # blocked: the scale has x's rank
    b = spec.block_size or 1
    index[axis] = slice(s0 // b, -(-s1 // b)) if spec.axis == axis else slice(s0, s1)
    return v[tuple(index)]
