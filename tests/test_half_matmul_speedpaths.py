"""``checking.half_matmul``: chunks of the reduced axis summed by ``np.add.reduce`` (or
``accumulate``), B widened by ``half.widen_into``, against ``np.matmul`` itself (NumPy's
float16 loop), bit for bit (NaN payloads aside, as ``compare.bit_identical``)."""

from __future__ import annotations

import numpy as np
import pytest

from dqtool.checking import half_matmul
from dqtool.checking.compare import bit_identical
from dqtool.kernel import half


@pytest.fixture(autouse=True)
def _fast_widening(monkeypatch) -> None:
    monkeypatch.setattr(half, "WARM_UP_ELEMENTS", 0)  # onnxruntime's Cast where verified


def _values(rng: np.random.Generator, shape: tuple[int, ...], kind: str) -> np.ndarray:
    x = rng.standard_normal(shape).astype(np.float32)
    if kind == "overflow":  # sums past 65504: inf in float16
        x *= 400
    elif kind == "subnormal":  # products and sums far below float16's normals
        x *= 3e-4
    h = x.astype(np.float16)
    if kind == "special":
        flat = h.reshape(-1)
        idx = rng.integers(0, flat.size, max(1, flat.size // 40))
        flat[idx] = rng.choice(np.array([np.inf, -np.inf, np.nan, 65504, -65504, 6e-8,
                                         -0.0], np.float16), idx.size)
    return h


def _check(a: np.ndarray, b: np.ndarray) -> None:
    with np.errstate(all="ignore"):
        want = np.matmul(a, b)
        got = half_matmul.matmul(a, b)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert bit_identical(got, want), (a.shape, b.shape)


SHAPES = [  # (a, b): 1-D, matrices, M > 1, batches that broadcast, one-element outputs
    ((37,), (37, 5)), ((64, 3), (3,)), ((1, 300), (300, 1)), ((300,), (300,)),
    ((1, 1, 257), (257, 700)), ((4, 129), (129, 33)), ((2, 3, 70), (70, 9)),
    ((3, 1, 2, 50), (2, 50, 6)), ((5, 1), (1, 8)), ((2, 1, 1, 90), (90,)),
    ((1, 1000), (1000, 2)), ((2, 1000), (1000, 1)), ((7, 1, 40), (1, 40, 3)),
]


@pytest.mark.parametrize(("a_shape", "b_shape"), SHAPES)
@pytest.mark.parametrize("kind", ["normal", "overflow", "subnormal", "special"])
def test_numpys_bits(a_shape, b_shape, kind) -> None:
    kinds = ["normal", "overflow", "subnormal", "special"]
    rng = np.random.default_rng([*a_shape, 0, *b_shape, kinds.index(kind)])
    _check(_values(rng, a_shape, kind), _values(rng, b_shape, kind))


@pytest.mark.parametrize("chunk", [1, 3, 64, 1 << 17])
def test_chunks_that_do_not_divide_k(monkeypatch, chunk) -> None:
    # chunks of one row, of a few rows ending anywhere, and of all of K
    monkeypatch.setattr(half_matmul, "CHUNK_ELEMENTS", chunk * 50)
    rng = np.random.default_rng(chunk)
    for a_shape, b_shape in (((1, 1001), (1001, 50)), ((3, 999), (999, 50)), ((999,), (999,))):
        for kind in ("normal", "special"):
            _check(_values(rng, a_shape, kind), _values(rng, b_shape, kind))


@pytest.mark.parametrize(("a_shape", "b_shape"), [
    ((1, 20000), (20000, 2)), ((20000,), (20000,)), ((2, 20000), (20000, 1)),
    ((1, 1, 20000), (20000, 3))])
def test_the_adds_are_in_the_order_of_k(a_shape, b_shape) -> None:
    # 2048 then 2^-13 twenty thousand times: added in order, each small term is a tie that
    # rounds back to 2048 in float32; summed pairwise they would add up to ~2.4 (2050 in
    # float16). NumPy's own loop adds in order.
    a = np.ones(a_shape, np.float16)
    b = np.full(b_shape, np.float16(2.0 ** -13))
    b[0] = 2048
    with np.errstate(all="ignore"):
        want = np.matmul(a, b)
    assert (want == 2048).all()
    _check(a, b)


def test_llm_shape() -> None:
    rng = np.random.default_rng(3)
    a = _values(rng, (1, 1, 3072), "normal")
    b = (_values(rng, (3072, 2048), "normal") * np.float16(0.02)).astype(np.float16)
    _check(a, b)


def test_numpy_widening_gives_the_same_bits(monkeypatch) -> None:
    monkeypatch.setenv("DQTOOL_ORT_CAST", "0")
    rng = np.random.default_rng(9)
    _check(_values(rng, (2, 513), "special"), _values(rng, (513, 600), "special"))


def test_mismatched_shapes_raise_numpys_error() -> None:
    with pytest.raises(ValueError):
        half_matmul.matmul(np.ones((2, 3), np.float16), np.ones((4, 5), np.float16))
