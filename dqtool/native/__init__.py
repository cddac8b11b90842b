"""Compiled helpers: the packed-code transpose at the heart of ``upgrade``, ``pack`` and
``fold`` of MatMulNBits, in C (``codes.c``), loaded with ctypes.

Why: a 7B-class model holds ~1.8 GB of 4-bit weights and its conversion's target is twice
the time of copying the file. On one core a 12.6 MB weight (8192 x 3072 codes) takes
8.8 ms on the NumPy path (``packing.transpose_codes_numpy``) and 3.8 ms here, output
allocation included (measured on this project's machine, median of 10).

It is optional. The source is compiled on first use with the machine's C compiler
(``$CC``, else Python's own, else ``cc``) into a per-user cache, keyed by the source, the
compiler command and the platform, and checked against the obvious transpose on every
width before use. Without a compiler, on a big-endian machine, if the build or that check
fails, or with ``DQTOOL_NATIVE=0``, everything runs on NumPy, with the same bytes.
``describe()`` says which; ``status()`` (``dqtool --version``) says so without building.

Where: ``$DQTOOL_NATIVE_DIR``; else ``$XDG_CACHE_HOME/dqtool`` or ``~/.cache/dqtool``,
and where that cannot be written, ``dqtool-native-<uid>`` in the temporary folder.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shlex
import struct
import sys
import sysconfig
import threading
from pathlib import Path

SOURCE = Path(__file__).with_name("codes.c")
VERSION = 1  # dq_native_version() of a build that means what this loader expects

_lock = threading.Lock()
_state: dict[str, object] = {}  # "fn": the entry point or None, "why": the reason


def _compiler() -> list[str]:
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    return shlex.split(cc)


def _flags() -> list[str]:
    return ["-O3", "-std=c99", "-shared", "-fPIC", "-fno-strict-aliasing"]


def cache_dir() -> Path:
    env = os.environ.get("DQTOOL_NATIVE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dqtool"


def _fallback_dir() -> Path | None:
    """Where to build when the cache cannot be written (a read-only home): a per-user
    folder in the temporary directory; none when ``DQTOOL_NATIVE_DIR`` names the place."""
    if os.environ.get("DQTOOL_NATIVE_DIR"):
        return None
    import tempfile

    uid = os.getuid() if hasattr(os, "getuid") else "user"
    return Path(tempfile.gettempdir()) / f"dqtool-native-{uid}"


def library_path(folder: Path | None = None) -> Path:
    """Where this source's build, with this compiler, on this platform, lives (in the
    cache, or in ``folder``)."""
    h = hashlib.sha256(SOURCE.read_bytes())
    h.update(" ".join([*_compiler(), *_flags()]).encode())
    h.update(f"{sys.platform}-{platform.machine()}-{struct.calcsize('P')}".encode())
    return (folder or cache_dir()) / f"codes-{h.hexdigest()[:16]}.so"


class CompileError(OSError):
    """The compiler ran and failed (no other folder will do better)."""


def _build(target: Path) -> None:
    """Compile into a temporary file next to ``target``, then rename it into place (two
    processes building at once each rename a complete library)."""
    import subprocess
    import tempfile

    target.parent.mkdir(parents=True, exist_ok=True)
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
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _built() -> Path:
    """The library, built if it is not there yet: in the cache, else the fallback."""
    path = library_path()
    if path.exists():
        return path
    try:
        _build(path)
        return path
    except CompileError:
        raise
    except OSError:  # the cache cannot be written: the fallback folder, if any
        other = _fallback_dir()
        if other is None:
            raise
        path = library_path(other)
        if not path.exists():
            _build(path)
        return path


def _load() -> tuple[object | None, str]:
    import ctypes

    if os.environ.get("DQTOOL_NATIVE", "1") == "0":
        return None, "off (DQTOOL_NATIVE=0)"
    if sys.byteorder != "little":
        return None, "off (big-endian machine)"
    try:
        path = _built()
        try:
            lib = ctypes.CDLL(str(path))
        except OSError:
            # A cached build that does not load (truncated by a full disk, say) is built
            # again, once. (Not one that loads but fails the check: dlopen would hand back
            # the loaded one.)
            path.unlink(missing_ok=True)
            path = _built()
            lib = ctypes.CDLL(str(path))
        if lib.dq_native_version() != VERSION:
            return None, f"off ({path} is version {lib.dq_native_version()}, not {VERSION})"
        fn = lib.dq_transpose_codes
    except (OSError, AttributeError) as e:
        return None, f"off ({e})"
    i64 = ctypes.c_int64
    fn.argtypes = [ctypes.c_void_p, i64, ctypes.c_void_p, i64, i64, i64, i64,
                   ctypes.c_int, ctypes.c_int]
    fn.restype = ctypes.c_int
    bad = _self_check(fn)
    if bad:
        return None, f"off ({path} disagrees with NumPy: {bad})"
    return fn, f"on ({path})"


def _reference(p, rows: int, cols: int, bits: int):
    """The transpose the slow, obvious way (every code unpacked, transposed, packed)."""
    import numpy as np

    per, mask = 8 // bits, (1 << bits) - 1
    codes = np.stack([(p >> (bits * j)) & mask for j in range(per)], axis=-1)
    codes = codes.reshape(rows, -1)[:, :cols].T  # (cols, rows)
    grouped = codes.reshape(cols, rows // per, per).astype(np.uint8)
    out = np.zeros((cols, rows // per), np.uint8)
    for j in range(per):
        out |= grouped[..., j] << (bits * j)
    return out


def _self_check(fn: object) -> str:
    """'' if the build transposes like the obvious way on every width (with and without a
    flip of every byte), else what differed."""
    import numpy as np

    rng = np.random.default_rng(7)
    for bits in (2, 4, 8):
        e = 64 // bits
        rows, cols = 3 * e, 2 * e
        src = rng.integers(0, 256, (rows, cols * bits // 8 + 5), dtype=np.uint8)
        for flip in (0, 0x88 if bits == 4 else 0x80 if bits == 8 else 0xAA):
            want = _reference(src ^ np.uint8(flip), rows, cols, bits)
            got = np.empty_like(want)
            rc = fn(src.ctypes.data, src.strides[0], got.ctypes.data, got.strides[0],
                    cols // e, 0, rows // e, bits, flip)
            if rc != 0 or not np.array_equal(got, want):
                return f"{bits}-bit transpose"
    return ""


def transpose_fn() -> object | None:
    """The C entry point, built and checked on first call; None where it is off."""
    fn = _state.get("fn", False)
    if fn is not False:
        return fn
    with _lock:
        if "fn" not in _state:
            _state["fn"], _state["why"] = _load()
        return _state["fn"]


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
        other = _fallback_dir()
        for built in (path, library_path(other) if other is not None else None):
            if built is not None and built.exists():
                return f"built ({built})"
    except OSError as e:
        return f"off ({e})"
    return f"not built yet (compiled on first use into {path.parent})"
