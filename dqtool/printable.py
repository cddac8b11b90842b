"""What dqtool prints of a model's names and a user's paths: visible escapes, never raw
control characters.

A value name, an external-data location or a path can hold anything: a newline (a forged
second line, a fake ``Traceback``), a carriage return, an escape sequence the terminal
obeys, a bidi override that reorders what the reader sees, bytes that are not UTF-8. Every
character ``str.isprintable`` refuses (controls, format characters such as bidi overrides
and zero-width joiners, separators other than the space, surrogates, unassigned code
points) is written as an escape: ``\\n``, ``\\r``, ``\\t``, ``\\x1b``, ``\\u202e``; a byte
that was not UTF-8 (a path's, kept by Python as a lone surrogate) as ``\\xff``. A backslash
itself is left as it is (paths stay readable), so an escape is not always unambiguous; what
matters is that nothing reaches the terminal raw. JSON output needs none of this: JSON
escapes controls itself and dqtool writes it in ASCII (``\\u001b``, ``\\udcff``), so a
reader gets the names back exactly.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def shown(text: str | bytes) -> str:
    """``text`` with every non-printable character escaped (see the module's docstring);
    bytes are read as UTF-8, what is not UTF-8 escaped byte by byte."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "surrogateescape")
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escape(c) for c in text)


def _escape(c: str) -> str:
    if c in _NAMED:
        return _NAMED[c]
    code = ord(c)
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8 (surrogateescape)
        return f"\\x{code - 0xDC00:02x}"
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def safe_console(**kwargs: Any) -> Console:
    """A rich console that escapes every string it renders (printed text, table cells,
    titles) and reads no markup unless a call asks for it (``markup=True``, with the
    names in it escaped by ``rich.markup.escape``): a name like ``[/x]`` is text. (rich is
    imported here, on first use: errors and JSON output never need it.)"""
    kwargs.setdefault("markup", False)
    return _console_class()(**kwargs)


@functools.cache
def _console_class() -> type[Console]:
    from rich.console import Console

    class SafeConsole(Console):
        def render_str(self, text: str, **kwargs: Any) -> Any:
            return super().render_str(shown(text), **kwargs)

    return SafeConsole


def number(v: object) -> str:
    """A figure as reports print it: six significant digits for a float, "-" for none."""
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)
