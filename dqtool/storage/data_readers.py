"""Which data files a save may remove: the rule that no other model loses its data.

A save that replaces ``X`` would leave the old model's data files behind, unread. It
removes one only on evidence that nothing else reads it (docs/saving.md, "What a save
removes"):

* its name is one dqtool gives the data of ``X`` (``X.data``, ``X.<8 hex>.data``, or a
  shard of either, ``onnx_ir``'s ``-NNNNN-of-NNNNN`` marker before the extensions), and it
  is a plain name in the output's folder;
* the model being replaced names it;
* no other model file (``*.onnx``) in the output's folder, nor in the folder above it,
  names it; and every one of those models could be read (one that cannot be might name
  it: then nothing is removed);
* it is a regular file, not a link, and not a file of the model being saved from.

Evidence dqtool cannot have (a model elsewhere reaching in, a program holding the name)
is out of reach; such a file is safe under a name that is not ``X``'s.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable
from pathlib import Path

DATA_SUFFIX = ".data"
MODEL_SUFFIX = ".onnx"
# onnx_ir's shard marker (``onnx_ir._shard_filename``): ``name-00001-of-00003.ext``.
_SHARD = re.compile(r"-\d{5,}-of-\d{5,}")


class Unreadable(Exception):
    """A model file whose external-data locations cannot be read."""


def locations(model_file: Path) -> set[str]:
    """The external-data locations a model file names (its payloads are not read);
    ``Unreadable`` if it does not parse."""
    # Imported here: the early copy (``early_copy``, through ``commit``) starts before a
    # command imports onnx_ir, NumPy and onnx (~0.3 s), which this module must not pull in.
    import onnx
    from onnx import external_data_helper

    from dqtool.storage import inline_read

    try:
        lean = inline_read.read(model_file)
        proto = lean[0] if lean is not None else onnx.load_model(
            str(model_file), load_external_data=False)
        tensors = list(external_data_helper._get_all_tensors(proto))
    except Exception as e:
        raise Unreadable(str(model_file)) from e
    found = set()
    for t in tensors:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            for e in t.external_data:
                if e.key == "location":
                    found.add(e.value)
    return found


def named_for(name: str, out_name: str) -> bool:
    """Whether dqtool gives a data file this name for the output ``out_name``."""
    if "/" in name or os.sep in name:
        return False
    plain = _SHARD.sub("", name, count=1)
    if plain == f"{out_name}{DATA_SUFFIX}":
        return True
    token = plain.removeprefix(f"{out_name}.").removesuffix(DATA_SUFFIX)
    return (plain.startswith(f"{out_name}.") and plain.endswith(DATA_SUFFIX)
            and re.fullmatch(r"[0-9a-f]{8}", token) is not None)


def read_by_others(parent: Path, skip: str | None) -> set[str] | None:
    """The names in ``parent`` that a model file there (but ``skip``), or in the folder
    above, names as external data; None if one of those models cannot be read."""
    found: set[str] = set()
    folders = [(parent, "")]
    if parent.resolve().parent != parent.resolve():
        folders.append((parent / "..", parent.resolve().name + "/"))
    for folder, prefix in folders:
        try:
            entries = list(os.scandir(folder))
        except OSError:
            if prefix:  # the folder above may be closed to us: this one is not
                continue
            return None
        for entry in entries:
            if not entry.name.lower().endswith(MODEL_SUFFIX) or (
                    not prefix and entry.name == skip):
                continue
            try:
                if not entry.is_file():
                    continue
                names = locations(Path(entry.path))
            except (OSError, Unreadable):
                return None
            for loc in names:
                loc = os.path.normpath(loc.replace("\\", "/"))
                if loc.startswith(prefix):
                    found.add(loc[len(prefix):])
    return found


def removable(parent: Path, out_name: str, old: Iterable[str], keep: set[Path],
              new: set[str]) -> list[str]:
    """Of the data files ``old`` the replaced model names, those the rule lets a save of
    ``out_name`` remove (see the module's docstring). ``keep``: resolved paths never
    removed; ``new``: the names this save places."""
    candidates = []
    for name in old:
        path = parent / name
        if name in new or not named_for(name, out_name):
            continue
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and path.resolve() not in keep:
            candidates.append(name)
    if not candidates:
        return []
    others = read_by_others(parent, skip=out_name)
    if others is None:
        return []
    return sorted(set(candidates) - others)
