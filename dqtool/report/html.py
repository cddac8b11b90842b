"""A report page, and writing it: all or nothing (a temporary file beside it, renamed into
place), refused up front where it cannot be written."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from html import escape
from pathlib import Path
from typing import Any

from dqtool.errors import UsageError
from dqtool.printable import number

# Nothing a page may fetch: no script, no remote style, font or image. A browser refuses
# any request the page would make.
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"

STYLE = """
body { font: 14px/1.4 sans-serif; margin: 24px; color: #222; max-width: 1100px; }
h1 { font-size: 20px; } h2 { font-size: 17px; margin-top: 28px; } h3 { font-size: 15px; }
table { border-collapse: collapse; margin: 8px 0; font-size: 12px; }
th, td { border: 1px solid #ccc; padding: 3px 6px; text-align: left; vertical-align: top; }
th { background: #f2f2f2; }
.verdict { font-weight: bold; padding: 6px 10px; display: inline-block; }
.pass { background: #d8f0dc; } .fail { background: #f6d5d1; }
.note { color: #555; font-size: 12px; }
svg.chart { border: 1px solid #ddd; margin: 6px 0; display: block; }
"""


def page(title: str, sections: Sequence[str]) -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta http-equiv=\"Content-Security-Policy\" content=\"{CSP}\">"
            f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>"
            f"<h1>{escape(title)}</h1>" + "".join(sections) + "</body></html>\n")


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], css: str = "") -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{escape(number(c))}</td>" for c in r) + "</tr>"
                   for r in rows)
    return f'<table class="{css}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def verdict(passed: bool, text: str) -> str:
    css = "pass" if passed else "fail"
    return f'<p class="verdict {css}" id="verdict">{escape(text)}</p>'


def writable(path: str | os.PathLike) -> Path:
    """The report's path, refused (exit 2, one line) when its folder does not exist or it
    names a folder: before the work a report follows."""
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"--report {p}: is a directory")
    if not p.parent.is_dir():
        raise UsageError(f"--report {p}: no such folder {p.parent}")
    return p


def write(path: str | os.PathLike, text: str) -> None:
    """Written whole or not at all."""
    p = writable(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", dir=p.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # as an ordinary file (mkstemp makes it 0600)
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
