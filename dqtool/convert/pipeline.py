"""One conversion: walk every node (main graph, subgraphs, functions), move it one version
step at a time with the registry's adapters, then fix opset imports and the IR version.

Nothing is written when any node is refused; the report says which and why.
"""

from __future__ import annotations

import functools
import itertools
import os
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import onnx_ir as ir

from dqtool import cleanup, codecs, graph, registry, storage, versions
from dqtool.convert import blocked, decompose, generic, value_info
from dqtool.convert.context import Context, Options, Step
from dqtool.convert.registry import Outcome, Registry, default_registry
from dqtool.convert.report import ConversionRefused, ConvertReport, NodeChange, NodeRefusal
from dqtool.errors import InputError, UsageError
from dqtool.spec import op_id

if TYPE_CHECKING:
    from dqtool.storage import EarlyWriter


def run(model_or_path: ir.Model | str | os.PathLike, opset: int,
        direction: Literal["upgrade", "downgrade"], options: Options,
        registry: Registry | None = None, *, path: str | os.PathLike | None = None,
        copy: bool = True, early: EarlyWriter | None = None) -> ConvertReport:
    """Convert in memory; raises ``ConversionRefused`` (with the report) if any node is
    refused. All or nothing: a model object is converted as a copy (``report.model``; its
    tensors are the input's, not copied), so the caller's model is never changed, refused
    or not. ``copy=False`` converts it in place, for a caller that owns the only reference
    and drops it on refusal. ``path`` names the file it was loaded from, if any (the
    report's source, and the value_info it declared). ``early``: the save's writer when it
    writes the data file during the conversion (``storage.start_early_writer``)."""
    if isinstance(model_or_path, ir.Model):
        model, source = model_or_path, "<model>" if path is None else str(path)
    else:
        model, source, copy = storage.load(model_or_path), str(model_or_path), False
    src = graph.opset_of(dict(model.opset_imports), "")
    _check_request(source, src, opset, direction)
    for fn in model.functions.values():
        version = graph.opset_of(dict(fn.opset_imports), "")
        if version is not None and version < 1:
            raise InputError(f"{source}: function {fn.name} declares ai.onnx opset {version}, "
                             "which does not exist (opsets start at 1)")
    declared = None if source == "<model>" else value_info.declared(source)
    report = ConvertReport(input=source, direction=direction, from_opset=src, to_opset=opset,
                           from_ir_version=model.ir_version)
    if copy:
        model = working_copy(model)
    ctx = Context(model, opset, options, report, early=early)
    reg = registry or default_registry()
    sites = list(graph.walk(model))
    # Constant nodes last: a rewrite of their readers may leave them unused (a function's
    # uint4 codes a DequantizeLinear below opset 21 reads widened to uint8), and such a
    # Constant goes rather than be refused for a type the target lacks.
    constant = [s.node.op_type == "Constant" and s.node.domain == "" for s in sites]
    for last in (False, True):
        batch = [s for s, c in zip(sites, constant, strict=True) if c == last]
        for site in batch:
            if site.node.graph is None:
                continue  # removed by an earlier rewrite
            node = site.node  # its identity before rewrites
            op = op_id(node.domain, node.op_type,
                       node.version or graph.opset_of(site.opsets, node.domain))
            _record(report, site, op, _convert_site(site, ctx, reg))
        # What the rewrites replaced, if nothing else uses it (a scale shared by a Q and a
        # DQ stays); Q nodes stay: a conversion removes no computation.
        cleanup.remove_unused(ctx.replaced, producers=frozenset({"Constant"}))
        ctx.replaced.clear()
    if report.refusals:
        raise ConversionRefused(report)
    try:
        report.warnings.extend(graph.sort_if_needed(model))
    except InputError as e:
        raise InputError(f"{source}: {e}") from None
    _set_opsets(model, opset)
    if opset < 21:
        _drop_notes(model)
    model.ir_version = storage.lowest_ir_version(model)
    report.to_ir_version = model.ir_version
    if declared is not None:
        value_info.drop_added(model, declared)
    report.opset_imports = {graph.domain_name(d): v for d, v in model.opset_imports.items()}
    report.warnings.extend(ctx.warnings)
    report.warnings.extend(generic.untyped_warnings(ctx.untyped))
    report.model = model
    return report


