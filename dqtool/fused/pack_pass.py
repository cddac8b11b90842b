"""``dqtool pack``: ai.onnx DequantizeLinear → MatMul / Gather back into onnxruntime's fused
MatMulNBits / GatherBlockQuantized, with bit-identical weights.

Cases rewritten (``FusedPackPass``):
- ``DequantizeLinear(x const (K, N), scale, zp)`` blocked along axis 0 (block a power of 2
  ≥ 16) or per-axis on axis 1 (or per-tensor), 2/4/8-bit, whose only use is MatMul's B
  → MatMulNBits; the ``Add`` of a constant ``(N,)`` bias that is the MatMul's only use
  becomes its bias input when ``upgrade`` made it from a MatMulNBits' bias (``BIAS_KEY``),
  or any such Add with ``fuse_bias``. Signed codes move to unsigned ones with the zero point
  (``q - zp`` is unchanged); a ragged last block is padded with code 0 and unused
  zero-point slots with ``2^(bits-1)``, as onnxruntime's quantizer writes them; zero
  points that are all ``2^(bits-1)`` are left out (``zero_points="auto"``), as that
  quantizer does for symmetric weights.
- the float-zero-point chain ``upgrade`` writes for HQQ weights (DequantizeLinear with a
  float32 scale → Reshape → Add(-(zp·s), from the stored zero points) → Reshape (→ Slice)
  (→ Cast) → MatMul)
  → MatMulNBits with float zero points (2 or 4 bits: onnxruntime refuses 8-bit codes with
  float zero points, so an 8-bit chain is left).
- ``DequantizeLinear(table const, blocked along one axis) → Gather`` on another axis
  → GatherBlockQuantized (int4/uint4 tables reused as stored; uint8 → bits 8; uint2 →
  uint8-packed bits 2).
Left alone, with the reason in the report: anything else (a computed weight, a
DequantizeLinear with several uses, blocks along N, scale type differing from A's, ...).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import onnx_ir as ir

from dqtool import codecs, graph
from dqtool.fused.pack_context import NoMatch, PackContext, only_use
from dqtool.fused.pack_float_zp import pack_float_zp_chain
from dqtool.fused.pack_gather import pack_gather
from dqtool.fused.pack_matmul import check_a, pack_matmul
from dqtool.fused.pack_names import restore_names
from dqtool.names import Names
from dqtool.spec import QuantSpec

if TYPE_CHECKING:
    from dqtool.storage import EarlyWriter


@dataclass
class Packed:
    """A DequantizeLinear pack rewrote, into which fused op and how."""

    node: str
    graph: str
    op: str  # the fused op written
    how: str


@dataclass
class Skipped:
    """A DequantizeLinear pack left, and why."""

    node: str
    graph: str
    why: str


@dataclass
class PackReport:
    """What a pack did: the nodes packed and those left (from ``pack``: model, files)."""

    packed: list[Packed] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    model: ir.Model | None = None
    written: list[str] = field(default_factory=list)


# With --per-axis, or below opset 21, upgrade lays a blocked weight out as per-axis rows,
# reshaped and transposed back: pack does not take that form.
_LAYOUT_HINT = {op: "; a weight laid out as per-axis rows (`--per-axis`, or below opset 21) "
                    "packs after `dqtool upgrade --opset 21` of the original, without "
                    "--per-axis" for op in ("Reshape", "Transpose")}


class FusedPackPass:
    """Rewrites the patterns in the module docstring; ``report`` lists what it did."""

    def __init__(self, accuracy_level: int | None = None, zero_points: str = "auto",
                 gather: bool = True, fuse_bias: bool = False,
                 early: EarlyWriter | None = None) -> None:
        """Take pack's options (``zero_points``: "auto" or "packed"); ``early``: the
        save's writer when it writes the data file while the pass packs."""
        self.early = early
        if zero_points not in ("auto", "packed"):
            raise ValueError(f"zero_points must be auto or packed, got {zero_points!r}")
        self.accuracy_level = accuracy_level
        self.zero_points = zero_points
        self.gather = gather
        self.fuse_bias = fuse_bias
        self.report = PackReport()

    def __call__(self, model: ir.Model) -> PackReport:
        """Pack every DequantizeLinear of ``model`` that fits a pattern, in place."""
        self.ctx = PackContext(Names(model), self.accuracy_level, self.zero_points,
                               self.fuse_bias, early=self.early)
        replaced: list[ir.Value] = []
        for site in list(graph.walk(model)):
            node = site.node
            if node.graph is None or node.op_type != "DequantizeLinear" or \
                    graph.domain_name(node.domain) != "ai.onnx":
                continue
            spec = codecs.read_node(node, site.opsets)
            weight = spec.constant and not spec.errors  # a weight left is said, with why
            for consumer, idx in self._consumers(node, site, weight, spec):
                self._pack_one(node, spec, site, consumer, idx, weight, replaced)
        _drop_unused(replaced)
        restore_names(model, self.ctx.named)
        if self.report.packed:
            model.opset_imports.setdefault("com.microsoft", 1)
            for fn in model.functions.values():
                if any(n.domain == "com.microsoft" for n in fn):
                    fn.opset_imports.setdefault("com.microsoft", 1)
        return self.report

    def _consumers(self, dq: ir.Node, site: graph.Site, weight: bool, spec: QuantSpec
                   ) -> list[tuple[ir.Node, int]]:
        """What pack rewrites of ``dq``: its one use, or several MatMuls that take it as B
        (a weight they share stays one: ``PackContext.made``); else nothing (said, for a weight)."""
        out = dq.outputs[0]
        use = only_use(out)
        if use is not None:
            return [use]
        uses = list(out.uses())
        if uses and not out.is_graph_output() and all(
                u.node.op_type == "MatMul" and u.idx == 1 for u in uses):
            # One packed weight for all of them or none (a part packed stored it twice),
            # and only within the DequantizeLinear's graph: the constants made for the
            # first are values of its scope (an If branch's MatMul read them from another).
            why = next((f"its MatMul '{u.node.name}' is in another graph" for u in uses
                        if u.node.graph is not dq.graph), None)
            if why is None and not spec.errors:
                for u in uses:
                    try:
                        check_a(graph.input_value(u.node, 0), spec, dq)
                    except NoMatch as e:
                        why = f"its MatMul '{u.node.name}' cannot take it: {e}"
                        break
            if why is None:
                return [(u.node, u.idx) for u in uses]
            if weight:
                self._skip(dq, site, f"{len(uses)} MatMuls share it and {why}: pack packs a "
                           "shared weight for all of them or none")
            return []
        if weight:
            self._skip(dq, site, f"its output has {len(uses)} uses (or is a graph output): "
                       "pack takes a weight feeding one Gather, or MatMuls only (as B)")
        return []

    def _pack_one(self, node: ir.Node, spec: QuantSpec, site: graph.Site, consumer: ir.Node,
                  idx: int, weight: bool, replaced: list[ir.Value]) -> None:
        """Rewrite ``node`` → ``consumer`` (input ``idx``), or say why not (a weight)."""
        try:
            self.ctx.in_function = site.function is not None
            if consumer.op_type == "MatMul" and idx == 1:
                how, old = pack_matmul(self.ctx, node, spec, consumer)
                op = "MatMulNBits"
            elif consumer.op_type == "Reshape" and idx == 0:
                how, old = pack_float_zp_chain(self.ctx, node, spec, consumer)
                op = "MatMulNBits"
            elif consumer.op_type == "Gather" and idx == 0 and self.gather:
                how, old = pack_gather(self.ctx, node, spec, consumer)
                op = "GatherBlockQuantized"
            else:
                raise NoMatch("--no-gather" if consumer.op_type == "Gather" and weight
                              else "")
        except NoMatch as e:
            if str(e):
                self._skip(node, site, str(e))
            elif weight:  # not a pattern pack knows: said, with what it feeds
                self._skip(node, site, f"it feeds {consumer.op_type} (input {idx}): "
                           "pack takes DequantizeLinear → MatMul (as its B), the float "
                           "zero-point chain upgrade writes, or → Gather (as its table)"
                           + _LAYOUT_HINT.get(consumer.op_type, ""))
            return
        replaced.extend(old)
        self.report.packed.append(Packed(node.name or "<unnamed>", site.graph, op, how))

    def _skip(self, node: ir.Node, site: graph.Site, why: str) -> None:
        """Report ``node`` left as it is, and why."""
        self.report.skipped.append(Skipped(node.name or "<unnamed>", site.graph, why))


def _drop_unused(values: list[ir.Value]) -> None:
    """Drop the constants of ``values`` that nothing uses any more."""
    seen: set[int] = set()
    for v in values:
        if id(v) in seen or v.uses() or v.is_graph_output() or v.is_graph_input():
            continue
        seen.add(id(v))
        if v.is_initializer() and v.graph is not None:
            v.graph.initializers.pop(v.name, None)
            continue
        producer = v.producer()
        if producer is not None and producer.op_type == "Constant" and \
                producer.graph is not None:
            producer.graph.remove(producer, safe=True)
