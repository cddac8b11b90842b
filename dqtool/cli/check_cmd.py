"""``dqtool check MODEL [--against ORIGINAL] [--rtol R] [--atol A] [--seed S]
[--shape NAME=D0,D1,...] [--inputs FILE.npz] [--accept-nonfinite] [--progress]
[--report FILE.html] [--json]``."""

from __future__ import annotations

import click
from rich.table import Table

from dqtool.cli.app import App, user_errors
from dqtool.printable import number

# The library is imported inside the command's body: `dqtool check --help` and a refused
# option load no onnx_ir or NumPy (~0.3 s), and no onnxruntime.


def _render_self(app: App, doc: dict) -> None:
    _render_structure(app, doc)
    if not doc["nodes"]:
        return  # a note says there was nothing to compare; no empty table
    table = Table(title="DequantizeLinear, fused and integer operators: onnxruntime vs "
                  "kernel (bit-exact)",
                  title_justify="left")
    for col in ("node", "op", "status", "detail"):
        table.add_column(col, overflow="fold")
    for n in doc["nodes"]:
        where = n["name"] or "<unnamed>"
        if n["graph"] != "main":
            where += f" [{n['graph']}]"
        table.add_row(where, n["op"], n["status"], n["reason"] or "-")
    app.out.print(table)


def _render_structure(app: App, doc: dict) -> None:
    st = doc.get("structure")
    if st is None:
        return
    inference = st.get("onnx_inference", "passed")
    checker = "(full check)" if inference == "passed" else "(type inference not counted, below)"
    errors = sum(p["severity"] == "error" for p in st["problems"])
    others = len(st["problems"]) - errors
    app.out.print(f"structure: onnx checker {checker} {st['onnx_checker']}; dqtool rules: "
                  f"{errors} error{'' if errors == 1 else 's'}, {others} other "
                  f"finding{'' if others == 1 else 's'}")
    if inference != "passed":
        app.out.print(f"  onnx's type inference {inference}", markup=False)
    if st.get("inherited"):
        app.out.print("  not counted: the original fails too "
                      f"({st['inherited']})", markup=False)
    for p in st["problems"]:
        if p["severity"] == "error":
            app.out.print(f"  {p['code']} {p['node']}: {p['message']}")


def _render_against(app: App, doc: dict) -> None:
    _render_structure(app, doc)
    _render_comparisons(app, doc)
    _render_fused(app, doc)


def _render_comparisons(app: App, doc: dict) -> None:
    for c in doc["comparisons"]:
        if c["skipped"]:
            app.out.print(f"{c['runtime']}: skipped: {c['skipped']}")
            continue
        against = doc["against"] or "reference evaluator"
        title = f"{c['runtime']}: {doc['input']} vs {against}"
        if not c.get("judged", True):
            title += " (measured in steps, reported, not judged)"
        table = Table(title=title, title_justify="left")
        for col in ("output", "ok", "max abs", "max rel", "mean abs", "worst index",
                    "values (checked / original)", "min atol / rtol",
                    "steps: max, ~1, >1"):
            table.add_column(col, overflow="fold")
        # Tolerated by a fused node's rounding bound, or by a faithful conversion's per-op
        # steps (the notes say which and why).
        tolerated_label = "yes (bound)" if doc.get("bounds") else "yes (per op)"
        for o in c["outputs"]:
            worst = "-" if o["worst_index"] is None else str(tuple(o["worst_index"]))
            vals = f"{number(o['worst_actual'])} / {number(o['worst_expected'])}"
            ok = (tolerated_label if o.get("tolerated") and not (
                o["max_abs"] <= o["atol"] or o["max_rel"] <= o["rtol"]) else "yes") \
                if o["passed"] else f"NO {o['failure'] or ''}"
            if o.get("finite") == 0 and o["size"] and o["failure"] is None:
                ok = "accepted: nothing finite" if o["passed"] else "NO: nothing finite"
            if not c.get("judged", True):
                ok = "same" if o["passed"] else "reported"
            table.add_row(o["name"], ok,
                          number(o["max_abs"]), number(o["max_rel"]), number(o["mean_abs"]),
                          worst, vals, f"{number(o['min_atol'])} / {number(o['min_rtol'])}",
                          _steps(o))
        app.out.print(table)


