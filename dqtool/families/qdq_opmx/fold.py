"""How an opmx DequantizeLinear folds: one call of ``kernel.dequantize_opmx`` on the whole
packed tensor (four rows per int16, groups on either axis: rows are never computed alone)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dqtool import kernel
from dqtool.codecs import base
from dqtool.codecs.opmx import logical_shape
from dqtool.families import qdq
from dqtool.folding.kernel_call import KernelCall
from dqtool.registry.family import FoldSupport, Kernel

if TYPE_CHECKING:
    import numpy as np
    import onnx_ir as ir

    from dqtool.folding.kernel_call import KernelCall
    from dqtool.spec import QuantSpec

# The attributes the kernel takes, in the order ``kernel.dequantize_opmx`` names them.
_ATTRS = ("quant_data_type", "quant_axis", "group_size", "has_zeropoint", "float_zeropoint")


def run(x: np.ndarray, scale: np.ndarray, zp: np.ndarray | None, step: KernelCall) -> np.ndarray:
    return kernel.dequantize_opmx(x, scale, zp, **dict(step.opmx))


def fold_call(node: ir.Node, spec: QuantSpec, out: np.dtype | None) -> KernelCall:
    scale, zp = qdq.params(node)
    a = dict(spec.attributes)
    if not a["has_zeropoint"]:
        zp = None  # ignored by the op (the codec warns)
    # No output type: opmx outputs its scale's type, which its kernel infers.
    return KernelCall(kind="opmx", scale=scale, zero_point=zp, axis=0,
                block_size=base.attr_int(node, "block_size", 0) or 0,
                granularity=spec.granularity, norm_axis=spec.axis, output_dtype=None,
                opmx=tuple((k, a[k]) for k in _ATTRS))


def shape(source: tuple[int, ...], spec: QuantSpec) -> tuple[int, ...]:
    """The unpacked shape: int4 holds four rows per int16."""
    return tuple(logical_shape(source, str(spec.attribute("quant_data_type"))))  # type: ignore[arg-type]


def fold_support() -> FoldSupport:
    return FoldSupport(roots=frozenset({"DequantizeLinear"}),
                       kernels={"opmx": Kernel(run, sliceable=False)}, call=fold_call, shape=shape)
