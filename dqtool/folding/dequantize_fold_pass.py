"""``DequantizeFoldPass``: constant DequantizeLinear nodes become constants."""

from __future__ import annotations

import onnx_ir as ir

from dqtool import cleanup, codecs, graph, registry, types
from dqtool.folding import commute
from dqtool.folding.compute import FoldedTensor, Folding
from dqtool.folding.plan import not_constant_reason, plan
from dqtool.folding.report import FoldedNode, LeftNode, rounding
from dqtool.folding.selection import Selection
from dqtool.names import Names

# Inputs onnxruntime prepacks when they are constant initializers: its GEMM then sums in
# another order, so a folded weight read directly gives outputs a few ulps off the
# original's (measured: MatMul with M=1 or K=300, Gemm with M=1). An Identity in between
# keeps the weight a run-time value, and the outputs bit-identical.
PREPACKED: dict[tuple[str, str], frozenset[int]] = {
    ("", "MatMul"): frozenset({1}), ("", "Gemm"): frozenset({1}),
    ("", "LSTM"): frozenset({1, 2}), ("", "GRU"): frozenset({1, 2}),
    ("", "RNN"): frozenset({1, 2}),
    ("com.microsoft", "FusedMatMul"): frozenset({1}),
    ("com.microsoft", "FusedGemm"): frozenset({1}),
}


