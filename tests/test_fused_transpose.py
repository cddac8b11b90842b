"""The word-wise transpose of packed codes (``packing.transpose_codes``) and the repacks
built on it, against the simple form: unpack every code, transpose, pack. Every test runs
twice: on the compiled kernel (``dqtool.native``) and on the NumPy path."""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest

from dqtool import native
from dqtool.families.fused import packing


@pytest.fixture(autouse=True, params=["c", "c-portable", "numpy"])
def path(request, monkeypatch) -> str:
    """Where the transposes run: the compiled kernels with their AVX-512 tiles where the
    CPU has them ("c"), their portable loop alone ("c-portable"), NumPy."""
    if request.param == "numpy":
        monkeypatch.setattr(native, "_ext", None)
    elif os.environ.get("DQTOOL_NATIVE") == "0":  # asked for: the loader must honour it
        assert native.transpose_fn() is None
    else:  # `make` builds it; on a machine with no C compiler run with DQTOOL_NATIVE=0
        assert native.transpose_fn() is not None, native.describe()
        native.set_wide(request.param == "c")
        request.addfinalizer(lambda: native.set_wide(True))
    return request.param


def simple_transpose(p: np.ndarray, rows: int, cols: int, bits: int) -> np.ndarray:
    codes = packing.unpack(p.reshape(rows, -1), bits)[:, :cols]
    return packing.pack(np.ascontiguousarray(codes.T), bits)


def simple_nbits_to_onnx(b: np.ndarray, k: int, n: int, bits: int) -> np.ndarray:
    codes = packing.unpack(b.reshape(n, -1), bits)[:, :k]  # (N, K)
    return packing.pack(np.ascontiguousarray(codes.T).reshape(-1), bits)


SHAPES = [(16, 16), (2, 2), (4, 8), (40, 24), (24, 40), (36, 100), (100, 36), (64, 8),
          (8, 64), (128, 96), (200, 330)]


# transpose_codes takes rows that fill whole bytes (others take the unpack path).
@pytest.mark.parametrize(("bits", "rows", "cols"),
                         [(b, r, c) for b in (2, 4, 8) for r, c in SHAPES if r * b % 8 == 0])