def working_copy(model: ir.Model) -> ir.Model:
    """A copy to rewrite: new graphs, nodes and values (O(nodes)); the tensors are shared,
    and a rewrite never changes a tensor, it makes a new value. ``meta`` (what storage.load
    recorded about the files read) goes along."""
    copy = model.clone()
    copy.meta.update(model.meta)
    return copy


def _check_request(source: str, src: int | None, opset: int, direction: str) -> None:
    if not 1 <= opset <= storage.MAX_ONNX_OPSET:
        raise UsageError(f"--opset {opset} is outside 1..{storage.MAX_ONNX_OPSET} (what the "
                         "installed onnx knows)")
    if src is None:
        return
    if src < 1:
        raise InputError(f"{source}: declares ai.onnx opset {src}, which does not exist "
                         "(opsets start at 1)")
    if direction == "upgrade" and opset < src:
        raise UsageError(f"{source}: is at ai.onnx opset {src}; upgrade goes up (use "
                         f"downgrade --opset {opset})")
    if direction == "downgrade" and opset > src:
        raise UsageError(f"{source}: is at ai.onnx opset {src}; downgrade goes down (use "
                         f"upgrade --opset {opset})")


def _name(node: ir.Node) -> str:
    return node.name or f"<unnamed {node.op_type}>"


def _record(report: ConvertReport, site: graph.Site, op: str, outcome: Outcome) -> None:
    node = site.node
    if outcome.status == "refused":
        report.refusals.append(NodeRefusal(_name(node), site.graph, op, outcome.why))
    elif outcome.status in ("changed", "repaired", "kept"):
        report.changes.append(NodeChange(_name(node), site.graph, op, outcome.status,
                                         outcome.how, outcome.why))


def _convert_site(site: graph.Site, ctx: Context, reg: Registry) -> Outcome:
    node = site.node
    domain = graph.domain_name(node.domain)
    src = graph.opset_of(site.opsets, "") or ctx.target
    step = Step(node, site.graph, site.function is not None, src, ctx.target, ctx)
    if domain == "ai.onnx" and (reg.steps("ai.onnx", node.op_type)
                                or _read_by_codec(node.op_type)):
        # An op with version adapters, or one a codec reads (the Q/DQ: exact or refused,
        # never onnx's converter); any other ai.onnx op, a family's without adapters
        # (QLinearMatMul) too, goes through the generic steps.
        out = _walk_versions(node, step, src, reg)
    elif domain == "ai.onnx":
        return generic.convert(node, step, src)
    else:  # any other domain: its family's adapter to ai.onnx, if the registry has one
        version = graph.opset_of(site.opsets, node.domain) or 1
        out = _from_foreign(node, step, domain, version, reg)
    if out.status == "refused" or node.graph is None or node.domain not in ("", "ai.onnx") \
            or not _read_by_codec(node.op_type):
        return out  # gone, still foreign, or an ai.onnx op no codec reads (nothing to check)
    return _finish(node, step, out)


def _walk_versions(node: ir.Node, step: Step, src_opset: int, reg: Registry,
                   src_since: int | None = None) -> Outcome:
    op = node.op_type
    src = src_since or generic.since_at(op, src_opset)
    dst = generic.since_at(op, step.target)
    if src is None:
        return Outcome.refused(f"{op} does not exist at the source opset {src_opset}")
    if dst is None:
        spec = codecs.read_node(node, {"": src})
        reason = f"{op} does not exist at opset {step.target} (it starts at 10)"
        if op == "DequantizeLinear" and step.ctx.options.allow_decompose:
            return decompose.decompose(step, spec, [reason])
        return Outcome.refused(reason)
    vs = generic.since_versions(op)
    outcomes: list[Outcome] = []
    if dst >= src:
        pairs = [(a, b, b, "up") for a, b in itertools.pairwise(vs) if src <= a < dst]
    else:
        pairs = [(b, a, b, "down") for a, b in reversed(list(itertools.pairwise(vs)))
                 if dst <= a < src]
    adapters = [reg.get("ai.onnx", op, key, direction) for _, _, key, direction in pairs]
    if pairs and all(reg.widening("ai.onnx", op, key, d) for _, _, key, d in pairs) and \
            not codecs.read_node(node, {"": src}).errors:
        # Every later version allows what an earlier one did: a node valid at the source
        # needs no step up (reading it at each step cost 4 reads per node on big models).
        return Outcome.unchanged()
    for (frm, to, _key, _direction), adapter in zip(pairs, adapters, strict=True):
        if adapter is None:
            return Outcome.refused(f"no adapter for {op} {frm}→{to}")
        step.src, step.dst = frm, to
        out = adapter(node, step)
        if out.status == "refused":
            return out
        outcomes.append(out)
        if node.graph is None:
            break
    return Outcome.merge(outcomes)


