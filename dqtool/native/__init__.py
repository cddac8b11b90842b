"""Compiled helpers: the packed-code transpose at the heart of ``upgrade``, ``pack`` and
``fold`` of MatMulNBits, in C (``codes.c``), loaded with ctypes.

Why: a 7B-class model holds ~1.8 GB of 4-bit weights and its conversion's target is twice
the time of copying the file. On one core a 12.6 MB weight (8192 x 3072 codes) takes
8.8 ms on the NumPy path (``transposes.transpose_codes_numpy``) and 3.2 ms here (3.7 ms
without the AVX-512 tiles), output allocation included (measured on this project's
machine, median of 10).

It is optional. The source is compiled on first use with the machine's C compiler
(``$CC``, else Python's own, else ``cc``) into a per-user cache, keyed by the source, the
compiler command and the platform, and checked against the obvious transpose on every
width when it is built (a build that fails the check is not kept). Without a compiler, on
a big-endian machine, if the build or that check fails, or with ``DQTOOL_NATIVE=0``,
everything runs on NumPy, with the same bytes. ``describe()`` says which; ``status()``
(``dqtool --version``) says so without building.

Besides the transpose: ``dq_write_transposed`` streams a weight's transpose to a file
band by band (no interpreter between bands), ``dq_write_all`` writes a buffer in the
pieces ``dqtool.storage.write_pieces`` explains (``write_at``), ``dq_turn_*`` is the lock writers
into one file take turns on, ``dq_reserve`` reserves a data file's bytes on disk, and
``dq_set_wide`` turns the AVX-512 tiles off and on (``set_wide``, for the tests).

Where: ``$DQTOOL_NATIVE_DIR``; else ``$XDG_CACHE_HOME/dqtool`` or ``~/.cache/dqtool``;
where that cannot be written, a private temporary folder, for the process alone, removed
once the library is loaded. A cached library is loaded only if it and its folder are the
user's own and writable by no one else (its code runs on load), and only if its bytes
are those its build recorded (a truncated library would crash the process on load; the
record also says the bytes passed the check, which a load then skips: ~7 ms a command).
"""

from __future__ import annotations

import errno
import os
import platform
import shlex
import stat
import struct
import sys
import sysconfig
import threading
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

SOURCE = Path(__file__).with_name("codes.c")

try:  # CPython's own SHA-256: hashlib's import loads OpenSSL (~3 ms of every command)
    from _sha256 import sha256
except ImportError:  # (named _sha2 from Python 3.12; other interpreters: hashlib's)
    try:
        from _sha2 import sha256  # type: ignore[no-redef]
    except ImportError:
        from hashlib import sha256  # type: ignore[assignment]
VERSION = 4  # dq_native_version() of a build that means what this loader expects

_lock = threading.Lock()
_state: dict[str, object] = {}  # "fn": the entry point or None, "why": the reason


class Off(OSError):
    """Why the compiled helper is not used (the message says so)."""


class CompileError(Off):
    """The compiler ran and failed (no other folder will do better)."""


def _compiler() -> list[str]:
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    try:
        return shlex.split(cc)
    except ValueError as e:
        raise Off(f"CC={cc!r} cannot be split into a command: {e}") from None


def _flags() -> list[str]:
    return ["-O3", "-std=c99", "-shared", "-fPIC", "-fno-strict-aliasing", "-pthread"]


