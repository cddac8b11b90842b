"""Options shared by several commands, defined once: every command that writes a model
takes the same ``-o``, ``--in-place``, ``--json``, ``--external-data``, ``--shard-size``
and ``--progress``; help text computed from a registry is computed when shown."""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from dqtool.errors import UsageError

if TYPE_CHECKING:
    from dqtool.cli.app import App

F = TypeVar("F", bound=Callable[..., Any])

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9,
          "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}
# Show a progress bar from this many output bytes: smaller saves finish before it helps.
PROGRESS_MIN_BYTES = 256 << 20


class LazyHelpOption(click.Option):
    """An option whose help comes from a function, called only when help is shown (the
    target table imports every target module; ``dqtool lint m.onnx`` should not)."""

    def __init__(self, *args: Any, lazy_help: Callable[[], str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lazy_help = lazy_help

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        self.help = self._lazy_help()
        return super().get_help_record(ctx)


def parse_size(text: str | None) -> int | None:
    """``"500MB"``, ``"1GiB"``, ``"1048576"`` → bytes."""
    if text is None:
        return None
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise UsageError(f"--shard-size: cannot read {text!r} as a size (e.g. 500MB, 2GiB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def writer_options(default_output: str) -> Callable[[F], F]:
    """The options of every command that writes a model. The command receives ``out``,
    ``in_place``, ``as_json``, ``external_data``, ``shard_size`` (text: ``parse_size`` it
    in the command, where a bad value is a one-line error) and ``progress`` (True, False or
    None: decide by size and terminal)."""
    decos = [
        click.option("-o", "--output", "out", type=click.Path(path_type=str), default=None,
                     help=f"Output file [default: {default_output}]."),
        click.option("--in-place", is_flag=True, help="Overwrite MODEL (atomically)."),
        click.option("--json", "as_json", is_flag=True, help="Print one JSON document."),
        click.option("--external-data", is_flag=True,
                     help="Write tensors as external data <OUT>.data (automatic past ~1.8 GB "
                          "or when the input used external data)."),
        click.option("--shard-size", metavar="SIZE",
                     help="Split external data into files of at most SIZE, e.g. 1GB (a "
                          "tensor larger than SIZE gets a file of its own)."),
        click.option("--progress/--no-progress", default=None,
                     help="Progress bar on stderr [default: for large saves on a terminal]."),
    ]

    def apply(f: F) -> F:
        for deco in reversed(decos):
            f = deco(f)
        return f

    return apply


class Progress:
    """A rich bar on stderr counting tensors and bytes, fed by onnx_ir's save callback."""

    def __init__(self, app: App) -> None:
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        self.bar = Progress(TextColumn("writing"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("tensors"), DownloadColumn(), TimeRemainingColumn(),
                            console=app.err, transient=True)
        self.tensors = self.bar.add_task("tensors", total=None)
        self.count = 0

    def __call__(self, tensor: Any, info: Any) -> None:
        # Called as each tensor starts: the bar shows what is being written.
        self.count += 1
        self.bar.update(self.tensors, total=info.total, completed=self.count)

    def __enter__(self) -> Progress:
        self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.stop()


def _estimate(model: str) -> int:
    """Rough output size (4 bytes per quantized byte) for deciding on a progress bar."""
    try:
        p = Path(model)
        data = sum(f.stat().st_size for f in p.parent.glob(f"{p.name}*") if f.is_file())
        return 4 * data
    except OSError:
        return 0


@contextlib.contextmanager
def progress_bar(app: App, model: str, show: bool | None) -> Iterator[Progress | None]:
    """A progress bar for the save (the ``progress`` callback of ``storage.save``), or None:
    ``show`` None decides by the estimated output size and whether stderr is a terminal
    (cheap: file sizes only, no tensor data is read)."""
    if show is None:
        show = sys.stderr.isatty() and _estimate(model) >= PROGRESS_MIN_BYTES
    if not show:
        yield None
        return
    with Progress(app) as bar:
        yield bar