def _from_foreign(node: ir.Node, step: Step, domain: str, version: int,
                  reg: Registry) -> Outcome:
    """A node of another domain, through its family's adapter to ai.onnx (if the registry
    has one for the version in force). The adapter sees ``step.src`` = that version and
    ``step.dst`` = the since-version of the same-named ai.onnx op at the target, or the
    target opset when ai.onnx has no op of that name (MatMulNBits → DequantizeLinear +
    MatMul is the adapter's to choose)."""
    adapter = reg.find(domain, node.op_type, version, "onnx")
    if adapter is None:
        return Outcome.unchanged()
    if step.ctx.options.keep_contrib and reg.optional(node.domain, node.op_type):
        return Outcome("kept", f"left as {domain}", "--keep-contrib")
    dst = generic.since_at(node.op_type, step.target)
    if dst is None and generic.since_versions(node.op_type):
        return Outcome("kept", f"left as {domain}", f"{node.op_type} does not exist at opset "
                       f"{step.target}")
    step.src, step.dst = version, step.target if dst is None else dst
    out = adapter(node, step)
    if out.status != "changed" or node.domain not in ("", "ai.onnx") or \
            not _read_by_codec(node.op_type):
        return out
    # The ai.onnx form may need a newer version than the target (opmx int4 → 21): lower it.
    spec = codecs.read_node(node, {"": generic.since_versions(node.op_type)[-1]})
    lowest = versions.lowest_version(spec)
    if lowest is None or lowest <= step.dst:
        return out
    lowered = _walk_versions(node, step, step.target, reg, src_since=lowest)
    return lowered if lowered.status == "refused" else Outcome.merge([out, lowered])


def _read_by_codec(op: str) -> bool:
    """A family's codec reads the ai.onnx op (so its result can be validated)."""
    return _codec_reads(op, registry.generation())


@functools.lru_cache(maxsize=1024)
def _codec_reads(op: str, _generation: int) -> bool:  # asked once per node: cached
    return any(codecs.lookup("ai.onnx", op, v) is not None for v in generic.since_versions(op))


def _finish(node: ir.Node, step: Step, out: Outcome) -> Outcome:
    dst = generic.since_at(node.op_type, step.target)
    if step.ctx.options.per_axis and node.op_type == "DequantizeLinear":
        spec = codecs.read_node(node, {"": dst})
        if spec.granularity == "blocked" and not spec.errors:
            step.src = step.dst = dst
            res = blocked.to_per_axis(step, spec, "--per-axis")
            if res.status == "refused":
                return res
            out = Outcome.merge([out, res])
    errors = codecs.read_node(node, {"": dst}).errors
    if errors:
        return Outcome.refused(f"not valid at {node.op_type}-{dst}: "
                               + "; ".join(p.message for p in errors))
    return out


def _set_opsets(model: ir.Model, opset: int) -> None:
    for holder in (model, *model.functions.values()):
        imports = holder.opset_imports
        key = "" if "" in imports else "ai.onnx" if "ai.onnx" in imports else None
        if key is not None:
            imports[key] = opset
    cleanup.prune_opsets(model)
    used = {site.node.domain for site in graph.walk(model)}
    # New ai.onnx nodes (an opmx DequantizeLinear became one) need the ai.onnx import.
    if "" not in model.opset_imports and "ai.onnx" not in model.opset_imports and \
            ("" in used or "ai.onnx" in used):
        model.opset_imports[""] = opset


def default_output(path: str | os.PathLike, opset: int) -> Path:
    p = Path(path)
    return p.with_name(f"{p.stem}.opset{opset}{p.suffix or '.onnx'}")


def _drop_notes(model: ir.Model) -> None:
    """The notes adapters leave on nodes for a later rewrite (node metadata under
    ``dqtool.``) go below opset 21: node metadata needs IR version 10, which a model lowered
    for an older runtime must not keep for them (a downgrade of an upgraded model stayed
    IR 10)."""
    for site in graph.walk(model):
        props = site.node.metadata_props
        for key in [k for k in props if k.startswith("dqtool.")]:
            del props[key]
