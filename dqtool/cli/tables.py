"""Tables of any number of rows, printed exactly as rich prints them, in linear time with a
small constant.

rich measures and renders every cell of a table through its whole layout machinery, about
1 ms per row of ``dqtool inspect``'s table: three to four times what reading and linting a
node costs, minutes for a 100,000-node model (docs/benchmarks.md, 2026-11-28). Here rich
still decides everything about the layout: the column widths (computed from two rows that
hold each column's widest cells, which give the same widths as all the rows), the title, the
header, the edges and any row it has to wrap. A row whose cells are printable ASCII that fit
their columns is padded by hand to the text rich would print for it.

Cells are plain text, shown as given (no markup, no emoji codes), what ``str.isprintable``
refuses escaped as everything dqtool prints is (``dqtool.printable``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from rich import box
from rich.console import Console, ConsoleOptions, RenderResult
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

from dqtool.printable import shown

_BOX = box.SIMPLE_HEAD


@dataclass(frozen=True)
class Column:
    """A column as ``rich.table.Table.add_column`` takes it: ``no_wrap`` keeps each cell on
    one line, otherwise a long cell folds onto more lines."""

    header: str
    no_wrap: bool = False
    min_width: int | None = None
    ratio: int | None = None


class FastTable:
    """A rich renderable: ``console.print(FastTable(title, columns, rows))``. The console
    renders ``title`` as any string it prints (dqtool's: as text, escaped); the cells are
    plain text."""

    def __init__(self, title: str, columns: Sequence[Column],
                 rows: Iterable[Sequence[str]]) -> None:
        self.title = title
        self.columns = tuple(columns)
        self.rows = [[shown(cell) for cell in row] for row in rows]

    def rich_table(self, widths: Sequence[int] | None = None, rows: Sequence[Sequence[str]] = (),
                   header: bool = True) -> Table:
        """The rich Table of ``rows`` (its columns fixed at ``widths``, padding included,
        when given); without a header it has no title either."""
        table = Table(title=self.title if header else None, title_justify="left", box=_BOX,
                      pad_edge=False, show_header=header)
        last = len(self.columns) - 1
        for i, c in enumerate(self.columns):
            width = None if widths is None else widths[i] - _padding(i, last)
            table.add_column(c.header, no_wrap=c.no_wrap, overflow="ellipsis" if c.no_wrap
                             else "fold", min_width=c.min_width, ratio=c.ratio, width=width)
        for row in rows:
            table.add_row(*(Text(cell) for cell in row))
        return table

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        widths = _widths(self, console, options) if self.rows else None
        chars = _body_chars(console, options)
        if widths is None or chars is None:
            yield self.rich_table(rows=self.rows)  # rich lays out every row itself
            return
        left, divider, right = chars
        head = console.render_lines(self.rich_table(widths), options, pad=False)
        for line in head[:-1]:  # the title, the top edge, the header and the line under it
            yield from line
            yield Segment.line()
        hard: list[Sequence[str]] = []
        for row in self.rows:
            text = _plain_row(row, widths, left, divider, right)
            if text is None:
                hard.append(row)
                continue
            yield from self._rows_by_rich(console, options, widths, hard)
            yield Segment(text)
            yield Segment.line()
        yield from self._rows_by_rich(console, options, widths, hard)
        yield from head[-1]  # the bottom edge
        yield Segment.line()

    def _rows_by_rich(self, console: Console, options: ConsoleOptions, widths: Sequence[int],
                      hard: list[Sequence[str]]) -> Iterator[Segment]:
        """The rows rich has to lay out (wrapped, wide or control characters), rendered
        by rich at the table's widths; ``hard`` is emptied."""
        if not hard:
            return
        lines = console.render_lines(self.rich_table(widths, hard, header=False), options,
                                     pad=False)
        hard.clear()
        for line in lines[1:-1]:  # without this table's own top and bottom edges
            yield from line
            yield Segment.line()


def plain_lines(lines: Iterable[str]) -> Text:
    """Lines of plain text (escaped as cells are) as one renderable: rich prints a line
    ~4x faster among others than on its own (80 µs each, 2026-11-28)."""
    return Text("\n".join(shown(line) for line in lines))


def _padding(index: int, last: int) -> int:
    """A cell's padding: one space each side, none at the table's edges (pad_edge=False)."""
    return (index > 0) + (index < last)


def _measure(console: Console, options: ConsoleOptions, cell: str) -> tuple[int, int]:
    """The (minimum, maximum) width rich measures for a cell: its longest word, its
    longest line."""
    if cell.isascii() and cell.isprintable():
        words = cell.split()
        return (max(map(len, words)) if words else len(cell)), len(cell)
    m = Text(cell).__rich_measure__(console, options)
    return m.minimum, m.maximum


def _widths(table: FastTable, console: Console, options: ConsoleOptions) -> list[int] | None:
    """The column widths (padding included) rich gives the whole table, or None when rich
    must lay the table out itself.

    rich's width of a column is a monotone function of the largest minimum and the largest
    maximum measure among its cells, so a table of the two rows that hold them is laid out
    with the same widths as all of them, at the cost of one measure per cell here."""
    n = len(table.columns)
    widest = [(-1, 0)] * n  # (maximum, row) per column
    longest_word = [(-1, 0)] * n
    for r, row in enumerate(table.rows):
        for i, cell in enumerate(row):
            lo, hi = _measure(console, options, cell)
            if hi > widest[i][0]:
                widest[i] = (hi, r)
            if lo > longest_word[i][0]:
                longest_word[i] = (lo, r)
    rows = table.rows
    proxy = table.rich_table(rows=[[rows[widest[i][1]][i] for i in range(n)],
                                   [rows[longest_word[i][1]][i] for i in range(n)]])
    try:  # rich's own layout; a rich without these private members renders the table itself
        extra = proxy._extra_width
        widths = proxy._calculate_column_widths(console,
                                                options.update_width(options.max_width - extra))
    except (AttributeError, TypeError):
        return None
    last = n - 1
    # Fixed at these widths, the header table must keep them: rich would shrink columns
    # wider than the console, or a column given no room for its text.
    if sum(widths) + extra > options.max_width or any(
            w - _padding(i, last) < 1 for i, w in enumerate(widths)):
        return None
    return list(widths)


def _body_chars(console: Console, options: ConsoleOptions) -> tuple[str, str, str] | None:
    """The left edge, divider and right edge of a body line, when every body line of the
    table and of its header-less part uses the same ones (else None: rich renders)."""
    used = _BOX.substitute(options, safe=console.safe_box)
    boxes = (used, used.get_plain_headed_box())
    chars = {(b.mid_left, b.mid_vertical, b.mid_right) for b in boxes}
    chars |= {(b.head_left, b.head_vertical, b.head_right) for b in boxes}
    chars |= {(b.foot_left, b.foot_vertical, b.foot_right) for b in boxes}
    return chars.pop() if len(chars) == 1 else None


def _plain_row(row: Sequence[str], widths: Sequence[int], left: str, divider: str,
               right: str) -> str | None:
    """The line rich prints for ``row`` when each cell is printable ASCII (one column per
    character, nothing for rich to strip or expand) that fits its column, else None."""
    last = len(widths) - 1
    cells = []
    for i, (cell, width) in enumerate(zip(row, widths, strict=True)):
        room = width - _padding(i, last)
        if len(cell) > room or not (cell.isascii() and cell.isprintable()):
            return None
        pad_left = " " if i > 0 else ""
        pad_right = " " if i < last else ""
        cells.append(pad_left + cell.ljust(room) + pad_right)
    return left + divider.join(cells) + right


__all__ = ["Column", "FastTable", "plain_lines"]
