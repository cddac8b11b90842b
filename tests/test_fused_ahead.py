"""Large lazily built constants of the fused rewrites are computed one ahead, on another
thread, in build order; the values are the same in any order of use."""

from __future__ import annotations

import threading

import pytest

from dqtool.families.fused.surgery import _Ahead


def _slots(n: int, log: list):
    def make(i: int):
        def f():
            log.append((i, threading.current_thread().name))
            return i * 10
        return f
    return [_Ahead(make(i)) for i in range(n)]


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
    broken = _Ahead(lambda: (_ for _ in ()).throw(ValueError("broken weight")))
    assert first() == 0
    with pytest.raises(ValueError, match="broken weight"):
        broken()
