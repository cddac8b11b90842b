"""The compiled kernels (``dqtool.native``, the extension ``dqtool.native._codes`` that the
package's build compiles): present wherever `make` installed dqtool (unless
``DQTOOL_NATIVE=0``), never compiled or loaded from elsewhere at run time, off with the
reason where they are not built, and the same bytes as the obvious transpose on every
width, with and without the AVX-512 tiles."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np
import pytest

from dqtool import native
from dqtool.families.fused import packing

# `make` builds the extension; a machine with no C compiler runs the suite with
# DQTOOL_NATIVE=0 (the NumPy path alone).
ASKED_OFF = os.environ.get("DQTOOL_NATIVE") == "0"
needs_ext = pytest.mark.skipif(ASKED_OFF, reason="DQTOOL_NATIVE=0: the NumPy path alone")


@pytest.fixture(params=["wide", "portable"])
def tiles(request):
    """Each test on the AVX-512 tile loop (where the CPU has it) and on the portable one."""
    native.set_wide(request.param == "wide")
    yield request.param
    native.set_wide(True)


def _transposes_right() -> None:
    rng = np.random.default_rng(11)
    p = rng.integers(0, 256, (48, 40), dtype=np.uint8)  # 48 rows of 80 4-bit codes
    codes = packing.unpack(p, 4)
    want = packing.pack(np.ascontiguousarray(codes.T), 4)
    assert np.array_equal(packing.transpose_codes(p, 48, 80, 4), want)


def _reference(p: np.ndarray, rows: int, cols: int, bits: int) -> np.ndarray:
    """The transpose the slow, obvious way (every code unpacked, transposed, packed; wider
    codes as the unsigned integers they are)."""
    if bits >= 8:
        codes = np.ascontiguousarray(p[:rows, : cols * bits // 8]).view(f"<u{bits // 8}")
        return np.ascontiguousarray(codes.T).view(np.uint8)
    per, mask = 8 // bits, (1 << bits) - 1
    codes = np.stack([(p >> (bits * j)) & mask for j in range(per)], axis=-1)
    codes = codes.reshape(rows, -1)[:, :cols].T  # (cols, rows)
    grouped = codes.reshape(cols, rows // per, per).astype(np.uint8)
    out = np.zeros((cols, rows // per), np.uint8)
    for j in range(per):
        out |= grouped[..., j] << (bits * j)
    return out


def test_the_extension_is_built_or_asked_off() -> None:
    if ASKED_OFF:
        assert native.transpose_fn() is None and native.stream_fn() is None
        assert native.describe() == "off (DQTOOL_NATIVE=0)"
        return
    assert native.transpose_fn() is not None, native.describe()
    where = Path(native.describe()[len("on ("):-1])
    assert where.parent == Path(native.__file__).parent and where.name.startswith("_codes.")
    assert native.status() == f"built ({where})"


def test_off_by_request_or_where_not_built(monkeypatch) -> None:
    monkeypatch.setenv("DQTOOL_NATIVE", "0")
    assert native._load() == (None, "off (DQTOOL_NATIVE=0)")
    monkeypatch.delenv("DQTOOL_NATIVE")
    monkeypatch.setitem(sys.modules, "dqtool.native._codes", None)  # as if never built
    ext, why = native._load()
    assert ext is None and why.startswith("off (not built: ")


def test_without_the_extension_dqtool_runs_on_numpy() -> None:
    # A process where the extension cannot be imported (an install without a C compiler)
    # converts with the same bytes, and compiles nothing.
    code = ("import sys; sys.modules['dqtool.native._codes'] = None\n"
            "import numpy as np\n"
            "from dqtool import native\n"
            "from dqtool.families.fused import packing\n"
            "p = np.arange(48 * 40, dtype=np.uint8).reshape(48, 40)\n"
            "print(native.describe().split(':')[0])\n"
            "print(packing.transpose_codes(p, 48, 80, 4, 0x88).tobytes().hex())\n")
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "CC": "/nonexistent/cc", "XDG_CACHE_HOME": cache}
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env=env, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert os.listdir(cache) == []
    p = np.arange(48 * 40, dtype=np.uint8).reshape(48, 40)
    want = _reference(p ^ np.uint8(0x88), 48, 80, 4).tobytes().hex()
    assert proc.stdout.splitlines() == ["off (not built", want]


@needs_ext
@pytest.mark.parametrize("bits", native.WIDTHS)
def test_the_transpose_is_the_obvious_one_on_every_width(bits: int, tiles) -> None:
    # 9 x 17 squares in two slabs (0-8, 8-9): whole 8 x 8 tiles and partial ones, the
    # lone-square path, a slab that does not start at 0; with and without a flip
    fn = native.transpose_fn()
    e = 64 // bits
    rows, cols = 9 * e, 17 * e
    src = np.random.default_rng(bits).integers(0, 256, (rows, cols * bits // 8 + 5),
                                               dtype=np.uint8)
    for flip in (0, {2: 0xAA, 4: 0x88}.get(bits, 0x80)):
        want = _reference(src ^ np.uint8(flip), rows, cols, bits)
        got = np.zeros_like(want)
        rc = [fn(src.ctypes.data, src.strides[0], got.ctypes.data, got.strides[0],
                 cols // e, s0, s1, bits, flip) for s0, s1 in ((0, 8), (8, 9))]
        assert rc == [0, 0] and np.array_equal(got, want), (bits, flip)


@needs_ext
def test_the_entry_point_refuses_other_widths() -> None:
    fn = native.transpose_fn()
    buf = np.zeros((16, 16), np.uint8)
    assert fn(buf.ctypes.data, 16, buf.ctypes.data, 16, 1, 0, 1, 3, 0) == -1
    with pytest.raises(TypeError, match="takes 9 arguments"):
        fn(buf.ctypes.data)


def _on_line(src: np.ndarray, skew: int) -> np.ndarray:
    """``src``'s bytes in rows 64 bytes apart whose first starts ``skew`` bytes after a
    64-byte line: where ``write_transposed`` cuts its bands to whole lines."""
    rows, width = src.shape
    stride = -(-width // 64) * 64
    room = np.zeros(rows * stride + 128, np.uint8)
    start = -room.ctypes.data % 64 + skew
    out = room[start:start + rows * stride].reshape(rows, stride)[:, :width]
    out[:] = src
    return out


class _CountingLock:
    def __init__(self) -> None:
        self.lock, self.taken = threading.RLock(), 0

    def __enter__(self) -> None:
        self.lock.acquire()
        self.taken += 1

    def __exit__(self, *exc: object) -> None:
        self.lock.release()


@needs_ext
@pytest.mark.parametrize("bits", native.WIDTHS)
@pytest.mark.parametrize(("skew", "band"), [(0, 3), (8, 17), (0, 40)])
def test_a_streamed_transpose_writes_the_obvious_bytes(bits: int, skew: int, band: int,
                                                       tiles, tmp_path) -> None:
    # Bands of `band` words into rows padded by 8 zero bytes, the last output row
    # dropped, 3 bytes into a file, every band's writes in the turn it was given
    e = 64 // bits
    rows, cols = 9 * e, 17 * e
    src = np.random.default_rng(bits).integers(0, 256, (rows, cols * bits // 8),
                                               dtype=np.uint8)
    src = _on_line(src, skew)
    row = rows * bits // 8 + 8
    want = np.zeros((cols - 1, row), np.uint8)
    want[:, : row - 8] = _reference(src, rows, cols, bits)[: cols - 1]
    buf = np.full(band * e * row, 0x5A, np.uint8)  # whatever an earlier band left
    turn = _CountingLock()
    with open(tmp_path / "out.bin", "wb") as f:
        f.write(b"abc")
        f.flush()
        n = native.stream_fn()(src.ctypes.data, src.strides[0], rows // e, cols // e, band,
                               bits, 0, buf.ctypes.data, row, cols - 1, f.fileno(), 3, turn)
    assert n == want.nbytes
    assert (tmp_path / "out.bin").read_bytes() == b"abc" + want.tobytes()
    assert turn.taken >= -(-(cols // e) // band)


@needs_ext
def test_the_streamed_transpose_refuses_what_would_overrun(tmp_path) -> None:
    # Rows narrower than a band's codes would overrun the buffer; no words a band would
    # never end: both refused (-EINVAL) before anything is touched or written.
    stream = native.stream_fn()
    src = np.zeros((32, 16), np.uint8)
    buf = np.zeros(4096, np.uint8)
    with open(tmp_path / "out.bin", "wb") as f:
        for out_row, band in ((15, 1), (16, 0)):  # 2 squares of 4-bit: rows of 16 bytes
            assert stream(src.ctypes.data, 16, 2, 2, band, 4, 0, buf.ctypes.data, out_row,
                          32, f.fileno(), 0, None) == -errno.EINVAL
    assert (tmp_path / "out.bin").stat().st_size == 0 and not buf.any()


@needs_ext
def test_a_failed_streamed_write_is_an_os_error(tmp_path) -> None:
    src = np.zeros((32, 16), np.uint8)
    buf = np.zeros(4096, np.uint8)
    path = tmp_path / "out.bin"
    path.write_bytes(b"")
    with open(path, "rb") as f, pytest.raises(OSError) as e:  # read-only: EBADF
        native.stream_fn()(src.ctypes.data, 16, 2, 2, 1, 4, 0, buf.ctypes.data, 16, 32,
                           f.fileno(), 0, None)
    assert e.value.errno == errno.EBADF


@needs_ext
def test_the_avx512_tiles_are_on_where_the_cpu_has_them() -> None:
    # The wide tile loop is taken where the CPU has AVX-512F, and can be turned off (the
    # tests of the transposes run both); off, the portable loop gives the same bytes.
    import platform

    has = False
    if platform.system() == "Linux" and platform.machine() == "x86_64":
        with open("/proc/cpuinfo") as f:
            has = "avx512f" in f.read().split()
    try:
        assert native.set_wide(False) is False
        _transposes_right()
        assert native.set_wide(True) is has
        _transposes_right()
    finally:
        native.set_wide(True)


def test_the_package_compiles_nothing_at_run_time() -> None:
    # No compiler, cache or loader of built code in the package: the extension is the
    # build's (setup.py), imported as any module.
    # (The system's C library may be called: check hands freed memory back with glibc's
    # malloc_trim, dqtool/checking/liveness.py; no library of the package's own is loaded.)
    root = Path(native.__file__).parents[1]
    for path in root.rglob("*.py"):
        text = path.read_text().replace('ctypes.CDLL("libc.so.6")', "")
        for word in ("ctypes.CDLL", "ctypes.cdll", "sysconfig.get_config_var(\"CC\")",
                     "setswitchinterval"):
            assert word not in text, (path, word)
