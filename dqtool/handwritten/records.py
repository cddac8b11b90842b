"""What ``find`` reports of one hand-written dequantization: immutable data, with
``to_json()``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dqtool.spec import Dim, Granularity


@dataclass(frozen=True)
class Handwritten:
    """One hand-written dequantization (``Cast → [Sub] → Mul``, and its variants).

    ``nodes`` / ``ops`` are its operators from the codes to the product (node names; an
    unnamed node is ``<op>#<index in its graph>``); ``output`` the value a
    DequantizeLinear would produce in their place. ``codes_type`` is the DequantizeLinear
    codes type the values fit (``stored_type`` is the constant's, e.g. ``uint8`` packing two
    ``uint4``). ``rewritable``: the scale and zero point are constants (a run-time scale
    is listed, never rewritten). ``exact``: an ai.onnx DequantizeLinear computes the same
    bits on onnxruntime and on the reference evaluator, from ``min_opset`` on, as ``form``
    says; otherwise ``reasons`` say why not.
    """

    graph: str
    nodes: tuple[str, ...]
    ops: tuple[str, ...]
    output: str
    consumers: tuple[str, ...]  # the op types reading the output
    codes: str  # the stored constant's name
    stored_type: str
    codes_type: str
    unpacked: bool  # BitShift / BitwiseAnd unpack the stored codes
    float_type: str
    scale: str
    scale_type: str | None
    granularity: Granularity | None
    axis: int | None
    block_size: int | None
    shape: tuple[Dim, ...] | None
    scale_shape: tuple[Dim, ...] | None
    zero_point: str  # "none", "integer"
    zero_point_where: str | None  # "before-cast" (an integer Sub), "after-cast" (a float Sub)
    scale_constant: bool
    zero_point_constant: bool
    rewritable: bool
    exact: bool
    min_opset: int | None
    form: str | None
    reasons: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "graph": self.graph, "nodes": list(self.nodes), "ops": list(self.ops),
            "output": self.output, "consumers": list(self.consumers), "codes": self.codes,
            "stored_type": self.stored_type, "codes_type": self.codes_type,
            "unpacked": self.unpacked, "float_type": self.float_type, "scale": self.scale,
            "scale_type": self.scale_type, "granularity": self.granularity,
            "axis": self.axis, "block_size": self.block_size,
            "shape": None if self.shape is None else list(self.shape),
            "scale_shape": None if self.scale_shape is None else list(self.scale_shape),
            "zero_point": self.zero_point, "zero_point_where": self.zero_point_where,
            "scale_constant": self.scale_constant,
            "zero_point_constant": self.zero_point_constant, "rewritable": self.rewritable,
            "exact": self.exact, "min_opset": self.min_opset, "form": self.form,
            "reasons": list(self.reasons), "notes": list(self.notes),
        }
