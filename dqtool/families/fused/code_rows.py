"""MatMulNBits' B as the ``(K, N)`` codes a fold reads, a band of K rows at a time.

A fold streams its output in bands of rows; given this tensor as x it asks for just the
rows of a band (``rows``), so each band transposes only the columns of B it covers, in
cache, instead of the whole weight being transposed and unpacked first (and again for the
fold's validation of its first rows). B's bytes are read once and kept until the fold
releases the tensor (``release_rows``). As a whole (``numpy()``) it is the same codes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import onnx_ir as ir

from dqtool.families.fused import packing

if TYPE_CHECKING:  # (importing dqtool.folding cost `upgrade` ~7 ms before its first write)
    from dqtool.folding.by_table import PackedRows


class CodeRows(ir.LazyTensor):
    """Codes ``(rows, n)`` (one per byte, viewed as ``dtype``) of B ``(n, blocks, blob)``."""

    def __init__(self, read_b: Callable[[], np.ndarray], rows: int, n: int, bits: int,
                 dtype: ir.DataType, name: str | None = None) -> None:
        self._read_b = read_b
        self._b: np.ndarray | None = None
        self.n_rows, self.n, self.bits = rows, n, bits
        super().__init__(lambda: ir.Tensor(self.rows(0, rows), dtype=dtype), dtype=dtype,
                         shape=ir.Shape((rows, n)), name=name)

    def _bytes(self) -> np.ndarray:
        if self._b is None:
            self._b = np.asarray(self._read_b(), np.uint8).reshape(self.n, -1)
        return self._b

    def rows(self, r0: int, r1: int) -> np.ndarray:
        """Rows ``r0:r1`` of the codes (K rows of B's transpose)."""
        per = 8 // self.bits
        b = self._bytes()
        view = self.dtype.numpy()
        if self.bits == 8:
            return np.ascontiguousarray(b[:, r0:r1].T).view(view)
        if self.n * self.bits % 8 == 0 and r0 % per == 0 and (r1 % per == 0
                                                               or r1 == self.n_rows):
            lo, hi = r0 // per, -(-r1 // per)
            packed = packing.transpose_codes(b[:, lo:hi], self.n, (hi - lo) * per, self.bits)
            codes = packing.unpack(packed[: r1 - r0], self.bits)
        else:  # rows that do not start on a byte: the whole transpose, then the rows
            raw = packing.nbits_to_onnx(b, self.n_rows, self.n, self.bits)
            codes = packing.unpack(raw, self.bits)[: self.n_rows * self.n]
            codes = codes.reshape(self.n_rows, self.n)[r0:r1]
        return np.ascontiguousarray(codes).view(view)

    def packed_rows(self, r0: int, r1: int) -> PackedRows | None:
        """Rows ``r0:r1`` of 2- or 4-bit codes transposed but still packed (for a fold by
        table, which reads them as they are); None where ``rows`` must unpack first."""
        # Imported here: dqtool.folding cost `upgrade` ~7 ms before its first write.
        from dqtool.folding.by_table import PackedRows

        per = 8 // self.bits
        if self.bits == 8 or self.n * self.bits % 8 or r0 % per or (
                r1 % per and r1 != self.n_rows):
            return None
        lo, hi = r0 // per, -(-r1 // per)
        packed = packing.transpose_codes(self._bytes()[:, lo:hi], self.n, (hi - lo) * per,
                                         self.bits)
        return PackedRows(np.ascontiguousarray(packed[: r1 - r0]), self.n, self.bits,
                          self.dtype.numpy())

    def release_rows(self) -> None:
        """Forget B's bytes (the fold of this weight is done)."""
        self._b = None
