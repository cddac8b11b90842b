"""The float16 rounding through onnxruntime's Cast (``kernel/half.py``) against NumPy's:
exhaustively on the domain it is used for, and through the kernel on random layouts."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from dqtool.kernel import dequantize, half
from dqtool.runtimes.onnxruntime import installed_version, release_of

VERIFIED = installed_version() is not None and release_of(installed_version()) in half.VERIFIED


class _Counting:
    """The fast cast's session, counting its runs (to prove a test used it)."""

    def __init__(self, session) -> None:
        self.session, self.runs = session, 0

    def run(self, *args, **kwargs):
        self.runs += 1
        return self.session.run(*args, **kwargs)


@pytest.fixture(autouse=True)
def _no_warm_up(monkeypatch) -> None:
    monkeypatch.setattr(half, "WARM_UP_ELEMENTS", 0)


@pytest.fixture
def counted(monkeypatch) -> _Counting | None:
    if not half.available():
        return None
    spy = _Counting(half._session)
    monkeypatch.setattr(half, "_session", spy)
    return spy


def _all_finite(dtype: np.dtype) -> np.ndarray:
    s = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(dtype)
    return s[np.isfinite(s.astype(np.float32))].astype(np.float32)


def test_used_only_on_verified_releases() -> None:
    # What the installed release does is data: listed and probed, or NumPy.
    assert half.available() == VERIFIED


@pytest.mark.skipif(not VERIFIED, reason="the fast cast is off on unlisted releases")
@pytest.mark.parametrize("scale_type", [np.float16, ml_dtypes.bfloat16])
def test_every_product_of_the_domain_rounds_as_numpy(scale_type, counted) -> None:
    # Every float32(d)·float32(s): d in [-255, 255], s every finite float16 / bfloat16.
    s = _all_finite(np.dtype(scale_type))
    out = np.empty(s.size, np.float16)
    for d in range(-half.D_RANGE, half.D_RANGE + 1):
        with np.errstate(over="ignore"):  # bfloat16 products may overflow float32: inf
            x = np.float32(d) * s
            half.cast_into(out, x, covered=True)
            want = x.astype(np.float16)
        assert np.array_equal(out.view(np.uint16), want.view(np.uint16)), d
    assert counted.runs == 2 * half.D_RANGE + 1


def test_probe_has_ties_subnormals_and_overflow() -> None:
    x = half.probe_values()
    with np.errstate(over="ignore"):
        h = x.astype(np.float16)
    assert np.isinf(h).any() and (np.abs(h) < np.float16(6.1e-5)).any()
    back = h.astype(np.float32)
    assert ((x != back) & np.isfinite(back)).sum() > 1000  # values that round


def test_outside_the_domain_numpy_converts(monkeypatch) -> None:
    calls = []
    monkeypatch.setattr(half, "_session", None)
    monkeypatch.setattr(half, "available", lambda: calls.append(1) or True)
    x = np.linspace(-1e6, 1e6, 1 << 13, dtype=np.float32)
    out = np.empty_like(x, np.float16)
    with np.errstate(over="ignore"):
        half.cast_into(out, x, covered=False)  # not covered: NumPy, the session unused
        assert np.array_equal(out.view(np.uint16), x.astype(np.float16).view(np.uint16))
    assert not calls
    s = np.array([1.0, np.inf], np.float16)
    assert not half.covers(np.dtype(ml_dtypes.uint4), s.dtype, s.astype(np.float32))
    assert not half.covers(np.dtype(np.int16), s.dtype, np.ones(2, np.float32))
    assert not half.covers(np.dtype(np.int8), np.dtype(np.float32), np.ones(2, np.float32))
    assert half.covers(np.dtype(np.int8), s.dtype, np.ones(2, np.float32))


def test_small_work_never_sets_it_up(monkeypatch) -> None:
    built = []
    monkeypatch.setattr(half, "WARM_UP_ELEMENTS", 3 * 4096)
    monkeypatch.setattr(half, "_numpy_elements", 0)
    monkeypatch.setattr(half, "_state", None)
    monkeypatch.setattr(half, "_session", None)
    monkeypatch.setattr(half, "_build", lambda: built.append(1))
    x = np.arange(4096, dtype=np.float32) * np.float32(0.37)
    out = np.empty(4096, np.float16)
    for _ in range(3):
        half.cast_into(out, x, covered=True)
        assert np.array_equal(out.view(np.uint16), x.astype(np.float16).view(np.uint16))
    assert not built and half._numpy_elements == 3 * 4096
    half.cast_into(out, x, covered=True)  # past the warm-up: set up (here: declined)
    assert built == [1] and half._state is False
    assert np.array_equal(out.view(np.uint16), x.astype(np.float16).view(np.uint16))


