"""What reports say about a fused node: bytes stored vs folded, the ai.onnx opset its
DequantizeLinear form needs, and the JSON fields QuantSpec does not have."""

from __future__ import annotations

from typing import Any

from dqtool import graph
from dqtool.families.fused import ort_facts
from dqtool.families.fused.spec import FusedSpec
from dqtool.families.fused.to_onnx import needed_opset


def lowest_onnx_opset(spec: FusedSpec) -> int | None:
    """The lowest ai.onnx opset ``upgrade`` can rewrite this node at, None if none can."""
    if spec.errors or spec.quant_type is None \
            or ort_facts.g_idx_refusal(spec.g_idx, spec.zero_point) is not None:
        return None
    if spec.quant_type == "uint8" and not spec.constant and spec.granularity == "blocked":
        return 21  # only a constant weight can be laid out as per-axis rows
    return needed_opset(spec)


def bytes_of(spec: FusedSpec) -> tuple[int | None, int | None]:
    """Bytes stored (codes + scales + zero points) and once folded to the float type."""
    if not spec.x_constant:
        return None, None
    codes = graph.stored_bytes("uint8", spec.stored_shape) if spec.op == "MatMulNBits" \
        else graph.stored_bytes(spec.quant_type if spec.packing == "none" else "uint8",
                                spec.stored_shape)
    scales = graph.stored_bytes(spec.scale_type, spec.scale_shape)
    zp = 0
    if spec.zero_point != "none":
        n = graph.num_elements(spec.scale_shape)
        bits = spec.bits or 8
        if n is None:
            zp = None
        elif spec.zero_point == "float":
            zp = graph.stored_bytes(spec.zero_point_type, spec.scale_shape)
        elif spec.zero_point_packed:  # uint8 bytes, each row of blocks padded to a byte
            last = spec.k_blocks if spec.op == "MatMulNBits" else \
                (spec.scale_shape or (None,))[-1]
            zp = None if not isinstance(last, int) or not last else \
                n // last * ((last * bits + 7) // 8)
        else:
            zp = (n * bits + 7) // 8
    stored = None if None in (codes, scales, zp) else codes + scales + zp
    return stored, graph.stored_bytes(spec.float_type, spec.x_shape)


def json_extras(spec: FusedSpec) -> dict[str, Any]:
    return {
        "kind": "fused",
        "bits": spec.bits,
        "zero_point_packed": spec.zero_point_packed,
        "default_zero_point": spec.default_zero_point,
        "stored_shape": None if spec.stored_shape is None else list(spec.stored_shape),
        "g_idx": spec.g_idx,
        "has_bias": spec.has_bias,
        "accuracy_level": spec.accuracy_level,
        "gather_axis": spec.gather_axis,
    }


def weight_bytes(node) -> int:
    """The bytes of a fused node's constant weight (its codes), 0 if it has none; reads no
    tensor data."""
    if not node.inputs:
        return 0
    tensor = graph.constant_tensor(node.inputs[1 if node.op_type == "MatMulNBits" else 0])
    return tensor.nbytes if tensor is not None else 0