def _render_fused(app: App, doc: dict) -> None:
    _render_per_op(app, doc.get("per_op") or [])
    fused = doc.get("fused")
    if fused is not None:
        what = f"cannot run it: {fused['error']}" if fused.get("error") else (
            f"{'identical' if fused['identical'] else 'differs'} ({fused['mismatched']} "
            "elements differ)")
        app.out.print(f"onnxruntime ORT_ENABLE_ALL (fuses QDQ back) vs the original: {what}",
                      markup=False)
    weights = doc.get("weights") or []
    for w in weights:
        app.out.print(f"weight of {w['node']} ({w['op']}): {w['status']}"
                      + (f" ({w['detail']})" if w["detail"] else ""), markup=False)
    for b in doc.get("bounds") or []:
        app.out.print(f"onnxruntime, fused node {_bound_line(b)}", markup=False)
    if weights:
        from dqtool import registry

        ops = {w["op"] for w in weights}
        for support in registry.check_supports():
            for op, note in support.notes.items():
                if op in ops:
                    app.out.print(note, markup=False)


def _bound_line(b: dict) -> str:
    if b["status"] == "unbounded":
        return f"{b['node']} ({b['op']}): not bounded: {b['detail']}"
    if not b["max_abs"]:
        return f"{b['node']} ({b['op']}): bit-identical"
    ulps = "" if b["ulps"] is None else f" ({number(b['ulps'])} ulp of {b['dtype']} there)"
    word = "within" if b["status"] == "within" else "BEYOND"
    text = (f"{b['node']} ({b['op']}): max abs {number(b['max_abs'])}{ulps}, {word} its "
            f"rounding bound (largest difference / bound {number(b['max_ratio'])}; "
            f"bound there {number(b['bound_at_worst'])})")
    if b["detail"]:
        text += f"; {b['detail']}"
    return text + (f" [{b['sampled']}]" if b["sampled"] else "")


def _render_per_op(app: App, entries: list[dict]) -> None:
    """Each rewritten operator run alone on the original's inputs (local error), apart
    from the outputs' end-to-end difference."""
    if not entries:
        return
    measured = [e for e in entries if e["skipped"] is None]
    worst = max((e["max_steps"] for e in measured if e["max_steps"] is not None), default=None)
    app.out.print(f"per op (each rewritten operator fed the original's inputs): "
                  f"{len(measured)} measured, max {worst} step(s)", markup=False)
    for e in entries:
        if e["skipped"] is not None:
            app.out.print(f"  {e['node']} ({e['op']}): not measured: {e['skipped']}",
                          markup=False, soft_wrap=True)
        elif e["max_steps"] is None or e["max_steps"] > 0:
            app.out.print(f"  {e['node']} ({e['op']}): {_steps(e)}, max abs "
                          f"{number(e['max_abs'])}", markup=False, soft_wrap=True)


def _steps(o: dict) -> str:
    """``1, 3, 0`` (largest distance in steps, elements about one step apart, more than
    one); ``-`` when the output has no quantization step."""
    if o.get("max_steps") is None:
        return "-"
    return f"{o['max_steps']}, {o['off_by_one']}, {o['off_by_more']} (step {number(o['step'])})"


