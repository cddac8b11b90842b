"""The fold step the ai.onnx and com.microsoft Q/DQ families share: one kernel call per
node, built from the node's constant scale and zero point."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dqtool.registry.family import FoldSupport, Kernel

if TYPE_CHECKING:
    import numpy as np
    import onnx_ir as ir

    from dqtool.folding.kernel_call import KernelCall
    from dqtool.spec import QuantSpec


# Each hook imports what it needs when it is called: the registry is read by the codecs and
# the evaluator, below every family, so a family's top level imports none of the engines
# (dqtool/registry/family.py).

def run_dq(x: np.ndarray, scale: np.ndarray, zp: np.ndarray | None, step: KernelCall) -> np.ndarray:
    from dqtool import kernel

    return kernel.dequantize(x, scale, zp, axis=step.axis, block_size=step.block_size,
                             output_dtype=step.output_dtype)


def run_q(x: np.ndarray, scale: np.ndarray, zp: np.ndarray | None, step: KernelCall) -> np.ndarray:
    from dqtool import kernel

    return kernel.quantize(x, scale, zp, axis=step.axis, block_size=step.block_size,
                           output_dtype=step.output_dtype, saturate=step.saturate)


def params(node: ir.Node) -> tuple[ir.TensorProtocol, ir.TensorProtocol | None]:
    """The constant scale (input 1) and zero point (input 2, if any) of a Q/DQ node."""
    from dqtool import graph

    scale = graph.constant_tensor(graph.input_value(node, 1))
    zp_value = graph.input_value(node, 2)
    zp = graph.constant_tensor(zp_value) if zp_value is not None else None
    assert scale is not None  # the spec said constant
    return scale, zp


def fold_call(node: ir.Node, spec: QuantSpec, out: np.dtype | None) -> KernelCall:
    """The kernel call computing ``node``, a QuantizeLinear ("q") or a DequantizeLinear
    ("dq") of ai.onnx or com.microsoft (same inputs; axis defaults to 1 in both)."""
    from dqtool.codecs import base
    from dqtool.folding.kernel_call import KernelCall

    scale, zp = params(node)
    return KernelCall(
        kind="q" if node.op_type == "QuantizeLinear" else "dq", scale=scale, zero_point=zp,
        axis=base.attr_int(node, "axis", 1) or 0,
        block_size=base.attr_int(node, "block_size", 0) or 0,
        granularity=spec.granularity, norm_axis=spec.axis, output_dtype=out,
        saturate=spec.saturate if spec.saturate is not None else True,
    )


def fold_support() -> FoldSupport:
    """The ai.onnx and com.microsoft Q/DQ: a DequantizeLinear folds, computing a
    QuantizeLinear of constants first when one feeds it."""
    return FoldSupport(roots=frozenset({"DequantizeLinear"}),
                       kernels={"dq": Kernel(run_dq, elementwise=True), "q": Kernel(run_q)},
                       call=fold_call)
