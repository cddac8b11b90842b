"""Cache-sized chunks of a ``(P, D, Q)`` problem, run on a small thread pool.

NumPy releases the GIL inside ``np.take``, casts and ufuncs, so two threads working on
disjoint chunks of the same output scale on the machine's cores. Chunks are chosen so that
each one is a contiguous slab of x and of the output (which keeps every NumPy call on a
contiguous buffer) and small enough for its working set to stay in L2.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext

import numpy as np

# Elements per chunk: 128 Ki float32 outputs plus the codes and np.take's index buffer stay
# within a 2 MiB L2 (docs/decisions.md, "Sizes the code holds").
CHUNK = 1 << 17
# Below this many elements a thread hand-off costs more than it saves.
PARALLEL_MIN = 1 << 18

Chunk = tuple[int, int, int, int, int, int]  # p0, p1, d0, d1, q0, q1

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()
_local = threading.local()


def num_threads() -> int:
    env = os.environ.get("DQTOOL_THREADS")
    if env:
        return max(1, int(env))
    return max(1, min(2, os.cpu_count() or 1))


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(num_threads(), thread_name_prefix="dqtool-kernel")
        return _pool


def plan(
    p: int, d: int, q: int, align: int = 1, budget: int = CHUNK, factor: int = 1
) -> list[Chunk]:
    """Split ``(P, D, Q)`` into contiguous chunks of at most about ``factor * budget`` elements.

    Splits along D start on multiples of ``align`` when possible so that most chunks hold
    whole blocks (cheaper broadcasting of the scale). ``factor`` scales the budget rather
    than replacing it, so a caller (or a test) that shrinks ``budget`` still shrinks chunks.
    """
    if p * d * q == 0:
        return []
    budget *= factor
    row = d * q
    if row <= budget:
        step = max(1, budget // row)
        return [(a, min(a + step, p), 0, d, 0, q) for a in range(0, p, step)]
    if q <= budget:
        step = max(1, budget // q)
        if step >= align:
            step -= step % align
        return [(i, i + 1, a, min(a + step, d), 0, q) for i in range(p) for a in range(0, d, step)]
    return [
        (i, i + 1, j, j + 1, a, min(a + budget, q))
        for i in range(p)
        for j in range(d)
        for a in range(0, q, budget)
    ]


def run(
    work: Callable[[Chunk], None],
    chunks: Sequence[Chunk],
    total: int,
    bufsize: int | None = None,
) -> None:
    """Call ``work`` on every chunk, on the pool when the problem is big enough.

    ``bufsize``: NumPy's ufunc buffer size (elements, a multiple of 16) in every thread
    while it works (see ``ufunc_bufsize``); None keeps NumPy's default.

    The calling thread and ``num_threads() - 1`` pool threads each take the next chunk from
    a shared queue until it is empty: the split stays dynamic (a core busy with another
    process simply takes fewer chunks), but there is one task hand-off per thread, not one
    per chunk (executor.map over 128 chunks costs ~1.7 ms of hand-offs).
    """
    if total < PARALLEL_MIN or len(chunks) < 2 or num_threads() == 1:
        _drain(work, iter(chunks), None, bufsize)
        return
    todo, lock = iter(chunks), threading.Lock()
    helpers = [
        _executor().submit(_drain, work, todo, lock, bufsize)
        for _ in range(min(num_threads(), len(chunks)) - 1)
    ]
    try:
        _drain(work, todo, lock, bufsize)
    finally:
        for f in helpers:
            f.result()  # waits, and re-raises a helper's exception


def _drain(
    work: Callable[[Chunk], None],
    todo: Iterator[Chunk],
    lock: threading.Lock | None,
    bufsize: int | None,
) -> None:
    # np.errstate is per thread: overflow to inf and NaN are results here, not errors. It
    # also scopes np.setbufsize (NumPy >= 2): the caller's buffer size is restored on exit.
    with np.errstate(all="ignore"):
        if bufsize is not None:
            np.setbufsize(bufsize)
        while True:
            with lock or nullcontext():
                c = next(todo, None)
            if c is None:
                return
            work(c)


def ufunc_bufsize(run: int) -> int | None:
    """The ufunc buffer size for broadcasting an operand over rows of ``run`` elements.

    NumPy (2.x) iterates a broadcast ufunc call whose rows are shorter than its buffer
    (8192 elements) through the buffered path, ~2x slower than a contiguous call
    (measured: (32, 4096) float32 times a (4096,) row, 29 vs 15 us); a buffer of at most
    one row keeps one unbuffered inner loop per row. Short rows (< 1024) gain nothing and
    lose with tiny buffers, so they keep the default (None).
    """
    if 1024 <= run < 8192:
        return run - run % 16
    return None


# Where every scratch buffer starts: a page. NumPy's large arrays start 16 bytes into one,
# so a 64-byte store straddled two cache lines (docs/decisions.md, "Sizes the code holds").
SCRATCH_ALIGN = 4096


def scratch(n: int, dtype: np.dtype, slot: int = 0) -> np.ndarray:
    """A per-thread reusable buffer of ``n`` elements (no page faults per chunk), starting
    on a page (``SCRATCH_ALIGN``)."""
    key = f"buf{slot}"
    buf: np.ndarray | None = getattr(_local, key, None)
    nbytes = n * np.dtype(dtype).itemsize
    if buf is None or buf.nbytes < nbytes:
        size = max(nbytes, CHUNK * 4)
        raw = np.empty(size + SCRATCH_ALIGN, np.uint8)
        skip = -raw.ctypes.data % SCRATCH_ALIGN
        buf = raw[skip: skip + size]  # (a view: keeps ``raw`` alive)
        setattr(_local, key, buf)
    return buf[:nbytes].view(dtype)
