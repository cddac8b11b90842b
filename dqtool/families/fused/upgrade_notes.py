"""What ``upgrade`` notes on the nodes it makes from a fused node (metadata keys), so that
``pack`` can give the original back: its width, accuracy level, bias, names, block size
and the bits of B past K."""

from __future__ import annotations

import json

import numpy as np
import onnx_ir as ir

from dqtool import graph
from dqtool.families.fused.spec import FusedSpec
from dqtool.families.fused.surgery import FusedBuilder

BITS_KEY = "dqtool.fused.bits"
# The original MatMulNBits' accuracy_level (> 0), on its DequantizeLinear: pack writes it
# back unless told another.
ACCURACY_KEY = "dqtool.fused.accuracy_level"
# On the bias Add made from a MatMulNBits' own bias input: pack takes this one back into
# the node (an Add that was in the original model stays an Add: a bias inside the node
# is summed in its own order, so outputs moved).
BIAS_KEY = "dqtool.fused.bias"
# The original node's name and its constant inputs' names (JSON, by role), on its
# DequantizeLinear: pack gives them back where they are free, so upgrade then pack gives
# back the original model's names too.
NAMES_KEY = "dqtool.fused.names"
# A MatMulNBits whose one block spans K (upgraded to per-axis): its block_size, which a
# per-axis weight does not say, where it is not what pack takes then (the smallest power
# of two >= K and >= 16).
BLOCK_KEY = "dqtool.fused.block_size"
# The bits of each row's last byte of B past K's last code (K·bits not a multiple of 8),
# one byte a row in hex, where any is not 0: onnxruntime's quantizer leaves codes there
# that no value reads, and pack puts them back so that B's bytes are the original's.
TAIL_KEY = "dqtool.fused.tail"
# role -> input index, of each fused op
NAME_ROLES = {"MatMulNBits": {"B": 1, "scales": 2, "zero_points": 3},
              "GatherBlockQuantized": {"data": 0, "scales": 2, "zero_points": 3}}


def note_original(node: ir.Node, spec: FusedSpec, b: FusedBuilder, y: ir.Value) -> None:
    """Write the notes of ``node`` (the fused original) on the nodes ``b`` made for it."""
    dqs = [n for n in b.nodes if n.op_type == "DequantizeLinear"]
    names = _names(node)
    if not dqs:  # a weight shared with a node before: the names go on this node's MatMul
        dqs = [n for n in b.nodes if n.op_type == "MatMul"][:1]
    tail = _tail(node, spec) if spec.op == "MatMulNBits" else None
    for dq in dqs:
        dq.metadata_props[NAMES_KEY] = names
        if spec.op == "MatMulNBits" and spec.accuracy_level > 0:
            dq.metadata_props[ACCURACY_KEY] = str(spec.accuracy_level)
        if spec.op == "MatMulNBits" and spec.k_blocks == 1 and \
                spec.block_size != max(16, 1 << (spec.x_shape[0] - 1).bit_length()):
            dq.metadata_props[BLOCK_KEY] = str(spec.block_size)
        if tail:
            dq.metadata_props[TAIL_KEY] = tail
    if spec.op == "MatMulNBits" and graph.input_value(node, 5) is not None:
        y.producer().metadata_props[BIAS_KEY] = "1"  # the Add made of the bias input


def tail_place(k: int, bits: int, block: int) -> tuple[int, int] | None:
    """(byte of a row of B holding K's last code, bit where the codes past K start), or
    None when K's codes end on a byte."""
    per = 8 // bits
    if k % per == 0:
        return None
    blob = block * bits // 8
    return (k - 1) // block * blob + (k - 1) % block // per, bits * (k % per)


def _tail(node: ir.Node, spec: FusedSpec) -> str | None:
    """``TAIL_KEY``'s note of a MatMulNBits, or None when there is nothing past K or only 0."""
    k, n = spec.x_shape
    place = tail_place(k, spec.bits, spec.block_size)
    bq = graph.input_value(node, 1)
    if place is None or bq is None or graph.constant_tensor(bq) is None:
        return None
    byte, shift = place
    rows = np.asarray(graph.constant_array(bq), np.uint8).reshape(n, -1)
    tail = rows[:, byte] >> shift
    return tail.astype(np.uint8).tobytes().hex() if tail.any() else None


def _names(node: ir.Node) -> str:
    """``NAMES_KEY``'s note: the node's name and its constant inputs' names, as JSON."""
    names: dict[str, str] = {"node": node.name or ""}
    if node.op_type == "GatherBlockQuantized":  # uint8-packed codes, or int4/uint4
        names["data_type"] = graph.elem_type(graph.input_value(node, 0)) or ""
    for role, i in NAME_ROLES[node.op_type].items():
        v = graph.input_value(node, i)
        if v is not None and v.name and v.is_initializer():
            names[role] = v.name
        elif v is not None and v.name and (holder := graph.constant_node(v)) is not None:
            # inside a function: a Constant node's output, and that node's own name
            names[role] = v.name
            names[f"{role}_node"] = holder.name or ""
    return json.dumps(names, sort_keys=True)
