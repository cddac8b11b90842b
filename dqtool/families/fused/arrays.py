"""The fused family's reading of constants: ``dqtool.storage.tensor_reads``'s (each weight on its
own map, nothing kept), and the same stored bytes seen as another packed type."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from dqtool import graph
from dqtool.storage.tensor_reads import constant_array, raw_bytes, same_bytes, tensor_array

__all__ = ["constant_array", "raw_bytes", "same_bytes", "tensor_array", "value_array"]


def value_array(v: ir.Value) -> np.ndarray:
    t = graph.constant_tensor(v)
    assert t is not None, f"{v.name} is not constant"
    return tensor_array(t)