def cache_dir() -> Path:
    env = os.environ.get("DQTOOL_NATIVE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dqtool"


def library_path(folder: Path | None = None) -> Path:
    """Where this source's build, with this compiler, on this platform, lives (in the
    cache, or in ``folder``)."""
    h = sha256(SOURCE.read_bytes())
    h.update(" ".join([*_compiler(), *_flags()]).encode())
    h.update(f"{sys.platform}-{platform.machine()}-{struct.calcsize('P')}".encode())
    # builds whose digest means "passed the check" (the check moved into the build): a
    # library an older loader recorded without checking it is not taken for one
    h.update(b"checked when built")
    return (folder or cache_dir()) / f"codes-{h.hexdigest()[:16]}.so"


def _digest_path(path: Path) -> Path:
    return path.with_suffix(".sha256")


def _digest(path: Path) -> str:
    return sha256(path.read_bytes()).hexdigest()


def _untrusted(path: Path) -> str:
    """Why ``path`` (a library about to be loaded: its code runs on load) is not to be
    trusted, or ''. It, and its folder, must be this user's and writable by no one else:
    a library another user could have put there would run as this one."""
    uid = os.getuid() if hasattr(os, "getuid") else None
    for p, kind in ((path, stat.S_ISREG), (path.parent, stat.S_ISDIR)):
        st = os.lstat(p)
        if not kind(st.st_mode):
            return f"{p} is not a {'file' if kind is stat.S_ISREG else 'folder'}"
        if uid is not None and st.st_uid not in (uid, 0):
            return f"{p} belongs to another user"
        if st.st_mode & 0o022:
            return f"{p} is writable by others"
    return ""


def _build(target: Path) -> None:
    """Compile into a temporary file next to ``target`` and check it against the obvious
    transpose (``_self_check``); write its SHA-256 beside it, then rename it into place
    (two processes building at once each rename a complete library; the digest lets a
    later load tell a damaged file, which would crash the process when mapped, from a
    good one, and says the library passed the check: a later load skips it)."""
    import ctypes
    import subprocess
    import tempfile

    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        try:
            proc = subprocess.run([*_compiler(), *_flags(), str(SOURCE), "-o", tmp],
                                  capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.SubprocessError) as e:
            raise CompileError(f"{' '.join(_compiler())}: {e}") from None
        if proc.returncode != 0:
            raise CompileError(f"{' '.join(_compiler())} failed: "
                               + (proc.stderr.strip().splitlines() or ["no message"])[-1])
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o755)
        try:
            lib = ctypes.CDLL(tmp)
            bad = _self_check(_bind(lib), lib.dq_write_transposed, lib.dq_set_wide)
        except (OSError, AttributeError) as e:
            raise CompileError(f"{' '.join(_compiler())} built a library that does not "
                               f"load: {e}") from None
        if bad:
            raise CompileError(f"{' '.join(_compiler())} built a library that disagrees "
                               f"with the obvious transpose: {bad}")
        digest = _digest_path(Path(tmp))
        digest.write_text(_digest(Path(tmp)))
        os.replace(digest, _digest_path(target))
        os.replace(tmp, target)
    finally:
        for leftover in (tmp, str(_digest_path(Path(tmp)))):
            if os.path.exists(leftover):
                os.unlink(leftover)
    _prune(target)


def _prune(keep: Path) -> None:
    """Remove the cache's builds of other sources or compilers (each process builds what it
    needs again; one already loaded keeps its mapping)."""
    import contextlib

    for old in keep.parent.glob("codes-*"):
        if old.stem != keep.stem:
            with contextlib.suppress(OSError):
                old.unlink()


def _intact(path: Path) -> bool:
    """The library is whole: its bytes are the ones its build recorded."""
    try:
        return _digest_path(path).read_text().strip() == _digest(path)
    except OSError:
        return False


def _built() -> tuple[Path, bool]:
    """(the library, whether it is this process's private build). Built in the cache if it
    is not there or not whole; where the cache cannot be written, into a private
    temporary folder for this process alone (never a shared, guessable one)."""
    path = library_path()
    if path.exists() and _intact(path):
        return path, False
    try:
        _build(path)
        return path, False
    except CompileError:
        raise
    except OSError:  # the cache cannot be written
        if os.environ.get("DQTOOL_NATIVE_DIR"):
            raise
        import tempfile

        private = Path(tempfile.mkdtemp(prefix="dqtool-native-"))
        path = library_path(private)
        _build(path)
        return path, True


def _load() -> tuple[object | None, str]:
    import ctypes

    if os.environ.get("DQTOOL_NATIVE", "1") == "0":
        return None, "off (DQTOOL_NATIVE=0)"
    if sys.byteorder != "little":
        return None, "off (big-endian machine)"
    private = False
    try:
        path, private = _built()
        why = _untrusted(path)
        if why:
            return None, f"off ({why})"
        lib = ctypes.CDLL(str(path))
        if lib.dq_native_version() != VERSION:
            return None, f"off ({path} is version {lib.dq_native_version()}, not {VERSION})"
        # (checked against the obvious transpose when it was built: its digest says so)
        fn = _bind(lib)
        lib.dq_set_wide(1)  # the AVX-512 tiles where the CPU has them, decided once here
    except (OSError, AttributeError) as e:
        return None, f"off ({e})"
    finally:
        if private:  # loaded (or not): the private folder is not needed any more
            import shutil

            shutil.rmtree(path.parent, ignore_errors=True)
    _state["lib"] = lib
    where = f"built for this process alone: {cache_dir()} cannot be written" if private \
        else str(path)
    return fn, f"on ({where})"


