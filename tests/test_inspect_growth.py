"""``dqtool inspect`` stays linear in nodes, counted rather than timed (its times against
lint are in bench/bench_inspect.py and docs/benchmarks.md); and the table it prints for
many nodes is, character for character, the one rich would print.

On 2026-11-28 (`8dc0eb0`) inspect was quadratic: the summary looked each report up in a
list, comparing dataclasses field by field (n²/2 calls of ``NodeReport.__eq__``), and rich
laid out every cell of the table (~1 ms a row).
"""

from __future__ import annotations

import io
import random
import sys
from collections.abc import Callable
from types import SimpleNamespace

import onnx_ir as ir
import pytest
from rich.console import Console
from rich.table import Table

from dqtool.cli.inspect_cmd import render
from dqtool.cli.tables import Column, FastTable, plain_lines
from dqtool.inspection import inspect
from dqtool.printable import safe_console, shown
from tools import many_nodes


def _chain(n: int) -> ir.Model:
    return ir.from_proto(many_nodes.chain(n))


def _flat(n: int) -> ir.Model:
    return ir.from_proto(many_nodes.flat(n))


def _python_calls(func: Callable[[], object]) -> int:
    """How many Python functions ``func`` calls, all the way down."""
    count = 0

    def profile(frame, event, arg) -> None:
        nonlocal count
        if event == "call":
            count += 1

    sys.setprofile(profile)
    try:
        func()
    finally:
        sys.setprofile(None)
    return count


def _inspect(model: ir.Model) -> None:
    inspect(model).to_json()


def _print(report, width: int) -> None:
    render(SimpleNamespace(out=safe_console(file=io.StringIO(), width=width)), report)


@pytest.mark.parametrize("build", [_chain, _flat], ids=["chain", "flat"])
def test_inspect_work_grows_linearly_with_nodes(build):
    # Twice the nodes, twice the calls (a chain's first 16 nodes have fewer producers to
    # look back through: a little more). With the n²/2 comparisons of 2026-11-28 it was
    # 2.5x (chain) and 2.9x (flat) at these sizes.
    _inspect(build(8))  # families registered, imports done
    n = 400
    small, large = build(n), build(2 * n)
    ratio = _python_calls(lambda: _inspect(large)) / _python_calls(lambda: _inspect(small))
    assert ratio < 2.1, ratio


@pytest.mark.parametrize("build", [_chain, _flat], ids=["chain", "flat"])
@pytest.mark.parametrize("width", [160, 60], ids=["wide", "narrow"])
def test_printing_grows_linearly_with_nodes(build, width):
    # At 60 columns the node names fold: rich lays those rows out itself.
    _print(inspect(build(8)), width)
    small, large = inspect(build(150)), inspect(build(300))
    ratio = _python_calls(lambda: _print(large, width)) / _python_calls(
        lambda: _print(small, width))
    assert ratio < 2.1, ratio


def _cell(rng: random.Random) -> str:
    """A cell as a model may name things: mostly short ASCII, sometimes long, with
    brackets, backslashes, wide, control or bidi characters, or empty."""
    kind = rng.random()
    if kind < 0.05:
        return ""
    pool = "abcxyz_./-:0123456789"
    if kind > 0.8:
        pool += " [ ] [/x] \\ é 漢字 😀 \t \n \x1b \u202e"
    length = rng.choice([1, 3, 8, 14]) if rng.random() < 0.8 else rng.randint(20, 90)
    return "".join(rng.choice(pool) for _ in range(length))


# The columns of inspect's table and of the integer operators' (no_wrap, min_width, ratio).
_LAYOUTS = [
    [Column("node", min_width=14, ratio=1), *(Column(c, no_wrap=True) for c in "abcd"),
     Column("feeds", min_width=6, ratio=1), Column("!", no_wrap=True)],
    [Column("node", min_width=14, ratio=1), *(Column(c) for c in ("op", "inputs", "qdq")),
     Column("!", no_wrap=True)],
]


def _reference(title: str, columns: list[Column], rows: list[list[str]]) -> Table:
    """The table as rich lays it out: inspect's Table before FastTable (cells as text)."""
    from rich import box
    from rich.text import Text

    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for c in columns:
        wrap = {"no_wrap": True} if c.no_wrap else {"overflow": "fold"}
        table.add_column(c.header, min_width=c.min_width, ratio=c.ratio, **wrap)
    for row in rows:
        table.add_row(*(Text(shown(cell)) for cell in row))
    return table


class _AsciiFile(io.StringIO):
    encoding = "ascii"  # rich draws ASCII boxes for it


def _printed(renderable, width: int, terminal: bool = False, ascii_only: bool = False,
             **options) -> str:
    """What dqtool's console (as ``App.out`` makes it) prints of ``renderable``."""
    file = _AsciiFile() if ascii_only else io.StringIO()
    console = safe_console(file=file, width=width, force_terminal=terminal,
                           color_system="truecolor" if terminal else None, highlight=False)
    console.print(renderable, **options)
    return file.getvalue()


def test_fast_table_prints_what_rich_prints(monkeypatch):
    from dqtool.cli import tables

    plain = {True: 0, False: 0}  # rows padded here, rows left to rich
    original = tables._plain_row

    def counted(*args):
        line = original(*args)
        plain[line is not None] += 1
        return line

    monkeypatch.setattr(tables, "_plain_row", counted)
    rng = random.Random(20261128)
    for case in range(200):
        columns = rng.choice(_LAYOUTS)
        rows = [[_cell(rng) for _ in columns] for _ in range(rng.randint(1, 12))]
        title = rng.choice(["model.onnx: 3 Q/DQ nodes", "t", "a long title " * 12])
        width = rng.choice([20, 45, 80, 109, 110, 160, 230])
        style = {"terminal": case % 3 == 1, "ascii_only": case % 5 == 2}
        assert _printed(FastTable(title, columns, rows), width, **style) == _printed(
            _reference(title, columns, rows), width, **style), (columns, rows, width, style)
    assert plain[True] > 50 and plain[False] > 50, plain  # both ways were taken


def test_fast_table_lays_out_no_row_with_rich(monkeypatch):
    # rich's layout costs ~1 ms a row: a table of short ASCII cells asks rich for the same
    # few renderings (title and header, measures of two rows) whatever its length.
    calls = []
    real = Console.render_lines

    def render_lines(self, *args, **kwargs):
        calls.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Console, "render_lines", render_lines)
    counts = []
    for n in (10, 1000):
        calls.clear()
        _printed(FastTable("t", _LAYOUTS[0], [[f"n{i}", "DQ", "int8", "f", "-", "Add", ""]
                                               for i in range(n)]), 160)
        counts.append(len(calls))
    assert counts[0] == counts[1] < 40, counts


def test_plain_lines_print_as_lines_printed_one_by_one():
    lines = ["  warning DQ101 n1: a [/x] name", "  error DQ202 n\x1b[31m2: zero point \\"]
    one_by_one = "".join(_printed(line, 40, soft_wrap=True) for line in lines)
    assert _printed(plain_lines(lines), 40, soft_wrap=True) == one_by_one
    assert "\x1b" not in one_by_one and "[/x]" in one_by_one
