"""The ``dqtool`` command line: a thin layer over the Python API.

Each command lives in its own module and is imported only when it runs, so a command
whose import fails does not take the others down, and ``fold`` never imports onnxruntime.
User errors print one line on stderr with exit 2 (bad input) or 1 (findings / refused);
anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import importlib
import os
import sys

from dqtool.deferred_imports import defer_sympy

defer_sympy()  # before anything imports onnx_ir: saves ~0.4 s of every command's start

import click  # noqa: E402

from dqtool.cli.app import App, imports_without_gc, quiet_libraries  # noqa: E402
from dqtool.cli.version import text  # noqa: E402
from dqtool.errors import DqtoolError  # noqa: E402
from dqtool.printable import shown  # noqa: E402

# command -> (module, attribute, one-line help shown in `dqtool --help`), in the order
# listed; a command's module is imported only when it runs.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "inspect": ("dqtool.cli.inspect_cmd", "inspect_cmd",
                "What dequantization a model holds, and what is wrong with it."),
    "upgrade": ("dqtool.cli.convert_cmd", "upgrade_cmd",
                "Move a model up to an opset, converting every Q/DQ exactly."),
    "downgrade": ("dqtool.cli.convert_cmd", "downgrade_cmd",
                  "Lower a model to an opset by exact rewrites, or refuse with the reason."),
    "pack": ("dqtool.cli.pack_cmd", "pack_cmd",
             "DequantizeLinear → MatMul / Gather into MatMulNBits / GatherBlockQuantized."),
    "fold": ("dqtool.cli.fold_cmd", "fold_cmd",
             "Fold constant dequantization into float initializers."),
    "check": ("dqtool.cli.check_cmd", "check_cmd",
              "Validate a model or a conversion against onnxruntime and the kernel."),
    "lint": ("dqtool.cli.lint_cmd", "lint_cmd",
             "Lint models against a target (an opset, onnxruntime, DirectML, ...)."),
    "qdq": ("dqtool.cli.integer_cmd", "qdq_cmd",
            "Rewrite integer operators (QLinear*, MatMulInteger, dynamic) into QDQ."),
    "qoperator": ("dqtool.cli.integer_cmd", "qoperator_cmd",
                  "Fuse QDQ patterns into integer operators (QLinearConv, ...)."),
}


def _unavailable(name: str, reason: str) -> click.Command:
    @click.command(name, help=f"(not available: {reason})",
                   context_settings={"ignore_unknown_options": True})
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    def cmd(args: tuple[str, ...]) -> None:
        App().abort(f"'{name}' is not available in this build: {reason}", 2)

    return cmd


def _print_versions(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    # Metadata only: importing onnxruntime or onnx to ask would cost most of a second.
    if not value or ctx.resilient_parsing:
        return

    click.echo(text())
    ctx.exit()


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module, attr, _ = COMMANDS[name]
        try:
            return getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            return _unavailable(name, str(e).splitlines()[0])

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Short help from the table: listing commands must not import them all.
        with formatter.section("Commands"):
            formatter.write_dl([(name, text) for name, (_, _, text) in COMMANDS.items()])


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True,
              callback=_print_versions,
              help="Show the versions of dqtool, onnx, onnx_ir, onnxruntime and numpy, and exit.")
@click.option("-v", "--verbose", count=True, help="More detail on stderr.")
@click.pass_context
def cli(ctx: click.Context, verbose: int) -> None:
    """Inspect, convert, fold, check and lint the dequantization nodes of ONNX models.

    Exit codes: 0 success; 1 findings (check mismatch, lint errors, conversion refused);
    2 usage error or unreadable input.
    """
    quiet_libraries(verbose)
    ctx.obj = App(verbose=verbose)


def _flat(message: str) -> str:
    return " ".join(message.split())


def main(argv: list[str] | None = None) -> None:
    try:
        code = cli.main(args=argv, prog_name="dqtool", standalone_mode=False)
    except DqtoolError as e:  # raised outside a command body (rare)
        App().abort(str(e), e.exit_code)
    except click.exceptions.NoArgsIsHelpError as e:  # bare `dqtool`: the help, as click does
        e.show()
        sys.exit(e.exit_code)
    except click.UsageError as e:
        # One line, like every other bad request (click's own would add the usage text).
        where = e.ctx.command_path if e.ctx is not None else "dqtool"
        App().abort(f"{_flat(e.format_message())} (see '{where} --help')", e.exit_code)
    except click.ClickException as e:
        App().abort(_flat(e.format_message()), e.exit_code)
    except click.Abort:
        click.echo("Aborted!", err=True)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


def quiet_blas() -> None:
    """Unless the user set it: OpenBLAS's worker threads (numpy's) go to sleep after 2^4
    idle cycles, not 2^28. Why: each one spins from numpy's import until that many cycles
    pass with no work (~0.1 s of a core, measured: 0.45 s against 0.35 s of CPU for
    ``import numpy`` and 0.3 s of work), on the core a conversion's writers need next. A
    BLAS call then wakes them (microseconds; dqtool's commands make few and small ones).
    Read once, when numpy loads OpenBLAS: so before anything imports numpy."""
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")


def entry() -> None:
    """The ``dqtool`` command: ``main``, then out without the interpreter's teardown.

    Why: a command is done once ``main`` returns (every file written, committed and closed;
    output is flushed here), and tearing down its objects only costs time
    (docs/decisions.md, "2026-11-24: a command starts and ends lean"). Errors (exceptions
    other than SystemExit) leave the usual way. Library callers and tests call ``main``,
    which never ends the process this way. Imports run without the garbage collector
    (``app.imports_without_gc``), and OpenBLAS's threads sleep as soon as they are idle
    (``quiet_blas``)."""
    quiet_blas()
    imports_without_gc()
    try:
        main()
        code = 0
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:  # a message, as sys.exit("...") prints it

            print(shown(str(e.code)), file=sys.stderr)
            code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except OSError:  # a reader that went away: the usual teardown reports it
            raise SystemExit(code) from None
    os._exit(code)
