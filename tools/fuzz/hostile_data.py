"""Family (c): hostile external data — where it points, and what its metadata says."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path

import onnx

from tools.fuzz import commands
from tools.fuzz.case import SENTINEL, Case, on_every_command

REPO = Path(__file__).resolve().parents[2]
BASE = REPO / "models" / "external_data" / "model.onnx"
MODEL = "in/model.onnx"
DATA = "in/model.onnx.data"

# kind -> (external_data entries for the first external tensor (None = keep), extra files,
#          special entries)
_OUT = "../outside/sentinel.txt"


def _variants() -> dict[str, tuple[dict[str, str] | None, dict[str, bytes], list]]:
    data = (BASE.parent / "model.onnx.data").read_bytes()
    v: dict[str, tuple[dict[str, str] | None, dict[str, bytes], list]] = {
        "dotdot": ({"location": _OUT}, {}, []),
        "sub-dotdot": ({"location": "sub/../../outside/sentinel.txt"}, {}, []),
        "absolute": ({"location": "/etc/passwd"}, {}, []),
        "dev-zero": ({"location": "/dev/zero"}, {}, []),
        "proc-environ": ({"location": "/proc/self/environ"}, {}, []),
        "symlink-etc": ({"location": "etc"}, {}, [("symlink", "in/etc", "/etc/passwd")]),
        "symlink-dev-zero": ({"location": "z"}, {}, [("symlink", "in/z", "/dev/zero")]),
        "symlink-outside": ({"location": "s"}, {}, [("symlink", "in/s", "../" + SENTINEL)]),
        "symlink-inside": ({"location": "alias.data"}, {},
                           [("symlink", "in/alias.data", "model.onnx.data")]),
        "hardlink": ({"location": "hl.data"}, {}, [("hardlink", "in/hl.data", DATA)]),
        "fifo": ({"location": "pipe"}, {}, [("fifo", "in/pipe", "")]),
        "directory": ({"location": "folder"}, {}, [("dir", "in/folder", "")]),
        "missing": ({"location": "nothing.data"}, {}, []),
        "empty-location": ({"location": ""}, {}, []),
        "no-location": ({"offset": "0", "length": "2048"}, {}, []),
        "location-nul": ({"location": "model.onnx.data\x00x", "offset": "0",
                          "length": "2048"}, {}, []),
        "location-slash": ({"location": "model.onnx.data/", "offset": "0", "length": "2048"},
                           {}, []),
        "location-dir-slash": ({"location": "folder/"}, {}, [("dir", "in/folder", "")]),
        "location-dot": ({"location": "."}, {}, []),
        "offset-past-end": ({"location": "model.onnx.data", "offset": str(len(data) + 64),
                             "length": "2048"}, {}, []),
        "offset-negative": ({"location": "model.onnx.data", "offset": "-64",
                             "length": "2048"}, {}, []),
        "offset-text": ({"location": "model.onnx.data", "offset": "abc", "length": "2048"},
                        {}, []),
        "offset-float": ({"location": "model.onnx.data", "offset": "1.5", "length": "2048"},
                         {}, []),
        "offset-huge": ({"location": "model.onnx.data", "offset": str(2**70),
                         "length": "2048"}, {}, []),
        "length-text": ({"location": "model.onnx.data", "offset": "0", "length": "x"}, {}, []),
        "length-negative": ({"location": "model.onnx.data", "offset": "0", "length": "-5"},
                            {}, []),
        "length-terabyte": ({"location": "model.onnx.data", "offset": "0",
                             "length": str(2**40)}, {}, []),
        "length-short": ({"location": "model.onnx.data", "offset": "0", "length": "16"},
                         {}, []),
        "length-long": ({"location": "model.onnx.data", "offset": "0", "length": "2304"},
                        {}, []),
        "length-zero": ({"location": "model.onnx.data", "offset": "0", "length": "0"}, {}, []),
        "offset-misaligned": ({"location": "model.onnx.data", "offset": "1",
                               "length": "2048"}, {}, []),
        "unknown-key": ({"location": "model.onnx.data", "offset": "0", "length": "2048",
                         "colour": "blue"}, {}, []),
        "checksum": ({"location": "model.onnx.data", "offset": "0", "length": "2048",
                      "checksum": "0" * 40}, {}, []),
        "data-truncated": (None, {DATA: data[:1000]}, []),
        "data-empty": (None, {DATA: b""}, []),
    }
    return v


def build(kind: str, on_constant: bool = False) -> dict[str, bytes]:
    """The model with the first external tensor's metadata replaced as ``kind`` says;
    ``on_constant``: the tensor is first moved into a Constant node (read differently)."""
    entries, extra, _ = _variants()[kind]
    files = with_entries(entries, on_constant)
    files.update(extra)
    return files


def with_entries(entries: dict[str, str] | None, on_constant: bool = False,
                 model: str = MODEL) -> dict[str, bytes]:
    """The model (at ``model``) and its data, the first external tensor's metadata
    replaced by ``entries`` (None: kept), that tensor moved into a Constant node if
    ``on_constant``."""
    proto = onnx.load_model(str(BASE), load_external_data=False)
    tensor = proto.graph.initializer[0]
    if entries is not None:
        del tensor.external_data[:]
        for k, val in entries.items():
            tensor.external_data.add(key=k, value=val)
    if on_constant:
        t = onnx.TensorProto()
        t.CopyFrom(tensor)
        del proto.graph.initializer[0]
        node = onnx.helper.make_node("Constant", [], [t.name], value=t)
        proto.graph.node.insert(0, node)
    return {model: proto.SerializeToString(),
            os.path.join(os.path.dirname(model), "model.onnx.data"):
                (BASE.parent / "model.onnx.data").read_bytes()}


def make(kind: str, argv_index: int, on_constant: bool = False) -> Case:
    _, _, special = _variants()[kind]
    argv = commands.for_model(MODEL)[argv_index]
    return Case("external", kind + (":constant" if on_constant else ""), argv,
                build(kind, on_constant), list(special))


def kinds() -> list[str]:
    return list(_variants())


def cases(rng: random.Random) -> Iterator[Case]:
    return on_every_command(rng, len(commands.for_model(MODEL)), kinds, make)
