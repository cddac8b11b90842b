"""When each value of a main graph is read for the last time, and how the graph is cut into
consecutive pieces: what a streamed run (``stream_ref``, ``stream_ort``) needs to hold one
piece's values and free the rest.

A node reads its inputs and, through its subgraphs (If, Loop, Scan), every name those
read from the scopes around them: a value lives until the last node that reads it either
way. A graph output lives to the end.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import onnx


def outer_reads(node: onnx.NodeProto) -> set[str]:
    """Names the subgraphs of ``node`` read that none of them defines (their inputs,
    initializers and node outputs, nested scopes included): values of the scopes around."""
    out: set[str] = set()
    for attr in node.attribute:
        for g in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
            out |= _graph_outer_reads(g)
    return out


def _graph_outer_reads(g: onnx.GraphProto) -> set[str]:
    defined = {i.name for i in g.input} | {t.name for t in g.initializer} | \
        {t.values.name for t in g.sparse_initializer}
    wanted: set[str] = set()
    for n in g.node:
        wanted.update(i for i in n.input if i and i not in defined)
        wanted.update(r for r in outer_reads(n) if r not in defined)
        defined.update(o for o in n.output if o)
    wanted.update(o.name for o in g.output if o.name not in defined)
    return wanted


def reads(node: onnx.NodeProto) -> list[str]:
    """Every name ``node`` reads: its inputs, then its subgraphs' outer reads."""
    direct = [i for i in node.input if i]
    return direct + sorted(outer_reads(node) - set(direct))


@dataclass(frozen=True)
class Liveness:
    """For a main graph's nodes in order: which values die after each node."""

    dying: tuple[tuple[str, ...], ...]  # dying[i]: values read for the last time by node i
    last_use: dict[str, int]  # value -> index of the last node reading it

    @classmethod
    def of(cls, nodes: Sequence[onnx.NodeProto], keep: Iterable[str] = ()) -> Liveness:
        """``keep``: names that never die (the outputs asked for)."""
        last: dict[str, int] = {}
        for i, node in enumerate(nodes):
            for name in reads(node):
                last[name] = i
        kept = set(keep)
        dying: list[list[str]] = [[] for _ in nodes]
        for name, i in last.items():
            if name not in kept:
                dying[i].append(name)
        return cls(tuple(tuple(d) for d in dying), last)


def value_bytes(t: onnx.TensorProto) -> int:
    """What a constant may cost once computed from: its elements at 4 bytes each (a
    dequantized float32 weight; a float16 one is half), whatever it is stored as."""
    return 4 * int(np.prod(list(t.dims), dtype=np.int64)) if t.dims else 4


@dataclass(frozen=True)
class Piece:
    start: int  # first node index
    stop: int  # one past the last


def cut(nodes: Sequence[onnx.NodeProto], weights: dict[str, int], budget: int,
        clean: Sequence[bool] | None = None, allowed: Sequence[bool] | None = None
        ) -> list[Piece]:
    """Consecutive pieces of ``nodes``, each reading about ``budget`` bytes of constants
    (``weights``: initializer name → ``value_bytes``), one node at least. ``clean[i]``:
    whether cutting after node i changes nothing a whole run would compute (see
    ``stream_ort``); past the budget a piece ends at the first clean place within as much
    again, else where it stands. ``allowed[i]``: whether a piece may end after node i at
    all (the values crossing can be carried)."""
    pieces: list[Piece] = []
    start, held, seen = 0, 0, set()
    for i, node in enumerate(nodes):
        for name in reads(node):
            if name in weights and name not in seen:
                seen.add(name)
                held += weights[name]
        last = i == len(nodes) - 1
        over = held >= budget
        fits = clean is None or clean[i] or held >= 2 * budget
        if last or (over and fits and (allowed is None or allowed[i])):
            pieces.append(Piece(start, i + 1))
            start, held, seen = i + 1, 0, set()
    return pieces


@functools.lru_cache(maxsize=1)
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim  # glibc
    except (OSError, AttributeError):
        return None


def release_freed() -> None:
    """Hand the memory freed so far back to the system (glibc's ``malloc_trim``; nothing
    elsewhere). Why: onnxruntime's and NumPy's blocks below glibc's mmap threshold (which
    rises to 32 MiB after a large free) stay in the heap once freed, so a streamed run's
    resident size grew by every piece: 100 → 740 MB over onnxruntime's pieces of the
    4-layer bench model (2026-11-28, docs/benchmarks.md "Check at LLM size")."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
