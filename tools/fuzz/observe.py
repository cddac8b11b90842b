"""What the judge looks at besides the files' snapshots: what a run printed, and whether the
models it did not write still read their external data.

Kept apart from ``run`` (which forks and classifies) so each check is a plain function of
bytes and folders that the tests can call on hand-made inputs.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import onnx

# A model file larger than this is not parsed by the harness (none of its inputs is; a
# reader bigger than that would only slow every run down).
MAX_MODEL_BYTES = 64 << 20
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def visible(text: str) -> str:
    """``text`` with every character ``str.isprintable`` refuses escaped as dqtool documents
    it (``\\n``, ``\\x1b``, ``\\u202e``; a byte that was not UTF-8, kept as a lone surrogate,
    as ``\\xff``). Used to match the paths dqtool names and to keep the harness's own
    report free of what it found (a raw escape sequence would act on the terminal)."""
    if text.isprintable():
        return text
    out = []
    for c in text:
        code = ord(c)
        if c.isprintable():
            out.append(c)
        elif c in _NAMED:
            out.append(_NAMED[c])
        elif 0xDC80 <= code <= 0xDCFF:
            out.append(f"\\x{code - 0xDC00:02x}")
        elif code < 0x100:
            out.append(f"\\x{code:02x}")
        else:
            out.append(f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
    return "".join(out)


def is_traceback(text: str) -> bool:
    """A traceback Python printed: the header line, then an indented frame line. A header
    alone is a forged line (a hostile name printed raw), which ``raw_output`` reports."""
    lines = text.split("\n")  # not splitlines: a raw \r is no line break to a reader
    return any(line.rstrip() == "Traceback (most recent call last):"
               and i + 1 < len(lines) and lines[i + 1].startswith("  ")
               for i, line in enumerate(lines))


def raw_output(stream: bytes, name: str) -> str | None:
    """Why ``stream`` (stdout or stderr) could deceive a terminal or its reader, or None:
    bytes that are not UTF-8, a character ``str.isprintable`` refuses other than the
    newline (controls, ESC, bidi overrides, zero-width joiners, NUL, surrogates), or a
    line that starts as a traceback does."""
    try:
        text = stream.decode("utf-8")
    except UnicodeDecodeError as e:
        near = stream[max(0, e.start - 40):e.start + 8]
        return f"{name} is not UTF-8 at byte {e.start}: {near!r}"
    for number, line in enumerate(text.split("\n"), 1):
        bad = next((c for c in line if not c.isprintable()), None)
        if bad is not None:
            return f"{name} line {number} holds {visible(bad)}: {visible(line)[:200]}"
        if line.startswith("Traceback"):
            return f"{name} line {number} starts with Traceback: {visible(line)[:200]}"
    return None


def json_mode(argv: list[str]) -> bool:
    """Whether the command prints a JSON document on stdout."""
    if "--json" in argv:
        return True
    return "--format" in argv and argv.index("--format") + 1 < len(argv) \
        and argv[argv.index("--format") + 1] in ("json", "sarif")


def bad_json(stdout: bytes) -> str | None:
    """Why stdout is not one JSON document, or None (an empty stdout is fine: a refused
    command prints its error on stderr only)."""
    if not stdout.strip():
        return None
    try:
        json.loads(stdout.decode("utf-8"))  # strict: a raw control in a string fails
    except (UnicodeDecodeError, ValueError) as e:
        return f"stdout is not one JSON document: {visible(str(e))[:200]}"
    return None


# -- what the other models in the sandbox read ----------------------------------------------
Read = tuple[str, str, int, int]  # model, data file (relative to the sandbox), offset, length


def _external_tensors(m: onnx.ModelProto) -> list[onnx.TensorProto]:
    """Every tensor stored externally, in every graph, subgraph and function (iteratively:
    a hostile model may nest deeper than Python recurses)."""
    found: list[onnx.TensorProto] = []
    stack: list = [m.graph, *m.functions]
    while stack:
        g = stack.pop()
        if isinstance(g, onnx.GraphProto):
            found.extend(g.initializer)
        for n in g.node:
            for a in n.attribute:
                found.extend([a.t] if a.HasField("t") else [])
                found.extend(a.tensors)
                stack.extend([a.g] if a.HasField("g") else [])
                stack.extend(a.graphs)
    return [t for t in found if t.data_location == onnx.TensorProto.EXTERNAL]


def _where(t: onnx.TensorProto) -> tuple[str, int, int] | None:
    info = {e.key: e.value for e in t.external_data}
    try:
        offset, length = int(info.get("offset", "0")), int(info.get("length", "-1"))
    except ValueError:
        return None
    location = info.get("location", "")
    if not location or "\0" in location or os.path.isabs(location) or offset < 0:
        return None
    return location, offset, length


def _digest(path: Path, offset: int, length: int) -> str:
    """The hash of the bytes a reader takes (``length`` -1: to the end), or what stands in
    their way. Never opens what is not a regular file (a FIFO would block), never reads
    more than the file holds (a declared length may be a terabyte)."""
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            return "not a file"
        size = length if length >= 0 else max(0, st.st_size - offset)
        if offset + size > st.st_size:
            return f"short ({max(0, st.st_size - offset)} of {size} bytes)"
        h = hashlib.sha256()
        with open(path, "rb") as f:
            f.seek(offset)
            while size > 0:
                block = f.read(min(size, 1 << 20))
                if not block:
                    return "short (it shrank while read)"
                h.update(block)
                size -= len(block)
    except OSError as e:
        return f"unreadable ({e.strerror})"
    return h.hexdigest()


def external_reads(root: Path, skip: set[str]) -> dict[Read, str]:
    """For every ``*.onnx`` under ``root`` but those in ``skip`` (the command's output),
    each range of external data it reads inside the sandbox and that range's hash.
    A model that does not parse, or a location that leads out of the sandbox, is not
    counted: only what a model reads successfully before the run must still be there."""
    base = os.path.realpath(root)
    reads: dict[Read, str] = {}
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            if not name.endswith(".onnx") or rel in skip:
                continue
            try:
                if not stat.S_ISREG(os.stat(path).st_mode) or \
                        os.path.getsize(path) > MAX_MODEL_BYTES:
                    continue
                m = onnx.ModelProto()
                m.ParseFromString(path.read_bytes())
            except Exception:  # an unreadable model reads nothing
                continue
            for t in _external_tensors(m):
                where = _where(t)
                if where is None:
                    continue
                # Read through the name, as the model's reader opens it (links followed
                # then, not now), but only where it leads inside the sandbox.
                named = os.path.join(os.path.dirname(rel), where[0])
                try:
                    inside = os.path.realpath(root / named).startswith(base + os.sep)
                except OSError:  # an overlong name
                    inside = False
                if not inside:
                    continue
                key = (rel, named, where[1], where[2])
                digest = _digest(root / named, where[1], where[2])
                if len(digest) == 64:  # only a range that reads now
                    reads[key] = digest
    return reads


def broken_reads(root: Path, before: dict[Read, str]) -> str | None:
    """The first model whose reads ``before`` no longer give the same bytes, or that is
    gone, described; None if every one still reads what it read."""
    for (model, data, offset, length), digest in sorted(before.items()):
        if not os.path.lexists(root / model):
            return f"{model} removed (it read {data})"
        now = _digest(root / data, offset, length)
        if now != digest:
            what = "changed" if len(now) == 64 else now
            return f"{model} reads {data} [{offset}:+{length}]: {what}"
    return None

