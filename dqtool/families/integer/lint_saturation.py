"""DQ111: u8 activations × s8 weights that onnxruntime saturates on x86 CPUs without VNNI.

onnxruntime's u8 × s8 GEMM on x86 without VNNI (``vpmaddubsw``) adds each two adjacent
products along the reduction axis in int16 and saturates (entry ``u8s8-pair-saturation`` of
``dqtool.runtimes.code_paths``). With u8 codes up to 255, a pair of weights (2j, 2j+1) can
leave int16 exactly when its positive weights sum to 129 or more, or its negative weights
to -129 or less (255·128 = 32640 fits, 255·129 = 32895 does not; measured with
MatMulInteger on onnxruntime 1.32.0 under ``qemu-x86_64 -cpu Haswell``). The rule decides
from the weights, never from the machine it runs on. The reduction axis pairs:

* MatMulInteger, QLinearMatMul, MatMulIntegerToFloat, DynamicQuantizeMatMul: B's rows;
* QGemm: B's rows, or its columns with ``transB``;
* QLinearConv: each filter laid out kernel positions first, input channels innermost (a
  depthwise convolution is exact); QAttention and DynamicQuantizeLSTM: W's input rows;
* the QDQ patterns onnxruntime fuses into those kernels: a DequantizeLinear of uint8
  activations and one of a constant int8 weight feeding MatMul or Conv.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import onnx_ir as ir

from dqtool import graph
from dqtool.linting.context import ModelContext
from dqtool.linting.finding import Finding
from dqtool.linting.registry import define
from dqtool.runtimes import code_paths
from dqtool.runtimes.onnxruntime import target_release

CODE = "DQ111"
define(CODE, "u8s8-saturation", "warning",
       "u8 activations × s8 weights whose adjacent products onnxruntime saturates in int16 "
       "on x86 CPUs without VNNI",
       "node 'fc' (ai.onnx MatMulInteger): onnxruntime 1.32 on x86 without VNNI (AVX2) "
       "saturates u8×s8 pair sums in int16: 12 of 64 weight pairs along the reduction axis "
       "can leave int16 (largest 254, limit 128); fix: 7-bit weights (onnxruntime's "
       "reduce_range), uint8 weights, or int8 activations")

LIMIT = 128  # the largest pair sum of one sign that 255 times still fits in int16

# op -> (index of the u8 input, index of the s8 weight, the weight's reduction axis)
_INTEGER = {
    "MatMulInteger": (0, 1, -2), "QLinearMatMul": (0, 3, -2),
    "MatMulIntegerToFloat": (0, 1, -2), "DynamicQuantizeMatMul": (None, 1, -2),
    "QGemm": (0, 3, -2), "QLinearConv": (0, 3, None), "QAttention": (0, 1, 0),
    "DynamicQuantizeLSTM": (None, 1, -2),
}


def pairs_beyond(w: np.ndarray, axis: int) -> tuple[int, int, int]:
    """(pairs that can leave int16, pairs in all, the largest one-signed pair sum) of the
    int8 weight ``w`` paired along ``axis`` (odd length: the last pairs with zero)."""
    v = np.moveaxis(np.asarray(w, np.int64), axis, 0)
    if v.shape[0] % 2:
        v = np.concatenate([v, np.zeros((1, *v.shape[1:]), np.int64)])
    pos = np.maximum(v, 0)
    neg = np.minimum(v, 0)
    psum = pos[0::2] + pos[1::2]
    nsum = -(neg[0::2] + neg[1::2])
    worst = np.maximum(psum, nsum)
    return int((worst > LIMIT).sum()), int(worst.size), int(worst.max(initial=0))


def conv_pairs(w: np.ndarray, group: int) -> np.ndarray | None:
    """QLinearConv's weight as (K, M) columns in onnxruntime's window order, or None for a
    depthwise convolution (computed exactly)."""
    m, cg = w.shape[0], w.shape[1]
    if cg == 1 and m // max(group, 1) == 1:
        return None
    return np.moveaxis(w, 1, -1).reshape(m, -1).T


def _u8(v: ir.Value | None) -> bool:
    return v is not None and graph.elem_type(v) == "uint8"


def _weight(node: ir.Node, index: int) -> np.ndarray | None:
    v = node.inputs[index] if index < len(node.inputs) else None
    arr = graph.constant_array(v) if v is not None else None
    return None if arr is None or np.asarray(arr).dtype != np.int8 else np.asarray(arr)


def _dq_source(v: ir.Value | None) -> ir.Node | None:
    p = v.producer() if v is not None else None
    return p if p is not None and p.op_type == "DequantizeLinear" else None


def _candidate(node: ir.Node) -> tuple[np.ndarray, int] | None:
    """(the int8 weight as (K, …) with K on axis 0 or given, its axis) for an operator
    onnxruntime runs on its u8 × s8 GEMM, or None."""
    op = node.op_type
    if op in _INTEGER:
        a, b, axis = _INTEGER[op]
        if a is not None and not _u8(node.inputs[a] if a < len(node.inputs) else None):
            return None
        w = _weight(node, b)
        if w is None:
            return None
        if op == "QGemm" and node.attributes.get_int("transB", 0):
            axis = -1
        if op == "QLinearConv":
            cols = conv_pairs(w, node.attributes.get_int("group", 1))
            return None if cols is None else (cols, 0)
        return w, axis
    if op in ("MatMul", "Conv") and len(node.inputs) >= 2:
        x, wdq = _dq_source(node.inputs[0]), _dq_source(node.inputs[1])
        if x is None or wdq is None or not _u8(x.inputs[0]):
            return None
        w = _weight(wdq, 0)
        if w is None:
            return None
        if op == "Conv":
            cols = conv_pairs(w, node.attributes.get_int("group", 1))
            return None if cols is None else (cols, 0)
        return w, -2
    return None


def target_findings(ctx: ModelContext, target: str) -> Iterator[Finding]:
    release = target_release(target)
    if release is None or code_paths.entry("u8s8-pair-saturation", release) is None:
        return
    for site in ctx.sites:
        node = site.node
        found = _candidate(node)
        if found is None:
            continue
        w, axis = found
        if w.ndim < 2 and axis != 0:
            continue
        beyond, total, worst = pairs_beyond(w, axis)
        if not beyond:
            continue
        where = node.name or f"<unnamed {node.op_type}>"
        domain = graph.domain_name(node.domain)
        fix = ("7-bit weights (onnxruntime's quantizer: reduce_range=True), uint8 weights, "
               "or int8 activations (exact on every CPU); or deploy on CPUs with VNNI")
        message = (f"{ctx.path}: node '{where}' ({domain} {node.op_type}): onnxruntime "
                   f"{release} on x86 without VNNI (AVX2) saturates u8×s8 pair sums in int16: "
                   f"{beyond} of {total} weight pairs along the reduction axis can leave "
                   f"int16 (largest {worst}, limit {LIMIT}); fix: {fix}")
        yield Finding(CODE, "warning", message, ctx.path, where, site.graph,
                      f"{domain}:{node.op_type}", target, fix)
