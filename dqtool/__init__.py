"""dqtool: inspect, convert, fold, check and lint the dequantization nodes of ONNX models.

The public API is imported lazily so that ``import dqtool`` stays cheap and a command
such as ``fold`` never imports onnxruntime.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it, imported when the name is first read.
_API = {
    "DqtoolError": "dqtool.errors",
    "InputError": "dqtool.errors",
    "RefusedError": "dqtool.errors",
    "KernelError": "dqtool.errors",
    "dequantize": "dqtool.kernel",
    "quantize": "dqtool.kernel",
    "dequantize_opmx": "dqtool.kernel",
    "dequantize_ms": "dqtool.kernel",
    "dequantize_matmul_nbits": "dqtool.families.fused.kernel",
    "dequantize_gather_block_quantized": "dqtool.families.fused.kernel",
    "quantize_ms": "dqtool.kernel",
    "unpack_opmx_int4": "dqtool.kernel",
    "reference_evaluator": "dqtool.evaluator",
    "QuantSpec": "dqtool.spec",
    "read_node": "dqtool.codecs",
    "load": "dqtool.storage",
    "save": "dqtool.storage",
    "inspect": "dqtool.inspection",
    "upgrade": "dqtool.convert",
    "downgrade": "dqtool.convert",
    "pack": "dqtool.fused.pack_api",
    "fold": "dqtool.folding",
    "check": "dqtool.checking",
    "lint": "dqtool.linting",
}


def __getattr__(name: str) -> Any:
    if name == "__all__":
        return sorted(_API)
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'dqtool' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
