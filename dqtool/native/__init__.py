"""Compiled kernels: the packed-code transpose at the heart of ``upgrade``, ``pack`` and
``fold`` of MatMulNBits (``transpose.c``), and the table lookups of a fold's 2- and 4-bit
codes (``lookup.c``, for ``dqtool.folding.by_table``), in the extension
``dqtool.native._codes`` that the package's build compiles (``setup.py``: ``pip install``,
``make``). Why: on the fused bench the NumPy path takes more CPU and time for the same
bytes (docs/benchmarks.md, "Compiled kernels or NumPy", 2026-11-28).

Optional: where the extension was not built (no C compiler at install time), on a
big-endian machine, or with ``DQTOOL_NATIVE=0``, everything runs on NumPy, with the same
bytes (the tests run both). ``describe()`` says which. Nothing is compiled, cached or
loaded from elsewhere at run time, and the I/O is Python's (``os.pwrite``, in
``write_transposed``).
"""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

WIDTHS = (2, 4, 8, 16, 32)  # packed codes; float16 / float32 elements


def _load() -> tuple[ModuleType | None, str]:
    """(the extension or None, what ``describe`` says)."""
    if os.environ.get("DQTOOL_NATIVE", "1") == "0":
        return None, "off (DQTOOL_NATIVE=0)"
    if sys.byteorder != "little":  # the kernels take words as little-endian
        return None, "off (big-endian machine)"
    import importlib

    try:
        ext = importlib.import_module("dqtool.native._codes")
    except ImportError as e:
        return None, f"off (not built: {e})"
    return ext, f"on ({ext.__file__})"


_ext, _why = _load()


def transpose_fn() -> Callable[..., int] | None:
    """``transpose(src, src_stride, dst, dst_stride, wide, s0, s1, bits, flip)`` (see
    ``transpose.c``: addresses and sizes, 0 or -1 for another width), releasing the GIL;
    None where the extension is off."""
    return _ext.transpose if _ext is not None else None


def stream_fn() -> Callable[..., int] | None:
    """``write_transposed`` where the extension is on, else None."""
    return write_transposed if _ext is not None else None


def _first_band(src: int, src_stride: int, band_words: int) -> tuple[int, int]:
    """(words of the first band, of every later one). Bands are whole 64-byte lines of the
    source where a band is a few lines wide: a line split between two bands is read from
    memory twice (docs/decisions.md, "2026-11-28: sizes the code holds"). The first is
    cut short so that the others start on a line, where rows do (a stride a multiple of
    64)."""
    if band_words < 16:
        return band_words, band_words
    band_words -= band_words % 8
    at = src % 64
    if src_stride % 64 == 0 and at % 8 == 0 and at != 0:
        return band_words - at // 8, band_words
    return band_words, band_words


def write_transposed(src: int, src_stride: int, squares: int, words: int, band_words: int,
                     bits: int, flip: int, buf: int, out_row: int, out_rows: int, fd: int,
                     offset: int, turn: AbstractContextManager | None) -> int:
    """The transpose of ``words`` source words a row (``squares`` x E rows of ``bits``-bit
    codes, E = 64 / bits, rows ``src_stride`` bytes apart, at address ``src``) written to
    ``fd`` at ``offset``, a band of ``band_words`` source words at a time: each band is
    transposed in C into ``buf`` (an address; rows ``out_row`` bytes apart, the bytes
    past the codes zeros) and written with ``os.pwrite`` in pieces (dqtool.storage.
    write_pieces), inside ``turn`` (a lock; None: none). Only the first ``out_rows``
    output rows are written. ``buf`` holds ``band_words`` x E x ``out_row`` bytes.
    Returns the bytes written, or -EINVAL (another width, rows narrower than the codes,
    no words a band), -ENOSYS where the extension is off; a failed write raises OSError."""
    # Imported here: `dqtool --version` reads this module, and NumPy and onnx_ir (which
    # pwrite_all's module loads) would slow it down.
    import numpy as np

    from dqtool.storage import pwrite_all

    ext = _ext
    if ext is None:
        return -errno.ENOSYS
    if bits not in WIDTHS or out_row < squares * 8 or band_words <= 0 or squares < 0 \
            or words < 0:
        return -errno.EINVAL
    e = 64 // bits
    band = ext.view(buf, band_words * e * out_row)
    if out_row > squares * 8:  # the padding bytes of every row of a band
        np.frombuffer(band, np.uint8).reshape(-1, out_row)[:, squares * 8:] = 0
    first, later = _first_band(src, src_stride, band_words)
    lock = turn if turn is not None else nullcontext()
    written = rows_done = w0 = 0
    while w0 < words and rows_done < out_rows:
        nw = min(words - w0, first if w0 == 0 else later)
        ext.transpose(src + w0 * 8, src_stride, buf, out_row, nw, 0, squares, bits, flip)
        rows = min(nw * e, out_rows - rows_done)
        with lock:
            pwrite_all(fd, band[: rows * out_row], offset + written)
        written += rows * out_row
        rows_done += rows
        w0 += first if w0 == 0 else later
    return written


