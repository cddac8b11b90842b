"""``dqtool pack MODEL``: DequantizeLinear → MatMul / Gather into onnxruntime's MatMulNBits /
GatherBlockQuantized, bit-identical weights."""

from __future__ import annotations

import click

from dqtool.cli.app import App, user_errors
from dqtool.cli.options import parse_size, progress_bar, writer_options

# The library is imported inside the command's body: `dqtool pack --help` and a refused
# option load no onnx_ir or NumPy (~0.3 s), and no onnxruntime.


@click.command("pack")
@click.argument("model", type=click.Path(dir_okay=True, path_type=str))
@writer_options("<stem>.packed.onnx next to MODEL")
@click.option("--accuracy-level", type=click.IntRange(0, 4), default=None,
              help="MatMulNBits accuracy_level written (0 leaves it out; >0 lets "
              "onnxruntime quantize or downcast A, so outputs change by design). Default: "
              "the level upgrade noted from the original MatMulNBits, else none.")
@click.option("--zero-points", type=click.Choice(["auto", "packed"]), default="auto",
              show_default=True, help="auto: leave zero points out when all are "
              "2^(bits-1) (onnxruntime's symmetric form); packed: always write them.")
@click.option("--no-gather", is_flag=True, help="Leave DequantizeLinear → Gather alone.")
@click.option("--fuse-bias", is_flag=True,
              help="Take every constant bias Add after the MatMul into MatMulNBits (default: "
              "only the one upgrade made from a MatMulNBits' bias; onnxruntime sums a bias "
              "inside the node in its own order, so outputs may move by an ulp).")
@click.pass_obj
@user_errors
def pack_cmd(app: App, model: str, out: str | None, accuracy_level: int | None,
             zero_points: str, no_gather: bool, fuse_bias: bool, as_json: bool,
             in_place: bool, external_data: bool, shard_size: str | None,
             progress: bool | None) -> None:
    """Turn DequantizeLinear(constant) → MatMul into com.microsoft MatMulNBits and
    DequantizeLinear(constant table) → Gather into GatherBlockQuantized.

    Weights stay bit-identical (2/4/8-bit, blocked along K or per-axis). Exit 0 written;
    2 bad input.
    """
    from dqtool.fused.pack_api import pack

    if out is not None and in_place:
        app.abort("give either --output or --in-place, not both", 2)
    heads: list[str] = []  # the summary, rendered while the data is written

    def summary(report) -> None:
        with app.out.capture() as captured:
            _summary(app, report)
        heads.append(captured.get())

    with progress_bar(app, model, progress) as bar:
        report = pack(model, out, accuracy_level=accuracy_level, zero_points=zero_points,
                      gather=not no_gather, fuse_bias=fuse_bias, in_place=in_place,
                      external_data=external_data or None,
                      shard_size=parse_size(shard_size), progress=bar,
                      while_writing=None if as_json else summary)
    if as_json:
        app.print_json({
            "input": model, "files": report.written,
            "packed": [vars(p) for p in report.packed],
            "skipped": [vars(s) for s in report.skipped],
        })
        return
    if heads:
        app.out.file.write(heads[-1])
    else:
        _summary(app, report)
    for path in report.written:
        app.out.print(f"wrote {path}")


def _summary(app: App, report) -> None:
    """A line per packed or left node, and the counts (printed while the data is still
    written where the save allows: ~25 ms of an LLM's 225 lines then overlap it)."""
    for p in report.packed:
        app.out.print(f"{p.node} [{p.graph}]: {p.how}", markup=False, soft_wrap=True)
    for s in report.skipped:
        app.out.print(f"{s.node} [{s.graph}]: left as it is: {s.why}", markup=False,
                      soft_wrap=True)
    app.out.print(f"{len(report.packed)} packed, {len(report.skipped)} left")
