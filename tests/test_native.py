"""The compiled helper's loader (``dqtool.native``): built on first use into its cache,
checked against NumPy, and off, with the reason, wherever it cannot be trusted. Whatever
the loader decides, the transpose gives the same bytes."""

from __future__ import annotations

import numpy as np
import pytest

from dqtool import native
from dqtool.families.fused import packing


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """A loader that has decided nothing yet, building into an empty cache."""
    monkeypatch.setattr(native, "_state", {})
    monkeypatch.setenv("DQTOOL_NATIVE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("DQTOOL_NATIVE", raising=False)
    return tmp_path / "cache"


def _transposes_right() -> None:
    rng = np.random.default_rng(11)
    p = rng.integers(0, 256, (48, 40), dtype=np.uint8)  # 48 rows of 80 4-bit codes
    codes = packing.unpack(p, 4)
    want = packing.pack(np.ascontiguousarray(codes.T), 4)
    assert np.array_equal(packing.transpose_codes(p, 48, 80, 4), want)


def test_built_into_the_cache_on_first_use(fresh) -> None:
    assert not fresh.exists()
    assert native.transpose_fn() is not None
    lib = native.library_path()
    assert sorted(p.name for p in fresh.iterdir()) == [lib.with_suffix(".sha256").name,
                                                      lib.name]
    assert native.describe() == f"on ({lib})"
    assert fresh.stat().st_mode & 0o777 == 0o700  # the cache folder is private
    _transposes_right()
    # a second process (a fresh loader) uses the cached build: nothing new is written
    mtime = lib.stat().st_mtime_ns
    native._state.clear()
    assert native.transpose_fn() is not None
    assert lib.stat().st_mtime_ns == mtime and len(list(fresh.iterdir())) == 2


def test_builds_of_another_source_or_compiler_are_pruned(fresh) -> None:
    fresh.mkdir()
    (fresh / "codes-0123456789abcdef.so").write_bytes(b"an old build")
    (fresh / "codes-0123456789abcdef.sha256").write_text("0" * 64)
    assert native.transpose_fn() is not None
    assert sorted(p.stem for p in fresh.iterdir()) == [native.library_path().stem] * 2


def test_off_by_request(fresh, monkeypatch) -> None:
    monkeypatch.setenv("DQTOOL_NATIVE", "0")
    assert native.transpose_fn() is None
    assert native.describe() == "off (DQTOOL_NATIVE=0)"
    assert not fresh.exists()
    _transposes_right()


def test_a_failing_compiler_leaves_numpy_and_no_files(fresh, monkeypatch) -> None:
    monkeypatch.setenv("CC", "false")  # a "compiler" that fails
    assert native.transpose_fn() is None
    assert native.describe().startswith("off (false failed")
    assert list(fresh.iterdir()) == []  # no half-built library left behind
    _transposes_right()


def test_a_missing_compiler_leaves_numpy(fresh, monkeypatch) -> None:
    monkeypatch.setenv("CC", "/nonexistent/cc")
    assert native.transpose_fn() is None
    assert "nonexistent" in native.describe()
    _transposes_right()


def test_the_build_depends_on_source_and_compiler(fresh, monkeypatch, tmp_path) -> None:
    gcc = native.library_path()
    monkeypatch.setenv("CC", "cc -g")
    assert native.library_path() != gcc
    monkeypatch.delenv("CC")
    changed = tmp_path / "codes.c"
    changed.write_text(native.SOURCE.read_text() + "\n/* changed */\n")
    monkeypatch.setattr(native, "SOURCE", changed)
    assert native.library_path() != gcc


def test_a_compiler_command_that_cannot_be_split_is_off(fresh, monkeypatch) -> None:
    monkeypatch.setenv("CC", 'gcc "')
    assert native.status().startswith("off (CC='gcc \"' cannot be split")
    assert native.transpose_fn() is None
    assert "cannot be split" in native.describe()
    _transposes_right()


def test_a_build_of_another_version_is_not_used(fresh, monkeypatch) -> None:
    monkeypatch.setattr(native, "VERSION", native.VERSION + 1)
    assert native.transpose_fn() is None
    assert f"not {native.VERSION}" in native.describe()
    _transposes_right()


def test_the_self_check_catches_a_wrong_transpose(fresh) -> None:
    fn = native.transpose_fn()
    assert fn is not None and native._self_check(fn) == ""

    def swaps_flip(src, src_stride, dst, dst_stride, wide, s0, s1, bits, flip):
        return fn(src, src_stride, dst, dst_stride, wide, s0, s1, bits, 0)  # ignores flip

    def refuses(*args):
        return -1

    assert native._self_check(swaps_flip) == "2-bit transpose"
    assert native._self_check(refuses) == "2-bit transpose"


def test_the_entry_point_refuses_other_widths(fresh) -> None:
    fn = native.transpose_fn()
    buf = np.zeros((16, 16), np.uint8)
    assert fn(buf.ctypes.data, 16, buf.ctypes.data, 16, 1, 0, 1, 3, 0) == -1


def test_a_cache_that_cannot_be_written_builds_privately(monkeypatch, tmp_path) -> None:
    # A read-only home: the library is built into a fresh private folder for this process
    # (never a shared, guessable one another user could have filled), removed once loaded.
    monkeypatch.setattr(native, "_state", {})
    monkeypatch.delenv("DQTOOL_NATIVE_DIR", raising=False)
    monkeypatch.delenv("DQTOOL_NATIVE", raising=False)
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder would be")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
    assert native.transpose_fn() is not None
    assert native.describe() == (f"on (built for this process alone: {blocker / 'dqtool'} "
                                 "cannot be written)")
    assert list((tmp_path / "tmp").iterdir()) == []
    _transposes_right()


def test_a_library_others_could_have_written_is_not_loaded(fresh) -> None:
    assert native.transpose_fn() is not None
    lib = native.library_path()
    for target in (lib, fresh):
        target.chmod(target.stat().st_mode | 0o022)
        native._state.clear()
        assert native.transpose_fn() is None
        assert native.describe() == f"off ({target} is writable by others)"
        _transposes_right()
        target.chmod(target.stat().st_mode & ~0o022)


@pytest.mark.parametrize("damage", ["truncated", "garbage", "no digest"])
def test_a_damaged_cached_build_is_built_again(fresh, damage: str) -> None:
    # A truncated library would crash a process that maps it (SIGBUS): its bytes are
    # checked against the digest its build recorded before it is loaded. Loaded in a new
    # process, as a later command would (this one has the library mapped already).
    import os
    import subprocess
    import sys

    assert native.transpose_fn() is not None
    lib = native.library_path()
    good = lib.read_bytes()
    if damage == "no digest":
        lib.with_suffix(".sha256").unlink()
    else:
        bad = lib.with_name("damaged")
        bad.write_bytes(good[:5000] if damage == "truncated" else b"\x7fELF" + bytes(100))
        os.replace(bad, lib)  # a new file: the mapped one stays as it is
    code = ("from dqtool import native; from dqtool.families.fused import packing; "
            "import numpy as np; print(native.describe()); "
            "p = np.arange(48 * 40, dtype=np.uint8).reshape(48, 40); "
            "print(packing.transpose_codes(p, 48, 80, 4).sum())")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "DQTOOL_NATIVE_DIR": str(fresh)}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    import numpy as np

    from dqtool.families.fused import packing

    p = np.arange(48 * 40, dtype=np.uint8).reshape(48, 40)
    assert proc.stdout.splitlines() == [f"on ({lib})",
                                        str(packing.transpose_codes(p, 48, 80, 4).sum())]
    assert lib.read_bytes() == good  # built again, the same bytes


