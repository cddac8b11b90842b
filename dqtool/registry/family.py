"""What an operator family is: one object naming the operators it owns and what dqtool can
do with them.

A family is a set of operators that share one meaning (the Q/DQ of ai.onnx; the Q/DQ of
com.microsoft; opmx's DequantizeLinear; a fused weight-only MatMul; the integer operators),
described once, in one folder under ``dqtool/families/``, and registered with one line in
``dqtool.families.BUILTIN``. Everything else in dqtool that cares about a domain or an
operator (the conversion driver, the fold pass, the cleanup that prunes opset imports, the
ReferenceEvaluator, the lint targets) asks the registry, never a hard-coded list.

Each capability is optional (``None``: the family does not offer it):

- ``keys``: the ``(domain, op_type, since_version)`` triples the family owns. A node
  belongs to the family when its (domain, op_type) appears here; the since-versions say
  which versions exist.
- ``codecs``: read → description. A callable returning the codecs
  (``dqtool.spec.Codec``) that read a node into a ``QuantSpec``; they join
  ``dqtool.codecs.REGISTRY``.
- ``evaluator_ops``: a callable returning ``onnx.reference.op_run.OpRun`` subclasses (class
  name = op type, ``op_domain`` = domain) that ``dqtool.reference_evaluator`` runs these
  operators with (dqtool's kernel instead of onnx's implementation).
- ``fold``: a ``FoldSupport``: which operators the fold pass starts from, the kernel call
  that computes a node's value from its constant inputs, and (for an operator that is not a
  plain dequantization, e.g. a fused MatMul) the float operator that replaces the node once
  its weight is a float constant, or the rewrite that turns the family's nodes into forms
  the pass folds first (``prepare``).
- ``converters``: a callable that registers adapters into a conversion registry
  (``dqtool.convert.registry.Registry``), keyed by (domain, op, version, direction):
  ``"up"``/``"down"`` move an ai.onnx op one since-version; ``"onnx"`` turns the family's
  node into ai.onnx (the reverse, ``pack``, is an application: see below). The driver
  dispatches every node whose (domain, op) is owned by a registered family.
- ``prunable``: the family's domains whose opset import dqtool may drop once a fold or a
  conversion has removed every node of them (a function's own domain is never listed).
- ``lint_facts``: what the lint targets need to know about the family's nodes, per target
  family name (``"onnxruntime"``, ``"directml"``, ``"onednn"``, ``"opmx"``, ...): a reason
  the target cannot run any node of the family, ``{domain}`` standing for the node's domain
  (e.g. ``{"onnxruntime": "onnxruntime has no {domain} domain"}``), or ``"native"`` when the
  family *is* the target's own form (its codec's rules judge it). A target not named has no
  fact: it judges the node by its ``QuantSpec``.
- ``inspect``: ``() → InspectSupport``: how ``dqtool.inspect`` reports the family's nodes
  (see ``InspectSupport``): a report per node, the family's summary fields, and the lines
  ``dqtool inspect`` prints for them.
- ``check``: ``() → CheckSupport``: what ``dqtool check`` (and ``--check``) adds for the
  family's nodes: its weights compared between a model and its conversion, and its own
  numeric self-check (see ``CheckSupport``).
- ``attribute_types``: op type → {attribute name: ONNX attribute type name (``"INT"``,
  ``"FLOATS"``, ...)} for the family's operators onnx has no schema for (com.microsoft,
  opmx). Validation refuses a model that gives one of them another type, when it is
  loaded (every command alike), so codecs and kernels read only the types named here
  (ai.onnx operators are held to onnx's own schemas).
- ``gathers``: op type → the attribute naming the axis along which the operator's input 1
  (indices) reads its input 0 (a table), for the family's operators that gather
  (``GatherBlockQuantized``: ``gather_axis``): ``check`` draws generated indices inside
  the table.
- ``lint_modules``: modules (dotted names) that define lint rules (``linting.registry.
  define``/``check``) or targets (a ``TARGETS`` list) for the family; imported when lint
  loads its registries. Such a module may also define ``target_findings(ctx, target)``,
  the ``--target`` findings for the family's nodes that are not Q/DQ (lint's target run
  calls it for every target).

What is built on a family's operators rather than needed to understand them, the
commands ``pack`` (``dqtool/fused``) and ``qdq`` / ``qoperator`` (``dqtool/integer``), is
no capability: those applications sit above the families, and ``dqtool.cli`` lists their
commands with the others.

Family modules must not import other dqtool modules at their top level: the registry is
read by low layers (codecs, kernel's evaluator), so each capability imports what it needs
when called.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from dqtool.spec import Codec, QuantSpec

if TYPE_CHECKING:
    from pathlib import Path

    import numpy as np
    import onnx
    import onnx_ir as ir

Key = tuple[str, str, int]  # (domain, op_type, since_version); ai.onnx is "ai.onnx"


class FoldCall(Protocol):
    """One kernel call of a fold, as the fold pass plans it (``dqtool.folding.kernel_call``'s
    ``KernelCall``): the kernel's name and the node's quantization parameters."""

    kind: str
    scale: ir.TensorProtocol
    zero_point: ir.TensorProtocol | None
    axis: int
    block_size: int
    granularity: str | None
    norm_axis: int | None
    output_dtype: np.dtype | None
    saturate: bool
    opmx: tuple[tuple[str, Any], ...]


class ConverterTable(Protocol):
    """Where a family registers its conversion adapters (``dqtool.convert.registry``'s
    ``Registry``): ``register(domain, op, versions, direction)`` decorates an adapter."""

    def register(self, domain: str, op: str, versions: int | Iterable[int],
                 direction: str, *, widening: bool = False, optional: bool = False,
                 replaces: Callable[[ir.Node, Any, int], int] | None = None
                 ) -> Callable[[Callable[..., Any]], Callable[..., Any]]: ...


class FoldKernel(Protocol):
    """One kernel call of a fold: from the rows of the source to the rows of the value."""

    #: rows of the output can be computed on their own (chunked, streamed); False when a
    #: row needs others (packed rows, groups across rows)
    sliceable: bool

    def __call__(self, x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None,
                 step: FoldCall) -> np.ndarray: ...


@dataclass(frozen=True)
class Kernel:
    """A ``FoldKernel`` from a plain function."""

    run: Callable[[np.ndarray, np.ndarray, np.ndarray | None, FoldCall], np.ndarray]
    sliceable: bool = True
    # each value depends only on its own code and its group's parameters (DequantizeLinear):
    # narrow codes may then be computed by table (dqtool.folding.by_table)
    elementwise: bool = False

    def __call__(self, x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None,
                 step: FoldCall) -> np.ndarray:
        return self.run(x, scale, zero_point, step)


@dataclass(frozen=True)
class FoldPrepared:
    """What a family's ``FoldSupport.prepare`` did before the fold pass: the nodes it
    rewrote (names), those it left (name, why), the outputs of the DequantizeLinear nodes it
    made (the pass folds them whatever the selection says) and the nodes it folded itself
    (``dqtool.folding.report.FoldedNode``)."""

    rewritten: list[str] = field(default_factory=list)
    left: list[tuple[str, str]] = field(default_factory=list)
    made: list[str] = field(default_factory=list)
    folded: list[Any] = field(default_factory=list)


class FoldPrepare(Protocol):
    """``(model, selection, store) → FoldPrepared``: rewrites the family's nodes that the
    fold's ``selection`` (``dqtool.folding.selection.Selection``) picks into forms the fold
    pass folds (a fused MatMul into DequantizeLinear + MatMul); ``store``: the NumPy type of
    ``--dtype``, None to keep."""

    def __call__(self, model: ir.Model, selection: Any, store: np.dtype | None
                 ) -> FoldPrepared: ...


@dataclass(frozen=True)
class FoldSupport:
    """How the fold pass folds the family's nodes.

    - ``roots``: op types the fold pass starts from (their output becomes a constant).
    - ``kernels``: kernel name → kernel; ``folding.kernel_call.KernelCall.kind`` names one of them.
    - ``call``: ``(node, spec, output dtype or None) → FoldCall``, the kernel call that computes
      ``node``'s output from its constant inputs (also used for a producer of the root's x,
      e.g. the QuantizeLinear of a Q→DQ pair); None for a family with no roots.
    - ``replace``: for an operator whose output is not the dequantized weight (a fused
      MatMul): ``(node, folded weight) → the float nodes`` that replace ``node``, reading
      the folded weight; None when the folded constant replaces the node's output itself.
      The last node returned takes over the node's outputs (values, names, consumers); the
      fold pass inserts them, names the weight ``<node>_weight`` and removes the node.
    - ``shape``: ``(source shape, spec) → the value's shape`` when they differ (packed
      sources: opmx int4 holds four rows per element); None: the same shape.
    - ``weight_input``: which input of the node holds the quantized source (0 for a
      DequantizeLinear's x; a fused MatMul's packed weight is its input 1).
    - ``prepare``: for a family that folds by rewriting its nodes first (``FoldPrepare``),
      called before the pass; its nodes then answer to ``--op-types`` by their own op type
      too.
    """

    roots: frozenset[str] = frozenset()
    kernels: Mapping[str, FoldKernel] = field(default_factory=dict)
    call: Callable[[ir.Node, QuantSpec, np.dtype | None], FoldCall] | None = None
    replace: Callable[[ir.Node, ir.Value], Sequence[ir.Node]] | None = None
    shape: Callable[[tuple[int, ...], QuantSpec], tuple[int, ...]] | None = None
    weight_input: int = 0
    prepare: FoldPrepare | None = None


class Reported(Protocol):
    """What a family reports of one node to ``dqtool.inspect``."""

    def to_json(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class InspectTable:
    """A family's own section of ``dqtool inspect``'s text, as data the command line lays
    out: a table titled ``title`` with one row per node (its first column names the node; a
    column ``!`` flags errors and warnings), then ``problems`` and ``lines`` printed as they
    are."""

    title: str
    columns: tuple[str, ...]
    rows: list[list[str]]
    problems: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class InspectSupport:
    """How ``dqtool.inspect`` reports a family's nodes.

    - ``node``: ``(node, opsets, graph name) → report or None``, called for every node of
      the model in walk order (main graph, subgraphs, functions); None for a node the
      family does not report. A report is either a ``dqtool.inspection.NodeReport`` (its
      ``kind`` not ``"qdq"``), listed with the Q/DQ nodes in ``nodes``, or any object with
      ``to_json()``, listed under the family's own ``section``.
    - ``section``: the JSON key (and ``InspectReport.sections`` key) of the family's own
      reports; "" when they join ``nodes``.
    - ``summary``: ``(reports) → fields`` added to the report's summary (after the shared
      ones), for the family's reports only.
    - ``summary_lines``: ``(summary) → lines`` printed under the Q/DQ counts of the table.
    - ``table``: ``(report) → InspectTable or None``: the family's own section of the
      text, printed after the summary (None: nothing to show).
    - ``short_ops``: a shorter op name for the table (``GatherBlockQuantized`` → ``GatherBQ``).
    """

    node: Callable[[ir.Node, Mapping[str, int], str], Reported | None]
    section: str = ""
    summary: Callable[[Sequence[Reported]], dict[str, Any]] | None = None
    summary_lines: Callable[[Mapping[str, Any]], list[str]] | None = None
    # (the ``dqtool.inspection.InspectReport``, which lies above the registry)
    table: Callable[[Any], InspectTable | None] | None = None
    short_ops: Mapping[str, str] = field(default_factory=dict)


class WeightComparison(Protocol):
    """One of a family's weights compared between a model and its conversion."""

    node: str
    op: str
    status: str  # "bit-identical", or how it differs
    detail: str
    same: bool  # the checked model computes it as the original does
    passed: bool

    def to_json(self) -> dict[str, Any]: ...


