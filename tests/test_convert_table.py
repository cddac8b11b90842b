"""upgrade/downgrade's table: one row per distinct rewrite."""

from __future__ import annotations

from dqtool.cli.convert_render import _grouped


def test_nodes_rewritten_alike_share_a_row_and_are_counted():
    same = ("main", "com.microsoft:MatMulNBits-1", "changed", "→ DequantizeLinear (3072, 3072)")
    other = ("main", "com.microsoft:MatMulNBits-1", "changed", "→ DequantizeLinear (3072, 8192)")
    rows = [(f"l{i}.q", *same) for i in range(5)] + [("l0.up", *other),
                                                      ("bad", "main", "op", "REFUSED", "why")]
    out = _grouped(rows)
    assert out == [("l0.q, l1.q, l2.q and 2 more (5 nodes)", *same), ("l0.up", *other),
                   ("bad", "main", "op", "REFUSED", "why")]


def test_two_alike_are_both_named():
    row = ("main", "op", "changed", "how")
    assert _grouped([("a", *row), ("b", *row)]) == [("a, b (2 nodes)", *row)]
