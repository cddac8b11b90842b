"""What pack's rewrites share: the pass's options and what it made so far (``PackContext``),
``NoMatch``, and the small tests of a pattern and of what ``upgrade`` noted."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import onnx_ir as ir

from dqtool import graph
from dqtool.families.fused.surgery import FusedBuilder
from dqtool.families.fused.upgrade_notes import BITS_KEY, NAMES_KEY
from dqtool.spec import QuantSpec

if TYPE_CHECKING:
    from dqtool.storage import EarlyWriter

BITS = {"uint2": 2, "int2": 2, "uint4": 4, "int4": 4, "uint8": 8, "int8": 8}


class NoMatch(Exception):
    """Why a pattern is not one pack rewrites (empty: not a pattern pack knows)."""


@dataclass
class PackContext:
    """The options of a pack and what it made so far, which its rewrites read and add to."""

    fresh: Callable[[str], str]
    accuracy_level: int | None = None
    zero_points: str = "auto"
    fuse_bias: bool = False
    in_function: bool = False
    # id(DequantizeLinear) → the B, scales (, zero points) packed for its first MatMul,
    # which the others that share the weight take as they are
    made: dict[int, list[ir.Value]] = field(default_factory=dict)
    # (packed node, the names upgrade noted, the names of the constants made for it)
    named: list[tuple[ir.Node, dict, set[str]]] = field(default_factory=list)
    # the save's writer when it writes the data file while the pass packs (``pack -o``)
    early: EarlyWriter | None = None

    def note_names(self, node: ir.Node, dq: ir.Node, b: FusedBuilder,
                   mm: ir.Node | None = None) -> None:
        """Keep the names upgrade noted for ``node`` (packed from ``dq``), to restore."""
        # a MatMul of a weight shared with a node before holds its own node's notes
        noted_names = (noted(mm) if mm is not None else {}) or noted(dq)
        if noted_names:
            self.named.append((node, noted_names, set(b.created)))


def only_use(v: ir.Value) -> tuple[ir.Node, int] | None:
    """(node, input index) of ``v``'s one use; None for several, none, or a graph output."""
    uses = list(v.uses())
    if len(uses) != 1 or v.is_graph_output():
        return None
    return uses[0].node, uses[0].idx


def pow2_16(b: int) -> bool:
    """Whether ``b`` is a block size the fused ops take: a power of 2 ≥ 16."""
    return b >= 16 and (b & (b - 1)) == 0


def next_pow2_16(n: int) -> int:
    """The smallest power of 2 ≥ 16 and ≥ ``n``."""
    b = 16
    while b < n:
        b *= 2
    return b


def unsigned_codes(arr: np.ndarray, bits: int, signed: bool) -> np.ndarray:
    """uint8 codes of ``arr``, signed ones moved by 2^(bits-1) (``q - zp`` is unchanged)."""
    a = arr.astype(np.int16)
    return (a + (1 << (bits - 1)) if signed else a).astype(np.uint8)


def noted(dq: ir.Node) -> dict:
    """What upgrade noted of the original fused node on this DequantizeLinear."""
    text = dq.metadata_props.get(NAMES_KEY)
    try:
        notes = json.loads(text) if text else {}
    except ValueError:
        return {}
    return notes if isinstance(notes, dict) else {}


def narrower(dq: ir.Node, spec: QuantSpec, bits: int) -> int | None:
    """The width ``upgrade`` widened these 8-bit codes from (its note on the node),
    when every code and zero point still fits in it; else None (8 bits stay)."""
    hint = dq.metadata_props.get(BITS_KEY)
    if bits != 8 or spec.quant_type != "uint8" or hint not in ("2", "4"):
        return None
    narrow = int(hint)
    for i in (0, 2):
        v = graph.input_value(dq, i)
        if v is not None and int(graph.constant_array(v).max(initial=0)) >= 1 << narrow:
            return None
    return narrow