def test_a_turn_is_reentrant_and_excludes_other_threads(fresh) -> None:
    # The writers' lock in C (dq_turn_*): held twice by one thread, another waits for it.
    import threading

    turn = native.new_turn()
    assert turn is not None and turn.handle, native.describe()
    taken = threading.Event()

    def other() -> None:
        with turn:
            taken.set()

    with turn:
        with turn:  # a copy through user space writes within its own turn
            t = threading.Thread(target=other)
            t.start()
            assert not taken.wait(0.2)
        assert not taken.wait(0.1)  # still held once
    assert taken.wait(30)
    t.join()


def test_reserve_allocates_the_bytes_or_says_why(fresh, tmp_path, monkeypatch) -> None:
    import errno

    path = tmp_path / "reserved.bin"
    with open(path, "wb") as f:
        err = native.reserve(f.fileno(), 0, 3 << 20)
    if err == 0:  # a file system with fallocate: the size is there, read as zeros
        assert path.stat().st_size == 3 << 20
        assert path.read_bytes() == bytes(3 << 20)
    else:
        assert err == errno.EOPNOTSUPP and path.stat().st_size == 0
    with open(path, "rb") as f:  # a descriptor open for reading only: EBADF, nothing else
        assert native.reserve(f.fileno(), 0, 1 << 20) == errno.EBADF
    monkeypatch.setenv("DQTOOL_NATIVE", "0")  # off: nothing is reserved, no C lock
    native._state.clear()
    with open(path, "r+b") as f:
        assert native.reserve(f.fileno(), 0, 1 << 20) == errno.EOPNOTSUPP
    assert native.new_turn() is None


