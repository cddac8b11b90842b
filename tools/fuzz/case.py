"""A fuzz case: the files of a sandbox folder and the command run in it.

The sandbox has three folders: ``in/`` (the model and its data), ``out/`` (where outputs
go) and ``outside/`` (files no command may touch: targets of symlinks, sentinels). Every
path in ``argv`` is relative to the sandbox, so a case replays anywhere.
"""

from __future__ import annotations

import json
import os
import socket
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

# Special entries a case may need besides regular files: (kind, relative path, argument).
#   symlink: argument is the link's target (as written into the link)
#   hardlink: argument is the existing file (relative to the sandbox) to link
#   fifo, socket, dir, chardev (a null device when run as root, else skipped)
#   mode: argument is an octal permission string applied after everything is made
Special = tuple[str, str, str]

SENTINEL = "outside/sentinel.txt"


@dataclass
class Case:
    family: str  # one of campaign.FAMILIES
    kind: str  # what was done, e.g. "truncate", "cycle", "location-nul", "output-fifo"
    argv: list[str]
    files: dict[str, bytes] = field(default_factory=dict)
    special: list[Special] = field(default_factory=list)
    # What the run must do besides being clean: "refused" (exit 2: the docs promise a
    # refusal, e.g. a location escaping through a link, which may read without a trace),
    # "works" (not exit 2: e.g. a model reached through a symlinked folder), "" (either).
    expect: str = ""

    @property
    def label(self) -> str:
        return f"{self.family}:{self.kind}:{' '.join(self.argv[:1])}"

    def materialize(self, root: Path) -> None:
        for d in ("in", "out", "outside"):
            (root / d).mkdir(parents=True, exist_ok=True)
        (root / SENTINEL).write_text("must never change\n")
        for rel, data in self.files.items():
            p = root / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
        modes = []
        for kind, rel, arg in self.special:
            p = root / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            if kind == "symlink":
                os.symlink(arg, p)
            elif kind == "hardlink":
                os.link(root / arg, p)
            elif kind == "fifo":
                os.mkfifo(p)
            elif kind == "dir":
                p.mkdir(exist_ok=True)
            elif kind == "socket":
                s = socket.socket(socket.AF_UNIX)
                try:
                    s.bind(str(p))
                except OSError:  # a path too long for a socket: a FIFO is as hostile
                    os.mkfifo(p)
                finally:
                    s.close()
            elif kind == "chardev":
                if os.geteuid() == 0:  # /dev/null's numbers, inside the sandbox
                    os.mknod(p, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
                else:
                    os.mkfifo(p)
            elif kind == "mode":
                modes.append((p, int(arg, 8)))
            else:
                raise ValueError(f"unknown special entry {kind}")
        for p, mode in modes:
            os.chmod(p, mode)

    # -- reproducers ------------------------------------------------------------------
    def save(self, folder: Path, failure: str) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        doc = {"family": self.family, "kind": self.kind, "argv": self.argv,
               "special": [list(s) for s in self.special], "failure": failure,
               "files": sorted(self.files)}
        if self.expect:
            doc["expect"] = self.expect
        for rel, data in self.files.items():
            p = folder / "files" / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
        (folder / "case.json").write_text(json.dumps(doc, indent=1, ensure_ascii=True) + "\n")

    @classmethod
    def load(cls, folder: Path) -> Case:
        doc = json.loads((folder / "case.json").read_text())
        files = {rel: (folder / "files" / rel).read_bytes() for rel in doc["files"]}
        return cls(doc["family"], doc["kind"], list(doc["argv"]), files,
                   [tuple(s) for s in doc["special"]], doc.get("expect", ""))


def restore_permissions(root: Path) -> None:
    """Make a sandbox removable again after a case made parts of it read-only."""
    for dirpath, dirnames, _ in os.walk(root):
        for d in dirnames:
            p = Path(dirpath) / d
            if not p.is_symlink():
                os.chmod(p, 0o755)


def shuffled(rng: object, combinations: Callable[[], list[tuple]],
             make: Callable[..., Case]) -> Iterator[Case]:
    """Every combination, in an order ``rng`` shuffles anew at each pass, for ever."""
    while True:
        order = combinations()
        rng.shuffle(order)  # type: ignore[attr-defined]
        for combo in order:
            yield make(*combo)


def on_every_command(rng: object, commands_of_model: int, kinds: Callable[[], list[str]],
                     make: Callable[..., Case]) -> Iterator[Case]:
    """Every kind on each of a model's commands (``commands_of_model`` of them), the
    tensor an initializer and a Constant, shuffled anew at each pass (``shuffled``)."""
    return shuffled(rng, lambda: [(k, i, c) for k in kinds() for i in range(commands_of_model)
                                  for c in (False, True)], make)
