"""Granularity from shapes: how a Mul's scale (and a Sub's zero point) broadcast over the
codes, said as a DequantizeLinear layout (``docs/handwritten.md#granularity``).

Pure functions of shapes; nothing here reads tensor data.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from dqtool.spec import Granularity

Shape = tuple[int, ...]


@dataclass(frozen=True)
class ScaleLayout:
    """A DequantizeLinear layout over codes of ``shape``: the scale's (and zero point's)
    shape is ``param_shape``."""

    granularity: Granularity
    shape: Shape  # the codes' (and the output's) shape
    axis: int | None = None
    block_size: int | None = None

    @property
    def param_shape(self) -> Shape:
        if self.granularity == "per-tensor":
            return ()
        assert self.axis is not None
        if self.granularity == "per-axis":
            return (self.shape[self.axis],)
        assert self.block_size
        return tuple(-(-d // self.block_size) if i == self.axis else d
                     for i, d in enumerate(self.shape))


def reshape_target(in_shape: Shape, target: Sequence[int], allowzero: bool) -> Shape | None:
    """The shape Reshape gives (0 copies the input's dimension unless ``allowzero``; one -1
    is inferred); None when the sizes do not match."""
    dims = [in_shape[i] if (d == 0 and not allowzero and i < len(in_shape)) else int(d)
            for i, d in enumerate(target)]
    total = math.prod(in_shape)
    if dims.count(-1) > 1 or any(d < -1 for d in dims):
        return None
    if -1 in dims:
        known = math.prod(d for d in dims if d != -1)
        if known == 0 or total % known:
            return None
        dims[dims.index(-1)] = total // known
    return tuple(dims) if math.prod(dims) == total else None


def aligned(x_shape: Shape, p_shape: Shape) -> Shape | None:
    """``p_shape`` left-padded with 1s to ``x_shape``'s rank, when it broadcasts into
    ``x_shape`` without growing it (each dimension 1 or x's); else None."""
    if len(p_shape) > len(x_shape):
        if any(d != 1 for d in p_shape[:len(p_shape) - len(x_shape)]):
            return None
        p_shape = p_shape[len(p_shape) - len(x_shape):]
    p = (1,) * (len(x_shape) - len(p_shape)) + tuple(p_shape)
    if any(d not in (1, x) for d, x in zip(p, x_shape, strict=True)):
        return None
    return p


def combine(x_shape: Shape, *params: Shape) -> Shape:
    """The aligned shape over which every one of ``params`` (aligned already) is
    constant: a dimension is x's where any parameter varies along it."""
    return tuple(x if any(p[i] != 1 for p in params) else 1
                 for i, x in enumerate(x_shape))


def infer(x_shape: Shape, p: Shape) -> ScaleLayout | str:
    """The layout of an aligned parameter shape ``p`` over ``x_shape``, or why none is.

    Per-tensor when nothing varies; per-axis when one dimension of size > 1 varies;
    blocked (21+) when the parameter is x's shape except one dimension where it is 1 (a
    block is that whole dimension: the form a ``Reshape`` to ``(…, blocks, block)`` makes);
    an elementwise parameter is blocked with block size 1 along the last axis.
    """
    real = [i for i in range(len(x_shape)) if p[i] != 1]
    shared = [i for i in range(len(x_shape)) if p[i] == 1 and x_shape[i] > 1]
    if not real:
        return ScaleLayout("per-tensor", x_shape)
    if len(real) == 1:
        return ScaleLayout("per-axis", x_shape, axis=real[0])
    if not shared:  # a scale per element
        return ScaleLayout("blocked", x_shape, axis=len(x_shape) - 1, block_size=1)
    if len(shared) == 1:
        b = shared[0]
        return ScaleLayout("blocked", x_shape, axis=b, block_size=x_shape[b])
    return (f"the scale varies along axes {real} of the codes {list(x_shape)} and is shared "
            f"along {shared}: a DequantizeLinear scale follows one axis or blocks along one")


def merged(layout: ScaleLayout, y_shape: Shape) -> ScaleLayout | None:
    """``layout`` said over ``y_shape``, the shape a ``Reshape`` after the Mul gives, when
    that Reshape keeps the layout: per-tensor always; per-axis when the axis survives as a
    dimension; blocked (axis b, block = the whole dimension b) when the Reshape merges
    dimension b into the one before it, which makes blocks of ``x[b]`` along that merged
    axis. None otherwise (the Reshape then stays after the DequantizeLinear)."""
    x = layout.shape
    if layout.granularity == "per-tensor":
        return ScaleLayout("per-tensor", y_shape)
    assert layout.axis is not None
    a = layout.axis
    if layout.granularity == "per-axis":
        for j, d in enumerate(y_shape):
            if d == x[a] and math.prod(y_shape[:j]) == math.prod(x[:a]):
                return ScaleLayout("per-axis", y_shape, axis=j)
        return None
    if layout.block_size != x[a] or a == 0:
        return None
    want = (*x[:a - 1], x[a - 1] * x[a], *x[a + 1:])
    if tuple(y_shape) != want:
        return None
    return ScaleLayout("blocked", want, axis=a - 1, block_size=x[a])
