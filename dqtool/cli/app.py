"""The object every command gets: consoles, verbosity, and how to stop with a message."""

from __future__ import annotations

import functools
import gc
import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

from dqtool.printable import safe_console, shown

if TYPE_CHECKING:
    from rich.console import Console

F = TypeVar("F", bound=Callable[..., Any])


class App:
    """Data goes to stdout, messages to stderr; NO_COLOR is honoured by rich."""

    def __init__(self, verbose: int = 0) -> None:
        self.verbose = verbose

    # The consoles are made on first use: rich costs ~50 ms to import, and JSON output,
    # errors and warnings never need it.
    @functools.cached_property
    def out(self) -> Console:
        # Piped output has no terminal width; tables stay readable at 160 columns.
        width = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 160
        return safe_console(file=sys.stdout, no_color=_no_color(), highlight=False,
                       soft_wrap=False, width=width)

    @functools.cached_property
    def err(self) -> Console:
        return safe_console(file=sys.stderr, no_color=_no_color(), highlight=False, stderr=True)

    def abort(self, message: str, code: int = 2) -> NoReturn:
        # A plain write: rich would wrap a long path across lines, and this must be one
        # line, whatever a name in it holds (``dqtool.printable``).
        click.echo(f"dqtool: error: {shown(message)}", err=True)
        raise SystemExit(code)

    def warn(self, message: str) -> None:
        click.echo(f"dqtool: warning: {shown(message)}", err=True)

    def info(self, message: str) -> None:
        self.err.print(message)

    def print_json(self, doc: Any) -> None:
        sys.stdout.write(json.dumps(doc, indent=2, default=_json_default) + "\n")


def quiet_libraries(verbose: int) -> None:
    """Third-party loggers (onnx_ir's "cannot be found in any scope…", one line per value)
    and Python warnings print nothing unless ``-v``: a bad input is one line, dqtool's."""
    logging.captureWarnings(True)  # warnings become log records of "py.warnings"
    root = logging.getLogger()
    if verbose:
        handler = logging.StreamHandler()
        handler.setFormatter(_ShownFormatter("%(name)s: %(levelname)s: %(message)s"))
        logging.basicConfig(level=logging.DEBUG if verbose > 1 else logging.INFO,
                            handlers=[handler])
    elif not root.handlers:  # a handler on the root: logging's last resort stays silent
        root.addHandler(logging.NullHandler())


class _ShownFormatter(logging.Formatter):
    """A library's log line names values too: escaped like everything dqtool prints."""

    def format(self, record: logging.LogRecord) -> str:
        return shown(super().format(record))


def _no_color() -> bool:
    return bool(os.environ.get("NO_COLOR"))


def _json_default(o: Any) -> Any:
    if hasattr(o, "to_json"):
        return o.to_json()
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    return str(o)


# The `dqtool` script imports with the cyclic garbage collector off, then freezes what the
# imports made (docs/decisions.md, "2026-11-24: a command starts and ends lean").
_GC_HELD = False


def imports_without_gc() -> None:
    """The collector off until a command's body starts (``collect_from_here``)."""
    global _GC_HELD
    if gc.isenabled():
        gc.disable()
        _GC_HELD = True


def collect_from_here() -> None:
    """What is alive now is frozen out of collection; the collector runs again, if
    ``imports_without_gc`` turned it off."""
    global _GC_HELD
    if _GC_HELD:
        _GC_HELD = False
        gc.freeze()
        gc.enable()


def user_errors(func: F) -> F:
    """Turn dqtool's user errors into one line and an exit code; bugs keep tracebacks.
    (Every command's body is wrapped in it: the collector restarts here.)"""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from dqtool.errors import DqtoolError

        collect_from_here()
        model = kwargs.get("model") if kwargs.get("in_place") else None
        before = _data_files(model) if isinstance(model, str) else set()
        try:
            return func(*args, **kwargs)
        except DqtoolError as e:
            App().abort(str(e), e.exit_code)
        finally:
            if before:
                _note_left(before, _data_files(model))

    return wrapper  # type: ignore[return-value]


def _data_files(model: str) -> set[Path]:
    """The data files a model file names (its payloads unread), resolved."""
    # Imported here: the module that reads them loads onnx, which `dqtool --help` never needs.
    from dqtool.storage import locations

    path = Path(model)
    try:
        return {(path.parent / loc).resolve() for loc in locations(path)}
    except (OSError, RuntimeError, ValueError):  # a link loop, a NUL: nothing to say
        return set()


def _note_left(before: set[Path], after: set[Path]) -> None:
    """``--in-place`` removes only the old data files named for the model that no other
    model reads (``data_readers``). What stays is said, with its size, so that a folder
    that doubled is not a surprise."""
    left = sorted(p for p in before - after if p.is_file())
    if not left:
        return
    size = sum(p.stat().st_size for p in left) / 2**20
    names = ", ".join(p.name for p in left[:3]) + (f" and {len(left) - 3} more"
                                                   if len(left) > 3 else "")
    App().warn(f"the replaced model's data files {names} ({size:.0f} MiB) are left in place: "
               "dqtool removes only data files named for the model that no other model in the "
               "folder reads; remove them if nothing else does")
