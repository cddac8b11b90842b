"""Apply a per-block operand (scale or zero point) to one chunk of a ``(P, D, Q)`` problem."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .parallel import Chunk


def split_axis(a: np.ndarray, axis: int, k: int, n: int) -> np.ndarray:
    """View ``a`` with ``axis`` split into ``(k, n)``; never copies (raises if it would)."""
    v = a.view()
    v.shape = (*a.shape[:axis], k, n, *a.shape[axis + 1 :])
    return v


def _squeezed(op: Callable[..., np.ndarray], dst: np.ndarray, operand: np.ndarray) -> None:
    # Drop the length-1 axes of dst (operand is 1 there too) so NumPy's inner loop runs over
    # the longest contiguous run instead of a length-1 axis.
    axes = tuple(i for i, n in enumerate(dst.shape) if n == 1)
    if axes and len(axes) < dst.ndim:
        dst = dst.squeeze(axes)
        operand = operand.squeeze(axes)
    op(dst, operand, out=dst)


def apply_blockwise(
    op: Callable[..., np.ndarray],
    dst3: np.ndarray,
    operand3: np.ndarray,
    chunk: Chunk,
    bs: int,
) -> None:
    """``dst3 = op(dst3, operand expanded along D in blocks of bs)`` for one chunk.

    ``dst3`` is the chunk ``(p1-p0, d1-d0, q1-q0)``; ``operand3`` is the whole operand
    ``(P or 1, NB, Q or 1)``. Whole blocks go through one broadcast call; a chunk edge that
    cuts a block (and the ragged last block) goes through one call per partial block.
    """
    p0, p1, d0, d1, q0, q1 = chunk
    ps = slice(p0, p1) if operand3.shape[0] > 1 else slice(None)
    qs = slice(q0, q1) if operand3.shape[2] > 1 else slice(None)
    d = d0
    while d < d1:
        b, off = divmod(d, bs)
        if off == 0 and d1 - d >= bs:
            k = (d1 - d) // bs
            seg = split_axis(dst3[:, d - d0 : d - d0 + k * bs, :], 1, k, bs)
            _squeezed(op, seg, operand3[ps, b : b + k, qs][:, :, None, :])
            d += k * bs
        else:
            e = min(d1, (b + 1) * bs)
            _squeezed(op, dst3[:, d - d0 : e - d0, :], operand3[ps, b : b + 1, qs])
            d = e
