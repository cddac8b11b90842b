"""``dqtool qdq MODEL`` / ``dqtool qoperator MODEL``: integer operators ⇄ QDQ.

Exit 0 converted and written; 1 a node refused or --check beyond one quantization step
(nothing written); 2 bad input or options.
"""

from __future__ import annotations

from typing import Any

import click

from dqtool.cli.app import App, user_errors
from dqtool.cli.convert_render import render as render_upgrade
from dqtool.cli.options import parse_size, progress_bar, writer_options

# The library is imported inside the command's body: `dqtool qdq --help` and a refused
# option load no onnx_ir or NumPy (~0.3 s), and no onnxruntime.


def render(app: App, report, as_json: bool) -> None:
    if as_json:
        app.print_json(report.to_json())
        return
    if report.upgrade is not None:  # first, as `dqtool upgrade` reports it
        app.out.print(f"first, an exact upgrade to ai.onnx opset {report.upgrade.to_opset}: "
                      "a rewritten node needs its DequantizeLinear")
        render_upgrade(app, report.upgrade, False)
    what = "integer operators → QDQ" if report.direction == "to-qdq" else \
        "QDQ patterns → integer operators"
    app.out.print(f"{report.input}: {what}: {len(report.changes)} rewritten, "
                  f"{len(report.refusals)} refused"
                  + (" (left as they are)" if report.refusals and report.kept else ""))
    for c in report.changes:
        where = "" if c.graph == "main" else f" [{c.graph}]"
        app.out.print(f"  {c.node}{where} ({c.op}): {c.into}", soft_wrap=True)
    for r in report.refusals:
        where = "" if r.graph == "main" else f" [{r.graph}]"
        app.out.print(f"  REFUSED {r.node}{where} ({r.op}): {r.reason}", soft_wrap=True)
    if report.check is not None:
        what = "each converted operator" if report.check.measured_locally else \
            "every output"
        app.out.print(f"check (faithful, not exact: {what} within one quantization step per "
                      "element):", markup=False)
        for line in report.check.describe():
            app.out.print(f"  {line}", markup=False, soft_wrap=True)
    for path in report.files:
        app.out.print(f"wrote {path}")


def _run(app: App, direction: str, model: str, out: str | None, keep: bool, check: bool,
         as_json: bool, in_place: bool, external_data: bool, shard_size: str | None,
         progress: bool | None, exact_dynamic: bool = False) -> None:
    from dqtool.integer import api

    if out is not None and in_place:
        app.abort("give either --output or --in-place, not both", 2)
    if out is None and not in_place:
        out = str(api.default_output(model, direction))  # type: ignore[arg-type]
    writing: dict[str, Any] = {"check": check, "in_place": in_place,
                               "external_data": external_data or None,
                               "shard_size": parse_size(shard_size)}
    try:
        with progress_bar(app, model, progress) as bar:
            if direction == "to-qdq":
                report = api.to_qdq(model, None if in_place else out,
                                    keep_unconvertible=keep, progress=bar,
                                    exact_dynamic=exact_dynamic, **writing)
            else:
                report = api.to_qoperator(model, None if in_place else out, progress=bar,
                                          **writing)
    except (api.IntegerConversionRefused, api.IntegerCheckFailed) as e:
        render(app, e.report, as_json)
        app.abort(str(e), 1)
    render(app, report, as_json)


_CHECK = click.option("--check", is_flag=True, help="Run both models (onnxruntime "
                      "ORT_DISABLE_ALL, dqtool reference) and require each converted operator, "
                      "fed the original's inputs, within one quantization step before writing; "
                      "report every output end to end and whether onnxruntime ORT_ENABLE_ALL "
                      "reproduces the original exactly.")
_CHECK_BACK = click.option("--check", is_flag=True, help="Run both models (onnxruntime "
                           "ORT_DISABLE_ALL, dqtool reference) and require every output "
                           "within one quantization step before writing.")


@click.command("qdq")
@click.argument("model", type=click.Path(dir_okay=True, path_type=str))
@writer_options("<stem>.qdq.onnx next to MODEL")
@_CHECK
@click.option("--keep-unconvertible", is_flag=True, help="Write the model with the nodes "
              "that have no QDQ form left as they are (they are listed) instead of "
              "refusing.")
@click.option("--exact-dynamic", is_flag=True, help="MatMulInteger/ConvInteger become "
              "DequantizeLinear with scale 1 → the float op → the original Mul by the scale "
              "product: bit-identical to the integer original while sums stay below 2**24.")
@click.pass_obj
@user_errors
def qdq_cmd(app: App, model: str, check: bool, keep_unconvertible: bool,
            exact_dynamic: bool, **writing: Any) -> None:
    """Rewrite integer operators (QLinear*, MatMulInteger/ConvInteger, dynamic
    quantization) into QDQ: DequantizeLinear → float op → QuantizeLinear.

    Faithful, not exact: integer accumulation and the float QDQ form may differ by a
    quantization step (measure it with --check or `dqtool check --against`). Exit 0
    written; 1 refused or --check failed (nothing written); 2 bad input.
    """
    _run(app, "to-qdq", model, writing.pop("out"), keep_unconvertible, check,
         exact_dynamic=exact_dynamic, **writing)


@click.command("qoperator")
@click.argument("model", type=click.Path(dir_okay=True, path_type=str))
@writer_options("<stem>.qop.onnx next to MODEL")
@_CHECK_BACK
@click.pass_obj
@user_errors
def qoperator_cmd(app: App, model: str, check: bool, **writing: Any) -> None:
    """Fuse the QDQ patterns onnxruntime fuses (DQ → Conv → Q ⇒ QLinearConv, DQ → MatMul →
    Q ⇒ QLinearMatMul, ...) into integer operators, for integer-only accelerators.

    Other Q/DQ nodes stay as they are. Exit 0 written; 1 --check failed; 2 bad input.
    """
    _run(app, "to-qoperator", model, writing.pop("out"), True, check, **writing)


def upgrade_to_qdq(app: App, model: str, out: str | None, in_place: bool, as_json: bool):
    """``upgrade --to-qdq``: integer operators into QDQ (as ``dqtool qdq``), in memory."""
    from dqtool import storage
    from dqtool.integer import api

    storage.no_overwrite_of_input(model, model if in_place else out, in_place)
    try:
        report = api.to_qdq(model)
    except api.IntegerConversionRefused as e:
        render(app, e.report, as_json)
        app.abort(str(e), 1)
    if not as_json:
        render(app, report, False)
    return report.model
