"""One kernel call of a fold (``registry.FoldCall``): the kernel a family names, and the
node's quantization parameters, sliced to the rows a chunk computes."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx_ir as ir

from dqtool import registry


@dataclass(frozen=True)
class KernelCall:
    """One kernel call: ``kind`` names a fold kernel of a registered family
    (``dqtool.families.fold_kernel``): "q", "dq" and "opmx" for the Q/DQ families."""

    kind: str
    scale: ir.TensorProtocol
    zero_point: ir.TensorProtocol | None
    axis: int  # the node's attribute as written (the kernel normalizes it)
    block_size: int
    granularity: str | None  # from the spec; decides how parameters follow a row slice
    norm_axis: int | None
    output_dtype: np.dtype | None = None
    saturate: bool = True
    opmx: tuple[tuple[str, Any], ...] = ()
    # The kernel ``kind`` names, bound when planned (a folded value computes at save time,
    # whatever the registry holds by then); None: looked up by name.
    kernel: registry.FoldKernel | None = None

    def _kernel(self) -> registry.FoldKernel:
        return self.kernel if self.kernel is not None else registry.fold_kernel(self.kind)

    def row_align(self) -> int | None:
        """Rows a chunk must be a multiple of, or None when rows cannot be sliced."""
        if not self._kernel().sliceable:
            return None
        if self.granularity == "blocked" and self.norm_axis == 0:
            return self.block_size
        return 1

    def arrays(self) -> tuple[np.ndarray, np.ndarray | None]:
        """The whole scale and zero point."""
        return load(self.scale), None if self.zero_point is None else load(self.zero_point)

    def params(self, r0: int | None, r1: int | None,
               loaded: tuple[np.ndarray, np.ndarray | None] | None = None
               ) -> tuple[np.ndarray, np.ndarray | None]:
        """The scale and zero point for output rows r0:r1 (all rows when None);
        ``loaded``: ``arrays()`` read before."""
        scale, zp = loaded if loaded is not None else self.arrays()
        if r0 is None or r1 is None:
            return scale, zp
        if self.granularity == "per-axis" and self.norm_axis == 0:
            sl = slice(r0, r1)
        elif self.granularity == "blocked" and self.norm_axis == 0:
            sl = slice(r0 // self.block_size, -(-r1 // self.block_size))
        elif self.granularity == "blocked":
            sl = slice(r0, r1)  # same rank as x: dim 0 follows x's rows
        else:
            return scale, zp
        return scale[sl], None if zp is None else zp[sl]

    def run(self, x: np.ndarray, r0: int | None, r1: int | None,
            loaded: tuple[np.ndarray, np.ndarray | None] | None = None) -> np.ndarray:
        scale, zp = self.params(r0, r1, loaded)
        return self._kernel()(x, scale, zp, self)


_LOADING = threading.Lock()


def load(t: ir.TensorProtocol) -> np.ndarray:
    if isinstance(t, ir.LazyTensor):
        return t.numpy()
    with _LOADING:
        return t.numpy()
