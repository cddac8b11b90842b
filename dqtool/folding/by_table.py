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
    from dqtool.folding.kernel_call import KernelCall


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


def _groups(call: KernelCall, et: types.ElemType, rows: int, cols: int
            ) -> tuple[int, int] | None:
    """(rows, columns) of a group sharing one table, where a table pays for itself (its
    group holds at least twice as many codes as levels); None where none applies."""
    if not getattr(call._kernel(), "elementwise", False) or not et.is_integer \
            or et.bits not in (2, 4) or not rows or not cols:
        return None
    gran, axis, block = call.granularity, call.norm_axis, call.block_size
    if gran == "blocked" and axis in (0, 1) and block > 0:
        group = (block, 1) if axis == 0 else (1, block)
    elif gran == "per-axis" and axis in (0, 1):
        group = (rows, 1) if axis == 1 else (1, cols)
    elif gran == "per-tensor":
        group = (rows, cols)
    else:
        return None
    return group if group[0] * group[1] >= 2 << et.bits else None


def takes(call: KernelCall, dtype: np.dtype, rows: int, cols: int) -> bool:
    """Whether ``dequantize`` computes rows of codes of ``dtype`` (checked before the codes
    are read, so that they are not read twice when it does not)."""
    try:
        et = types.from_dtype(dtype)
    except KeyError:
        return False
    return _groups(call, et, rows, cols) is not None and native.transpose_fn() is not None


def dequantize(call: KernelCall, x: np.ndarray | PackedRows, scale: np.ndarray,
               zp: np.ndarray | None, store_dtype: np.dtype) -> np.ndarray | None:
    """The dequantized rows ``x`` (codes, one a byte, or ``PackedRows``) of ``call`` cast
    to ``store_dtype``, by table; None where this does not apply (the caller computes them
    as before)."""
    packed = isinstance(x, PackedRows)
    shape = (x.data.shape[0], x.cols) if packed else x.shape
    if len(shape) != 2:
        return None
    try:
        et = types.from_dtype(x.dtype)
    except KeyError:
        return None
    rows, cols = shape
    group = _groups(call, et, rows, cols)
    if group is None or (packed and x.bits != et.bits):
        return None
    kernel = call._kernel()
    levels = levels_of(et)
    n = levels.size
    gran, axis = call.granularity, call.norm_axis
    codes = np.ascontiguousarray(x.data if packed else x.view(np.uint8))
    bits = x.bits if packed else 8
    if gran == "blocked" and axis == 0 and scale.ndim == 2:
        groups = scale.shape[0]
        xl = np.repeat(np.tile(levels, groups)[:, None], cols, axis=1)
        t = kernel(xl, scale, zp, replace(call, block_size=n))
        by_column = _select(t.reshape(groups, n, cols), codes, cols, bits, group[0],
                            store_dtype)
        if by_column is not None:
            return by_column
        tables = t.reshape(groups, n, cols).transpose(0, 2, 1)
    elif gran == "blocked" and axis == 1 and scale.ndim == 2:
        groups = scale.shape[1]
        xl = np.repeat(np.tile(levels, groups)[None, :], rows, axis=0)
        t = kernel(xl, scale, zp, replace(call, block_size=n))
        tables = t.reshape(rows, groups, n)
    elif gran == "per-axis" and axis == 1:
        t = kernel(np.repeat(levels[:, None], cols, axis=1), scale, zp, call)
        by_column = _select(t[None], codes, cols, bits, rows, store_dtype)
        if by_column is not None:
            return by_column
        tables = t.T[None]
    elif gran == "per-axis" and axis == 0:
        t = kernel(np.repeat(levels[None, :], rows, axis=0), scale, zp, call)
        tables = t[:, None, :]
    elif gran == "per-tensor":
        t = kernel(levels.reshape(n, 1), scale, zp, call)
        tables = t.reshape(1, 1, n)
    else:
        return None
    tables = np.ascontiguousarray(tables.astype(store_dtype, copy=False))
    if tables.itemsize not in (2, 4):
        return None
    out = np.empty((rows, cols), tables.dtype)
    return out if native.lut_rows(codes, cols, bits, *group, tables, out) else None


def _select(tables: np.ndarray, codes: np.ndarray, cols: int, bits: int, rows_per_group: int,
            store_dtype: np.dtype) -> np.ndarray | None:
    """A table per column, (row groups, levels, columns) as the kernel computed them:
    the rows looked up by ``native.lut_select`` (AVX-512, ~3.5x the lookups of
    ``lut_rows``, and no transpose of the tables); None where it does not run."""
    if not native.select_on():
        return None
    tables = np.ascontiguousarray(tables.astype(store_dtype, copy=False))
    if tables.itemsize not in (2, 4):
        return None
    out = np.empty((codes.shape[0], cols), tables.dtype)
    return out if native.lut_select(codes, cols, bits, rows_per_group, tables, out) else None
