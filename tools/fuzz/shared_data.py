"""Family "shared": a save next to models that read data files named like the output's.

The hostile campaign of 2026-11 lost other models' weights to a save: ``out/other.onnx``
read ``out/x.onnx.0123abcd.data`` (a name dqtool gives an output's data), or the old
``out/x.onnx`` and ``out/other.onnx`` shared ``out/x-shared.data`` or ``out/x.onnx.data``,
and ``fold ... -o out/x.onnx`` removed or replaced it. The judge's "other-model-broken"
check (``observe.broken_reads``) says whether every model but the output still reads the
bytes it read before.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import onnx

from tools.fuzz.case import Case, shuffled
from tools.fuzz.hostile_data import BASE

REPO = Path(__file__).resolve().parents[2]
DATA = (BASE.parent / "model.onnx.data").read_bytes()
INLINE = REPO / "models" / "ort_qdq_per_channel.onnx"
OUT = "out/x.onnx"

# kind -> {model path: the data file (relative to the model) all its external tensors read}
LAYOUTS: dict[str, dict[str, str]] = {
    "fresh-name": {"out/other.onnx": "x.onnx.0123abcd.data"},
    "fresh-name-beside-x": {OUT: "x.onnx.data", "out/other.onnx": "x.onnx.0123abcd.data"},
    "fresh-shard-name": {OUT: "x.onnx.data",
                         "out/other.onnx": "x.onnx.0123abcd-00002-of-00002.data"},
    "shard-name": {"out/other.onnx": "x-00001-of-00002.onnx.data"},
    "shared-plain": {OUT: "x-shared.data", "out/other.onnx": "x-shared.data"},
    "shared-named": {OUT: "x.onnx.data", "out/other.onnx": "x.onnx.data"},
    "other-reads-x-data": {"out/other.onnx": "x.onnx.data"},
    "above": {OUT: "x.onnx.data", "top.onnx": "out/x.onnx.data"},
    "above-only": {"top.onnx": "out/x.onnx.data"},
    "beside-input": {"in/other.onnx": "model.onnx.data"},
}
VERBS = [
    ["fold", "{IN}", "-o", OUT],
    ["fold", "{IN}", "--external-data", "-o", OUT],
    ["fold", "{IN}", "--external-data", "--shard-size", "1KB", "-o", OUT],
    ["upgrade", "{IN}", "--opset", "21", "-o", OUT],
    ["upgrade", "{IN}", "--opset", "21", "--external-data", "-o", OUT],
    ["downgrade", "{IN}", "--opset", "13", "-o", OUT],
    ["pack", "{IN}", "-o", OUT],
    ["fold", OUT, "--in-place"],
    ["upgrade", OUT, "--opset", "21", "--external-data", "--in-place"],
]


def reader(location: str) -> bytes:
    """The external-data model with every external tensor reading ``location``."""
    proto = onnx.load_model(str(BASE), load_external_data=False)
    for t in proto.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = location
    return proto.SerializeToString()


def sandbox(kind: str, external: bool, in_place: bool = False) -> dict[str, bytes]:
    """The input (external or inline) and the layout's models and data files; an
    in-place run works on out/x.onnx, so it is made if the layout has none."""
    files = {"in/model.onnx": BASE.read_bytes(), "in/model.onnx.data": DATA} if external \
        else {"in/model.onnx": INLINE.read_bytes()}
    layout = dict(LAYOUTS[kind])
    if in_place:
        layout.setdefault(OUT, "x.onnx.data")
    for model, location in layout.items():
        files[model] = reader(location)
        files[str(Path(model).parent / location)] = DATA
    return files


def make(kind: str, verb: int, external: bool) -> Case:
    argv = [a.replace("{IN}", "in/model.onnx") for a in VERBS[verb]]
    return Case("shared", f"{kind}:{'external' if external else 'inline'}", argv,
                sandbox(kind, external, "--in-place" in argv))


def kinds() -> list[str]:
    return list(LAYOUTS)


def cases(rng: random.Random) -> Iterator[Case]:
    return shuffled(rng, lambda: [(k, v, e) for k in kinds() for v in range(len(VERBS))
                                  for e in (False, True)], make)
