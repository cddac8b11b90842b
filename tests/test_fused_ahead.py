"""Large lazily built constants of the fused rewrites are computed one ahead, on another
thread, in build order; the values are the same in any order of use."""

from __future__ import annotations

import threading

import pytest

from dqtool.families.fused.surgery import _ComputedAhead


def _slots(n: int, log: list):
    def make(i: int):
        def f():
            log.append((i, threading.current_thread().name))
            return i * 10
        return f
    return [_ComputedAhead(make(i)) for i in range(n)]


def test_in_order_the_next_is_computed_ahead_on_another_thread() -> None:
    log: list = []
    a, b, c = _slots(3, log)
    assert a() == 0
    assert b() == 10
    assert c() == 20
    by = dict(log)
    assert by[0] == threading.current_thread().name
    assert by[1].startswith("dqtool-ahead") and by[2].startswith("dqtool-ahead")
    assert len(log) == 3  # each computed once


def test_out_of_order_and_repeated_uses_give_the_same_values() -> None:
    log: list = []
    s = _slots(5, log)
    assert [s[i]() for i in (3, 0, 0, 4, 1, 2, 2)] == [30, 0, 0, 40, 10, 20, 20]


def test_an_error_computed_ahead_is_raised_where_the_value_is_used() -> None:
    log: list = []
    first = _slots(1, log)[0]
    broken = _ComputedAhead(lambda: (_ for _ in ()).throw(ValueError("broken weight")))
    assert first() == 0
    with pytest.raises(ValueError, match="broken weight"):
        broken()


@pytest.mark.parametrize("kind", ["packed", "float16", "uint8", "uint4-unpacked", "bool"])
def test_a_lazy_constant_writes_the_bytes_of_its_tensor_in_pieces(kind, monkeypatch,
                                                                   tmp_path) -> None:
    import ml_dtypes
    import numpy as np
    import onnx_ir as ir

    from dqtool.families.fused import surgery
    from dqtool.storage import write_pieces

    monkeypatch.setattr(write_pieces, "WRITE_PIECE", 7)
    rng = np.random.default_rng(0)
    tensor = {
        "packed": lambda: ir.PackedTensor(rng.integers(0, 256, 50, np.uint8),
                                          ir.DataType.UINT4, shape=(100,)),
        "float16": lambda: ir.Tensor(rng.standard_normal(33).astype(np.float16)),
        "uint8": lambda: ir.Tensor(rng.integers(0, 256, (5, 9), np.uint8)),
        "uint4-unpacked": lambda: ir.Tensor(rng.integers(0, 16, 31, np.uint8).view(
            ml_dtypes.uint4), dtype=ir.DataType.UINT4),
        "bool": lambda: ir.Tensor(rng.integers(0, 2, 20).astype(bool)),
    }[kind]()
    lazy = surgery._Lazy(lambda: tensor, dtype=tensor.dtype, shape=tensor.shape)
    path = tmp_path / "t.bin"
    sizes: list[int] = []
    with open(path, "wb") as f:
        class Recording:  # the file, with the size of each write noted
            def write(self, data) -> int:
                sizes.append(memoryview(data).nbytes)
                return f.write(data)

        lazy.tofile(Recording())
    assert path.read_bytes() == tensor.tobytes()
    assert len(tensor.tobytes()) > 7
    assert max(sizes) <= 7  # in pieces (dqtool.storage.write_pieces), whatever the kind


def test_a_weight_that_is_gone_is_not_kept_alive() -> None:
    import gc
    import weakref

    log: list = []
    a, b = _slots(2, log)
    gone = weakref.ref(b)
    del b
    gc.collect()
    assert gone() is None  # the link from a, and the class's latest, do not keep it
    assert a() == 0
    assert [i for i, _ in log] == [0]
