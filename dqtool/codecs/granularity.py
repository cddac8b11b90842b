"""The granularity rules shared by every encoding: scale and zero-point shapes, axis, blocks.

Granularity comes from the scale's shape (``docs/semantics.md#granularity``): scalar or one
element → per-tensor; 1-D → per-axis; same rank as x → blocked, with
``scale.shape[axis] == ceil(x.shape[axis] / block_size)``. These are onnxruntime's rules;
onnx's reference evaluator does not enforce them, dqtool does.
"""

from __future__ import annotations

from dataclasses import dataclass

from dqtool.kernel.layout import normalize_axis
from dqtool.spec import P_AXIS, P_BLOCK, P_SHAPE, Dim, Granularity, Problem


@dataclass(frozen=True)
class Layout:
    granularity: Granularity | None
    axis: int | None
    block_size: int | None
    problems: tuple[Problem, ...]


def _fmt(shape: tuple[Dim, ...] | None) -> str:
    if shape is None:
        return "?"
    return "(" + ", ".join("?" if d is None else str(d) for d in shape) + ")"


def _one_element(shape: tuple[Dim, ...]) -> bool:
    return len(shape) == 0 or (len(shape) == 1 and shape[0] == 1)


def _axis(axis: int, rank: int | None) -> tuple[int, Problem | None]:
    """(``axis`` normalized, or as given with the problem it has)."""
    if rank is None:
        return axis, None
    norm = normalize_axis(axis, rank)
    if norm is None:
        rng = f"[{-rank}, {rank - 1}]" if rank else "none: x is a scalar"
        return axis, Problem(P_AXIS, f"axis {axis} is out of range {rng} for x of rank {rank}")
    return norm, None


def classify(
    x_shape: tuple[Dim, ...] | None,
    scale_shape: tuple[Dim, ...] | None,
    zp_shape: tuple[Dim, ...] | None,
    *,
    axis: int,
    block_size: int,
    allow_per_axis: bool,
    allow_blocked: bool,
    where: str,
) -> Layout:
    """Granularity, normalized axis and block size of a node, with the rules it breaks.

    ``where`` names the encoding in messages ("DequantizeLinear-13").
    """
    problems: list[Problem] = []
    if zp_shape is not None and scale_shape is not None and zp_shape != scale_shape \
            and not (_one_element(zp_shape) and _one_element(scale_shape)):
        # A scalar next to a one-element 1-D tensor is per-tensor either way: onnxruntime's
        # quantizer writes its int32 bias DQs so, and onnx's checker and every runtime accept
        # it.
        problems.append(
            Problem(P_SHAPE, f"zero point shape {_fmt(zp_shape)} differs from scale shape "
                    f"{_fmt(scale_shape)}")
        )
    if scale_shape is None:
        return Layout(None, None, block_size or None, tuple(problems))
    rank = None if x_shape is None else len(x_shape)
    srank = len(scale_shape)
    if srank == 0 or (srank == 1 and scale_shape[0] == 1 and block_size <= 0):
        return Layout("per-tensor", None, None, tuple(problems))
    if srank == 1 and not (block_size > 0 and rank == 1):
        return _per_axis(x_shape, scale_shape, axis, block_size, allow_per_axis, where, problems)
    if rank is not None and srank != rank:
        problems.append(
            Problem(P_SHAPE, f"scale shape {_fmt(scale_shape)} fits no granularity for x "
                    f"{_fmt(x_shape)}: it must be a scalar, 1-D, or of x's rank {rank}")
        )
        return Layout(None, None, None, tuple(problems))
    return _blocked(x_shape, scale_shape, axis, block_size, allow_blocked, where, problems)


def _per_axis(x_shape, scale_shape, axis, block_size, allowed, where, problems) -> Layout:
    rank = None if x_shape is None else len(x_shape)
    if not allowed:
        problems.append(
            Problem(P_SHAPE, f"scale shape {_fmt(scale_shape)} is per-axis, which {where} "
                    "does not allow (scale must be a scalar)")
        )
    if block_size > 0:
        problems.append(
            Problem(P_BLOCK, f"block_size {block_size} given with a 1-D scale "
                    f"{_fmt(scale_shape)}: blocked quantization needs a scale of x's rank")
        )
    norm, bad = _axis(axis, rank)
    if bad:
        problems.append(bad)
        return Layout("per-axis", axis, None, tuple(problems))
    if x_shape is not None:
        dim = x_shape[norm]
        if isinstance(dim, int) and isinstance(scale_shape[0], int) and dim != scale_shape[0]:
            problems.append(
                Problem(P_SHAPE, f"per-axis scale has {scale_shape[0]} elements but x "
                        f"{_fmt(x_shape)} has {dim} on axis {norm}")
            )
    return Layout("per-axis", norm if rank is not None else axis, None, tuple(problems))


def _blocked(x_shape, scale_shape, axis, block_size, allowed, where, problems) -> Layout:
    rank = len(scale_shape)
    if not allowed:
        problems.append(
            Problem(P_SHAPE, f"scale shape {_fmt(scale_shape)} is blocked (same rank as x), "
                    f"which {where} does not allow")
        )
    norm, bad = _axis(axis, rank)
    if bad:
        problems.append(bad)
        return Layout("blocked", axis, block_size or None, tuple(problems))
    if block_size <= 0:
        problems.append(
            Problem(P_BLOCK, f"blocked scale {_fmt(scale_shape)} needs a positive block_size, "
                    f"got {block_size}")
        )
        return Layout("blocked", norm, None, tuple(problems))
    if x_shape is None:
        return Layout("blocked", norm, block_size, tuple(problems))
    for d, (xd, sd) in enumerate(zip(x_shape, scale_shape, strict=True)):
        if not (isinstance(xd, int) and isinstance(sd, int)):
            continue
        if d != norm and xd != sd:
            problems.append(
                Problem(P_SHAPE, f"blocked scale {_fmt(scale_shape)} must equal x "
                        f"{_fmt(x_shape)} on every axis but {norm}; differs on axis {d}")
            )
        if d == norm and sd != -(-xd // block_size):
            lo = -(-xd // sd) if sd > 0 else "?"
            hi = (-(-xd // (sd - 1)) - 1) if sd > 1 else "∞"
            problems.append(
                Problem(P_BLOCK, f"block_size {block_size} does not fit: x has {xd} on axis "
                        f"{norm} and the scale {sd} blocks, so block_size must be in "
                        f"[{lo}, {hi}]")
            )
    return Layout("blocked", norm, block_size, tuple(problems))