def test_turned_off_by_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("DQTOOL_ORT_CAST", "0")
    assert not half.available()


CASES = [  # (x type, zero point?, x shape, axis, block)
    (ml_dtypes.uint4, True, (256, 96), 0, 128),
    (ml_dtypes.uint4, False, (300, 70), 0, 32),
    (ml_dtypes.int4, True, (97, 130), 1, 16),
    (ml_dtypes.int4, False, (64, 257), 1, 0),
    (ml_dtypes.uint2, True, (129, 64), 0, 64),
    (ml_dtypes.int2, False, (64, 99), 0, 0),
    (np.int8, True, (128, 100), 0, 0),
    (np.uint8, True, (77, 200), 1, 0),
    (np.uint8, True, (200, 77), 0, 50),
]


@pytest.mark.parametrize("scale_type", [np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize(("x_type", "with_zp", "shape", "axis", "block"), CASES)
def test_kernel_float16_output_matches_numpy_rounding(monkeypatch, counted, x_type, with_zp,
                                                      shape, axis, block, scale_type) -> None:
    rng = np.random.default_rng(sum(shape) + axis + block)
    info = ml_dtypes.iinfo(x_type)
    x = rng.integers(int(info.min), int(info.max) + 1, shape).astype(x_type)
    if block:
        s_shape = list(shape)
        s_shape[axis] = -(-shape[axis] // block)
    else:
        s_shape = [shape[axis]]
    # scales over the whole range: products round, underflow to subnormals, overflow
    scale = (rng.standard_normal(s_shape) * 10.0 ** rng.integers(-7, 4, s_shape))
    scale = scale.astype(np.float32).astype(scale_type)
    zp = rng.integers(int(info.min), int(info.max) + 1, s_shape).astype(x_type) \
        if with_zp else None
    out_type = np.float16
    kw = {"axis": axis, "block_size": block}
    if scale_type != np.float16:
        kw["output_dtype"] = out_type
    with np.errstate(over="ignore"):
        fast = dequantize(x, scale, zp, **kw)
        monkeypatch.setenv("DQTOOL_ORT_CAST", "0")
        plain = dequantize(x, scale, zp, **kw)
    if counted is not None:  # the fast cast did run (chunks of at least MIN_ELEMENTS)
        assert counted.runs >= 1
    assert fast.dtype == plain.dtype == np.float16
    assert np.array_equal(fast.view(np.uint16), plain.view(np.uint16))
    # and the plain path itself is the float32 product rounded once
    xs = x.astype(np.float32) - (0 if zp is None else np.broadcast_to(
        np.repeat(zp.astype(np.float32), block or shape[axis], axis=axis if block else 0)
        [tuple(slice(0, d) for d in shape)] if block else
        np.expand_dims(zp.astype(np.float32), 1 - axis), shape))
    sf = scale.astype(np.float32)
    sf = np.repeat(sf, block, axis=axis)[tuple(slice(0, d) for d in shape)] if block \
        else np.expand_dims(sf, 1 - axis)
    with np.errstate(over="ignore"):
        want = (xs * sf).astype(np.float16)
    assert np.array_equal(plain.view(np.uint16), want.view(np.uint16))


def test_non_finite_scales_take_numpy_and_match(monkeypatch) -> None:
    x = np.arange(1 << 14, dtype=np.int64).reshape(128, 128).astype(np.uint8)
    scale = np.full(128, 0.5, np.float16)
    scale[3], scale[5], scale[7] = np.inf, -np.inf, np.nan
    zp = np.full(128, 3, np.uint8)
    x[:, 3] = 3  # (3 - 3) * inf
    x[:, 5] = 9
    with np.errstate(invalid="ignore"):
        fast = dequantize(x, scale, zp, axis=1)
        monkeypatch.setenv("DQTOOL_ORT_CAST", "0")
        plain = dequantize(x, scale, zp, axis=1)
    assert np.array_equal(fast.view(np.uint16), plain.view(np.uint16))
    assert np.isnan(fast[:, 7]).all() and np.isnan(fast[:, 3]).all()
    assert (fast[:, 5] == -np.inf).all() and (fast[:, 0] == fast[:, 0]).all()


def test_a_failing_run_falls_back_to_numpy(monkeypatch) -> None:
    class Broken:
        def run(self, *args, **kwargs):
            raise RuntimeError("out of memory")

    monkeypatch.setattr(half, "_state", True)
    monkeypatch.setattr(half, "_session", Broken())
    x = np.arange(8192, dtype=np.float32) * np.float32(0.37)
    out = np.empty(8192, np.float16)
    half.cast_into(out, x, covered=True)
    assert np.array_equal(out.view(np.uint16), x.astype(np.float16).view(np.uint16))
    # and a float64 source is never handed to the session
    out[:] = 0
    half.cast_into(out, x.astype(np.float64), covered=True)
    assert np.array_equal(out.view(np.uint16), x.astype(np.float16).view(np.uint16))


# --- the output bound to the destination (IOBinding), and float16 → float32 ----------------


@pytest.mark.skipif(not VERIFIED, reason="the fast cast is off on unlisted releases")
def test_bound_output_gets_numpy_bits_in_place() -> None:
    # The real session (no stand-in): its output is written straight into rows of a larger
    # array, through this thread's IOBinding, and nothing else is touched.
    assert half.available()
    s = _all_finite(np.dtype(np.float16))
    x = (np.float32(-13) * s).reshape(16, -1)
    big = np.full((20, x.shape[1]), np.float16(7))
    with np.errstate(over="ignore"):
        half.cast_into(big[2:18], x, covered=True)
        want = x.astype(np.float16)
    assert half._bindings.held[0] is half._session  # the bound path ran
    assert np.array_equal(big[2:18].view(np.uint16), want.view(np.uint16))
    assert (big[:2] == 7).all() and (big[18:] == 7).all()


def test_widening_used_only_on_verified_releases() -> None:
    assert half.widening_available() == VERIFIED


def test_widening_is_numpys_for_every_half() -> None:
    # The whole domain: every float16 bit pattern, NaNs included, in one buffer and in
    # odd pieces (every kind of SIMD tail).
    x = half.every_half()
    out = np.empty(x.size, np.float32)
    half.widen_into(out, x)
    assert half.same_widening(out, x)
    want = x.astype(np.float32)
    finite = ~np.isnan(want)
    assert np.array_equal(out.view(np.uint32)[finite], want.view(np.uint32)[finite])
    for lo, hi in ((3, 4100), (31000, 36111), (60000, 65536)):
        part = np.empty(hi - lo, np.float32)
        half.widen_into(part, x[lo:hi])
        assert half.same_widening(part, x[lo:hi])


def test_widening_strided_and_shaped() -> None:
    rng = np.random.default_rng(11)
    x = rng.integers(0, 1 << 16, (70, 300), dtype=np.uint32).astype(np.uint16)
    x = x.view(np.float16)[::2, 5:290]  # not contiguous
    out = np.empty(x.shape, np.float32)
    half.widen_into(out, x)
    assert half.same_widening(out, x)


def test_widening_probe_and_its_fallbacks(monkeypatch) -> None:
    x = half.every_half()
    got = x.astype(np.float32)
    assert half.same_widening(got, x)
    quieted = got.copy()
    quieted.view(np.uint32)[np.isnan(got)] |= np.uint32(1 << 22)
    assert half.same_widening(quieted, x)  # a NaN for a NaN
    wrong = got.copy()
    wrong[123] = np.nextafter(wrong[123], np.float32(np.inf))
    assert not half.same_widening(wrong, x)
    nan_lost = got.copy()
    nan_lost[np.isnan(got)] = 0
    assert not half.same_widening(nan_lost, x)

    class Broken:
        def run(self, *args, **kwargs):
            raise RuntimeError("out of memory")

    monkeypatch.setattr(half, "_wide_state", True)
    monkeypatch.setattr(half, "_wide_session", Broken())
    out = np.empty(x.size, np.float32)
    half.widen_into(out, x)
    assert np.array_equal(out.view(np.uint32), got.view(np.uint32))  # NumPy's own bits
    monkeypatch.setenv("DQTOOL_ORT_CAST", "0")
    assert not half.widening_available()


def test_small_widening_never_sets_it_up(monkeypatch) -> None:
    built = []
    monkeypatch.setattr(half, "WARM_UP_ELEMENTS", 3 * 4096)
    monkeypatch.setattr(half, "_numpy_widened", 0)
    monkeypatch.setattr(half, "_wide_state", None)
    monkeypatch.setattr(half, "_wide_session", None)
    monkeypatch.setattr(half, "_build_widening", lambda: built.append(1))
    x = half.every_half()[:4096]
    out = np.empty(4096, np.float32)
    for _ in range(3):
        half.widen_into(out, x)
    assert not built and half._numpy_widened == 3 * 4096
    half.widen_into(out, x)  # past the warm-up: set up (here: declined)
    assert built == [1] and half._wide_state is False
    assert np.array_equal(out.view(np.uint32), x.astype(np.float32).view(np.uint32))
