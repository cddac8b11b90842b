"""Bit packing of MatMulNBits / GatherBlockQuantized codes, and the one-pass repacks to and
from ai.onnx's packed layout.

onnxruntime packs ``8 / bits`` codes per uint8 byte, lowest bits first, along K (MatMulNBits:
B is ``(N, k_blocks, blob)``) or along the last axis (GatherBlockQuantized uint8 data).
ai.onnx packs a uint2/uint4 tensor over its flattened row-major elements, lowest bits first.
So MatMulNBits' ``(N, K)`` codes become ai.onnx's ``(K, N)`` by a transpose of packed codes
(``transpose_codes``: on 64-bit words, never unpacked), in slabs of rows on a thread pool;
odd shapes whose rows do not start on a byte go through unpack → transpose → pack in bands.
"""

from __future__ import annotations

import io
import os

import numpy as np

from dqtool.kernel import parallel
from dqtool.native import stream_fn, transpose_fn
from dqtool.storage import Pieces, unpack
from dqtool.transposes import _whole_squares, transpose_codes

# Bytes of unpacked codes one band may hold (bands keep temporaries in cache-sized pieces).
BAND_BYTES = 1 << 22


def pack(codes: np.ndarray, bits: int, fill: int = 0) -> np.ndarray:
    """uint8 bytes of ``8 / bits`` codes each along the last axis (padded with ``fill``)."""
    codes = np.asarray(codes, dtype=np.uint8)
    if bits == 8:
        return codes
    per = 8 // bits
    n = codes.shape[-1]
    if n % per:
        pad = np.full((*codes.shape[:-1], per - n % per), fill, np.uint8)
        codes = np.concatenate([codes, pad], axis=-1)
    grouped = codes.reshape(*codes.shape[:-1], codes.shape[-1] // per, per)
    out = grouped[..., 0].copy()
    for j in range(1, per):
        out |= grouped[..., j] << (bits * j)
    return out


def _rows_per_band(cols: int) -> int:
    return max(1, BAND_BYTES // max(cols, 1))


def nbits_to_onnx(b: np.ndarray, k: int, n: int, bits: int) -> np.ndarray:
    """MatMulNBits B ``(N, k_blocks, blob)`` → the packed bytes of ai.onnx codes ``(K, N)``
    (uint2 / uint4: flattened row-major, lowest bits first; uint8: the codes)."""
    b = np.asarray(b, dtype=np.uint8).reshape(n, -1)
    if n * bits % 8 == 0:
        # B's rows are the codes of K padded to whole blocks: transpose them all, keep K.
        return transpose_codes(b, n, b.shape[1] * 8 // bits, bits)[:k].reshape(-1)
    per = 8 // bits
    out = np.empty(-(-k * n // per), np.uint8)
    # Bands of K rows, a multiple of ``per`` long, so that every band starts on a byte.
    step = max(per, _rows_per_band(n) // per * per)
    for k0 in range(0, k, step):
        k1 = min(k, k0 + step)
        # Whole stored bytes covering K rows k0..k1 (k0 is byte-aligned in B's rows too).
        lo, hi = k0 // per, -(-k1 // per)
        codes = unpack(b[:, lo:hi], bits)[:, : k1 - k0]  # (N, rows)
        band = np.ascontiguousarray(codes.T).reshape(-1)  # (rows, N) flattened
        packed = pack(band, bits)
        out[k0 * n // per: k0 * n // per + packed.size] = packed
    return out


def onnx_to_nbits(codes_kn: np.ndarray, k: int, n: int, bits: int, block: int,
                  pad_codes: np.ndarray | None = None, flip: int = 0) -> np.ndarray:
    """ai.onnx codes ``(K, N)`` (uint8 values) → MatMulNBits B ``(N, k_blocks, blob)``.

    A ragged last block is padded with ``pad_codes`` (one code per column N; default 0).
    ``flip``: a byte every stored (packed) byte is xor-ed with first, e.g. 0x88 to offset
    signed int4 codes by 8 (done inside the transpose where it can be).
    """
    if flip and not (k * bits % 8 == 0 and n * bits % 8 == 0 and pad_codes is None):
        # codes one a byte here: the same flip, code by code
        codes_kn = np.asarray(codes_kn, np.uint8) ^ np.uint8(flip & ((1 << bits) - 1))
        flip = 0
    kb = -(-k // block)
    blob = block * bits // 8
    if k * bits % 8 == 0 and n * bits % 8 == 0 and pad_codes is None:
        # codes_kn: the packed bytes already (1-D, k·n·bits/8 of them), or the codes
        if codes_kn.ndim == 1:
            packed = np.ascontiguousarray(codes_kn, dtype=np.uint8).reshape(k, -1)
        else:  # codes one a byte
            packed = pack(codes_kn, bits)
        t = transpose_codes(packed, k, n, bits, flip)  # (N, K·bits/8)
        if t.shape[1] == kb * blob:
            return t.reshape(n, kb, blob)
        out = np.zeros((n, kb * blob), np.uint8)  # a ragged last block: padded with 0
        out[:, : t.shape[1]] = t
        return out.reshape(n, kb, blob)
    out = np.empty((n, kb * blob), np.uint8)
    cols_per_band = max(1, _rows_per_band(k))
    for n0 in range(0, n, cols_per_band):
        n1 = min(n, n0 + cols_per_band)
        band = np.empty((n1 - n0, kb * block), np.uint8)
        band[:, :k] = codes_kn[:, n0:n1].T
        if kb * block > k:
            fill = 0 if pad_codes is None else pad_codes[n0:n1, None]
            band[:, k:] = fill
        out[n0:n1] = pack(band, bits)
    return out.reshape(n, kb, blob)


def onnx_packed_codes(packed: np.ndarray, shape: tuple[int, ...], bits: int) -> np.ndarray:
    """uint8 codes of shape ``shape`` from an ai.onnx packed uint2/uint4 buffer."""
    count = int(np.prod(shape, dtype=np.int64))
    flat = unpack(np.asarray(packed, np.uint8).reshape(-1), bits)[:count]
    return flat.reshape(shape)


# Output bytes one band of a streamed repack holds: the band's source columns and its
# output stay in L2 and the output goes to write() from there (no fresh pages for a whole
# weight, no second pass over it in memory).
STREAM_BYTES = 1 << 20


def transpose_band(p: np.ndarray, rows: int, cols: int, bits: int, flip: int,
                   buf: np.ndarray) -> np.ndarray:
    """``transpose_codes`` of one band on the calling thread, into ``buf`` where the C
    kernel runs and ``rows`` fills whole squares (else as ``transpose_codes`` does)."""
    fn = transpose_fn()
    e = 64 // bits
    if fn is None or rows % e:
        return transpose_codes(p, rows, cols, bits, flip)
    wide, squares = -(-cols // e), rows // e
    p = _whole_squares(p, rows, wide * 8)  # the last band of a row is padded
    out = buf[: wide * e * squares * 8].reshape(wide * e, squares * 8)
    fn(p.ctypes.data, p.strides[0], out.ctypes.data, out.strides[0], wide, 0, squares,
       bits, flip)
    return out[:cols]


def band_scratch(nbytes: int) -> np.ndarray:
    """This thread's buffer for ``transpose_band``'s output."""
    return parallel.scratch(nbytes, np.dtype(np.uint8), slot=7)


def _native_stream(file, rows: int, bits: int) -> tuple[object, int, object] | None:
    """(``dq_write_transposed``, the file's descriptor, its writers' turn handle or None)
    where a streamed repack can run in C: the helper is on, the file is an OS file, and
    ``rows`` fills whole squares; else None (the NumPy path)."""
    fn = stream_fn()
    if fn is None or rows % (64 // bits):
        return None
    # Only a plain OS file (or the data-file writer's wrapper of one, or one written in
    # pieces: the inline save's): C writes to its descriptor at its position, which for,
    # say, a GzipFile is not where bytes go.
    target = file.file if isinstance(file, Pieces) else file
    if not (isinstance(target, (io.FileIO, io.BufferedWriter, io.BufferedRandom))
            or getattr(type(target), "streams_to_fd", False)):
        return None
    try:
        fd = file.fileno()
    except (AttributeError, OSError, ValueError):
        return None
    return fn, fd, getattr(file, "native_turn", None)


def _stream_c(native: tuple[object, int, object], file, src: np.ndarray, rows: int,
              words: int, band_words: int, bits: int, flip: int, out_row: int,
              out_rows: int) -> int:
    """``dq_write_transposed`` of ``words`` source words a row of ``src`` at the file's
    position (left after the bytes written); returns the bytes written."""
    fn, fd, turn = native
    e = 64 // bits
    buf = band_scratch(band_words * e * out_row)
    file.flush()  # anything buffered goes first
    at = file.tell()
    n = fn(src.ctypes.data, src.strides[0], rows // e, words, band_words, bits, flip,
           buf.ctypes.data, out_row, out_rows, fd, at, turn)
    if n < 0:
        raise OSError(-n, f"writing a repacked weight: {os.strerror(-n)}")
    file.seek(at + n)
    return n


def write_nbits_as_onnx(b: np.ndarray, k: int, n: int, bits: int, file) -> int:
    """``nbits_to_onnx(b, k, n, bits)`` written to ``file`` a band of K rows at a time
    (``n·bits`` a multiple of 8); returns the bytes written."""
    b = np.asarray(b, dtype=np.uint8).reshape(n, -1)
    per = 8 // bits
    band = max(8, STREAM_BYTES // max(n, 1) // 8 * 8)  # source bytes per row per band
    stop = -(-k // per)
    written, start = 0, 0
    native = _native_stream(file, n, bits)
    if native is not None and b.strides[1] == 1:
        # the whole words of every row in C; a last partial word (rows of B that are not
        # whole words) below
        words = stop // 8
        if words:
            written = _stream_c(native, file, b, n, words, band // 8, bits, 0,
                                n * bits // 8, min(k, words * 64 // bits))
            start = words * 8
    buf = band_scratch((band * per + 64 // bits) * (n * bits // 8))  # a band's whole squares
    for lo in range(start, stop, band):
        hi = min(stop, lo + band)
        t = transpose_band(b[:, lo:hi], n, (hi - lo) * per, bits, 0, buf)
        t = t[: min(k, hi * per) - lo * per]
        file.write(np.ascontiguousarray(t).data)
        written += t.nbytes
    return written


def write_transposed(a: np.ndarray, file) -> int:
    """``np.ascontiguousarray(a.T)`` of a 2-D array of 1-, 2- or 4-byte elements (e.g. a
    MatMulNBits' scales, ``(N, k_blocks)`` → ``(k_blocks, N)``) written to ``file``, in C
    where it can (``dq_write_transposed``: NumPy's own transpose of float16 ``(3072, 24)``
    runs at ~0.8 GB/s); returns the bytes written."""
    a = np.asarray(a)
    rows, cols = a.shape
    size = a.dtype.itemsize
    written, start = 0, 0
    native = _native_stream(file, rows, size * 8) if size in (1, 2, 4) else None
    if native is not None and a.flags.c_contiguous and rows:
        per_word = 8 // size  # elements a 64-bit word holds
        words = cols // per_word
        if words:
            band_words = max(1, STREAM_BYTES // max(rows * 8, 1))  # ~STREAM_BYTES a band
            written = _stream_c(native, file, a.view(np.uint8).reshape(rows, -1), rows,
                                words, band_words, size * 8, 0, rows * size,
                                words * per_word)
            start = words * per_word
    if start < cols:  # no C, or the last columns that do not fill a word
        rest = np.ascontiguousarray(a[:, start:].T)
        file.write(rest.reshape(-1).view(np.uint8).data)  # (bfloat16 has no buffer format)
        written += rest.nbytes
    return written


def write_onnx_as_nbits(packed: np.ndarray, k: int, n: int, bits: int, block: int,
                        file, flip: int = 0) -> int:
    """``onnx_to_nbits`` of the packed bytes of codes ``(K, N)`` (``k·bits`` and ``n·bits``
    multiples of 8) written to ``file`` a band of N rows at a time; returns the bytes."""
    per = 8 // bits
    packed = np.asarray(packed, dtype=np.uint8).reshape(k, -1)
    row = -(-k // block) * block * bits // 8  # bytes of one row of B (ragged block padded)
    band = max(8, STREAM_BYTES // max(row * per, 1) // 8 * 8)  # source bytes per row per band
    stop = n // per
    written, start = 0, 0
    native = _native_stream(file, k, bits)
    if native is not None and packed.strides[1] == 1:
        words = stop // 8  # whole words of every row in C, a last partial one below
        if words:
            written = _stream_c(native, file, packed, k, words, band // 8, bits, flip, row,
                                words * 64 // bits)
            start = words * 8
    buf = band_scratch((band * per + 64 // bits) * (k * bits // 8))  # a band's whole squares
    for lo in range(start, stop, band):
        hi = min(stop, lo + band)
        t = transpose_band(packed[:, lo:hi], k, (hi - lo) * per, bits, flip, buf)
        if t.shape[1] != row:  # a ragged last block: padded with code 0
            padded = np.zeros((t.shape[0], row), np.uint8)
            padded[:, : t.shape[1]] = t
            t = padded
        file.write(np.ascontiguousarray(t).data)
        written += t.nbytes
    return written