def _bind(lib: object) -> object:
    """Declare the library's entry points' C types; returns ``dq_transpose_codes``."""
    import ctypes

    i64, ptr, c_int = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
    fn = lib.dq_transpose_codes
    fn.argtypes = [ptr, i64, ptr, i64, i64, i64, i64, c_int, c_int]
    fn.restype = c_int
    stream = lib.dq_write_transposed
    stream.argtypes = [ptr, i64, i64, i64, i64, c_int, c_int, ptr, i64, i64, c_int, i64, ptr]
    stream.restype = i64
    lib.dq_reserve.argtypes = [c_int, i64, i64]
    lib.dq_reserve.restype = c_int
    lib.dq_write_all.argtypes = [c_int, ptr, i64, i64, ptr]
    lib.dq_write_all.restype = i64
    lib.dq_write_piece.argtypes = []
    lib.dq_write_piece.restype = i64
    lib.dq_set_wide.argtypes = [c_int]
    lib.dq_set_wide.restype = c_int
    lib.dq_turn_new.restype = ptr
    lib.dq_turn_new.argtypes = []
    lib.dq_lut_rows.argtypes = [ptr, i64, i64, i64, i64, i64, i64, ptr, i64, i64, ptr]
    lib.dq_lut_rows.restype = c_int
    lib.dq_lut_select.argtypes = [ptr, i64, i64, i64, i64, ptr, i64, i64, ptr]
    lib.dq_lut_select.restype = c_int
    for name in ("dq_turn_take", "dq_turn_give", "dq_turn_free"):
        getattr(lib, name).argtypes = [ptr]
        getattr(lib, name).restype = None
    return fn


def _reference(p, rows: int, cols: int, bits: int):
    """The transpose the slow, obvious way (every code unpacked, transposed, packed; wider
    codes as the unsigned integers they are)."""
    import numpy as np

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


WIDTHS = (2, 4, 8, 16, 32)  # packed codes; float16 / float32 elements


def _self_check(fn: object, stream: object | None = None,
                set_wide: object | None = None) -> str:
    """'' if the build transposes like the obvious way on every width (with and without a
    flip of every byte), else what differed. 9 x 17 squares, in two slabs (0-8, 8-9):
    whole 8 x 8 tiles and partial ones, the lone-square path, a slab that does not start
    at 0 (each a branch a miscompile could break alone). With ``stream``
    (``dq_write_transposed``), also its bands written to a file: padded rows, a last row
    dropped, at an offset, and bands cut to whole lines. With ``set_wide``
    (``dq_set_wide``), both tile loops where the CPU has the wide one (AVX-512): a cache
    shared by machines may load this build on a CPU without it."""
    modes = [0, 1] if set_wide is not None and set_wide(1) else [None]
    try:
        for mode in modes:
            if mode is not None:
                set_wide(mode)
            bad = _check_widths(fn, stream)
            if bad:
                return bad + (" (AVX-512 tiles)" if mode else "")
        return ""
    finally:
        if set_wide is not None:
            set_wide(1)


