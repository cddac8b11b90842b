"""A fold's DequantizeLinear of 2- or 4-bit codes, computed by table.

A DequantizeLinear is elementwise: each value depends only on its code and its group's
scale and zero point. With 4 or 16 possible codes, the kernel dequantizes every level of
every group once (a "table": far fewer values than the group has when a group holds at
least twice as many codes as levels), and the compiled helper picks each code's entry
(``native.lut_rows``). The values are the kernel's own, cast to ``--dtype`` the same way,
so the result is the kernel's bit for bit (tested against it for every granularity, type
and block); it only skips computing the same value again. Measured on the 4-bit weights
of the fused bench (8192 x 3072, block 128): 0.85 ms a chunk of 2 Mi codes for the
lookups, against ~8 ms for NumPy's cast, subtract, multiply and cast.

Anything else (8-bit codes, small groups, more than two dimensions, another kernel, no
compiled helper) returns None and is computed as before.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from dqtool import native, types

if TYPE_CHECKING:
    from dqtool.folding.compute import Step


@dataclass(frozen=True)
class PackedRows:
    """Rows of ``bits``-bit codes (2 or 4) of ``dtype``, packed low bits first, ``cols``
    codes a row in whole bytes: ``data`` uint8 (rows, cols * bits / 8)."""

    data: np.ndarray
    cols: int
    bits: int
    dtype: np.dtype


def levels_of(et: types.ElemType) -> np.ndarray:
    """Every code of a 2- or 4-bit type, at the table position of its low bits."""
    n = 1 << et.bits
    codes = np.arange(n)
    if et.signed:
        codes = np.where(codes >= n // 2, codes - n, codes)
    return codes.astype(et.dtype)


def dequantize(step: Step, x: np.ndarray | PackedRows, scale: np.ndarray,
               zp: np.ndarray | None, store_dtype: np.dtype) -> np.ndarray | None:
    """The dequantized rows ``x`` (codes, one a byte, or ``PackedRows``) of ``step`` cast
    to ``store_dtype``, by table; None where this does not apply (the caller computes them
    as before)."""
    kernel = step._kernel()
    packed = isinstance(x, PackedRows)
    shape = (x.data.shape[0], x.cols) if packed else x.shape
    if not getattr(kernel, "elementwise", False) or len(shape) != 2 or 0 in shape:
        return None
    try:
        et = types.from_dtype(x.dtype)
    except KeyError:
        return None
    if not et.is_integer or et.bits not in (2, 4) or (packed and x.bits != et.bits):
        return None
    levels = levels_of(et)
    n = levels.size
    rows, cols = shape
    gran, axis, block = step.granularity, step.norm_axis, step.block_size
    if gran == "blocked" and axis == 0 and scale.ndim == 2:
        groups = scale.shape[0]
        xl = np.repeat(np.tile(levels, groups)[:, None], cols, axis=1)
        t = kernel(xl, scale, zp, replace(step, block_size=n))
        tables, rpg, cpg, size = t.reshape(groups, n, cols).transpose(0, 2, 1), block, 1, block
    elif gran == "blocked" and axis == 1 and scale.ndim == 2:
        groups = scale.shape[1]
        xl = np.repeat(np.tile(levels, groups)[None, :], rows, axis=0)
        t = kernel(xl, scale, zp, replace(step, block_size=n))
        tables, rpg, cpg, size = t.reshape(rows, groups, n), 1, block, block
    elif gran == "per-axis" and axis == 1:
        t = kernel(np.repeat(levels[:, None], cols, axis=1), scale, zp, step)
        tables, rpg, cpg, size = t.T[None], rows, 1, rows
    elif gran == "per-axis" and axis == 0:
        t = kernel(np.repeat(levels[None, :], rows, axis=0), scale, zp, step)
        tables, rpg, cpg, size = t[:, None, :], 1, cols, cols
    elif gran == "per-tensor":
        t = kernel(levels.reshape(n, 1), scale, zp, step)
        tables, rpg, cpg, size = t.reshape(1, 1, n), rows, cols, rows * cols
    else:
        return None
    if size < 2 * n:  # a table per few codes: computing it costs what it saves
        return None
    tables = np.ascontiguousarray(tables.astype(store_dtype, copy=False))
    if tables.itemsize not in (2, 4):
        return None
    out = np.empty((rows, cols), tables.dtype)
    codes = np.ascontiguousarray(x.data if packed else x.view(np.uint8))
    bits = x.bits if packed else 8
    return out if native.lut_rows(codes, cols, bits, rpg, cpg, tables, out) else None
