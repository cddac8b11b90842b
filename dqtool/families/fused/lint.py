"""Lint facts of the fused family: which targets run com.microsoft MatMulNBits /
GatherBlockQuantized (only onnxruntime), and the command that makes a model portable."""

from __future__ import annotations

from collections.abc import Iterator

from dqtool.families.fused import ort_facts, read, to_onnx
from dqtool.families.fused import spec as S
from dqtool.families.fused.lint_fix import clean_fixes, common_fix
from dqtool.families.fused.reporting import lowest_onnx_opset
from dqtool.families.fused.to_onnx import needed_opset
from dqtool.linting.context import ModelContext
from dqtool.linting.finding import Finding
from dqtool.linting.registry import check, define
from dqtool.runtimes import onnxruntime as ort_profiles
from dqtool.spec import op_id

RULE = "DQ109"

define(RULE, "target-fused-op", "error",
       "the target cannot run a com.microsoft MatMulNBits / GatherBlockQuantized "
       "(dequantization inside an onnxruntime contrib op)",
       "node 'mm': directml-fl6.2 cannot run it: com.microsoft MatMulNBits (weight uint4 "
       "dequantized inside the operator) is an onnxruntime contrib op; fix: `dqtool "
       "downgrade --opset 20` (ai.onnx DequantizeLinear + MatMul, exact; its result lints "
       "clean for directml-fl6.2), or `dqtool fold` (float weights)")


# The problems read finds in a fused node (FusedSpec.problems), as lint rules of the same
# codes, so that inspect and lint agree (as DQ010-DQ019 do for Q/DQ). FU007 (a combination
# onnxruntime's kernel rejects) is a fact of that target: DQ109 with --target onnxruntime.
define(S.P_FUSED_INPUTS, "fused-inputs", "error",
       "a MatMulNBits / GatherBlockQuantized input or required attribute is missing",
       "node 'mm': com.microsoft.MatMulNBits: required attribute K is missing")
define(S.P_FUSED_ATTR, "fused-attribute", "error",
       "a MatMulNBits / GatherBlockQuantized attribute out of range (bits, block_size, "
       "axes, weight_prepacked)",
       "node 'mm': com.microsoft.MatMulNBits: bits=3; onnxruntime takes 2, 4 or 8")
define(S.P_FUSED_TYPE, "fused-type", "error",
       "an input type a MatMulNBits / GatherBlockQuantized does not take",
       "node 'mm': com.microsoft.MatMulNBits: B is int8, not uint8")
define(S.P_FUSED_SHAPE, "fused-shape", "error",
       "B / scales / zero points / table shapes disagree with K, N and the blocks",
       "node 'mm': com.microsoft.MatMulNBits: B is (9, 1, 16), expected (N, k_blocks, "
       "blob) = (9, 2, 16)")
define(S.P_FUSED_G_IDX, "fused-g-idx", "warning",
       "a MatMulNBits g_idx that no ai.onnx form expresses exactly (act-order, computed, or "
       "with integer or no zero points, which onnxruntime runs by its own path)",
       "node 'mm': com.microsoft.MatMulNBits: g_idx is computed at run time")
define(S.P_FUSED_ACCURACY, "fused-accuracy-level", "info",
       "MatMulNBits accuracy_level > 0: onnxruntime may quantize A, so outputs differ from "
       "a float MatMul by design",
       "node 'mm': com.microsoft.MatMulNBits: accuracy_level=4: onnxruntime may quantize "
       "or downcast A")
_NODE_CODES = (S.P_FUSED_INPUTS, S.P_FUSED_ATTR, S.P_FUSED_TYPE, S.P_FUSED_SHAPE,
               S.P_FUSED_G_IDX, S.P_FUSED_ACCURACY)


@check(*_NODE_CODES)
def node_problems(ctx: ModelContext) -> Iterator[Finding]:
    for site in ctx.sites:
        if not read.is_fused(site.node):
            continue
        spec = read.read(site.node, site.opsets)
        name = site.node.name or f"<unnamed {site.node.op_type}>"
        for p in spec.problems:
            if p.code in _NODE_CODES:
                yield ctx.finding(p.code, p.severity, p.message, node=name, where=site.graph,
                                  op=_op(site))


