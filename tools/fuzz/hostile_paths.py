"""Family "paths": external-data locations resolved as the operating system opens them.

The hostile campaign of 2026-11 reached outside the model's folder through a location whose
lexical form stays inside (``sub/../w.bin`` with ``sub`` a link out: onnx's CVE-2024-27318
class), and hung or crashed on link loops, overlong names and ``..`` after a missing
folder. docs/safety.md promises each is one line, exit 2, so these cases expect a refusal
(a read of the outside file leaves no trace the snapshots would show); a model reached
through a symlinked folder reads its own data and must work.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field

from tools.fuzz import commands
from tools.fuzz.case import Case, on_every_command
from tools.fuzz.hostile_data import BASE, MODEL, with_entries

DATA = (BASE.parent / "model.onnx.data").read_bytes()
# The outside file holds valid data of the right size (reversed, so its values differ):
# a reader that follows the link succeeds, and only the expected refusal tells.
OUTSIDE_DATA = DATA[::-1]


@dataclass(frozen=True)
class Variant:
    location: str | None  # the first external tensor's new location (None: kept)
    files: dict[str, bytes] = field(default_factory=dict)
    special: tuple = ()
    expect: str = "refused"
    model: str = MODEL  # the model's path in argv (through a link, for "parent-link")


def _variants() -> dict[str, Variant]:
    loc = "model.onnx.data"
    return {
        # in/sub -> ../outside/deep: sub/../w.bin is in/w.bin lexically (a decoy with
        # valid bytes), outside/w.bin to the operating system.
        "link-dotdot-escape": Variant(
            "sub/../w.bin", {"in/w.bin": DATA, "outside/w.bin": OUTSIDE_DATA},
            (("dir", "outside/deep", ""), ("symlink", "in/sub", "../outside/deep"))),
        # The same through two links, the second inside the folder.
        "link-chain-escape": Variant(
            "hop/../w.bin", {"in/w.bin": DATA, "outside/w.bin": OUTSIDE_DATA},
            (("dir", "outside/deep", ""), ("symlink", "in/sub", "../outside/deep"),
             ("symlink", "in/hop", "sub"))),
        # A link that stays inside: in/link -> a/b, link/../w2.bin is in/a/w2.bin.
        "link-dotdot-inside": Variant(
            "link/../w2.bin", {"in/a/w2.bin": DATA, "in/w2.bin": OUTSIDE_DATA},
            (("dir", "in/a/b", ""), ("symlink", "in/link", "a/b")), expect="works"),
        "loop-pair": Variant("a", {}, (("symlink", "in/a", "b"), ("symlink", "in/b", "a"))),
        "loop-self": Variant("self", {}, (("symlink", "in/self", "self"),)),
        "loop-component": Variant(f"loop/{loc}", {}, (("symlink", "in/loop", "loop"),)),
        "loop-pair-component": Variant(f"a/{loc}", {}, (("symlink", "in/a", "b"),
                                                        ("symlink", "in/b", "a"))),
        "long-component": Variant("x" * 5000),  # past NAME_MAX (255)
        "long-path": Variant("d/" * 2499 + "w"),  # 4,999 characters: past PATH_MAX (4,096)
        "long-dotdot": Variant("d/../" * 999 + loc),  # 5,010, and every "d" is missing
        "missing-dotdot": Variant(f"nosuch/../{loc}"),
        "missing-dotdot-existing-file": Variant(f"{loc}/../{loc}"),  # a file as a folder
        # The argv path goes through a link to the model's folder (via -> in): a model
        # there reads its own data like any other.
        "parent-link": Variant(None, {}, (("symlink", "via", "in"),), "works",
                               "via/model.onnx"),
        "parent-link-deep": Variant(None, {}, (("dir", "up", ""),
                                               ("symlink", "up/there", "../in")), "works",
                                    "up/there/model.onnx"),
    }


def make(kind: str, argv_index: int, on_constant: bool = False) -> Case:
    v = _variants()[kind]
    # The first tensor's own offset and length (0, 2048): only the location changes.
    entries = None if v.location is None else {"location": v.location, "offset": "0",
                                               "length": "2048"}
    files = with_entries(entries, on_constant)
    files.update(v.files)
    argv = commands.for_model(v.model)[argv_index]
    return Case("paths", kind + (":constant" if on_constant else ""), argv, files,
                list(v.special), v.expect)


def kinds() -> list[str]:
    return list(_variants())


def cases(rng: random.Random) -> Iterator[Case]:
    return on_every_command(rng, len(commands.for_model(MODEL)), kinds, make)
