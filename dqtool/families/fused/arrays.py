"""The fused family's reading of constants: ``dqtool.reading``'s (each weight on its own
map, nothing kept), and the same stored bytes seen as another packed type."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from dqtool import graph, inline_load
from dqtool.reading import constant_array, raw_bytes, tensor_array

__all__ = ["constant_array", "raw_bytes", "same_bytes", "tensor_array", "value_array"]


def value_array(v: ir.Value) -> np.ndarray:
    t = graph.constant_tensor(v)
    assert t is not None, f"{v.name} is not constant"
    return tensor_array(t)


def same_bytes(tensor: ir.TensorProtocol, dtype: ir.DataType, shape: tuple[int, ...]
               ) -> ir.TensorProtocol:
    """The stored bytes of ``tensor`` read as another packed type and shape (no copy when
    they live in a data file): uint8-packed 4-bit codes as uint4, and back."""
    if isinstance(tensor, ir.ExternalTensor):
        return ir.ExternalTensor(tensor.location, tensor.offset, tensor.length, dtype,
                                 shape=ir.Shape(shape), name=tensor.name,
                                 base_dir=tensor.base_dir)
    if isinstance(tensor, inline_load.MappedTensor):
        return tensor.retyped(dtype, ir.Shape(shape))
    raw = np.frombuffer(tensor.tobytes(), np.uint8)
    if ir.DataType(dtype).bitwidth == 8:
        return ir.Tensor(raw.reshape(shape), dtype=dtype, name=tensor.name)
    return ir.PackedTensor(raw, dtype, shape=shape)
