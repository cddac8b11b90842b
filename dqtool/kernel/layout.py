"""Granularity of a (de)quantization, decided from the scale's shape, and its validation.

The order of the checks is onnxruntime's (``PrepareForQDQ``), so the kernel accepts exactly
what onnxruntime accepts:

1. a scalar or a 1-D scale of length 1 is **per-tensor**; ``axis`` is then ignored (ONNX says
   so, and e.g. opset-13 models with a rank-1 ``x`` and the default ``axis=1`` rely on it).
   With ``block_size > 0`` onnxruntime refuses it; we accept it only when it is also a valid
   blocked layout (rank-1 x, one block), which computes the same thing;
2. otherwise, ``block_size == 0`` means **per-axis**: the scale must be 1-D of length
   ``x.shape[axis]``;
3. otherwise (``block_size > 0``) it is **blocked**: the scale has x's rank and x's shape except
   on ``axis``, where it is ``ceil(x.shape[axis] / block_size)``; the last block may be shorter.

Everything is then described on a 3-D view ``(P, D, Q)`` of x, where ``D`` is the axis, with a
scale of shape ``(P or 1, NB, Q or 1)`` and block size ``BS`` (per-axis is ``BS = 1``,
``NB = D`` and scale ``(1, D, 1)``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import KernelError


@dataclass(frozen=True)
class AxisView:
    kind: str  # "per-tensor" | "per-axis" | "blocked"
    p: int  # product of the dims before the axis
    d: int  # the axis' length
    q: int  # product of the dims after the axis
    bs: int  # elements of the axis that share one scale
    scale_shape3: tuple[int, int, int]  # the scale viewed in 3-D

    def scale3(self, a: np.ndarray) -> np.ndarray:
        return a.reshape(self.scale_shape3)


def _shapes(x: np.ndarray, scale: np.ndarray, zp: np.ndarray | None) -> str:
    zps = "" if zp is None else f", zero point shape {zp.shape}"
    return f"(x shape {x.shape}, scale shape {scale.shape}{zps})"


def normalize_axis(axis: int, rank: int) -> int | None:
    """``axis`` counted from the front of a shape of rank ``rank``; None outside
    [-rank, rank - 1] (a scalar has no axis)."""
    return axis % rank if -rank <= axis < rank else None


def _axis(axis: int, rank: int) -> int:
    norm = normalize_axis(axis, rank)
    if norm is None:
        raise KernelError(f"axis must be in [-r, r-1] for x of rank r={rank}; got axis={axis}")
    return norm


def is_per_tensor(a: np.ndarray) -> bool:
    return a.ndim == 0 or (a.ndim == 1 and a.shape[0] == 1)


def _check_single_block(
    x: np.ndarray, scale: np.ndarray, zp: np.ndarray | None, axis: int, block_size: int
) -> None:
    """A 1-element scale with block_size > 0 is fine only as a blocked layout of one block.

    onnxruntime rejects every 1-element scale with block_size > 0 ("block_size must be 0 for
    per-tensor quantization"); the spec allows it when it is a valid blocked layout (x of rank
    1 no longer than the block), where it means the same as per-tensor. We accept exactly that.
    """
    if x.ndim == 0 or scale.ndim != x.ndim:
        raise KernelError(
            f"block_size={block_size} with a 1-element scale: blocked needs the scale to have "
            f"x's rank (onnxruntime rejects any block_size > 0 here) {_shapes(x, scale, zp)}"
        )
    ax = _axis(axis, x.ndim)
    if -(-x.shape[ax] // block_size) != 1:
        raise KernelError(
            f"blocked (block_size={block_size}, axis={axis}): the scale shape must be "
            f"(ceil({x.shape[ax]}/{block_size}),) {_shapes(x, scale, zp)}"
        )


def resolve(
    x: np.ndarray,
    scale: np.ndarray,
    zp: np.ndarray | None,
    axis: int,
    block_size: int,
) -> AxisView:
    """Check the shapes against the operator's rules and describe the granularity."""
    if block_size < 0:
        raise KernelError(f"block_size must be >= 0; got {block_size} {_shapes(x, scale, zp)}")
    if is_per_tensor(scale):
        if block_size > 0:
            _check_single_block(x, scale, zp, axis, block_size)
        # onnxruntime lets a per-tensor zero point be () or (1,) independently of the scale.
        if zp is not None and not is_per_tensor(zp):
            raise KernelError(
                "per-tensor: a scalar (or 1-element 1-D) scale needs a scalar (or 1-element "
                f"1-D) zero point {_shapes(x, scale, zp)}"
            )
        return AxisView("per-tensor", 1, x.size, 1, max(x.size, 1), (1, 1, 1))
    if zp is not None and zp.shape != scale.shape:
        raise KernelError(f"zero point shape must equal scale shape {_shapes(x, scale, zp)}")
    if x.ndim == 0:
        raise KernelError(
            "a scalar x allows only a per-tensor (scalar or 1-element) scale "
            f"{_shapes(x, scale, zp)}"
        )
    ax = _axis(axis, x.ndim)
    p, d, q = math.prod(x.shape[:ax]), x.shape[ax], math.prod(x.shape[ax + 1 :])
    if block_size == 0:
        if scale.ndim != 1 or scale.shape[0] != d:
            raise KernelError(
                f"per-axis (block_size=0): the scale must be 1-D of length x.shape[axis]="
                f"{d} (axis={axis}) {_shapes(x, scale, zp)}"
            )
        return AxisView("per-axis", p, d, q, 1, (1, d, 1))
    if scale.ndim != x.ndim:
        raise KernelError(
            f"blocked (block_size={block_size}): the scale must have x's rank {x.ndim} "
            f"{_shapes(x, scale, zp)}"
        )
    nb = -(-d // block_size)
    want = (*x.shape[:ax], nb, *x.shape[ax + 1 :])
    if scale.shape != want:
        raise KernelError(
            f"blocked (block_size={block_size}, axis={axis}): the scale shape must be {want} "
            f"(x's shape with ceil({d}/{block_size})={nb} on the axis) {_shapes(x, scale, zp)}"
        )
    return AxisView("blocked", p, d, q, block_size, (p, nb, q))