def _lut_arrays_fit(codes: np.ndarray, cols: int, bits: int, rows_per_group: int,
                    groups: int, tables: np.ndarray, out: np.ndarray) -> bool:
    """What both lookups need of their arrays (C trusts every size: each is checked here;
    a wrong one would read or write past an array instead of failing)."""
    import numpy as np

    rows = codes.shape[0]
    row_bytes = cols if bits == 8 else cols * bits // 8
    return (codes.dtype == np.uint8 and codes.ndim == 2 and codes.shape[1] == row_bytes
            and bits in (2, 4, 8) and rows_per_group > 0 and groups * rows_per_group >= rows
            and out.shape == (rows, cols) and out.dtype == tables.dtype
            and all(a.flags.c_contiguous for a in (codes, tables, out)))


def lut_rows(codes: np.ndarray, cols: int, bits: int, rows_per_group: int,
             cols_per_group: int, tables: np.ndarray, out: np.ndarray) -> bool:
    """``out[r, c] = tables[r // rows_per_group, c // cols_per_group, code(r, c)]`` in C
    without the GIL: True; False where the extension is off (nothing done).
    ``codes``: uint8 rows, one code a byte (``bits`` 8, masked to the table's levels) or
    ``bits`` (4 or 2) packed low bits first, ``cols`` codes a row in whole bytes;
    ``tables`` (row groups, column groups, L) with L 4 or 16 entries of 2 or 4 bytes;
    ``out`` (rows, cols) of the tables' type; all C-contiguous."""
    if _ext is None:
        return False
    groups, ncg, levels = tables.shape
    if not (_lut_arrays_fit(codes, cols, bits, rows_per_group, groups, tables, out)
            and cols_per_group > 0 and ncg * cols_per_group >= cols):
        raise ValueError(f"dq_lut_rows: arrays that do not fit: codes {codes.shape}, {cols} "
                         f"codes of {bits} bits a row, tables {tables.shape}, groups of "
                         f"{rows_per_group} x {cols_per_group}, out {out.shape}")
    rc = _ext.lut_rows(codes.ctypes.data, codes.shape[0], cols, bits, rows_per_group,
                       cols_per_group, ncg, tables.ctypes.data, levels, tables.itemsize,
                       out.ctypes.data)
    if rc < 0:
        raise ValueError(f"dq_lut_rows: {os.strerror(-rc)}")
    return True


def lut_select(codes: np.ndarray, cols: int, bits: int, rows_per_group: int,
               tables: np.ndarray, out: np.ndarray) -> bool:
    """``out[r, c] = tables[r // rows_per_group, code(r, c), c]`` (a table per column, laid
    out [row group][level][column] as the kernel computes them) in C on AVX-512 without
    the GIL: True; False where the extension is off or the CPU has no AVX-512BW (nothing
    done: ``lut_rows`` on the tables transposed gives the same). ``codes`` as for
    ``lut_rows``; ``tables`` (row groups, L, cols) with L 4 or 16 entries of 2 or 4 bytes;
    ``out`` (rows, cols) of the tables' type; all C-contiguous."""
    if _ext is None:
        return False
    if tables.ndim != 3:
        raise ValueError(f"dq_lut_select: tables {tables.shape}, not (groups, levels, cols)")
    groups, levels, tcols = tables.shape
    if not (_lut_arrays_fit(codes, cols, bits, rows_per_group, groups, tables, out)
            and tcols == cols):
        raise ValueError(f"dq_lut_select: arrays that do not fit: codes {codes.shape}, "
                         f"{cols} codes of {bits} bits a row, tables {tables.shape}, groups "
                         f"of {rows_per_group} rows, out {out.shape}")
    rc = _ext.lut_select(codes.ctypes.data, codes.shape[0], cols, bits, rows_per_group,
                         tables.ctypes.data, levels, tables.itemsize, out.ctypes.data)
    if rc == -errno.ENOSYS:
        return False
    if rc < 0:
        raise ValueError(f"dq_lut_select: {os.strerror(-rc)}")
    return True


def select_on() -> bool:
    """Whether ``lut_select`` runs here (the extension is on and the CPU has AVX-512BW,
    not turned off by ``set_wide``), so that a caller builds its tables in the layout that
    will be used."""
    return _ext is not None and bool(_ext.select_supported())


def set_wide(on: bool) -> bool:
    """Turn the AVX-512 paths (the tile loop, ``lut_select``) on (where the CPU has them)
    or off; returns whether they are on. Both ways give the same bytes: tests run each.
    False where the extension is off."""
    return _ext is not None and bool(_ext.set_wide(on))


def describe() -> str:
    """'on (the extension's file)' or 'off (the reason)'."""
    return _why


def status() -> str:
    """What ``dqtool --version`` prints: 'built (the extension's file)' or 'off (why)'."""
    return f"built ({_ext.__file__})" if _ext is not None else _why