def render(app: App, doc: dict) -> None:
    for r in doc["runtimes"]:
        app.out.print(f"runtime {r['name']}: {r['description']}")
    ins = ", ".join(f"{k} {v['dtype']}{tuple(v['shape'])} ({v['source']})"
                    for k, v in doc["inputs"].items()) or "none"
    app.out.print(f"inputs (seed {doc['seed']}): {ins}")
    if doc["defaulted_dims"]:
        app.out.print(f"dimensions set to the default {doc['default_dim']}: "
                      + ", ".join(doc["defaulted_dims"]))
    if doc["mode"] == "self":
        _render_self(app, doc)
        _render_comparisons(app, doc)
    else:
        tol = doc["tolerance"]
        app.out.print(f"tolerance: rtol {tol['rtol']}, atol {tol['atol']} ({tol['criterion']})")
        _render_against(app, doc)
    for note in doc["notes"]:
        app.out.print(f"note: {note}")
    if doc["mode"] == "against" and all(c["skipped"] for c in doc["comparisons"]):
        app.out.print("nothing compared: no runtime could run both models")
    app.out.print("PASSED" if doc["passed"] else "FAILED")


@click.command("check")
@click.argument("model", type=str)
@click.option("--against", "original", type=str, default=None,
              help="Compare every output with this model's (the conversion's original).")
@click.option("--rtol", type=click.FloatRange(min=0.0), default=0.0, show_default=True,
              help="Relative tolerance for --against comparisons.")
@click.option("--atol", type=click.FloatRange(min=0.0), default=0.0, show_default=True,
              help="Absolute tolerance for --against comparisons.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
              help="Seed of the inputs.")
@click.option("--shape", "shapes", multiple=True, metavar="NAME=D0,D1,...",
              help="An input's shape, or a symbolic dimension's size (default 1). Repeatable.")
@click.option("--inputs", "inputs_file", type=str, default=None, metavar="FILE.npz",
              help="Feeds by input name; inputs not in it are generated.")
@click.option("--accept-nonfinite", is_flag=True,
              help="Pass outputs that are NaN or inf in every element of both models "
              "(they compare nothing, and fail otherwise).")
@click.option("--progress", is_flag=True,
              help="Report the pieces of a streamed run on stderr as they finish.")
@click.option("--report", "report_file", type=str, default=None, metavar="FILE.html",
              help="Also write a self-contained HTML report with charts.")
@click.option("--runtime", type=click.Choice(["onnxruntime", "qnn-htp", "openvino"]),
              default="onnxruntime", show_default=True,
              help="The runtime beside dqtool's reference evaluator: onnxruntime's CPU "
              "provider, or a deployment runtime (qnn-htp: QNN's HTP through onnxruntime; "
              "openvino: its CPU plugin), whose outputs are measured in quantization steps "
              "and reported, not judged.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@click.pass_obj
@user_errors
def check_cmd(app: App, model: str, original: str | None, rtol: float, atol: float, seed: int,
              shapes: tuple[str, ...], inputs_file: str | None, accept_nonfinite: bool,
              progress: bool, report_file: str | None, runtime: str, as_json: bool) -> None:
    """Check MODEL alone (structure, and every DequantizeLinear on onnxruntime against the
    kernel, bit for bit), or against ORIGINAL (every output, on onnxruntime with
    ORT_DISABLE_ALL and on dqtool's reference evaluator).

    Exit codes: 0 passed, 1 mismatch or invalid model, 2 bad input.
    """
    from dqtool.checking import check, runners
    from dqtool.checking.inputs import load_npz, parse_shapes

    if report_file is not None:
        from dqtool.report import html

        html.writable(report_file)  # refused before the check runs, not after
    given = load_npz(inputs_file) if inputs_file else None
    def say(text: str) -> None:
        click.echo(f"check: {text}", err=True)

    with runners.reporting(say if progress else None):
        report = check(model, against=original, rtol=rtol, atol=atol, seed=seed,
                       shapes=parse_shapes(shapes), inputs=given,
                       accept_nonfinite=accept_nonfinite, runtime=runtime)
    doc = report.to_json()
    if report_file is not None:
        from dqtool.report import check_page

        check_page.write(report_file, report)
    if as_json:
        app.print_json(doc)
    else:
        render(app, doc)
    raise SystemExit(report.exit_code)
