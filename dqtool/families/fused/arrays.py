"""Reading a constant's values without keeping its data file mapped.

onnx_ir memory-maps an external tensor and keeps every page it touched resident (and in
the process's RSS) until the map is released; a conversion that reads hundreds of weights
that way ends up holding all of them. Here an external tensor is read with one
``np.fromfile`` into memory that is freed with the array.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from dqtool import graph, types
from dqtool.families.fused import packing


def tensor_array(t: ir.TensorProtocol) -> np.ndarray:
    shape = tuple(int(d) for d in t.shape)
    et = types.from_ir(t.dtype)
    readable = et is not None and (et.is_integer or et.name in ("float", "float16", "bfloat16"))
    if isinstance(t, ir.ExternalTensor) and readable:
        count = int(np.prod(shape, dtype=np.int64))
        if et.bits >= 8:
            arr = np.fromfile(t.path, dtype=et.dtype, count=count, offset=t.offset or 0)
            return arr.reshape(shape)
        raw = np.fromfile(t.path, dtype=np.uint8, count=(count * et.bits + 7) // 8,
                          offset=t.offset or 0)
        codes = packing.unpack(raw, et.bits)[:count]
        if et.signed:  # two's complement in ``bits`` bits
            codes = codes.astype(np.int8)
            codes[codes >= 1 << (et.bits - 1)] -= 1 << et.bits
        return codes.astype(et.dtype).reshape(shape)
    return t.numpy().reshape(shape)


def raw_bytes(t: ir.TensorProtocol) -> np.ndarray:
    """The stored bytes of a tensor (packed types packed), as uint8."""
    if isinstance(t, ir.ExternalTensor):
        return np.fromfile(t.path, dtype=np.uint8, count=t.length or -1, offset=t.offset or 0)
    return np.frombuffer(t.tobytes(), np.uint8)


def value_array(v: ir.Value) -> np.ndarray:
    t = graph.constant_tensor(v)
    assert t is not None, f"{v.name} is not constant"
    return tensor_array(t)
