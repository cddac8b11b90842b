"""``dqtool fold MODEL [-o OUT] [--json] [selection] [--dtype] [--dry-run] ...``."""

from __future__ import annotations

import click

from dqtool.cli.app import App, user_errors
from dqtool.cli.options import parse_size, progress_bar, writer_options

# The library is imported inside the command's body: `dqtool fold --help` and a refused
# option load no onnx_ir or NumPy (~0.3 s), and no onnxruntime.


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _line(app: App, text: str) -> None:
    # Names hold brackets (rich would eat them); one line per item, whatever the width.
    app.out.print(text, markup=False, soft_wrap=True)


def render(app: App, report) -> None:
    verb = "would fold" if report.dry_run else "folded"
    for n in report.folded:
        note = f" ({n.rounding} rounding)" if n.rounding else ""
        if n.before_gather:
            note += " (it dequantized a Gather's rows: moved before the Gather, the table folded)"
        pair = " Q→DQ pair" if n.pair else ""
        _line(app, f"{verb} {n.name} [{n.graph}] {n.op}{pair}: {n.quant_type}→"
                      f"{n.stored_type} {tuple(n.shape)} {_size(n.bytes_quantized or 0)}→"
                      f"{_size(n.bytes_folded)}{note}")
    for left in report.left:
        tag = "refused" if left.refused else "left"
        _line(app, f"{tag} {left.name} [{left.graph}]: {left.reason}")
    if report.prepared:
        # Which ops these are is the family's business: the line names the nodes.
        _line(app, f"{len(report.prepared)} fused node(s) (dequantization inside the operator) "
                   f"rewritten exactly into DequantizeLinear form before folding (or "
                   f"folded whole, listed above): "
                   f"{_some(report.prepared)}")
    for name, why in report.prepared_left:
        _line(app, f"left fused {name}: {why}")
    if report.handwritten:
        _line(app, f"{len(report.handwritten)} hand-written dequantization(s) (Cast → Sub → Mul) "
                   f"rewritten exactly into DequantizeLinear before folding: "
                   f"{_some(report.handwritten)}")
    for name, why in report.handwritten_left:
        _line(app, f"left hand-written {name}: {why}")
    _line(app,
        f"{len(report.folded)} {verb}, {len(report.left)} left ({len(report.refused)} "
        f"refused)" + (f", {len(report.prepared_left)} fused left" if report.prepared_left else "")
        + f"; initializers {_size(report.bytes_before)} → {_size(report.bytes_after)}; "
        f"removed {len(report.removed)}, kept {len(report.kept)} still used"
        + (f"; {report.guarded} prepack-guarded" if report.guarded else ""))
    if report.files:
        _line(app, f"wrote {', '.join(report.files)} (IR {report.ir_version}"
                      + (", external data" if report.external_data else "") + ")")


@click.command("fold")
@click.argument("model", type=click.Path(dir_okay=True, path_type=str))
@writer_options("<stem>.folded.onnx next to MODEL")
@click.option("--op-types", multiple=True, metavar="OPS",
              help="Fold only DequantizeLinear feeding these ops (e.g. MatMul,Gemm).")
@click.option("--include", multiple=True, metavar="GLOB",
              help="Fold only nodes whose name or output name matches a glob.")
@click.option("--exclude", multiple=True, metavar="GLOB",
              help="Leave nodes whose name or output name matches a glob.")
@click.option("--x-types", multiple=True, metavar="TYPES",
              help="Fold only these quantized types (e.g. int32 for biases).")
@click.option("--min-elements", type=click.IntRange(min=0), default=0, show_default=True,
              help="Fold only tensors with at least this many elements.")
@click.option("--dtype", type=click.Choice(["keep", "float32", "float16", "bfloat16"]),
              default="keep", show_default=True,
              help="Type stored; not keep = Cast of the node's output (a reported rounding "
                   "when narrower), with a Cast back so the graph keeps its types.")
@click.option("--dry-run", is_flag=True, help="List what would be folded; write nothing.")
@click.option("--prepack-guard/--no-prepack-guard", default=True, show_default=True,
              help="Identity between a folded weight and the MatMul/Gemm/RNN input "
                   "onnxruntime prepacks, keeping its outputs bit-identical.")
@click.pass_obj
@user_errors
def fold_cmd(app: App, model: str, out: str | None, as_json: bool, op_types: tuple[str, ...],
             include: tuple[str, ...], exclude: tuple[str, ...], x_types: tuple[str, ...],
             min_elements: int, dtype: str, dry_run: bool, external_data: bool,
             shard_size: str | None, in_place: bool, prepack_guard: bool,
             progress: bool | None) -> None:
    """Fold every constant DequantizeLinear of MODEL into an initializer holding its output.

    Values are bit-identical to onnxruntime's (ORT_DISABLE_ALL). Exit codes: 0 done;
    1 a selected constant node was refused (invalid; listed; the output is still written);
    2 bad input or options (nothing written).
    """
    from dqtool.folding import fold

    options = dict(op_types=op_types, include=include, exclude=exclude, x_types=x_types,
                   min_elements=min_elements, dtype=dtype, external_data=external_data or None,
                   shard_size=parse_size(shard_size), in_place=in_place,
                   prepack_guard=prepack_guard)
    with progress_bar(app, model, False if dry_run else progress) as bar:
        report = fold(model, out, dry_run=dry_run, progress=bar, **options)
    if op_types:
        # Op types are open-ended (custom ops), so an unknown one is not an error; but a
        # typo would silently fold nothing.
        _warn_unfed_op_types(app, report.fed_op_types, op_types)
    if as_json:
        app.print_json(report.to_json())
    else:
        render(app, report)
    if report.exit_code:
        raise SystemExit(report.exit_code)


def _some(names: list[str], shown: int = 5) -> str:
    more = len(names) - shown
    return ", ".join(names[:shown]) + (f" and {more} more" if more > 0 else "")


def _warn_unfed_op_types(app: App, fed: set[str], op_types: tuple[str, ...]) -> None:
    from dqtool.folding.selection import split_list

    unfed = [t for t in dict.fromkeys(split_list(op_types)) if t not in fed]
    if unfed:
        near = sorted({f for t in unfed for f in fed if f.lower() == t.lower()})
        hint = f"; op types are case-sensitive: did you mean {', '.join(near)}?" if near else ""
        app.warn(f"--op-types {','.join(unfed)}: no DequantizeLinear in the model feeds "
                 f"{'it' if len(unfed) == 1 else 'them'} (DequantizeLinear nodes feed, or "
                 f"fused nodes are: {', '.join(sorted(fed)) or 'nothing'}){hint}")
