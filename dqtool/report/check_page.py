"""``check --report``: the verdict, each output's error distribution and worst elements,
the error along the depth of the model (values both models compute, on the reference
runtime), and one row per weight; drawn from the report's JSON (``CheckReport.to_json``),
so a saved report can be drawn again."""

from __future__ import annotations

from html import escape
from typing import Any

from dqtool.printable import number
from dqtool.report import html, svg


def render(report: Any) -> str:
    doc = report.to_json() if hasattr(report, "to_json") else report
    title = f"dqtool check {doc['input']}" + (
        f" against {doc['against']}" if doc.get("against") else "")
    sections = [html.verdict(doc["passed"], "PASSED" if doc["passed"] else "FAILED"),
                _inputs(doc)]
    if doc["mode"] == "self":
        sections.append(_nodes(doc))
    else:
        for c in doc["comparisons"]:
            sections.append(_runtime(c, doc))
        sections.append(_weights(doc))
    if doc["notes"]:
        sections.append("<h2>Notes</h2><ul>" + "".join(
            f'<li class="note">{escape(n)}</li>' for n in doc["notes"]) + "</ul>")
    return html.page(title, sections)


def _inputs(doc: dict[str, Any]) -> str:
    rows = [(k, v["dtype"], str(tuple(v["shape"])), v["source"], v.get("values", "-"))
            for k, v in doc["inputs"].items()]
    return ("<h2>Inputs</h2>" + f'<p class="note">seed {doc["seed"]}; rtol '
            f'{doc["tolerance"]["rtol"]}, atol {doc["tolerance"]["atol"]}</p>'
            + html.table(("input", "type", "shape", "source", "values"), rows, "inputs"))


def _labels(hist: dict[str, Any]) -> list[str]:
    edges = hist["edges"]
    return (["0"] + [f"≤{e:g}" for e in edges[1:]] + [f">{edges[-1]:g}", "not finite"])


def _colors(n: int) -> list[str]:
    # equal: green; up to one unit: blue; further: orange; beyond the last edge, NaN: red
    return ["#2e8b57", "#3b6ea8"] + ["#e08a2c"] * (n - 4) + ["#c0392b", "#c0392b"]


def _output(o: dict[str, Any], runtime: str) -> str:
    ok = "passed" if o["passed"] else "FAILED"
    if o.get("finite") == 0 and o["size"] and not o["failure"]:
        ok += ": nothing finite to compare (NaN or inf everywhere in both models)"
    parts = [f'<h3>{escape(o["name"])} <span class="note">({escape(runtime)}: {ok}; '
             f'{o["mismatched"]} of {o["size"]} elements differ, max abs '
             f'{number(o["max_abs"])})</span></h3>']
    hist = o.get("histogram")
    if hist:
        parts.append(svg.bars(f"{o['name']}: error in {hist['unit']}", _labels(hist),
                              hist["counts"], f"distance ({hist['unit']})",
                              _colors(len(hist["counts"]))))
    if o.get("worst"):
        parts.append(html.table(("worst element", "checked", "original"),
                                [(str(tuple(w["index"])), w["actual"], w["expected"])
                                 for w in o["worst"]], "worst"))
    return "".join(parts)


def _depth(c: dict[str, Any]) -> str:
    points = c.get("depth") or []
    if not points:
        return ""
    of = max(p["of"] for p in points)
    xs = [p["position"] for p in points]
    ys = [float(p["max_abs"]) for p in points]
    rows = [(p["value"], f"{p['position']}/{p['of']}", p["max_abs"], p["max_rel"],
             f"{p['mismatched']} of {p['size']}") for p in points]
    return ("<h3>Along the depth of the model</h3>"
            '<p class="note">values both models compute (same name), in the original\'s '
            "node order: where the difference appears and how it grows (reported, not "
            "judged)</p>"
            + svg.points("largest difference along the model", xs, ys,
                         "node position in the original", "max abs difference", of)
            + html.table(("value", "position", "max abs", "max rel", "differ"), rows,
                         "depth"))


def _runtime(c: dict[str, Any], doc: dict[str, Any]) -> str:
    head = f"<h2>{escape(c['runtime'])}</h2>"
    if c["skipped"]:
        return head + f'<p class="note">skipped: {escape(c["skipped"])}</p>'
    return head + "".join(_output(o, c["runtime"]) for o in c["outputs"]) + _depth(c)


def _weights(doc: dict[str, Any]) -> str:
    weights = doc.get("weights") or []
    if not weights:
        return ""
    rows = [(w["node"], w["op"], w["status"], w["detail"]) for w in weights]
    same = sum(w["status"] in ("bit-identical", "kept") for w in weights)
    return (f"<h2>Weights</h2><p>{same} of {len(weights)} bit-identical</p>"
            + html.table(("node", "kind", "status", "bytes / detail"), rows, "weights"))


def _nodes(doc: dict[str, Any]) -> str:
    nodes = doc.get("nodes") or []
    counts = doc.get("summary") or {}
    labels = [k for k in counts]
    chart = svg.bars("nodes by status", labels, [counts[k] for k in labels], "status") \
        if nodes else ""
    rows = [(n["name"] or "<unnamed>", n["graph"], n["op"], n["status"], n["reason"])
            for n in nodes]
    return ("<h2>Weights and nodes: onnxruntime against the kernel</h2>" + chart
            + html.table(("node", "graph", "op", "status", "detail"), rows, "weights"))


def write(path: str, report: Any) -> None:
    """``check --report``: the page, written whole or not at all."""
    html.write(path, render(report))