class NodeBound(Protocol):
    """A family node's output difference on onnxruntime against a proven bound."""

    node: str
    op: str
    status: str  # "within", "beyond", "unbounded"
    passed: bool

    def describe(self) -> str: ...

    def to_json(self) -> dict[str, Any]: ...


class PerOpEntry(Protocol):
    """A rewritten node run alone on the original's inputs (reported, not judged)."""

    comparison: Any  # its output comparison, None when it could not be measured

    def describe(self) -> str: ...

    def to_json(self) -> dict[str, Any]: ...


class NumericCheck(Protocol):
    """``check MODEL``: the family's nodes against the kernel (``NodeCheck`` each)."""

    def __call__(self, proto: onnx.ModelProto, model: ir.Model,
                 feeds: Mapping[str, np.ndarray], notes: list[str], *,
                 external_dir: Path | None = None) -> list[Any]: ...


class BoundsCheck(Protocol):
    """``check --against``: each of the original's family nodes on onnxruntime in both
    models, judged against its rounding bound."""

    def __call__(self, checked: onnx.ModelProto, original: onnx.ModelProto,
                 checked_model: ir.Model, original_model: ir.Model,
                 feeds: Mapping[str, np.ndarray], checked_dir: Path | None,
                 original_dir: Path | None,
                 ran: Mapping[int, Mapping[str, np.ndarray]] | None = None
                 ) -> Sequence[NodeBound]: ...