def test_a_build_that_fails_the_check_is_not_kept(fresh, monkeypatch) -> None:
    # The check runs once, when the library is built; a build that fails it is neither
    # used nor cached (a later process would build and check it again).
    monkeypatch.setattr(native, "_self_check", lambda *a: "4-bit transpose")
    assert native.transpose_fn() is None
    assert "disagrees with the obvious transpose: 4-bit transpose" in native.describe()
    assert not list(fresh.glob("codes-*")) and not list(fresh.glob("*.sha256"))
    _transposes_right()


def test_a_cached_build_is_loaded_without_checking_again(fresh, monkeypatch) -> None:
    assert native.transpose_fn() is not None  # built and checked
    native._state.clear()
    monkeypatch.setattr(native, "_self_check", lambda *a: pytest.fail("checked again"))
    assert native.transpose_fn() is not None
    assert native.describe() == f"on ({native.library_path()})"
    _transposes_right()


def test_the_streamed_transpose_refuses_what_would_overrun(fresh, tmp_path) -> None:
    # Rows narrower than a band's codes would overrun the buffer; no words a band would
    # never end: both refused (-EINVAL) before anything is touched or written.
    import errno

    assert native.transpose_fn() is not None, native.describe()
    stream = native.stream_fn()
    src = np.zeros((32, 16), np.uint8)
    buf = np.zeros(4096, np.uint8)
    with open(tmp_path / "out.bin", "wb") as f:
        for out_row, band in ((15, 1), (16, 0)):  # 2 squares of 4-bit: rows of 16 bytes
            assert stream(src.ctypes.data, 16, 2, 2, band, 4, 0, buf.ctypes.data, out_row,
                          32, f.fileno(), 0, None) == -errno.EINVAL
    assert (tmp_path / "out.bin").stat().st_size == 0 and not buf.any()


def test_the_avx512_tiles_are_on_where_the_cpu_has_them(fresh) -> None:
    # The wide tile loop is taken where the CPU has AVX-512F, and can be turned off (the
    # tests of the transposes run both); off, the portable loop gives the same bytes.
    import platform

    assert native.transpose_fn() is not None, native.describe()
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


def test_the_build_check_runs_both_tile_loops(fresh) -> None:
    # A library built on a CPU with AVX-512 may be loaded from a shared cache by one
    # without it: the check at build time runs the portable loop too, and says which
    # loop disagreed.
    assert native.transpose_fn() is not None
    lib = native._state["lib"]
    fn = lib.dq_transpose_codes
    modes: list[int] = []
    on = {"now": 1}

    def set_wide(mode: int) -> int:
        modes.append(mode)
        on["now"] = lib.dq_set_wide(mode)
        return on["now"]

    has = bool(lib.dq_set_wide(1))
    assert native._self_check(fn, lib.dq_write_transposed, set_wide) == ""
    # asked (and turned on), the portable loop, the wide one, back on as loaded
    assert modes == ([1, 0, 1, 1] if has else [1, 1])
    assert lib.dq_set_wide(1) == has

    def wrong_when_wide(*args: object) -> int:
        return -1 if on["now"] else fn(*args)

    bad = native._self_check(wrong_when_wide, None, set_wide)
    assert bad == ("2-bit transpose (AVX-512 tiles)" if has else "")