def test_transpose_codes_matches_the_simple_form(bits: int, rows: int, cols: int) -> None:
    rng = np.random.default_rng(rows * 1000 + cols + bits)
    width = -(-cols * bits // 8) + 3  # rows longer than the codes, as B's padded blocks
    p = rng.integers(0, 256, (rows, width), dtype=np.uint8)
    got = packing.transpose_codes(p, rows, cols, bits)
    want = simple_transpose(p, rows, cols, bits).reshape(cols, -1)
    assert got.shape == (cols, rows * bits // 8)
    assert np.array_equal(got, want)


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_transpose_codes_in_slabs_and_threads(bits: int, monkeypatch) -> None:
    # Slabs far smaller than the matrix, several threads: the same bytes.
    from dqtool import transposes

    monkeypatch.setattr(transposes, "SLAB_BYTES", 512)
    monkeypatch.setenv("DQTOOL_THREADS", "3")
    rows, cols = 64 * 37, 64 * 5 + 16
    p = np.random.default_rng(bits).integers(0, 256, (rows, cols * bits // 8), np.uint8)
    got = packing.transpose_codes(p, rows, cols, bits)
    assert np.array_equal(got, simple_transpose(p, rows, cols, bits).reshape(cols, -1))
    # and back again
    assert np.array_equal(packing.transpose_codes(got, cols, rows, bits), p)


def test_transpose_codes_of_a_known_matrix() -> None:
    # 4-bit codes (r, c) = (r + 3c) % 16 in a 2×4 matrix: a transpose by hand.
    codes = np.array([[(r + 3 * c) % 16 for c in range(4)] for r in range(2)], np.uint8)
    got = packing.transpose_codes(packing.pack(codes, 4), 2, 4, 4)
    assert got.tolist() == [[0x10], [0x43], [0x76], [0xA9]]


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("k,n,block", [(64, 48, 16), (100, 40, 32), (33, 16, 16),
                                       (1, 8, 16), (256, 24, 128), (130, 72, 64),
                                       (48, 7, 16), (47, 5, 16)])
def test_repacks_match_the_simple_form_and_invert(bits: int, k: int, n: int, block: int
                                                  ) -> None:
    rng = np.random.default_rng(k * n + bits)
    kb = -(-k // block)
    blob = block * bits // 8
    codes = rng.integers(0, 1 << bits, (n, kb * block), dtype=np.uint8)
    codes[:, k:] = 0  # a ragged last block padded with code 0, as onnxruntime writes it
    b = packing.pack(codes, bits).reshape(n, kb, blob)
    onnx = packing.nbits_to_onnx(b, k, n, bits)
    assert np.array_equal(onnx, simple_nbits_to_onnx(b, k, n, bits))
    kn = np.ascontiguousarray(codes[:, :k].T)
    if k * bits % 8 == 0 and n * bits % 8 == 0:  # the packed bytes as pack_pass gives them
        back = packing.onnx_to_nbits(onnx if bits != 8 else onnx.reshape(k, n), k, n, bits,
                                     block)
        assert np.array_equal(back, b)
    assert np.array_equal(packing.onnx_to_nbits(kn, k, n, bits, block), b)


@pytest.mark.parametrize(("bits", "flip"), [(2, 0xAA), (4, 0x88), (8, 0x80), (4, 0x0F)])
@pytest.mark.parametrize(("rows", "cols"), [(64, 64), (40, 24), (200, 330), (16 * 9, 16 * 17),
                                          (32 * 8, 32 * 16)])  # whole 2-bit tiles
def test_transpose_codes_flips_every_source_byte(bits: int, flip: int, rows: int,
                                                 cols: int) -> None:
    rng = np.random.default_rng(rows + cols + flip)
    p = rng.integers(0, 256, (rows, -(-cols * bits // 8)), dtype=np.uint8)
    got = packing.transpose_codes(p, rows, cols, bits, flip)
    want = simple_transpose(p ^ np.uint8(flip), rows, cols, bits).reshape(cols, -1)
    assert np.array_equal(got, want)
    assert not np.array_equal(got, packing.transpose_codes(p, rows, cols, bits))


def test_transpose_codes_of_a_strided_view() -> None:
    # A band of B's columns (fold's CodeRows): rows far apart, not starting on a word.
    rng = np.random.default_rng(3)
    b = rng.integers(0, 256, (48, 203), dtype=np.uint8)
    view = b[:, 5:37]  # 32 bytes = 64 codes of each of 48 rows
    got = packing.transpose_codes(view, 48, 64, 4)
    assert np.array_equal(got, simple_transpose(np.ascontiguousarray(view), 48, 64, 4)
                          .reshape(64, -1))


@pytest.mark.parametrize(("bits", "flip"), [(4, 0x88), (8, 0x80), (2, 0xAA)])
def test_onnx_to_nbits_flip_offsets_signed_codes(bits: int, flip: int) -> None:
    # pack_pass hands signed codes' stored bytes over with a flip: the codes + 2^(bits-1).
    k, n, block = 64, 32, 32
    rng = np.random.default_rng(bits)
    codes = rng.integers(0, 1 << bits, (k, n), dtype=np.uint8)
    half = np.uint8(1 << (bits - 1))
    want = packing.onnx_to_nbits(codes ^ half, k, n, bits, block)
    stored = packing.pack(codes, bits).reshape(-1)
    got = packing.onnx_to_nbits(stored if bits != 8 else stored.reshape(k, n), k, n, bits,
                                block, flip=flip)
    assert np.array_equal(got, want)
    # codes one a byte, and a shape off the fast path: the same flip, code by code
    assert np.array_equal(packing.onnx_to_nbits(codes, k, n, bits, block, flip=flip), want)
    odd = codes[:, :31]
    assert np.array_equal(packing.onnx_to_nbits(odd, k, 31, bits, block, flip=flip),
                          packing.onnx_to_nbits(odd ^ half, k, 31, bits, block))


class _FileSink:
    """A real file, entered 13 bytes in (an offset no band is aligned to), read back."""

    def __init__(self, folder) -> None:
        self.f = open(folder / "sink.bin", "w+b")  # noqa: SIM115 - closed by getvalue()
        self.f.write(b"p" * 13)

    def getvalue(self) -> bytes:
        self.f.write(b"end")  # the position was left right after the weight
        self.f.seek(0)
        data = self.f.read()
        self.f.close()
        assert data[:13] == b"p" * 13 and data[-3:] == b"end", data[:16]
        return data[13:-3]


@pytest.mark.parametrize("sink", ["bytes", "file"])
@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize(("k", "n", "block"), [(64, 48, 16), (100, 40, 32), (256, 24, 128),
                                               (130, 72, 64), (48, 16, 16), (1, 8, 16),
                                               (512, 96, 32), (48, 64, 16), (40, 64, 16),
                                               (600, 128, 128)])
def test_streamed_repacks_write_the_same_bytes(bits: int, k: int, n: int, block: int,
                                               sink: str, path: str, tmp_path,
                                               monkeypatch) -> None:
    # Bands far smaller than a weight (every band boundary, a short last band, a ragged
    # last block), and whatever is left in the scratch buffer from an earlier band. Into
    # a file (on the compiled path: transposed and written in C where rows fill whole
    # squares, a last partial word of B's rows in NumPy), or a BytesIO (NumPy).
    import io

    monkeypatch.setattr(packing, "STREAM_BYTES", 64)
    assert n * bits % 8 == 0  # streamed only where rows are whole bytes
    rng = np.random.default_rng(k + n + bits)
    kb, blob = -(-k // block), block * bits // 8
    codes = rng.integers(0, 1 << bits, (n, kb * block), dtype=np.uint8)
    codes[:, k:] = 0
    b = packing.pack(codes, bits).reshape(n, kb, blob)

    def new_sink():
        sink_ = io.BytesIO() if sink == "bytes" else _FileSink(tmp_path)
        return sink_, sink_ if sink == "bytes" else sink_.f  # (what is read, written to)

    # (the "c" path runs on NumPy too where DQTOOL_NATIVE=0 was asked for)
    in_c = native.transpose_fn() is not None and sink == "file" and n % (64 // bits) == 0
    assert (packing._native_stream(new_sink()[1], n, bits) is not None) == in_c
    f, to = new_sink()
    assert packing.write_nbits_as_onnx(b, k, n, bits, to) == k * n * bits // 8
    onnx = packing.nbits_to_onnx(b, k, n, bits)
    got = f.getvalue()
    assert got == onnx.tobytes()
    assert got == simple_nbits_to_onnx(b, k, n, bits).tobytes()
    if k * bits % 8 == 0:
        half = (0xAA, 0x88, 0x80)[(2, 4, 8).index(bits)]
        f, to = new_sink()
        written = packing.write_onnx_as_nbits(onnx ^ np.uint8(half), k, n, bits, block, to,
                                              flip=half)
        assert written == b.nbytes and f.getvalue() == b.tobytes()


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("skew", [0, 8, 24, 56, 3])
@pytest.mark.parametrize(("k", "per_band"), [(2048, 200), (2048, 130), (1000, 260)])
def test_streamed_bands_cut_to_whole_lines_write_the_same_bytes(
        bits: int, skew: int, k: int, per_band: int, path: str, tmp_path,
        monkeypatch) -> None:
    # Bands of 16 words or more are cut to whole 64-byte lines of the source, the first
    # one short where the weight does not start on a line (C): a weight at every skew
    # from a line (3: not even on a word), rows a multiple of 64 bytes apart (k 2048) or
    # not (1000), bands of 25 and 16 words (cut to 24 and 16) and 32, rows enough for
    # whole tiles of squares at every width: the same bytes.
    n = 256
    monkeypatch.setattr(packing, "STREAM_BYTES", n * per_band)
    rng = np.random.default_rng(skew + k + bits)
    row = k * bits // 8
    room = np.zeros(n * row + 128, np.uint8)
    start = -room.ctypes.data % 64 + skew
    b = room[start:start + n * row].reshape(n, row)
    b[:] = rng.integers(0, 256, b.shape, dtype=np.uint8)
    f = _FileSink(tmp_path)
    assert packing.write_nbits_as_onnx(b, k, n, bits, f.f) == k * n * bits // 8
    assert f.getvalue() == simple_nbits_to_onnx(b, k, n, bits).tobytes()


def test_a_file_like_that_is_not_an_os_file_is_written_in_numpy(tmp_path) -> None:
    # A wrapper with a descriptor underneath (a GzipFile, say) takes what it is given
    # through write(): C's pwrite to that descriptor would bypass it.
    import gzip

    b = np.arange(64 * 32, dtype=np.uint8).reshape(64, 2, 16)
    with gzip.open(tmp_path / "w.gz", "wb") as g:
        assert packing._native_stream(g, 64, 4) is None
        packing.write_nbits_as_onnx(b, 64, 64, 4, g)
    with gzip.open(tmp_path / "w.gz", "rb") as g:
        assert g.read() == packing.nbits_to_onnx(b, 64, 64, 4).tobytes()


def test_streamed_repack_write_errors_are_raised(path: str, tmp_path) -> None:
    # A file opened for reading only: the C path's pwrite fails (EBADF) and says so, as
    # the NumPy path's write does.
    import io

    b = np.arange(64 * 32, dtype=np.uint8).reshape(64, 2, 16)
    target = tmp_path / "ro.bin"
    target.write_bytes(b"")
    with open(target, "rb", buffering=0) as f, pytest.raises(OSError) as raised:
        packing.write_nbits_as_onnx(b, 64, 64, 4, f)  # (a FileIO: an OS file, read-only)
    if native.transpose_fn() is not None:  # pwrite's own error
        assert raised.value.errno == errno.EBADF, raised.value
    else:
        assert isinstance(raised.value, io.UnsupportedOperation)


@pytest.mark.parametrize("dtype", ["float16", "float32", "bfloat16", "uint8"])
@pytest.mark.parametrize(("rows", "cols"), [(0, 8), (4, 3), (64, 24), (48, 64), (8, 1),
                                            (128, 13)])
def test_write_transposed_writes_the_transpose(dtype: str, rows: int, cols: int, path: str,
                                               tmp_path) -> None:
    # Scales (N, k_blocks) written as (k_blocks, N): whole words of every row in C where
    # rows fill whole squares, the rest (and every width without C) in NumPy.
    import ml_dtypes

    np_type = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    a = (np.arange(rows * cols) % 251 + 1).astype(np.float32).astype(np_type)
    a = a.reshape(rows, cols)
    with open(tmp_path / "t.bin", "w+b") as f:
        f.write(b"xyz")
        assert packing.write_transposed(a, f) == a.nbytes
        f.write(b"!")
        f.seek(0)
        data = f.read()
    want = np.ascontiguousarray(a.T).reshape(-1).view(np.uint8).tobytes()
    assert data == b"xyz" + want + b"!"
