"""Family "names": node, value, initializer, graph and input/output names and external-data
locations holding what a terminal obeys or a reader misreads.

The hostile campaign of 2026-11 forged a second line (``\\nTraceback (most recent call
last):``), recoloured and retitled the terminal (``\\x1b[31m``, ``\\x1b]0;title\\x07``),
reordered text with bidi overrides (U+202E, U+2066), hid characters (zero-width joiner,
NUL) through names dqtool printed raw. The judge's "raw-control" check says whether any of
it reaches stdout or stderr unescaped; JSON output must still parse.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Iterator
from pathlib import Path

import onnx

from tools.fuzz import commands
from tools.fuzz.case import Case, shuffled
from tools.fuzz.hostile_data import BASE
from tools.fuzz.mutate_structure import _base_weight

REPO = Path(__file__).resolve().parents[2]
MODEL = "in/model.onnx"

HOSTILE = {
    "newline": "\n", "cr": "\r", "csi": "\x1b[31m", "osc-title": "\x1b]0;title\x07",
    "rlo": "\u202e", "lri": "\u2066", "zwj": "\u200d", "nul": "\x00", "c1-csi": "\x9b2J",
    "del": "\x7f", "line-separator": "\u2028",
    # A forged traceback header on a line of its own; the name goes on after it, so the
    # line is never Python's own header (see observe.is_traceback).
    "forged-traceback": "\nTraceback (most recent call last):",
    "all": "\nTraceback (most recent call last):\r\x1b[31m\x1b]0;t\x07\u202e\u2066\u200d\x00",
}
TARGETS = ("node-names", "values", "initializers", "graph-names", "io-names", "location",
           "everything")
BASES = ("weight", "external", "nbits", "qop", "function", "if")


@functools.cache
def _base(name: str) -> bytes:
    if name == "weight":
        return _base_weight().SerializeToString()
    if name == "external":
        return BASE.read_bytes()
    file = {"nbits": "ort_matmulnbits_4bit_sym_b32", "qop": "ort_qop_per_channel",
            "function": "dq_in_function", "if": "dq_in_if_subgraph"}[name]
    return (REPO / "models" / f"{file}.onnx").read_bytes()


def _graphs(m: onnx.ModelProto) -> list[onnx.GraphProto]:
    """The main graph and every subgraph (not functions: their names are their own)."""
    out, stack = [], [m.graph]
    while stack:
        g = stack.pop()
        out.append(g)
        for n in g.node:
            for a in n.attribute:
                stack.extend([a.g] if a.HasField("g") else [])
                stack.extend(a.graphs)
    return out


def _rename_values(m: onnx.ModelProto, pick, fresh) -> None:
    """Rename the values ``pick(graph)`` lists, everywhere they are read or declared
    (subgraphs read outer values by name)."""
    graphs = _graphs(m)
    mapping: dict[str, str] = {}
    for g in graphs:
        for old in pick(g):
            if old and old not in mapping:
                mapping[old] = fresh()
    for g in graphs:
        for n in g.node:
            n.input[:] = [mapping.get(x, x) for x in n.input]
            n.output[:] = [mapping.get(x, x) for x in n.output]
        for vi in [*g.input, *g.output, *g.value_info]:
            vi.name = mapping.get(vi.name, vi.name)
        for t in g.initializer:
            t.name = mapping.get(t.name, t.name)


def apply(m: onnx.ModelProto, target: str, hostile: str) -> dict[str, str]:
    """Make ``target`` hostile in ``m``; the data files renamed (old location -> new)."""
    count = iter(range(1 << 30))

    def fresh(tag: str = "v") -> str:
        return f"{tag}{hostile}{next(count)}"

    everything = target == "everything"
    if target in ("node-names", "everything"):
        for g in _graphs(m):
            for n in g.node:
                n.name = fresh("n")
        for f in m.functions:
            for n in f.node:
                n.name = fresh("n")
    if target in ("values", "everything"):
        _rename_values(m, lambda g: [*(x for n in g.node for x in (*n.input, *n.output)),
                                     *(v.name for v in (*g.input, *g.output))], fresh)
    if target == "initializers":
        _rename_values(m, lambda g: [t.name for t in g.initializer], fresh)
    if target == "io-names":
        _rename_values(m, lambda g: [v.name for v in (*g.input, *g.output)], fresh)
    if target in ("graph-names", "everything"):
        for g in _graphs(m):
            g.name = fresh("g")
    moved: dict[str, str] = {}
    if target == "location" or everything:
        for t in m.graph.initializer:
            for e in t.external_data:
                if e.key == "location":
                    e.value = moved.setdefault(e.value, fresh("w") + ".data")
    return moved


def make(hostile: str, target: str, base: str, argv_index: int) -> Case:
    m = onnx.ModelProto()
    m.ParseFromString(_base(base))
    moved = apply(m, target, HOSTILE[hostile])
    files = {MODEL: m.SerializeToString()}
    if base == "external":
        data = (BASE.parent / "model.onnx.data").read_bytes()
        for new in moved.values() or ["model.onnx.data"]:
            if "\0" not in new:  # no file name holds NUL: that location names no file
                files[f"in/{new}"] = data
    argv = commands.more(MODEL)[argv_index]
    return Case("names", f"{target}:{hostile}@{base}", argv, files)


def combinations() -> list[tuple[str, str, str, int]]:
    n = len(commands.more(MODEL))
    return [(h, t, b, i) for h in HOSTILE for t in TARGETS for b in BASES for i in range(n)
            if t != "location" or b == "external"]


def cases(rng: random.Random) -> Iterator[Case]:
    return shuffled(rng, combinations, make)