class BoundValues(Protocol):
    """``check --against``: the values ``BoundsCheck`` reads from onnxruntime's run of each
    model, by ``id`` of the model's proto."""

    def __call__(self, checked: onnx.ModelProto, original: onnx.ModelProto,
                 original_model: ir.Model) -> Mapping[int, Sequence[str]]: ...


class PerOpCheck(Protocol):
    """``check --against``: each node the checked model rewrote, run alone."""

    def __call__(self, checked: onnx.ModelProto, original: onnx.ModelProto,
                 feeds: Mapping[str, np.ndarray], original_dir: Path | None
                 ) -> Sequence[PerOpEntry]: ...


class OptimizedRun(Protocol):
    """``check --against``: the checked model with every onnxruntime optimization against
    the original (``identical``, ``mismatched``, ``error``), or None where it says
    nothing."""

    def __call__(self, checked: onnx.ModelProto, original: onnx.ModelProto,
                 feeds: Mapping[str, np.ndarray]) -> dict[str, Any] | None: ...


@dataclass(frozen=True)
class CheckSupport:
    """What checking adds for a family's nodes.

    - ``holds_weights``: ``proto → bool``: the model has nodes whose weights ``weights``
      compares. A conversion check compares them when the original holds them, else when
      the checked model does (a conversion into the family's nodes): ``weights`` and
      ``bounds`` are then called with the two models' places swapped.
    - ``weights``: ``(checked model, original model) → comparisons`` of each of the
      original's family weights with its counterpart in the checked model (objects with
      ``node``, ``op``, ``status`` — "bit-identical" or not — ``detail``, and ``same``:
      whether the checked model computes the weight as the original does, bit-identical
      or by the very same node).
    - ``kind``: what check's notes and verdicts call those nodes ("fused").
    - ``weights_label``: how a conversion check's note names them ("fused weight(s) ...").
    - ``tolerated``: why final outputs may still differ when every weight is bit-identical
      (the operator sums in its own order); a conversion check then tolerates them.
    - ``notes``: op type → the note ``dqtool check`` prints under the weights of that op.
    - ``numeric``: ``(proto, model, feeds, notes, external_dir) → [NodeCheck]``: the
      family's nodes checked against the kernel, beside the Q/DQ nodes' self-check.
    - ``bounds``: ``(checked proto, original proto, checked model, original model, feeds,
      checked_dir, original_dir) → [bound]``: each of the original's family nodes run on
      onnxruntime in both models, its output difference judged against a proven bound on
      the runtime's own rounding (objects with ``node``, ``op``, ``status`` — "within",
      "beyond", "unbounded" —, ``passed``, ``describe()``, ``to_json()``). A check
      --against tolerates onnxruntime's output differences beyond rtol/atol only when every
      weight is bit-identical and every such node is within its bound. ``ran``:
      onnxruntime's runs of the two models (by ``id`` of their protos) that kept the
      values ``bound_values`` names, used in place of runs of its own.
    - ``bound_values``: ``(checked proto, original proto, original model) → {id(proto):
      names}``: what ``bounds`` reads from each model's onnxruntime run.
    - ``per_op``: ``(checked proto, original proto, feeds) → [entry]``: for a conversion
      check, each of the original's family nodes that the checked model rewrote, its
      rewritten form run alone on the original's inputs (entries with ``to_json`` and
      ``describe``); reported beside the outputs, not judged.
    - ``optimized_run``: ``(checked proto, original proto, feeds) → dict | None``: for a
      conversion into a form onnxruntime fuses back, the checked model run with every
      optimization against the original (``identical``, ``mismatched``, ``error``).
    """

    holds_weights: Callable[[onnx.ModelProto], bool] | None = None
    kind: str = ""
    weights: Callable[[ir.Model, ir.Model], Sequence[WeightComparison]] | None = None
    weights_label: str = ""
    tolerated: str = ""
    notes: Mapping[str, str] = field(default_factory=dict)
    numeric: NumericCheck | None = None
    bounds: BoundsCheck | None = None
    bound_values: BoundValues | None = None
    per_op: PerOpCheck | None = None
    optimized_run: OptimizedRun | None = None


@dataclass(frozen=True)
class Family:
    """One operator family, registered once (see the module docstring for each field)."""

    name: str
    keys: tuple[Key, ...]
    codecs: Callable[[], Iterable[Codec]] | None = None
    evaluator_ops: Callable[[], Sequence[type[Any]]] | None = None
    fold: Callable[[], FoldSupport] | None = None
    converters: Callable[[ConverterTable], None] | None = None
    prunable: frozenset[str] = frozenset()
    lint_facts: Mapping[str, str] = field(default_factory=dict)
    lint_modules: tuple[str, ...] = ()
    inspect: Callable[[], InspectSupport] | None = None
    check: Callable[[], CheckSupport] | None = None
    attribute_types: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    gathers: Mapping[str, str] = field(default_factory=dict)

    @property
    def domains(self) -> frozenset[str]:
        return frozenset(d for d, _, _ in self.keys)

    @property
    def ops(self) -> frozenset[tuple[str, str]]:
        return frozenset((d, o) for d, o, _ in self.keys)

    def owns(self, domain: str, op_type: str) -> bool:
        return (domain, op_type) in self.ops

    def since_versions(self, domain: str, op_type: str) -> list[int]:
        return sorted(v for d, o, v in self.keys if (d, o) == (domain, op_type))
