"""How ``upgrade`` / ``downgrade`` reports print (also under ``qdq``, which may upgrade
first)."""

from __future__ import annotations

from dqtool.cli.app import App


def render(app: App, report, as_json: bool, head: str | None = None) -> None:
    """The report; ``head``: its summary already rendered (``summary``), printed as is."""
    if as_json:
        app.print_json(report.to_json())
        return
    if head is None:
        _render_head(app, report)
    else:
        app.out.file.write(head)
    for path in report.files:
        app.out.print(f"wrote {path}")


def summary(app: App, report) -> str:
    """The report's table and lines but the files written, rendered as ``render`` prints
    them. Why apart: a save calls this while its data is still being written (the model's
    table costs ~20 ms, which then overlap the writes)."""
    with app.out.capture() as captured:
        _render_head(app, report)
    return captured.get()


def _render_head(app: App, report) -> None:
    from rich.table import Table

    rows = _grouped([
        *((c.node, c.graph, c.op, c.status, f"{c.how}\n  why: {c.why}" if c.why else c.how)
          for c in report.changes),
        *((r.node, r.graph, r.op, "REFUSED", r.reason) for r in report.refusals)])
    head = (f"{report.input}: {report.direction} ai.onnx opset {report.from_opset} → "
            f"{report.to_opset}")
    if rows:
        table = Table(title=head, title_justify="left")
        for col in ("node", "graph", "op", "status", "how / why"):
            table.add_column(col, overflow="fold")
        for row in rows:
            table.add_row(*row)
        app.out.print(table)
    else:
        app.out.print(f"{head}: no Q/DQ node needed a rewrite")
    if report.ok:
        app.out.print(f"IR version {report.from_ir_version} → {report.to_ir_version}; opsets "
                      + ", ".join(f"{d or 'ai.onnx'} {v}"
                                  for d, v in report.opset_imports.items()))
    if report.check:
        app.out.print("check (bit-identical outputs on random inputs):", markup=False)
        for line in report.check.describe():
            app.out.print(f"  {line}", markup=False, overflow="fold")


# Names listed in a row that stands for several nodes rewritten alike.
NAMES_PER_ROW = 3


def _grouped(rows: list[tuple[str, ...]]) -> list[tuple[str, ...]]:
    """One row per distinct (graph, op, status, how): an LLM's 224 MatMulNBits are a few
    shapes rewritten alike, and a row per node buries the one that differs (and costs
    rich ~2 ms a row). ``--json`` keeps every node."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for node, *rest in rows:
        groups.setdefault(tuple(rest), []).append(node)
    out = []
    for rest, nodes in groups.items():
        if len(nodes) == 1:
            out.append((nodes[0], *rest))
            continue
        shown = ", ".join(nodes[:NAMES_PER_ROW])
        more = len(nodes) - NAMES_PER_ROW
        out.append((f"{shown}{f' and {more} more' if more > 0 else ''} ({len(nodes)} nodes)",
                    *rest))
    return out
