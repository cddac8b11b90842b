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
    built = list(fresh.glob("codes-*.so"))
    assert [p.name for p in built] == [native.library_path().name]
    assert native.describe() == f"on ({built[0]})"
    _transposes_right()
    # a second process (a fresh loader) uses the cached build: nothing new is written
    mtime = built[0].stat().st_mtime_ns
    native._state.clear()
    assert native.transpose_fn() is not None
    assert built[0].stat().st_mtime_ns == mtime and len(list(fresh.iterdir())) == 1


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


def test_the_build_depends_on_source_and_compiler(fresh, monkeypatch) -> None:
    gcc = native.library_path()
    monkeypatch.setenv("CC", "cc -g")
    assert native.library_path() != gcc


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


def test_a_cache_that_cannot_be_written_builds_in_the_temporary_folder(monkeypatch,
                                                                       tmp_path) -> None:
    monkeypatch.setattr(native, "_state", {})
    monkeypatch.delenv("DQTOOL_NATIVE_DIR", raising=False)
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder would be")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    assert native.transpose_fn() is not None
    built = native.describe()
    assert built.startswith(f"on ({tmp_path / 'tmp'}/dqtool-native-")
    _transposes_right()


def test_a_cached_build_that_does_not_load_is_built_again(fresh) -> None:
    path = native.library_path()
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\x7fELF truncated")  # what a full disk can leave
    assert native.transpose_fn() is not None
    assert native.describe() == f"on ({path})"
    assert path.stat().st_size > 1000
    _transposes_right()
