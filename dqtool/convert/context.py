"""The state one conversion shares between adapters, and the graph surgery they use.

Surgery rules that keep "nothing else changes" true:
- a node keeps its name; helper nodes are named ``<node>/<role>``;
- a rewritten constant is a *new* value (its old one may be shared, e.g. a scale used by a
  Q and a DQ); the old one is removed at the end only if nothing uses it any more;
- when a helper node now produces a node's result, it takes over the result's name, type,
  shape and doc string, so consumers, graph outputs and value_info are unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import onnx_ir as ir

from dqtool import graph, types
from dqtool.building import Builder
from dqtool.convert.report import ConvertReport
from dqtool.names import Names
from dqtool.storage import WidenedCodes, file_range, same_bytes

if TYPE_CHECKING:
    from dqtool.storage import EarlyWriter


@dataclass(frozen=True)
class Options:
    per_axis: bool = False
    allow_decompose: bool = False
    # leave the working operators of other domains (those whose "onnx" rewrite is
    # registered ``optional``: MatMulNBits, GatherBlockQuantized) as they are
    keep_contrib: bool = False
    # then rewrite dequantization written by hand (Cast → Sub → Mul) into DequantizeLinear
    handwritten: bool = False


@dataclass(eq=False)  # identity: adapters may key their own state by it
class Context:
    model: ir.Model
    target: int  # the ai.onnx opset N being converted to
    options: Options
    report: ConvertReport
    replaced: list[ir.Value] = field(default_factory=list)  # may be orphaned now
    warnings: list[str] = field(default_factory=list)
    # Nodes whose version step allows other types than the model records for them:
    # (node, op, from, to, the values without a recorded type); warned of by groups.
    untyped: list[tuple[str, str, int, int, tuple[str, ...]]] = field(default_factory=list)
    # The save's writer when it writes the data file while the model is converted
    # (``storage.start_early_writer``): adapters hand it the tensors that stream themselves.
    early: EarlyWriter | None = None
    # ``fresh(base)``: a value name not used anywhere in the model.
    fresh: Names = field(init=False)

    def __post_init__(self) -> None:
        self.fresh = Names(self.model)


@dataclass
class Step:
    """One node being moved across one version step (or across domains)."""

    node: ir.Node
    where: str  # graph path, as reports show it
    in_function: bool
    src: int  # since-version (or domain version) the node is read at
    dst: int  # since-version it must be valid at after this step
    ctx: Context
    _builder: Builder | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def target(self) -> int:
        return self.ctx.target

    # --- constants (``dqtool.building``: an initializer, or a Constant node in a
    # function, put before the node at once) -------------------------------------------

    @property
    def build(self) -> Builder:
        """The builder of this step's new constants (made on first use)."""
        if self._builder is None:
            self._builder = Builder(self.node, self.ctx.fresh, in_function=self.in_function)
        return self._builder

    def constant(self, base: str, dtype: ir.DataType, shape: tuple[int, ...],
                 compute: Callable[[], np.ndarray]) -> ir.Value:
        """A new constant next to the node, computed only when the model is saved
        (``LazyTensor``), so a rewrite never holds every weight in memory at once."""
        name = self.ctx.fresh(base)
        return self._placed(self.build.lazy(name, dtype, shape, compute), name, base)

    def reshaped(self, base: str, v: ir.Value, shape: tuple[int, ...]) -> ir.Value:
        """A new constant next to the node: constant ``v`` reshaped. Where ``v`` is in a
        file, its stored bytes as they are (``same_bytes``): the save copies them
        there, a weight is never read into memory; else computed when saved."""
        stored = graph.constant_tensor(v)
        assert stored is not None, f"{v.name} is not constant"
        # (a Constant node of a function is saved inline, from its values)
        if self.in_function or (file_range(stored) is None
                                and not isinstance(stored, WidenedCodes)):
            return self.constant(base, stored.dtype, shape,
                                 lambda: graph.tensor_values(stored).reshape(shape))
        return self.holding(base, same_bytes(stored, stored.dtype, shape))

    def holding(self, base: str, tensor: ir.TensorProtocol) -> ir.Value:
        """A new constant next to the node holding ``tensor`` (renamed)."""
        return self._placed(tensor, self.ctx.fresh(base), base)

    def _placed(self, tensor: ir.TensorProtocol, name: str, base: str) -> ir.Value:
        value = self.build.place(tensor, name, base)
        self.build.insert()
        return value

    def small_constant(self, base: str, arr: np.ndarray, dtype: ir.DataType | None = None
                       ) -> ir.Value:
        arr = np.asarray(arr)
        dt = dtype or types.from_dtype(arr.dtype).ir_type
        return self.constant(base, dt, tuple(arr.shape), lambda: arr)

    def set_input(self, index: int, value: ir.Value | None) -> None:
        old = graph.input_value(self.node, index)
        if old is not None:
            self.ctx.replaced.append(old)
        if value is None and index == len(self.node.inputs) - 1:
            self.node.resize_inputs(index)
        elif index >= len(self.node.inputs):
            self.node.resize_inputs(index + 1)
            self.node.replace_input_with(index, value)
        else:
            self.node.replace_input_with(index, value)

    # --- helper nodes ------------------------------------------------------------------

    def append(self, chain: list[tuple[str, list[ir.Value | None], dict, str]],
               dtype: ir.DataType, shape: tuple[int, ...] | None = None) -> ir.Value:
        """Insert ``chain`` (op, extra inputs, attributes, role) after the node, fed by its
        output; the last helper takes over the output's name and consumers. ``dtype`` is
        the element type the node itself now outputs."""
        y = self.node.outputs[0]
        # Copies: setting y.dtype below mutates y's type object in place.
        name, keep_dtype, doc = y.name, y.dtype, y.doc_string
        keep_shape = None if y.shape is None else ir.Shape(list(y.shape))
        meta = dict(y.metadata_props)
        nodes: list[ir.Node] = []
        prev = y
        for op, extra, attrs, role in chain:
            n = ir.node(op, [prev, *extra], attrs,
                        name=self.ctx.fresh.node(f"{self.node.name}/{role}"))
            nodes.append(n)
            prev = n.outputs[0]
        last = prev
        # Consumers first, then wire the chain (otherwise the chain's own use of y moves).
        first_use = nodes[0]
        ir.convenience.replace_all_uses_with(y, last, replace_graph_outputs=True)
        first_use.replace_input_with(0, y)
        y.name = self.ctx.fresh(f"{name}/{nodes[0].op_type.lower()}_in")
        y.dtype = dtype
        if shape is not None:
            y.shape = ir.Shape(shape)
        y.doc_string = None
        for i, n in enumerate(nodes[:-1]):
            n.outputs[0].name = self.ctx.fresh(f"{name}/{i}")
        last.name = name
        if keep_dtype is not None:
            last.dtype = keep_dtype
        last.shape, last.doc_string = keep_shape, doc
        last.metadata_props.update(meta)
        self.node.graph.insert_after(self.node, nodes)
        return last
