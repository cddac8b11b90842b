"""``dqtool inspect MODEL [--json]``."""

from __future__ import annotations

from collections import Counter

import click

from dqtool.cli.app import App, user_errors
from dqtool.cli.tables import Column, FastTable, plain_lines
from dqtool.registry import InspectTable

# The library is imported inside the command's body: `dqtool inspect --help` and a refused
# option load no onnx_ir or NumPy (~0.3 s), and no onnxruntime.

_SHORT = {"com.microsoft": "ms"}


def _zp(s) -> str:
    if s.zero_point == "none" and getattr(s, "default_zero_point", None):
        return f"={s.default_zero_point}"  # a fused op's implied zero point
    return {"none": "-", "integer": "int"}.get(s.zero_point, s.zero_point)


def _size(n: int | None) -> str:
    if n is None:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _shape(dims) -> str:
    return "?" if dims is None else "(" + ",".join("?" if d is None else str(d) for d in dims) + ")"


def _row(n, short_ops: dict[str, str], wide: bool) -> list[str]:
    """The table's cells for one node (plain text)."""
    s = n.spec
    dom = "" if s.domain == "ai.onnx" else f"{_SHORT.get(s.domain, s.domain)}:"
    op = f"{dom}{'DQ' if s.is_dequantize else 'Q'}-{s.version}"
    if n.inside_operator:
        op = f"{dom}{short_ops.get(s.op, s.op)}-{s.version}"
    gran = {"per-tensor": "tensor", "per-axis": f"axis {s.axis}",
            "blocked": f"axis {s.axis} block {s.block_size}"}.get(s.granularity or "", "?")
    out = s.float_type if s.is_dequantize else s.quant_type
    where = n.name or "<unnamed>"
    if n.graph != "main":
        where += f" [{n.graph}]"
    flags = "E" if s.errors else ("W" if s.problems else "")
    stored = s.is_dequantize and (s.x_constant or s.x_from_quantize)
    cells = [where, op, s.quant_type or "?", s.scale_type or "?", out or "?", gran, _zp(s),
             "yes" if s.constant else "no"]
    if wide:
        cells += [_shape(s.x_shape), _size(n.bytes_stored) if stored else "-",
                  _size(n.bytes_folded) if stored else "-",
                  ",".join(sorted(set(n.consumers))) or "-"]
    return [*cells, flags]


def render(app: App, report) -> None:
    from dqtool import registry

    supports = registry.inspect_supports()
    short_ops = {op: short for s in supports for op, short in s.short_ops.items()}
    kinds = Counter(n.kind for n in report.nodes if n.inside_operator)
    title = f"{report.input}: {len(report.nodes) - sum(kinds.values())} Q/DQ nodes"
    for kind, count in kinds.items():
        title += f", {count} {kind} (dequantization inside an operator)"
    # Below ~110 columns the sizes, shapes and consumers make every cell wrap: leave them
    # out there (--json and a wider terminal show them).
    wide = app.out.width >= 110
    columns = [Column("node", min_width=14, ratio=1),
               *(Column(c, no_wrap=True) for c in ("op", "x", "scale", "out", "granularity",
                                                    "zp", "const"))]
    if wide:
        columns += [Column(c, no_wrap=True) for c in ("shape", "stored", "folded")]
        columns.append(Column("feeds", min_width=6, ratio=1))
    columns.append(Column("!", no_wrap=True))
    rows = [_row(n, short_ops, wide) for n in report.nodes]
    if report.nodes or not any(report.sections.values()):
        # FastTable, not a rich Table: rich's per-cell layout made a 100,000-node table take
        # minutes (docs/benchmarks.md, 2026-11-28).
        app.out.print(FastTable(title, columns, rows))
    else:  # e.g. an integer-operator model: no empty Q/DQ table above the family's own
        app.out.print(f"{report.input}: 0 Q/DQ nodes")
    problems = [f"  {p.severity} {p.code} {n.name or '<unnamed>'}: {p.message}"
                for n in report.nodes for p in n.spec.problems]
    if problems:
        app.out.print(plain_lines(problems), soft_wrap=True)
    sm = report.summary
    app.out.print(
        f"IR version {report.ir_version}; opsets "
        + ", ".join(f"{d} {v}" for d, v in report.opset_imports.items())
        + (f"; {sm['functions']} local functions" if sm["functions"] else "")
        + ("; external data" if report.external_data else "")
    )
    app.out.print(f"{sm['dequantize_nodes']} DequantizeLinear, {sm['quantize_nodes']} "
                  f"QuantizeLinear; {sm['constant_dequantize']} constant DequantizeLinear; "
                  f"{sm['nodes_with_problems']} with errors")
    for support in supports:
        for line in support.summary_lines(sm) if support.summary_lines else ():
            app.out.print(line)
    for key, label in (("by_domain_version", "by domain/version"),
                       ("by_quant_type", "by quantized type"),
                       ("by_granularity", "by granularity")):
        if sm[key]:
            app.out.print(f"{label}: " + ", ".join(f"{k} ×{v}" for k, v in sm[key].items()))
    app.out.print(f"bytes stored {_size(sm['bytes_stored'])}, folded {_size(sm['bytes_folded'])}"
                  + (f" ({sm['bytes_unknown']} nodes of unknown size)" if sm["bytes_unknown"]
                     else ""))
    app.out.print(f"lowest ai.onnx opset expressing every node: {_lowest(sm)}")
    for support in supports:
        section = support.table(report) if support.table is not None else None
        if section is not None:
            _render_section(app, section)
    hand = report.sections.get("handwritten", ())
    if hand:
        _render_section(app, _handwritten_table(hand, sm))


