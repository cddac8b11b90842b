"""Reading a node's scale / zero point / x as arrays, and laying them out against x.

Only rewrites call these; a constant's values (``graph.constant_array``) are read inside a
``LazyTensor`` compute function (at save time), never while planning.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from dqtool import graph
from dqtool.spec import QuantSpec


def const_shape(v: ir.Value) -> tuple[int, ...]:
    """A constant's shape, from its tensor (always known, unlike value_info)."""
    tensor = graph.constant_tensor(v)
    assert tensor is not None, f"{v.name} is not constant"
    return tuple(int(d) for d in tensor.shape)


def static_shape(shape) -> tuple[int, ...] | None:
    if shape is None or not all(isinstance(d, int) for d in shape):
        return None
    return tuple(shape)


def broadcastable(p: np.ndarray, spec: QuantSpec, x_shape: tuple[int, ...]) -> np.ndarray:
    """A scale or zero point reshaped/repeated so that it broadcasts against x."""
    rank = len(x_shape)
    if spec.granularity == "per-tensor" or (p.size == 1 and spec.granularity != "blocked"):
        return p.reshape(())
    if spec.granularity == "per-axis":
        shape = [1] * rank
        shape[spec.axis] = p.size
        return p.reshape(shape)
    # blocked: repeat every block, cut the ragged tail
    a, b = spec.axis, spec.block_size
    return np.take(np.repeat(p, b, axis=a), np.arange(x_shape[a]), axis=a)
