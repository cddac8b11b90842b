"""The ai.onnx types of fused codes, and the constants ``upgrade`` makes of them: default zero
points packed as ai.onnx packs them, a constant's stored bytes read as its transpose."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from dqtool import graph
from dqtool.storage import same_bytes

IR_CODE = {"uint2": ir.DataType.UINT2, "uint4": ir.DataType.UINT4, "uint8": ir.DataType.UINT8,
           "int4": ir.DataType.INT4}


def stored_transpose(made: ir.Value, stored: ir.Value, shape: tuple[int, int]) -> None:
    """Say that ``made`` (a new constant) is ``stored``'s bytes read as ``made``'s type and
    ``shape``, transposed: a rewrite that wants ``made``'s transpose (blocked → per-axis
    rows: B's own rows) takes the stored bytes as they are (``transposed``), where it would
    transpose the transpose back."""
    t, source = graph.constant_tensor(made), graph.constant_tensor(stored)
    if t is not None and source is not None:
        dtype = t.dtype
        t.transposed = lambda: same_bytes(source, dtype, shape)  # type: ignore[attr-defined]


def default_zero_points(code: int, bits: int, shape: tuple[int, ...],
                        dtype: ir.DataType) -> ir.PackedTensor:
    """``code`` everywhere in a packed 2/4-bit tensor: its packed byte, repeated (the bytes
    ``packing.pack`` gives; the last byte's unused slots stay 0)."""
    count = int(np.prod(shape))
    byte = sum(code << (bits * j) for j in range(8 // bits))
    packed = np.full(-(-count * bits // 8), byte, np.uint8)
    if count * bits % 8:
        packed[-1] &= (1 << (count * bits % 8)) - 1
    return ir.PackedTensor(packed, dtype, shape=shape)
