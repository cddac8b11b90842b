"""``inspect --report``: how each weight is quantized. For every DequantizeLinear of a
constant integer weight: the codes it uses out of its type's range, the share at the
type's two extremes (saturation), the spread of its scales across channels or blocks, and
its bytes stored against its bytes dequantized; for every other weight (a fused
operator's), its bytes, from ``inspect``'s own report."""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from dqtool import codecs, graph, storage, types
from dqtool.report import html, svg
from dqtool.storage import tensor_array

BINS = 16  # code histogram buckets over a type's range


@dataclass(frozen=True)
class WeightStats:
    name: str
    quant_type: str
    granularity: str
    used: int  # distinct codes
    possible: int  # codes the type has
    low: int  # smallest code used
    high: int
    at_extremes: float  # share of codes at the type's minimum or maximum
    scale_spread: float | None  # largest / smallest nonzero |scale|
    scales: int
    stored: int | None
    dequantized: int | None
    histogram: tuple[int, ...]


def _stats(site: graph.Site, spec: Any) -> WeightStats | None:
    node = site.node
    et = types.TYPES.get(spec.quant_type or "")
    x = graph.constant_tensor(node.inputs[0]) if node.inputs else None
    if et is None or not et.is_integer or x is None or et.bits > 16:
        return None
    codes = tensor_array(x).astype(np.int32).reshape(-1)
    lo, hi = int(et.min), int(et.max)
    counts = np.bincount(codes - lo, minlength=hi - lo + 1)
    edges = np.linspace(0, hi - lo + 1, BINS + 1).astype(int)
    hist = tuple(int(counts[a:b].sum()) for a, b in itertools.pairwise(edges))
    scale_v = graph.constant_array(node.inputs[1]) if len(node.inputs) > 1 else None
    spread, n_scales = None, 0
    if scale_v is not None:
        s = np.abs(np.asarray(scale_v, np.float64)).reshape(-1)
        n_scales = int(s.size)
        nz = s[(s > 0) & np.isfinite(s)]
        spread = float(nz.max() / nz.min()) if nz.size else None
    out_et = types.TYPES.get(spec.float_type or "")
    n = int(codes.size)
    return WeightStats(
        name=node.name or node.outputs[0].name, quant_type=spec.quant_type,
        granularity=spec.granularity or "?", used=int((counts > 0).sum()),
        possible=hi - lo + 1, low=int(codes.min()) if n else 0,
        high=int(codes.max()) if n else 0,
        at_extremes=float((counts[0] + counts[-1]) / n) if n else 0.0,
        scale_spread=spread, scales=n_scales, stored=int(x.nbytes),
        dequantized=n * (out_et.bits // 8 if out_et else 4), histogram=hist)


def weights(model_path: str | os.PathLike) -> list[WeightStats]:
    model = storage.load(model_path)
    out = []
    for site in graph.walk(model):
        if not codecs.is_quant_node(site.node):
            continue
        spec = codecs.read_node(site.node, site.opsets)
        if spec.is_dequantize and spec.x_constant:
            got = _stats(site, spec)
            if got is not None:
                out.append(got)
    return out


def render(model_path: str | os.PathLike, inspected: dict[str, Any] | None = None) -> str:
    stats = weights(model_path)
    sections = [f'<p class="note">{len(stats)} DequantizeLinear weight(s) of integer codes '
                "read; bytes of every node from dqtool inspect</p>"]
    if stats:
        xs = list(range(len(stats)))
        sections.append("<h2>Saturation</h2>" + svg.points(
            "share of codes at the type's minimum or maximum, per weight", xs,
            [w.at_extremes for w in stats], "weight (model order)", "share at extremes",
            max(1, len(stats) - 1)))
        spread = [w.scale_spread if w.scale_spread is not None else 0.0 for w in stats]
        sections.append("<h2>Spread of scales</h2>" + svg.points(
            "largest / smallest scale across channels or blocks, per weight", xs, spread,
            "weight (model order)", "max / min scale", max(1, len(stats) - 1)))
        by_type: dict[str, list[int]] = {}
        for w in stats:
            acc = by_type.setdefault(w.quant_type, [0] * len(w.histogram))
            by_type[w.quant_type] = [a + b for a, b in zip(acc, w.histogram, strict=True)]
        for name, hist in sorted(by_type.items()):
            et = types.TYPES[name]
            edges = np.linspace(int(et.min), int(et.max) + 1, BINS + 1).astype(int)
            labels = [str(a) if b - a <= 1 else f"{a}..{b - 1}"
                      for a, b in itertools.pairwise(edges)]
            sections.append(f"<h2>Codes used: {name}</h2>" + svg.bars(
                f"{name} codes over the type's range, every {name} weight", labels, hist,
                "code"))
        sections.append("<h2>Weights</h2>" + html.table(
            ("weight", "type", "granularity", "codes used / possible", "range used",
             "at extremes", "scales", "max/min scale", "bytes stored", "bytes dequantized"),
            [(w.name, w.quant_type, w.granularity, f"{w.used} / {w.possible}",
              f"[{w.low}, {w.high}]", f"{100 * w.at_extremes:.2f}%", w.scales,
              w.scale_spread, w.stored, w.dequantized) for w in stats], "weights"))
    sections.append(_bytes(inspected))
    return html.page(f"dqtool inspect {model_path}", sections)


def _bytes(inspected: dict[str, Any] | None) -> str:
    nodes = [n for n in (inspected or {}).get("nodes", [])
             if n.get("bytes_stored") is not None]
    if not nodes:
        return ""
    stored = sum(n["bytes_stored"] for n in nodes)
    folded = sum(n["bytes_folded"] or 0 for n in nodes)
    return ("<h2>Bytes stored against dequantized</h2>"
            + svg.bars("every weight: bytes stored, bytes once dequantized",
                       ["stored", "dequantized"], [stored, folded], "all weights")
            + html.table(("node", "kind", "x type", "output", "bytes stored",
                          "bytes dequantized"),
                         [(n["name"], n.get("kind", "qdq"), n["x_type"], n["output_type"],
                           n["bytes_stored"], n["bytes_folded"]) for n in nodes], "bytes"))


def write(path: str, model_path: str | os.PathLike,
          inspected: dict[str, Any] | None = None) -> None:
    """``inspect --report``: ``inspected`` is ``inspect``'s JSON document (every node's
    bytes)."""
    html.write(path, render(model_path, inspected))