def _handwritten_table(records, sm) -> InspectTable:
    """Dequantization written by hand, one row each (``dqtool.handwritten``)."""
    def gran(r) -> str:
        if r.granularity == "per-axis":
            return f"per-axis {r.axis}"
        if r.granularity == "blocked":
            return f"blocked {r.axis}/{r.block_size}"
        return r.granularity or "?"

    def form(r) -> str:
        if not r.rewritable:
            return "no (run-time parameters)"
        return f"yes, opset {r.min_opset}" if r.exact else "no"

    rows = [[r.nodes[-1] + ("" if r.graph == "main" else f" [{r.graph}]"),
             " → ".join(r.ops), r.codes_type + (" (unpacked)" if r.unpacked else ""),
             f"{r.scale_type or '?'}{'' if r.scale_constant else ' dyn'}", gran(r),
             r.zero_point if r.zero_point_where is None
             else f"{r.zero_point} ({r.zero_point_where})", form(r)] for r in records]
    problems = [f"  {r.nodes[-1]}: no exact DequantizeLinear: {'; '.join(r.reasons)}"
                for r in records if r.reasons and not (r.exact and r.rewritable)]
    return InspectTable(
        f"{len(records)} hand-written dequantizations", ("node", "ops", "codes", "scale",
                                                          "granularity", "zero point",
                                                          "DequantizeLinear"),
        rows, problems=problems,
        lines=[f"{sm['handwritten']} hand-written dequantizations, {sm['handwritten_exact']} "
               "with an exact DequantizeLinear form (`dqtool upgrade --handwritten` rewrites "
               "them; `dqtool fold` folds them)"])


def _render_section(app: App, section: InspectTable) -> None:
    """A family's own section: its table, then its lines as they are."""
    columns = [Column(section.columns[0], min_width=14, ratio=1),
               *(Column(c, no_wrap=c == "!") for c in section.columns[1:])]
    # FastTable: rich's own layout of every cell costs ~1 ms a row (docs/benchmarks.md,
    # 2026-11-28).
    app.out.print(FastTable(section.title, columns, section.rows))
    if section.problems:
        app.out.print(plain_lines(section.problems), soft_wrap=True)
    for line in section.lines:
        app.out.print(line)


def _lowest(sm: dict) -> str:
    if sm["not_expressible_in_onnx"]:
        return "none (" + ", ".join(sm["not_expressible_in_onnx"]) + " cannot be)"
    text = "any (no typed Q/DQ nodes)" if sm["lowest_onnx_opset"] is None \
        else str(sm["lowest_onnx_opset"])
    if sm["types_unknown"]:
        text += f" (types unknown for {len(sm['types_unknown'])} nodes)"
    return text


@click.command("inspect")
@click.argument("model", type=click.Path(dir_okay=True, path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@click.option("--report", "report_file", type=str, default=None, metavar="FILE.html",
              help="Also write a self-contained HTML report of each weight's quantization.")
@click.pass_obj
@user_errors
def inspect_cmd(app: App, model: str, as_json: bool, report_file: str | None) -> None:
    """What dequantization MODEL holds, and what is wrong with it.

    Exits 0 whenever the model can be read, even when nodes have problems (lint judges).
    """
    from dqtool.inspection import inspect

    if report_file is not None:
        from dqtool.report import html

        html.writable(report_file)
    report = inspect(model)
    if report_file is not None:
        from dqtool.report import inspect_page

        inspect_page.write(report_file, model, report.to_json())
    if as_json:
        app.print_json(report.to_json())
    else:
        render(app, report)
