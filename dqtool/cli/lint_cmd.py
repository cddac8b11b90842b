"""``dqtool lint MODEL... [--target T] [--select CODES] [--ignore CODES]
[--format text|json|github|sarif] [--json]``."""

from __future__ import annotations

import json
import sys

import click

from dqtool.cli.app import App, user_errors
from dqtool.cli.options import LazyHelpOption
from dqtool.errors import UsageError

# The library is imported inside the command's body: `dqtool lint --help` and a refused
# option load no onnx_ir or NumPy (~0.3 s), and no onnxruntime.


def _target_help() -> str:
    from dqtool.linting import targets

    return "One of: " + ", ".join(targets.names()) + "."


@click.command("lint")
@click.argument("models", nargs=-1, required=True, type=str)
@click.option("--target", default=None, metavar="T", cls=LazyHelpOption,
              lazy_help=_target_help)
@click.option("--select", default=None, metavar="CODES",
              help="Comma-separated rule codes or prefixes to run (default: all).")
@click.option("--ignore", default=None, metavar="CODES",
              help="Comma-separated rule codes or prefixes to skip.")
@click.option("--format", "fmt", type=click.Choice(["text", "json", "github", "sarif"]),
              default="text", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document (as "
              "--format json).")
@click.pass_obj
@user_errors
def lint_cmd(app: App, models: tuple[str, ...], target: str | None, select: str | None,
             ignore: str | None, fmt: str, as_json: bool) -> None:
    """Lint the dequantization of MODELS, optionally for a --target.

    Settings come from [tool.dqtool.lint] (target, select, ignore) in the nearest
    pyproject.toml upward from the working directory; options override them.

    Exit codes: 0 no error-severity finding, 1 errors found, 2 bad input.
    """
    from dqtool.linting import config, formats, lint

    if as_json:
        if fmt not in ("text", "json"):
            raise UsageError(f"--json and --format {fmt} ask for two formats; give one")
        fmt = "json"
    report = lint(list(models), target=target, select=select, ignore=ignore,
                  config=config.find())
    if fmt == "text":
        formats.text(report, app.out)
    elif fmt == "json":
        sys.stdout.write(formats.as_json(report) + "\n")
    elif fmt == "github":
        out = formats.github(report)
        sys.stdout.write(out + "\n" if out else "")
    else:
        sys.stdout.write(json.dumps(formats.sarif(report), indent=2) + "\n")
    raise SystemExit(report.exit_code)
