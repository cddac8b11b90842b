"""What onnxruntime releases compute for the fused family where it is not the operator's
definition: data keyed by release, measured by this family's tests (never a timeless claim).

``G_IDX_OWN_PATH``: MatMulNBits with a ``g_idx`` input runs another dequantization in
these releases: integer zero points (packed uint8) are ignored (``2^(bits-1)`` is used), and
without zero points the weight is ``q·s - 2^(bits-1)·s``, which rounds differently from
``(q - 2^(bits-1))·s`` (1 ulp). With float zero points the node gives what it gives
without ``g_idx``. A ``g_idx`` that maps every row of K to its own block (``k //
block_size``) therefore cannot be dropped exactly unless the zero points are float: the
converted node would compute the definition where the original computed this.
"""

from __future__ import annotations

G_IDX_OWN_PATH: tuple[str, ...] = ("1.31", "1.32")  # measured on 1.31.1 and 1.32.0

# Releases whose CPU MatMulNBits refuses 8-bit codes with float zero points (HQQ's form at
# 8 bits): at session creation in 1.32.0, at run time in 1.31.1 (measured).
FLOAT_ZP_8BIT_REJECTED: tuple[str, ...] = ("1.31", "1.32")


def float_zp_8bit_reason() -> str:
    return ("onnxruntime's CPU kernel rejects 8-bit weights with float zero points "
            f"(measured on {', '.join(FLOAT_ZP_8BIT_REJECTED)})")


def g_idx_reason() -> str:
    """Why a MatMulNBits with a g_idx and integer (or no) zero points stays."""
    return ("g_idx with integer or no zero points: onnxruntime (measured on "
            f"{', '.join(G_IDX_OWN_PATH)}) computes such a node by its own path (zero points "
            "ignored, other rounding), not as the operator defines it, so no ai.onnx form "
            "gives the original's outputs")


def g_idx_refusal(g_idx: str, zero_point: str) -> str | None:
    """Why a MatMulNBits with this ``g_idx`` kind ("none", "trivial", "act-order",
    "unknown") and zero point kind ("none", "integer", "float") has no exact ai.onnx form,
    or None when it has one."""
    if g_idx == "act-order":
        return ("g_idx reorders rows of K across blocks (act-order): a blocked "
                "DequantizeLinear cannot express it without one scale per element")
    if g_idx == "unknown":
        return "g_idx is computed at run time"
    if g_idx == "trivial" and zero_point != "float":
        return g_idx_reason()
    return None