class DequantizeFoldPass(ir.passes.InPlacePass):
    """Replace every selected DequantizeLinear whose inputs are all constant by a constant.

    Rewrites, for any dialect the codecs read (ai.onnx every version, com.microsoft,
    opmx/pmx):

    1. ``y = DQ(x, s, zp)`` with x, s, zp initializers (not graph inputs) or Constant
       nodes, in the main graph or a subgraph (inputs may live in an outer scope) → ``y``
       becomes an initializer of the DQ's own graph, computed lazily (``FoldedTensor``).
    2. The same inside a function (or a subgraph in one) → a ``Constant`` node there.
    3. ``y = DQ(QuantizeLinear(w, s1, zp1), s2, zp2)`` with w, s1, zp1 constant → the pair
       is folded (quantize, then dequantize, with the kernel).
    4. With ``dtype`` other than "keep" and different from y's type: the constant holds
       ``Cast(y, dtype)`` and a ``Cast`` back to y's type keeps the graph well typed.
    5. ``y = DQ(Gather(T, i), s, zp)`` with T, s, zp constant and a per-tensor scale (an
       embedding as onnxruntime's dynamic quantizer writes it) → ``Gather(DQ(T, s, zp), i)``
       (the same values), then T's dequantization is folded (``commute``).
    6. With ``prepack_guard`` (default), a folded value read as a weight that onnxruntime
       prepacks (MatMul/Gemm B, RNN weights) goes through an ``Identity``, so onnxruntime's
       outputs stay bit-identical to the original's (see ``PREPACKED``).

    The constant keeps ``y``'s name, so graph outputs and consumers read it unchanged.
    Which nodes are folded, and how, comes from the registered families
    (``dqtool.families``: ``FoldSupport``). Quantized constants (and QuantizeLinear nodes)
    nothing uses any more are removed; those still used elsewhere are kept. Opset imports
    of the families' prunable domains (com.microsoft, opmx, pmx) are dropped where no node
    uses them any more. Nodes not folded are listed in ``left``.
    """

    def __init__(self, selection: Selection | None = None, dtype: str = "keep",
                 prepack_guard: bool = True) -> None:
        super().__init__()
        self.prepack_guard = prepack_guard
        self.guarded = 0  # folded values given an Identity
        self._model: ir.Model | None = None
        self.selection = selection or Selection()
        self.dtype = dtype
        self.folded: list[FoldedNode] = []
        self.left: list[LeftNode] = []
        self.removed: list[str] = []
        self.kept: list[str] = []
        self.fed_op_types: set[str] = set()  # what DQs fed before folding (for --op-types)

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        self._model = model
        self._names = Names(model)
        self._shared: dict[tuple, ir.Value] = {}  # folded weights by what they fold
        self._tables: list[ir.Value] = []  # quantized tables of nodes moved before a Gather
        domains_before = cleanup.used_domains(model)
        # Collect first: folding edits the graphs being walked.
        sites = [s for s in graph.walk(model)
                 if registry.is_fold_root(s.node.domain, s.node.op_type)]
        self.fed_op_types = {use.node.op_type for s in sites for use in s.node.outputs[0].uses()}
        inputs: list[ir.Value] = []
        for site in sites:
            before = [v for v in site.node.inputs if v is not None]
            if self._try_fold(site):
                inputs.extend(before)
        inputs.extend(self._tables)  # read by nodes moved before their Gather
        self.removed, self.kept = cleanup.remove_unused(inputs)
        cleanup.prune_opsets(model, domains_before)
        return ir.passes.PassResult(model, modified=bool(self.folded))

    def _try_fold(self, site: graph.Site) -> bool:
        node = site.node
        spec = codecs.read_node(node, site.opsets)
        name = node.name or node.outputs[0].name
        if spec.since_version == 0:  # no version of the op at this opset: nothing was read
            reason = "; ".join(p.message for p in spec.errors)
            self.left.append(LeftNode(name, site.graph, reason, refused=True))
            return False
        moved = False
        if not spec.constant:
            gather = commute.gathered_table(node, spec)
            why = None if gather is None or spec.errors else self.selection.why_not(node, spec)
            if gather is None or spec.errors or why:
                reason = why or not_constant_reason(node, spec, site.function)
                self.left.append(LeftNode(name, site.graph, reason))
                return False
            # (selected as it was: it feeds the Gather now)
            commute.move_before(node, gather, spec,
                                self._names)
            spec, moved = codecs.read_node(node, site.opsets), True
            self._tables.append(graph.input_value(node, 0))
        why = None if moved else self.selection.why_not(node, spec)
        if why:
            self.left.append(LeftNode(name, site.graph, why))
            return False
        if spec.errors:
            reason = "; ".join(p.message for p in spec.errors)
            self.left.append(LeftNode(name, site.graph, reason, refused=True))
            return False
        folding = plan(node, spec, site.opsets,
                       "keep" if _offset_follows(node) else self.dtype)
        if isinstance(folding, str):
            self.left.append(LeftNode(name, site.graph, folding, refused=True))
            return False
        if site.function is not None or self.dtype != "keep":
            self._import_default_domain(site.function)
        support = registry.fold_support(node.domain, node.op_type)
        assert support is not None  # plan() found it
        self._replace(node, folding, support, in_function=site.function is not None)
        self.folded.append(self._record(name, site, spec, folding, before_gather=moved))
        return True

    def _replace(self, node: ir.Node, folding: Folding, support: registry.FoldSupport, *,
                 in_function: bool) -> None:
        y = node.outputs[0]
        owner = node.graph
        assert owner is not None
        y_name = y.name or f"{node.name}_folded"
        # The folded value keeps y's name; a fused op's folded weight gets its own (y stays
        # the result of the float op that replaces it).
        fused = support.replace is not None
        value_name = self._names(f"{node.name or y_name}_weight") if fused \
            else y_name
        # The same constants folded the same way in another graph (the branches of an If,
        # both reading a weight of the main graph): one folded weight, stored where both see
        # it, not one per branch.
        home = None if in_function or y.is_graph_output() else _inputs_home(node)
        if home is owner:  # in one graph each node keeps its own constant, as it always did
            home = None
        key = None if home is None else _fold_key(node, folding)
        shared = self._shared.get(key) if key is not None else None
        const_name = value_name
        if folding.store_dtype != folding.out_dtype:
            store = types.from_dtype(folding.store_dtype).name
            const_name = self._names(f"{value_name}_{store}")
        if shared is not None:
            const = shared
        elif in_function:
            # Functions have no initializers: the value lives in a Constant node.
            const_node = ir.node("Constant", [], attributes={
                "value": FoldedTensor(folding, name=value_name)},
                name=f"{node.name}_folded" if node.name else None)
            owner.insert_before(node, const_node)
            const = const_node.outputs[0]
        else:
            tensor = FoldedTensor(folding, name=value_name)
            const = ir.Value(name=f"{const_name}__folding", const_value=tensor,
                             shape=ir.Shape(folding.shape),
                             type=ir.TensorType(tensor.dtype))
        replacement = const
        if folding.store_dtype != folding.out_dtype:
            to = types.from_dtype(folding.out_dtype).ir_type
            cast = ir.node("Cast", [const], attributes={"to": to},
                           name=f"{node.name}_cast" if node.name else None)
            owner.insert_before(node, cast)
            replacement = cast.outputs[0]
            replacement.type = ir.TensorType(to)
            replacement.shape = ir.Shape(folding.shape)
        renames = [] if replacement is const else [(replacement, value_name)]
        if fused:
            renames += self._replace_op(node, replacement, support)
        else:
            ir.convenience.replace_all_uses_with(y, replacement, replace_graph_outputs=True)
        owner.remove(node, safe=True)
        # Names are set after the node is gone so that its outputs' names are free to take.
        if shared is None:
            const.name = const_name
        for value, name in renames:
            value.name = name
        if shared is None and not in_function:
            assert isinstance(owner, ir.Graph)
            if home is not None:  # a name free in the graph above too
                const.name = self._names(const_name)
            (home or owner).register_initializer(const)
            if key is not None:
                self._shared[key] = const
        if self.prepack_guard and self._guard(replacement, value_name):
            self.guarded += 1

    @staticmethod
    def _replace_op(node: ir.Node, weight: ir.Value, support: registry.FoldSupport
                    ) -> list[tuple[ir.Value, str]]:
        """Insert the float nodes the family builds on ``weight``; the last one takes over
        ``node``'s outputs. Returns the names its outputs take once ``node`` is gone."""
        assert support.replace is not None and node.graph is not None
        new = list(support.replace(node, weight))
        node.graph.insert_before(node, new)
        renames = []
        for old, fresh in zip(node.outputs, new[-1].outputs, strict=True):
            fresh.type, fresh.shape = old.type, old.shape
            ir.convenience.replace_all_uses_with(old, fresh, replace_graph_outputs=True)
            renames.append((fresh, old.name or ""))
        return renames

    def _guard(self, value: ir.Value, name: str) -> bool:
        """Route prepacked uses of ``value`` through one Identity per consuming graph."""
        idents: dict[int, ir.Value] = {}
        for use in list(value.uses()):
            consumer, index = use.node, use.idx
            if index not in PREPACKED.get((consumer.domain, consumer.op_type), ()):
                continue
            owner = consumer.graph
            assert owner is not None
            if id(owner) not in idents:
                ident = ir.node("Identity", [value], name=f"{name}_noprepack")
                owner.insert_before(consumer, ident)
                ident.outputs[0].name = self._names(f"{name}_noprepack")
                ident.outputs[0].type = value.type
                ident.outputs[0].shape = value.shape
                idents[id(owner)] = ident.outputs[0]
            consumer.replace_input_with(index, idents[id(owner)])
        return bool(idents)

    def _import_default_domain(self, fn: ir.Function | None) -> None:
        """Constant and Cast need ai.onnx: a function using only other domains lacks it."""
        model = self._model
        assert model is not None
        opsets = model.opset_imports if fn is None else fn.opset_imports
        if "" not in opsets and "ai.onnx" not in opsets:
            opsets[""] = graph.opset_of(dict(model.opset_imports), "") or 13

    def _record(self, name: str, site: graph.Site, spec, folding: Folding,
                before_gather: bool = False) -> FoldedNode:
        store = types.from_dtype(folding.store_dtype)
        out = types.from_dtype(folding.out_dtype)
        n = 1
        for d in folding.shape:
            n *= d
        pair = len(folding.calls) > 1  # a QuantizeLinear computed first
        # What the quantized data takes in the model (a pair stores its float weight).
        stored = folding.source.nbytes if pair or spec.packing != "none" \
            else graph.stored_bytes(spec.quant_type, folding.shape)
        return FoldedNode(
            name=name, graph=site.graph, output=site.node.outputs[0].name or "",
            op=spec.op_id, quant_type=spec.quant_type,
            output_type=out.name, stored_type=store.name, shape=folding.shape,
            bytes_quantized=stored, bytes_folded=(n * store.bits + 7) // 8, pair=pair,
            rounding=rounding(out, store), before_gather=before_gather,
        )


