"""``dqtool upgrade`` / ``dqtool downgrade MODEL --opset N``: exact conversion.

Exit 0 converted and written; 1 some node refused (nothing written) or --check failed;
2 bad input or options.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from dqtool.cli.app import App, user_errors
from dqtool.cli.convert_render import render, summary
from dqtool.cli.options import parse_size, progress_bar, writer_options

# The library is imported inside the command's body: `dqtool upgrade --help` and a refused
# option load no onnx_ir or NumPy (~0.3 s), and no onnxruntime.


def _run(app: App, direction: str, model: str, opset: int, out: str | None, as_json: bool,
         in_place: bool, external_data: bool, shard_size: str | None, progress: bool | None,
         **kwargs: Any) -> None:
    from dqtool.storage import start_early_copy

    if out is not None and in_place:  # before anything is copied or written
        app.abort("give either --output or --in-place, not both", 2)
    # A large input starts copying to the output's folder now, while the imports below
    # run; the save keeps what is still in place (see dqtool/storage/early_copy.py).
    copy = None
    if not external_data and shard_size is None and not kwargs.get("to_qdq"):
        copy = start_early_copy(model, model if in_place else out)
    try:
        _convert(app, direction, model, opset, out, as_json, in_place, external_data,
                 shard_size, progress, started_copy=copy, **kwargs)
    finally:
        if copy is not None:
            copy.discard()


def _convert(app: App, direction: str, model: str, opset: int, out: str | None,
             as_json: bool, in_place: bool, external_data: bool, shard_size: str | None,
             progress: bool | None, **kwargs: Any) -> None:
    from dqtool import convert

    if out is None and not in_place:
        out = str(convert.default_output(model, opset))
    first = bool(kwargs.pop("to_qdq", False))  # integer operators into QDQ, in memory
    kwargs.update(in_place=in_place and not first, external_data=external_data or None,
                  shard_size=parse_size(shard_size))
    fn = convert.upgrade if direction == "upgrade" else convert.downgrade
    source: Any = model
    if first:  # then the opset conversion
        from dqtool.cli.integer_cmd import upgrade_to_qdq

        source = upgrade_to_qdq(app, model, out, in_place, as_json)
        out = model if in_place else out
    heads: list[str] = []  # the summary, rendered while the data is written
    try:
        with progress_bar(app, model, progress) as bar:
            report = fn(source, opset, None if in_place and not first else out, progress=bar,
                        # with --check the verdict comes after the writing (a model read
                        # from its files is checked once saved): rendered at the end
                        while_writing=None if as_json or kwargs.get("check") else
                        lambda r: heads.append(summary(app, r)), **kwargs)
    except (convert.ConversionRefused, convert.CheckFailed) as e:
        render(app, e.report, as_json)
        app.abort(str(e), 1)
    for w in report.warnings:
        app.warn(w)
    render(app, report, as_json, heads[-1] if heads else None)


_common = [
    click.argument("model", type=click.Path(dir_okay=True, path_type=str)),
    click.option("--opset", "opset", type=int, required=True, help="Target ai.onnx opset N."),
    writer_options("<stem>.opset<N>.onnx next to MODEL"),
    click.option("--per-axis", is_flag=True,
                 help="Also rewrite every blocked DequantizeLinear to per-axis."),
    click.option("--check", is_flag=True, help="Run both models (dqtool reference, "
                 "onnxruntime) and require bit-identical results before writing."),
    click.option("--keep-contrib", is_flag=True, help="Leave com.microsoft MatMulNBits / "
                 "GatherBlockQuantized as they are (only the opset moves)."),
]


def _with_common(f):
    for deco in reversed(_common):
        f = deco(f)
    return f


@click.command("upgrade")
@_with_common
@click.option("--to-qdq", "to_qdq", is_flag=True, help="First rewrite integer operators "
              "(QLinear*, MatMulInteger, dynamic quantization) into QDQ, as `dqtool qdq` "
              "does (faithful, not exact).")
@click.option("--handwritten", is_flag=True, help="Then rewrite dequantization written by "
              "hand (Cast → Sub → Mul, see `dqtool inspect`) into DequantizeLinear at N, "
              "exactly; refused with the reason where N has no exact form.")
@click.pass_obj
@user_errors
def upgrade_cmd(app: App, model: str, opset: int, per_axis: bool, check: bool,
                keep_contrib: bool, handwritten: bool, **writing: Any) -> None:
    """Move MODEL up to ai.onnx opset N, converting every Q/DQ exactly.

    com.microsoft and opmx Q/DQ become ai.onnx where N expresses them; invalid Q/DQ that
    real tools write (onnxruntime's per-axis at opset 10/11, nncf's uint4 at 17) are
    repaired; MatMulNBits / GatherBlockQuantized become DequantizeLinear + MatMul / Gather
    with bit-identical weights (--keep-contrib leaves them). Exit 0 written; 1 refused
    (nothing written); 2 bad input.
    """
    _run(app, "upgrade", model, opset, per_axis=per_axis, check=check,
         keep_contrib=keep_contrib, handwritten=handwritten, **writing)


@click.command("downgrade")
@_with_common
@click.option("--allow-decompose", is_flag=True, help="Rewrite a DequantizeLinear no "
              "version at N expresses as Cast/Sub/Mul (exact, but no longer QDQ).")
@click.pass_obj
@user_errors
def downgrade_cmd(app: App, model: str, opset: int, per_axis: bool, check: bool,
                  keep_contrib: bool, allow_decompose: bool, **writing: Any) -> None:
    """Lower MODEL to ai.onnx opset N by exact rewrites, or refuse with the reason.

    Exit 0 written; 1 refused (nothing written); 2 bad input.
    """
    _run(app, "downgrade", model, opset, per_axis=per_axis, check=check,
         allow_decompose=allow_decompose, keep_contrib=keep_contrib, **writing)


__all__ = ["Path", "downgrade_cmd", "upgrade_cmd"]
