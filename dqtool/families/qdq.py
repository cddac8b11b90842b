"""The fold step the three Q/DQ families share: one kernel call per node, built from the
node's constant scale and zero point (moved here from the fold planner, which no longer
knows any dialect)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from dqtool.families.base import FoldKernel, FoldSupport

if TYPE_CHECKING:
    import numpy as np
    import onnx_ir as ir

    from dqtool.folding.compute import Step
    from dqtool.spec import QuantSpec

# opmx attributes the kernel takes, in the order ``kernel.dequantize_opmx`` names them.
_OPMX_ATTRS = ("quant_data_type", "quant_axis", "group_size", "has_zeropoint",
               "float_zeropoint")


def run_dq(x: np.ndarray, scale: np.ndarray, zp: np.ndarray | None, step: Step) -> np.ndarray:
    from dqtool import kernel

    return kernel.dequantize(x, scale, zp, axis=step.axis, block_size=step.block_size,
                             output_dtype=step.output_dtype)


def run_q(x: np.ndarray, scale: np.ndarray, zp: np.ndarray | None, step: Step) -> np.ndarray:
    from dqtool import kernel

    return kernel.quantize(x, scale, zp, axis=step.axis, block_size=step.block_size,
                           output_dtype=step.output_dtype, saturate=step.saturate)


def run_opmx(x: np.ndarray, scale: np.ndarray, zp: np.ndarray | None,
             step: Step) -> np.ndarray:
    from dqtool import kernel

    return kernel.dequantize_opmx(x, scale, zp, **dict(step.opmx))


def step(node: ir.Node, spec: QuantSpec, out: np.dtype | None) -> Step:
    """The kernel call computing ``node`` (a Q or DQ of any of the three dialects)."""
    from dqtool import graph
    from dqtool.codecs import base
    from dqtool.folding.compute import Step

    kind = "opmx" if spec.domain in ("opmx", "pmx") else \
        "q" if node.op_type == "QuantizeLinear" else "dq"
    scale = graph.constant_tensor(graph.input_value(node, 1))
    zp_value = graph.input_value(node, 2)
    zp = graph.constant_tensor(zp_value) if zp_value is not None else None
    assert scale is not None  # the spec said constant
    opmx: tuple = ()
    if kind == "opmx":
        a = dict(spec.attributes)
        opmx = tuple((k, a[k]) for k in _OPMX_ATTRS)
        if not a["has_zeropoint"]:
            zp = None  # ignored by the op (the codec warns)
        out = None  # opmx outputs its scale's type, which its kernel infers
    return Step(
        kind=kind, scale=scale, zero_point=zp,
        axis=(base.attr_int(node, "axis", 1) or 0) if kind != "opmx" else 0,
        block_size=base.attr_int(node, "block_size", 0) or 0,
        granularity=spec.granularity, norm_axis=spec.axis, output_dtype=out,
        saturate=spec.saturate if spec.saturate is not None else True, opmx=opmx,
    )


def opmx_shape(source: tuple[int, ...], spec: QuantSpec) -> tuple[int, ...]:
    from dqtool.codecs.opmx import logical_shape

    return tuple(logical_shape(source, str(spec.attribute("quant_data_type"))))  # type: ignore[arg-type]


def fold_support(kernels: Mapping[str, FoldKernel], shape=None) -> FoldSupport:
    return FoldSupport(roots=frozenset({"DequantizeLinear"}), kernels=kernels, step=step,
                       shape=shape)
