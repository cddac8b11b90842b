"""Kernel tests: one-node models run in onnxruntime, and bit-for-bit comparison."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper

from dqtool import types as dt

from .build import node_model, onnx_type
from .fold import run_ort


def run_ort_node(model: onnx.ModelProto) -> np.ndarray:
    """The output of a model without inputs, on onnxruntime (ORT_DISABLE_ALL)."""
    return run_ort(model, {})[0]


def ort_dequantize(
    x: np.ndarray,
    scale: np.ndarray,
    zp: np.ndarray | None = None,
    *,
    opset: int = 23,
    out_dtype: np.dtype | None = None,
    **attrs: Any,
) -> np.ndarray:
    out = np.dtype(out_dtype) if out_dtype is not None else scale.dtype
    if out_dtype is not None:
        attrs["output_dtype"] = onnx_type(out)
    m = node_model("DequantizeLinear", {"x": x, "s": scale, "zp": zp}, out, opset=opset, **attrs)
    return run_ort_node(m)


def ort_quantize(
    x: np.ndarray,
    scale: np.ndarray,
    zp: np.ndarray | None = None,
    *,
    opset: int = 23,
    out_dtype: np.dtype | None = None,
    **attrs: Any,
) -> np.ndarray:
    out = np.dtype(out_dtype) if out_dtype is not None else (
        zp.dtype if zp is not None else np.dtype(np.uint8)
    )
    if out_dtype is not None and zp is None:
        attrs["output_dtype"] = onnx_type(out)
    m = node_model("QuantizeLinear", {"x": x, "s": scale, "zp": zp}, out, opset=opset, **attrs)
    if out.itemsize == 1 and out.kind == "V" and dt.from_dtype(out).is_integer:
        # onnxruntime's Python API cannot return int4/uint4: cast to a byte type in the graph.
        wide = np.dtype(np.int8 if dt.from_dtype(out).signed else np.uint8)
        g = m.graph
        g.node[0].output[0] = "q"
        g.node.append(helper.make_node("Cast", ["q"], ["y"], to=onnx_type(wide)))
        g.output[0].type.tensor_type.elem_type = onnx_type(wide)
        return run_ort_node(m).astype(out)
    return run_ort_node(m)


def bits(a: np.ndarray) -> np.ndarray:
    """The raw bit patterns (for bit-identity comparisons, NaN included)."""
    a = np.ascontiguousarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def assert_bits_equal(got: np.ndarray, want: np.ndarray, context: str = "") -> None:
    assert got.dtype == want.dtype, f"{context}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"{context}: shape {got.shape} != {want.shape}"
    g, w = bits(got), bits(want)
    if np.array_equal(g, w):
        return
    # Any NaN matches any NaN (payloads are not part of the contract) ...
    if got.dtype.kind == "f" or got.dtype.itemsize <= 2:
        gn = np.isnan(got.astype(np.float32))
        wn = np.isnan(want.astype(np.float32))
        if np.array_equal(gn, wn) and np.array_equal(g[~gn], w[~wn]):
            return
    bad = np.flatnonzero(g.ravel() != w.ravel())
    i = bad[0]
    raise AssertionError(
        f"{context}: {bad.size} of {g.size} differ; first at {i}: "
        f"got {got.ravel()[i]!r} (0x{int(g.ravel()[i]):x}) want {want.ravel()[i]!r} "
        f"(0x{int(w.ravel()[i]):x})"
    )