def _inputs_home(node: ir.Node) -> ir.Graph | None:
    """The graph whose initializers are all of ``node``'s inputs, if they are."""
    graphs = {id(v.graph): v.graph for v in node.inputs
              if v is not None and v.is_initializer() and v.graph is not None}
    whole = all(v is None or v.is_initializer() for v in node.inputs)
    return next(iter(graphs.values())) if whole and len(graphs) == 1 else None


def _fold_key(node: ir.Node, folding: Folding) -> tuple:
    """What two nodes folded alike share: their op, inputs (the values themselves),
    attributes, and the types and shape of the folded weight."""
    attrs = tuple(sorted((k, repr(a.value)) for k, a in node.attributes.items()))
    return (node.domain, node.op_type, tuple(id(v) for v in node.inputs), attrs,
            str(folding.store_dtype), str(folding.out_dtype), tuple(folding.shape))


def _offset_follows(node: ir.Node) -> bool:
    """Whether the node's output goes on through a Reshape into an Add (the offsets
    ``-(zp·s)`` that ``upgrade`` writes after an HQQ weight's DequantizeLinear): rounded
    to a narrower ``--dtype`` before that Add, weights near zero came out up to 90x off
    (the Add cancels most of ``q·s``), so such a node keeps its own type; the fused fold
    of the original node rounds the sum once."""
    uses = node.outputs[0].uses()
    if len(uses) != 1 or uses[0].node.op_type != "Reshape" or uses[0].idx != 0:
        return False
    after = uses[0].node.outputs[0].uses()
    return len(after) == 1 and after[0].node.op_type == "Add"