def target_findings(ctx: ModelContext, target: str) -> Iterator[Finding]:
    """DQ109 for every fused node a target cannot run (every target but onnxruntime, which
    runs them unless its CPU kernel rejects the combination)."""
    opset = ctx.onnx_opset or 0
    fused = [(s, read.read(s.node, s.opsets)) for s in ctx.sites if read.is_fused(s.node)]
    tried: list[str | None] = []
    if not target.startswith("onnxruntime") and _target_opset(target) is None:
        # a target with limits of its own: each node's conversions tried, and one command
        # for the model where one serves every node (an invalid node has none: its own
        # findings say what is wrong with it)
        each = [[] if spec.errors else clean_fixes(s.node, s.opsets, opset, target)
                for s, spec in fused]
        common = common_fix([t for t, (_, spec) in zip(each, fused, strict=True)
                             if not spec.errors])
        tried = [common or next(iter(t), None) for t in each]
    for i, (site, spec) in enumerate(fused):
        node = site.node
        name = node.name or f"<unnamed {node.op_type}>"
        if target.startswith("onnxruntime"):
            rejected = [p for p in spec.problems if p.code == "FU007"]
            if rejected:
                yield ctx.finding(RULE, "error", f"onnxruntime cannot run it: "
                                  f"{rejected[0].message}", target=target, node=name,
                                  where=site.graph, fix=_fix(spec, opset), op=_op(site))
            lacking = _ort_lacks(spec, target)
            if lacking and not rejected:
                yield ctx.finding(RULE, "error", lacking, target=target, node=name,
                                  where=site.graph, op=_op(site))
            continue
        if _target_opset(target) is None:  # a target with limits of its own: tried
            fix = _fix(spec, opset, tried=tried[i], target_name=target)
        else:
            fix = _fix(spec, opset, _target_opset(target))
        yield ctx.finding(
            RULE, "error", f"{target} cannot run it: com.microsoft {node.op_type} (weight "
            f"{spec.quant_type} dequantized inside the operator) is an onnxruntime contrib "
            "op", target=target, node=name, where=site.graph, fix=fix, op=_op(site))


def _ort_lacks(spec, target: str) -> str | None:
    """The kernel the target's onnxruntime CPU provider has not for this node (its A type),
    from the release's measured profile (``onnxruntime``: the installed one, probed)."""
    a_type = spec.float_type
    if spec.op != "MatMulNBits" or a_type is None:
        return None
    release = target.removeprefix("onnxruntime").removeprefix("-") or None
    facts = ort_profiles.profile_for(release)
    if not facts.matmulnbits_a_types or a_type in facts.matmulnbits_a_types:
        return None
    return (f"{facts.name} cannot run it: no MatMulNBits kernel for {a_type} A (it has "
            f"{' and '.join(sorted(facts.matmulnbits_a_types))}; {facts.source}); no "
            "conversion of the node changes A's type")


def _op(site) -> str:
    """The node's operator as reports name it: ``com.microsoft:MatMulNBits-1``."""
    node = site.node
    return op_id(node.domain, node.op_type, site.opsets.get(node.domain))


def _target_opset(target: str) -> int | None:
    """N of an ``onnx-opset-N`` target: the opset a fix must land on."""
    head, _, n = target.rpartition("-")
    return int(n) if head == "onnx-opset" and n.isdigit() else None


def _fix(spec, opset: int, target: int | None = None, tried: str | None = None,
         target_name: str | None = None) -> str | None:
    """The commands that make the node portable. For an ``onnx-opset-N`` target, the
    conversion lands on N (a fix that upgraded past it left other findings: measured by a
    trial running each suggested command). For a target with its own limits on
    DequantizeLinear (DirectML, oneDNN Graph, opmx: ``target_name``), the conversion
    whose result lints clean for it (``tried``, see ``lint_fix``), if one does; else
    ``fold``. With neither (onnxruntime rejecting a combination), the lowest opset at or
    above the model's that expresses the node."""
    if spec.errors:  # no conversion or fold takes an invalid node (FU001-FU004 say why)
        return None
    ways = []
    form = f"ai.onnx DequantizeLinear + {'MatMul' if spec.op == 'MatMulNBits' else 'Gather'}"
    if target is not None:
        lowest = lowest_onnx_opset(spec)
        if lowest is not None and lowest <= target:
            verb = "upgrade" if target >= opset else "downgrade"
            ways.append(f"`dqtool {verb} --opset {target}` ({form}, exact)")
    elif target_name is not None:
        if tried is not None:
            ways.append(f"{tried} ({form}, exact; its result lints clean for "
                        f"{target_name})")
    else:
        need = max(needed_opset(spec), opset)
        try:
            to_onnx.check(spec, need)
            ways.append(f"`dqtool upgrade --opset {need}` ({form}, exact)")
        except to_onnx.NoExactForm:
            pass
    if spec.constant and ort_facts.g_idx_refusal(spec.g_idx, spec.zero_point) is None:
        ways.append("`dqtool fold` (float weights)")
    return ", or ".join(ways) or None
