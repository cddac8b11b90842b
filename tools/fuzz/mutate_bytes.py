"""Family (a): byte mutations and truncations of every model in ``models/``."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

from tools.fuzz import commands
from tools.fuzz.case import Case

REPO = Path(__file__).resolve().parents[2]


def sources() -> list[dict[str, bytes]]:
    """Each model of models/ as sandbox files (with its data file, if any)."""
    found = []
    for p in sorted((REPO / "models").rglob("*.onnx")):
        files = {f"in/{p.name}": p.read_bytes()}
        for data in p.parent.glob(p.name + ".data"):
            files[f"in/{data.name}"] = data.read_bytes()
        found.append(files)
    return found


def mutate(files: dict[str, bytes], target: str, edit: tuple) -> dict[str, bytes]:
    """``edit`` is ("truncate", n) or ("flip", ((offset, byte), ...))."""
    out = dict(files)
    data = bytearray(files[target])
    if edit[0] == "truncate":
        out[target] = bytes(data[: edit[1]])
    else:
        for offset, value in edit[1]:
            if offset < len(data):
                data[offset] = value
        out[target] = bytes(data)
    return out


def make(files: dict[str, bytes], target: str, edit: tuple, argv_index: int) -> Case:
    model = next(k for k in files if k.endswith(".onnx"))
    argv = commands.for_model(model)[argv_index]
    kind = f"{edit[0]}:{Path(target).name}"
    case = Case("bytes", kind, argv, mutate(files, target, edit))
    case.edit = (target, edit)  # type: ignore[attr-defined]  # for shrinking
    return case


def cases(rng: random.Random) -> Iterator[Case]:
    models = sources()
    n = 0
    while True:
        files = rng.choice(models)
        target = rng.choice(sorted(files))
        size = len(files[target])
        if rng.random() < 0.3:
            edit: tuple = ("truncate", rng.randrange(size))
        else:
            flips = tuple((rng.randrange(size), rng.randrange(256))
                          for _ in range(rng.choice((1, 1, 2, 3, 8, 32))))
            edit = ("flip", flips)
        yield make(files, target, edit, n % len(commands.for_model("m")))
        n += 1


def shrink(case: Case, still_fails) -> Case:
    """Drop flips one at a time while the case still fails the same way."""
    target, edit = getattr(case, "edit", (None, None))
    if edit is None or edit[0] != "flip":
        return case
    flips = list(edit[1])
    model = next(k for k in case.files if k.endswith(".onnx"))
    index = next(i for i, a in enumerate(commands.for_model(model)) if a == case.argv)
    original = {k: v for k, v in sources_by_name()[Path(target).name].items()}
    i = 0
    while i < len(flips) and len(flips) > 1:
        trial = flips[:i] + flips[i + 1:]
        candidate = make(original, target, ("flip", tuple(trial)), index)
        if still_fails(candidate):
            flips, case = trial, candidate
        else:
            i += 1
    return case


def sources_by_name() -> dict[str, dict[str, bytes]]:
    table = {}
    for files in sources():
        for name in files:
            table[Path(name).name] = files
    return table
