"""Family (d): hostile outputs — devices, FIFOs, sockets, folders, symlinks, read-only
places, in-place runs on a model that is a symlink."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path

from tools.fuzz.case import SENTINEL, Case, shuffled

REPO = Path(__file__).resolve().parents[2]
INLINE = REPO / "models" / "ort_qdq_per_channel.onnx"
EXTERNAL = REPO / "models" / "external_data" / "model.onnx"

# kind -> (output argument, special entries)
TARGETS: dict[str, tuple[str, list]] = {
    "chardev": ("out/null", [("chardev", "out/null", "")]),
    "fifo": ("out/pipe", [("fifo", "out/pipe", "")]),
    "socket": ("out/sock", [("socket", "out/sock", "")]),
    "directory": ("out/dir", [("dir", "out/dir", "")]),
    "directory-slash": ("out/dir/", [("dir", "out/dir", "")]),
    "new-folder-slash": ("out/newdir/", []),
    "missing-folder": ("out/no/such/o.onnx", []),
    "symlink-outside-file": ("out/link.onnx", [("symlink", "out/link.onnx",
                                                "../" + SENTINEL)]),
    "symlink-outside-dir": ("out/linkdir/o.onnx", [("symlink", "out/linkdir", "../outside")]),
    "symlink-to-dir": ("out/l", [("dir", "out/d", ""), ("symlink", "out/l", "d")]),
    "symlink-to-fifo": ("out/l", [("fifo", "out/p", ""), ("symlink", "out/l", "p")]),
    "symlink-dangling": ("out/dangling.onnx", [("symlink", "out/dangling.onnx", "nowhere")]),
    "data-is-directory": ("out/o.onnx", [("dir", "out/o.onnx.data", "")]),
    "data-is-fifo": ("out/o.onnx", [("fifo", "out/o.onnx.data", "")]),
    "data-is-chardev": ("out/o.onnx", [("chardev", "out/o.onnx.data", "")]),
    "data-symlink-outside": ("out/o.onnx", [("symlink", "out/o.onnx.data",
                                             "../" + SENTINEL)]),
    "read-only-folder": ("out/ro/o.onnx", [("dir", "out/ro", ""), ("mode", "out/ro", "555")]),
    "output-is-input": ("in/model.onnx", []),
    "output-is-input-data": ("in/model.onnx.data", []),
    "empty-name": ("", []),
    "dot": (".", []),
    # Names whose bytes are not UTF-8 (argv holds bytes; Python gives them as lone
    # surrogates, as os.fsdecode does): written under exactly that name, or refused in one
    # line with nothing written (hostile campaign of 2026-11).
    "not-utf8": (os.fsdecode(b"out/o\xff.onnx"), []),
    "not-utf8-controls": (os.fsdecode(b"out/o\xfe\x1b[2J\n\xe2\x80\xae.onnx"), []),
    "not-utf8-folder": (os.fsdecode(b"out/d\xff/o.onnx"), [("dir", os.fsdecode(b"out/d\xff"),
                                                          "")]),
    "not-utf8-missing-folder": (os.fsdecode(b"out/n\xff/o.onnx"), []),
    "not-utf8-truncated": (os.fsdecode(b"out/o\xe2\x80.onnx"), []),  # a cut 3-byte sequence
}
# (No NUL in an output name: execve cannot pass one in argv, so no user can type it.)
VERBS = [["fold"], ["fold", "--external-data"], ["upgrade", "--opset", "21"],
         ["downgrade", "--opset", "13"]]


def _files(external: bool) -> dict[str, bytes]:
    if external:
        return {"in/model.onnx": EXTERNAL.read_bytes(),
                "in/model.onnx.data": (EXTERNAL.parent / "model.onnx.data").read_bytes()}
    return {"in/model.onnx": INLINE.read_bytes()}


def make(kind: str, verb: int, external: bool) -> Case:
    if kind == "in-place-symlink":  # the model is a symlink to a file outside
        files = {f"outside/{k[3:]}": v for k, v in _files(external).items()}
        special = [("symlink", "in/model.onnx", "../outside/model.onnx")]
        if external:
            special.append(("symlink", "in/model.onnx.data", "../outside/model.onnx.data"))
        argv = [*VERBS[verb][:1], "in/model.onnx", *VERBS[verb][1:], "--in-place"]
        return Case("output", f"{kind}:{'external' if external else 'inline'}", argv, files,
                    special)
    out, special = TARGETS[kind]
    argv = [*VERBS[verb][:1], "in/model.onnx", *VERBS[verb][1:], "-o", out]
    return Case("output", f"{kind}:{'external' if external else 'inline'}", argv,
                _files(external), list(special))


def kinds() -> list[str]:
    return [*TARGETS, "in-place-symlink"]


def cases(rng: random.Random) -> Iterator[Case]:
    return shuffled(rng, lambda: [(k, v, e) for k in kinds() for v in range(len(VERBS))
                                  for e in (False, True)], make)