def _check_widths(fn: object, stream: object | None) -> str:
    import numpy as np

    rng = np.random.default_rng(7)
    for bits in WIDTHS:
        e = 64 // bits
        rows, cols = 9 * e, 17 * e
        src = rng.integers(0, 256, (rows, cols * bits // 8 + 5), dtype=np.uint8)
        for flip in (0, {2: 0xAA, 4: 0x88}.get(bits, 0x80)):
            want = _reference(src ^ np.uint8(flip), rows, cols, bits)
            got = np.zeros_like(want)
            rc = [fn(src.ctypes.data, src.strides[0], got.ctypes.data, got.strides[0],
                     cols // e, s0, s1, bits, flip) for s0, s1 in ((0, 8), (8, 9))]
            if rc != [0, 0] or not np.array_equal(got, want):
                return f"{bits}-bit transpose"
        if stream is not None and not (_streams_right(stream, src, rows, cols, bits, 3)
                                       and _streams_right(stream, _on_line(src, 8), rows,
                                                          cols, bits, 17)):
            return f"{bits}-bit streamed transpose"
    return ""


def _on_line(src, skew: int):
    """``src``'s bytes in rows 64 bytes apart whose first starts ``skew`` bytes after a
    64-byte line: where ``dq_write_transposed`` cuts its bands to whole lines."""
    import numpy as np

    rows, width = src.shape
    stride = -(-width // 64) * 64
    room = np.zeros(rows * stride + 128, np.uint8)
    start = -room.ctypes.data % 64 + skew
    out = room[start:start + rows * stride].reshape(rows, stride)[:, :width]
    out[:] = src
    return out


def _streams_right(stream: object, src, rows: int, cols: int, bits: int,
                   band: int) -> bool:
    """``dq_write_transposed`` of ``src`` in bands of ``band`` words, into rows padded by 8 zero
    bytes, the last output row dropped, 3 bytes into a file: as ``_reference`` says."""
    import tempfile

    import numpy as np

    e = 64 // bits
    row = rows * bits // 8 + 8
    want = np.zeros((cols - 1, row), np.uint8)
    want[:, : row - 8] = _reference(src, rows, cols, bits)[: cols - 1]
    buf = np.full(band * e * row, 0x5A, np.uint8)  # whatever an earlier band left
    with tempfile.TemporaryFile() as f:
        f.write(b"abc")
        n = stream(src.ctypes.data, src.strides[0], rows // e, cols // e, band, bits, 0,
                   buf.ctypes.data, row, cols - 1, f.fileno(), 3, None)
        f.seek(0)
        return n == want.nbytes and f.read() == b"abc" + want.tobytes()


def transpose_fn() -> object | None:
    """The C entry point, built and checked on first call; None where it is off."""
    fn = _state.get("fn", False)
    if fn is not False:
        return fn
    with _lock:
        if "fn" not in _state:
            _state["fn"], _state["why"] = _load()
        return _state["fn"]


def stream_fn() -> object | None:
    """``dq_write_transposed`` (see ``codes.c``): a weight's transpose written band by band
    to a file descriptor without the GIL; None where the compiled helper is off."""
    return _state["lib"].dq_write_transposed if transpose_fn() is not None else None


def reserve(fd: int, offset: int, length: int) -> int:
    """``dq_reserve`` (see ``codes.c``): 0 when the file's bytes ``offset`` .. ``offset +
    length`` are reserved on disk, else the errno why not (EOPNOTSUPP where the system or
    the file system cannot, or the compiled helper is off)."""
    if transpose_fn() is None:
        return errno.EOPNOTSUPP
    return -int(_state["lib"].dq_reserve(fd, offset, length))


class Turn:
    """A turn for writes into one file (``threading.RLock``'s ``with`` and ``acquire`` /
    ``release``), that ``dq_write_transposed`` takes too: Python's writes and the C ones
    into the same file then take turns on one lock. Waiting for it releases the GIL."""

    def __init__(self, lib: object) -> None:
        self._lib = lib
        self.handle = lib.dq_turn_new()
        if not self.handle:
            raise MemoryError("dq_turn_new")

    def acquire(self) -> bool:
        self._lib.dq_turn_take(self.handle)
        return True

    def release(self) -> None:
        self._lib.dq_turn_give(self.handle)

    __enter__ = acquire

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:
        handle, self.handle = getattr(self, "handle", None), None
        if handle:
            self._lib.dq_turn_free(handle)


def write_at(fd: int, data: object, offset: int, turn: Turn | None = None) -> bool:
    """``data`` (a contiguous buffer) written whole at ``offset`` of ``fd`` by the compiled
    helper, in pieces (``dqtool.storage.write_pieces``) and in ``turn``, without the GIL: True;
    False where the helper is off (nothing written). A failed write raises OSError."""
    if transpose_fn() is None:
        return False
    import numpy as np

    buf = np.frombuffer(data, np.uint8)  # type: ignore[call-overload]
    rc = _state["lib"].dq_write_all(fd, buf.ctypes.data, buf.size, offset,
                                    turn.handle if turn is not None else None)
    if rc < 0:
        raise OSError(-rc, os.strerror(-rc))
    return True


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
    without the GIL: True; False where the compiled helper is off (nothing done).
    ``codes``: uint8 rows, one code a byte (``bits`` 8, masked to the table's levels) or
    ``bits`` (4 or 2) packed low bits first, ``cols`` codes a row in whole bytes;
    ``tables`` (row groups, column groups, L) with L 4 or 16 entries of 2 or 4 bytes;
    ``out`` (rows, cols) of the tables' type; all C-contiguous."""
    if transpose_fn() is None:
        return False
    groups, ncg, levels = tables.shape
    if not (_lut_arrays_fit(codes, cols, bits, rows_per_group, groups, tables, out)
            and cols_per_group > 0 and ncg * cols_per_group >= cols):
        raise ValueError(f"dq_lut_rows: arrays that do not fit: codes {codes.shape}, {cols} "
                         f"codes of {bits} bits a row, tables {tables.shape}, groups of "
                         f"{rows_per_group} x {cols_per_group}, out {out.shape}")
    rc = _state["lib"].dq_lut_rows(codes.ctypes.data, codes.shape[0], cols, bits,
                                   rows_per_group, cols_per_group, ncg, tables.ctypes.data,
                                   levels, tables.itemsize, out.ctypes.data)
    if rc < 0:
        raise ValueError(f"dq_lut_rows: {os.strerror(-rc)}")
    return True


def lut_select(codes: np.ndarray, cols: int, bits: int, rows_per_group: int,
               tables: np.ndarray, out: np.ndarray) -> bool:
    """``out[r, c] = tables[r // rows_per_group, code(r, c), c]`` (a table per column, laid
    out [row group][level][column] as the kernel computes them) in C on AVX-512 without
    the GIL: True; False where the helper is off or the CPU has no AVX-512BW (nothing
    done: ``lut_rows`` on the tables transposed gives the same). ``codes`` as for
    ``lut_rows``; ``tables`` (row groups, L, cols) with L 4 or 16 entries of 2 or 4 bytes;
    ``out`` (rows, cols) of the tables' type; all C-contiguous."""
    if transpose_fn() is None:
        return False
    if tables.ndim != 3:
        raise ValueError(f"dq_lut_select: tables {tables.shape}, not (groups, levels, cols)")
    groups, levels, tcols = tables.shape
    if not (_lut_arrays_fit(codes, cols, bits, rows_per_group, groups, tables, out)
            and tcols == cols):
        raise ValueError(f"dq_lut_select: arrays that do not fit: codes {codes.shape}, "
                         f"{cols} codes of {bits} bits a row, tables {tables.shape}, groups "
                         f"of {rows_per_group} rows, out {out.shape}")
    rc = _state["lib"].dq_lut_select(codes.ctypes.data, codes.shape[0], cols, bits,
                                     rows_per_group, tables.ctypes.data, levels,
                                     tables.itemsize, out.ctypes.data)
    if rc == -errno.ENOSYS:
        return False
    if rc < 0:
        raise ValueError(f"dq_lut_select: {os.strerror(-rc)}")
    return True


def select_on() -> bool:
    """Whether ``lut_select`` runs here (the helper is on and the CPU has AVX-512BW, not
    turned off by ``set_wide``): asked of C with no rows, so that a caller builds its
    tables in the layout that will be used."""
    if transpose_fn() is None:
        return False
    rc = _state["lib"].dq_lut_select(None, 0, 0, 4, 1, None, 16, 2, None)
    return rc != -errno.ENOSYS


def set_wide(on: bool) -> bool:
    """Turn the AVX-512 paths (the tile loop, ``lut_select``) on (where the CPU has them)
    or off; returns whether they are on. Both ways give the same bytes: tests run each.
    False where the helper is off."""
    if transpose_fn() is None:
        return False
    return bool(_state["lib"].dq_set_wide(1 if on else 0))


def new_turn() -> Turn | None:
    """A ``Turn`` where the compiled helper is on, else None (use ``threading.RLock``)."""
    return Turn(_state["lib"]) if transpose_fn() is not None else None


def describe() -> str:
    """'on (path)' or 'off (reason)'; builds the library if it is not built yet."""
    transpose_fn()
    return str(_state["why"])


def status() -> str:
    """What ``describe()`` would say, without building or loading anything (fast)."""
    if os.environ.get("DQTOOL_NATIVE", "1") == "0":
        return "off (DQTOOL_NATIVE=0)"
    if "why" in _state:
        return str(_state["why"])
    try:
        path = library_path()
    except OSError as e:
        return f"off ({e})"
    if path.exists():
        return f"built ({path})"
    return f"not built yet (compiled on first use into {path.parent})"
