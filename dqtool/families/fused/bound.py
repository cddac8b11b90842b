"""``check --against`` on onnxruntime: how far a fused node's output may move when only the
order of its sums changes, and whether the checked model stays within that.

MatMulNBits computes ``y = Σ_k a_k·w_k (+ bias)``; an exact conversion multiplies the very
same weights (proved bit for bit apart), yet onnxruntime's MatMulNBits and its MatMul sum
in their own orders (blocks, threads, vector lanes), so onnxruntime's outputs of the two
models may differ in their last bits. The classic bound on a dot product summed in any
order with unit roundoff ``u`` (``docs/fused.md``):

    |fl(y) - y| ≤ γ_n · Σ_k |a_k|·|w_k|   (+ |bias|),   γ_n = n·u / (1 - n·u),  n = K (+1)

then one rounding to the output type (``u_out·|y|``, plus half its smallest subnormal). Each
model's node is within that of the exact value, so their difference is within the sum of
the two, plus ``Σ_k |w_k|·|a1_k - a2_k|`` when the node's input A already differs
(differences from earlier nodes). onnxruntime sums float32, float16 and bfloat16 inputs in
float32 (``u = 2^-24``); a float16/bfloat16 MatMulNBits multiplies by the float32 weight
``(q - zp)·scale`` before its rounding to the output type (measured: its outputs are then
exactly a float32 product with that weight, rounded once), so each of its weights may be
off the rounded one by ``u_out·|w|``. With ``accuracy_level`` > 0 onnxruntime may first
round A:
to float16 (2) or bfloat16 (3) (then summing in that type is allowed for), or to int8 with
one scale per block (4: each element moves by at most one step, ``max|a|/127`` of its row).

GatherBlockQuantized only gathers: its bound is 0 (bit-identical outputs).

The bound is computed in float64 (its products ``|a|·|w|`` bounded from above through
float32 BLAS, ``_products_above``) from the node's own inputs (read back from onnxruntime's
runs of both models, the fused node's A and output exposed as graph outputs) and the weight
dqtool's kernel dequantizes. Past ``WORK`` multiply-adds a node with more than one row of A is
checked on a sample of its output columns (every column's bound is exact; the sample is
reported); with one row, every column (since 2026-11-28).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir

from dqtool import graph, storage
from dqtool.checking import runners
from dqtool.checking.compare import max_abs_difference
from dqtool.checking.models import for_ort
from dqtool.errors import KernelError
from dqtool.families.fused import kernel, read
from dqtool.kernel import half

WORK = 1 << 24  # multiply-adds per node before its columns are sampled
_U = {np.dtype(np.float32): 2.0 ** -24, np.dtype(np.float16): 2.0 ** -11,
      np.dtype(ml_dtypes.bfloat16): 2.0 ** -8}
# half the smallest subnormal: the absolute error of rounding a value near zero
_ETA = {np.dtype(np.float32): 2.0 ** -150, np.dtype(np.float16): 2.0 ** -25,
        np.dtype(ml_dtypes.bfloat16): 2.0 ** -134}
_ACC_U = 2.0 ** -24  # onnxruntime's CPU kernels sum float16/bfloat16 inputs in float32


@dataclass(frozen=True)
class NodeBound:
    """One fused node of the original, its output on onnxruntime in both models."""

    node: str
    op: str
    status: str  # "within", "beyond", "unbounded" (could not be compared)
    max_abs: float | None = None
    ulps: float | None = None  # the largest difference in ulps of the output type there
    max_ratio: float | None = None  # largest difference / bound (≤ 1 within)
    bound_at_worst: float | None = None
    sampled: str | None = None
    detail: str = ""
    dtype: str | None = None  # the output's type
    # unbounded because it sits in a subgraph or a function, whose values cannot be made
    # outputs: only then may the reference runtime's agreement stand in for its bound
    hidden: bool = False

    @property
    def passed(self) -> bool:
        return self.status != "beyond"

    def describe(self) -> str:
        if self.status == "unbounded":
            return f"{self.node} ({self.op}): not bounded: {self.detail}"
        if not self.max_abs:
            return f"{self.node} ({self.op}): bit-identical"
        ulps = "" if self.ulps is None else f" ({self.ulps:g} ulp of {self.dtype})"
        word = "within" if self.status == "within" else "BEYOND"
        text = (f"{self.node} ({self.op}): max abs {self.max_abs:.6g}{ulps}, {word} its "
                f"rounding bound (largest difference / bound "
                f"{self.max_ratio:.3g}; bound there {self.bound_at_worst:.6g})")
        if self.detail:
            text += f"; {self.detail}"
        return text + (f" [{self.sampled}]" if self.sampled else "")

    def to_json(self) -> dict[str, Any]:
        ratio = self.max_ratio
        return {"node": self.node, "op": self.op, "status": self.status,
                "max_abs": self.max_abs, "ulps": self.ulps, "dtype": self.dtype,
                "max_ratio": ratio if ratio is None or np.isfinite(ratio) else str(ratio),
                "bound_at_worst": self.bound_at_worst, "sampled": self.sampled,
                "detail": self.detail}


def _with_outputs(model: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    extra = onnx.ModelProto()
    extra.CopyFrom(model)
    known = {o.name for o in extra.graph.output}
    for n in names:
        if n not in known:
            extra.graph.output.append(onnx.helper.make_empty_tensor_value_info(n))
    return extra


def _main_values(model: onnx.ModelProto) -> set[str]:
    names = {i.name for i in model.graph.input}
    for n in model.graph.node:
        names.update(o for o in n.output if o)
    return names


def _accuracy(node: ir.Node | None) -> int:
    if node is None or node.op_type != "MatMulNBits":
        return 0
    a = node.attributes.get("accuracy_level")
    return a.as_int() if a is not None else 0


def _perturbation(a: np.ndarray, level: int, absw: np.ndarray, s: np.ndarray
                  ) -> tuple[np.ndarray, float]:
    """How far rounding A (by ``accuracy_level``) may move ``a @ w``, and the unit roundoff
    of the sums."""
    if level == 2:
        return 2.0 ** -11 * s, 2.0 ** -11
    if level == 3:
        return 2.0 ** -8 * s, 2.0 ** -8
    if level >= 4:
        step = np.max(np.abs(a), axis=-1, keepdims=True) / 127.0
        return step * absw.sum(axis=0, dtype=np.float64), _ACC_U
    return np.zeros_like(s), _ACC_U


def _gamma(n: int, u: float) -> float:
    nu = n * u
    return nu / (1.0 - nu) if nu < 1 else np.inf


def _columns(n_cols: int, rows: int, k: int) -> np.ndarray:
    # one row of A (a sequence of one token) costs no more than the weight itself
    if rows * k * n_cols <= WORK or rows == 1:
        return np.arange(n_cols)
    keep = max(1, WORK // max(1, rows * k))
    return np.unique(np.linspace(0, n_cols - 1, keep).astype(np.int64))


def _weight_columns(node: ir.Node, cols: np.ndarray) -> np.ndarray:
    """The dequantized weight ``(K, len(cols))`` of a MatMulNBits, only those columns."""
    a = {k: v.as_int() for k, v in node.attributes.items() if v.type == ir.AttributeType.INT}
    k, n, bits, block = a["K"], a["N"], a.get("bits", 4), a["block_size"]
    kb = -(-k // block)
    every = len(cols) == n  # every column (one row of A): the arrays as they are, no copy
    b = storage.stored_values(node.inputs[1]).reshape(n, -1)
    s = storage.stored_values(node.inputs[2]).reshape(n, kb)
    zp_v = graph.input_value(node, 3)
    zp = None if zp_v is None else storage.stored_values(zp_v).reshape(n, -1)
    if not every:
        b, s, zp = b[cols], s[cols], None if zp is None else zp[cols]
    g_v = graph.input_value(node, 4)
    g_idx = None if g_v is None else storage.stored_values(g_v)
    return kernel.dequantize_matmul_nbits(b, s, zp, K=k, N=len(cols), bits=bits,
                                          block_size=block, g_idx=g_idx)


def _ulps(diff: np.ndarray, y1: np.ndarray, y2: np.ndarray, dtype: np.dtype) -> float | None:
    """The largest difference in units in the last place of the output type at that
    element (of the larger of the two values): "1 ulp of float16 at 72.5"."""
    if dtype not in _U or diff.size == 0:
        return None if dtype not in _U else 0.0
    at = np.unravel_index(int(np.argmax(diff)), diff.shape)
    mag = max(abs(float(y1[at])), abs(float(y2[at])))
    tiny = {np.dtype(np.float32): -126, np.dtype(np.float16): -14,
            np.dtype(ml_dtypes.bfloat16): -126}[dtype]
    mantissa = {np.dtype(np.float32): 23, np.dtype(np.float16): 10,
                np.dtype(ml_dtypes.bfloat16): 7}[dtype]
    exp = max(np.floor(np.log2(mag)) if mag > 0 else tiny, tiny)
    return float(diff[at]) / 2.0 ** (exp - mantissa)


# Terms a float32 partial sum of ``_products_above`` adds: its rounding is within γ_64(2^-24)
# (~3.8e-6) of the exact partial sum; the partial sums are added in float64
_BLOCK = 64


def _products_above(x: np.ndarray, absw: np.ndarray) -> np.ndarray:
    """An upper bound on ``x @ absw`` (float64, both non-negative; ``absw`` float32) made
    by float32 BLAS: the sum over K is cut into blocks of ``_BLOCK`` terms, each summed in
    float32 (one batched product) and the blocks' sums added in float64. With no
    cancellation a float32 sum of 64 products in any order is within γ_64 of its exact
    value (plus x's rounding to float32 and what underflow loses), so each block's result
    scaled by (1 + 2^-23)/(1 - γ_64), plus 64·2^-149·(1 + max|w|), is above it: the bound
    is the exact one looser by at most ~4e-6 of itself, whatever K, at a fraction of the
    float64 product's cost (2026-11-28: 18 of the finite bench model's 29 s of bounds were
    float64 products over a float64 copy of the weight, docs/benchmarks.md). Where
    float32 overflows, or x is not finite, float64 products."""
    rows, k = x.shape
    blocks = -(-k // _BLOCK)
    if not np.isfinite(x).all():
        return x @ absw.astype(np.float64)
    xp = np.zeros((rows, blocks * _BLOCK), np.float32)
    with np.errstate(over="ignore"):
        xp[:, :k] = x
    wp = absw if k == blocks * _BLOCK else np.concatenate(
        [absw, np.zeros((blocks * _BLOCK - k, absw.shape[1]), np.float32)])
    # (blocks, rows, 64) @ (blocks, 64, N): one float32 sum of 64 terms per block
    with np.errstate(over="ignore", invalid="ignore"):
        parts = np.matmul(xp.reshape(rows, blocks, _BLOCK).transpose(1, 0, 2),
                          wp.reshape(blocks, _BLOCK, -1))
    if not np.isfinite(parts).all():
        return x @ absw.astype(np.float64)
    gamma = _gamma(_BLOCK, 2.0 ** -24)
    tiny = _BLOCK * 2.0 ** -149 * (1.0 + float(absw.max(initial=0.0)))  # underflow's loss
    # the float64 sum of the blocks' results, and this product, round too
    scale = (1 + 2.0 ** -23) / (1 - gamma) * (1 + (blocks + 2) * 2.0 ** -52)
    return parts.sum(axis=0, dtype=np.float64) * scale + blocks * tiny


def _matmul_bound(node: ir.Node, checked_node: ir.Node | None, a1: np.ndarray,
                  a2: np.ndarray, y1: np.ndarray, y2: np.ndarray) -> NodeBound:
    name = node.name or node.outputs[0].name
    kk = int(node.attributes["K"].as_int())
    out_t = np.dtype(y1.dtype)
    if y1.shape != y2.shape or a1.shape != a2.shape or a1.shape[-1] != kk:
        return NodeBound(name, node.op_type, "beyond", detail=f"shapes differ: output "
                         f"{y2.shape} vs {y1.shape}, A {a2.shape} vs {a1.shape}")
    n_cols = y1.shape[-1]
    rows = int(np.prod(y1.shape[:-1], dtype=np.int64))
    cols = _columns(n_cols, rows, kk)
    w = _weight_columns(node, cols)  # (K, c)
    absw = np.empty(w.shape, np.float32)  # exact: a float type of at most 24 bits
    if w.dtype == np.float16:
        half.widen_into(absw, w)  # onnxruntime's Cast where proven, ~2.5x NumPy's
    else:
        np.copyto(absw, w, casting="unsafe")
    del w
    np.abs(absw, out=absw)
    a1f = a1.reshape(rows, kk).astype(np.float64)
    a2f = a2.reshape(rows, kk).astype(np.float64)
    bias_v = graph.input_value(node, 5)
    bias = np.zeros(len(cols))
    if bias_v is not None:
        b = storage.stored_values(bias_v)
        if b is None:
            return NodeBound(name, node.op_type, "unbounded",
                             detail="the bias is not constant")
        bias = np.abs(b.astype(np.float64).reshape(-1)[cols])
    n_terms = kk + (bias_v is not None)
    f1 = y1.reshape(rows, n_cols)[:, cols].astype(np.float64)
    f2 = y2.reshape(rows, n_cols)[:, cols].astype(np.float64)
    u_out, eta = _U.get(out_t, 0.0), _ETA.get(out_t, 0.0)
    # the three products in one pass over the weight: |a1 - a2|, |a1|, |a2| (rows each)
    products = _products_above(np.abs(np.concatenate([a1f - a2f, a1f, a2f])), absw)
    total = products[:rows].copy()
    for i, (a, y, fused, level) in enumerate((
            (a1f, f1, True, _accuracy(node)),
            (a2f, f2, checked_node is not None, _accuracy(checked_node))), start=1):
        s = products[i * rows:(i + 1) * rows]
        moved, u = _perturbation(a, level, absw, s)
        if fused and u_out > _ACC_U:
            # A float16/bfloat16 MatMulNBits multiplies by the float32 weight, before its
            # rounding to the output type (measured): each weight is off by at most that
            # rounding, u_out/(1-u_out)·|w| (plus half a subnormal).
            moved = moved + u_out / (1 - u_out) * s + eta * np.abs(a).sum(axis=1)[:, None]
        total += _gamma(n_terms, u) * (s + moved + bias) + moved
        # the rounding to the output type; a bias may be added after it (a second one)
        roundings = 2 if fused and bias_v is not None else 1
        total += roundings * (u_out * np.abs(y) / (1 - u_out) + eta)
    total *= 1 + 2.0 ** -40  # the bound's own float64 rounding
    diff = np.abs(f1 - f2)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(diff == 0, 0.0, diff / total)
    ratio = np.where(np.isnan(ratio), np.inf, ratio)
    worst = np.unravel_index(int(np.argmax(ratio)), ratio.shape) if ratio.size else None
    nonfinite = ~(np.isfinite(f1) & np.isfinite(f2)) & (f1 != f2)
    max_ratio = float(ratio.max()) if ratio.size else 0.0
    if nonfinite.any():
        max_ratio = np.inf
    sampled = None if len(cols) == n_cols else \
        f"sampled: {len(cols)} of {n_cols} output columns (every row)"
    levels = {_accuracy(node), _accuracy(checked_node)} - {0}
    detail = f"accuracy_level {max(levels)}: onnxruntime may round A first" if levels else ""
    full_diff = np.abs(y1.astype(np.float64) - y2.astype(np.float64))
    with np.errstate(invalid="ignore"):
        vacuous = bool(((diff > 0) & np.isinf(total)).any())
    if vacuous:  # n·u ≥ 1 (accuracy_level 3 from K = 256): the bound says nothing
        return NodeBound(name, node.op_type, "unbounded",
                         max_abs=float(np.max(full_diff)) if full_diff.size else 0.0,
                         ulps=_ulps(full_diff, y1, y2, out_t), dtype=str(out_t),
                         detail=f"no finite rounding bound for {n_terms} terms at this "
                         f"unit roundoff{'; ' + detail if detail else ''}")
    return NodeBound(
        name, node.op_type, "within" if max_ratio <= 1.0 else "beyond",
        max_abs=float(np.max(full_diff)) if full_diff.size else 0.0,
        ulps=_ulps(full_diff, y1, y2, out_t), max_ratio=max_ratio,
        bound_at_worst=None if worst is None else float(total[worst]),
        sampled=sampled, detail=detail, dtype=str(out_t))


def _gather_bound(node: ir.Node, y1: np.ndarray, y2: np.ndarray) -> NodeBound:
    name = node.name or node.outputs[0].name
    if y1.shape != y2.shape:
        return NodeBound(name, node.op_type, "beyond",
                         detail=f"shape {y2.shape} vs {y1.shape}")
    same = (y1.view(np.uint8).reshape(-1) == y2.view(np.uint8).reshape(-1)).all() \
        if y1.dtype == y2.dtype else False
    diff = np.abs(y1.astype(np.float64) - y2.astype(np.float64))
    return NodeBound(name, node.op_type, "within" if same else "beyond",
                     max_abs=float(diff.max()) if diff.size else 0.0,
                     ulps=_ulps(diff, y1, y2, np.dtype(y1.dtype)),
                     max_ratio=0.0 if same else np.inf, bound_at_worst=0.0,
                     detail="" if same else "a gather sums nothing: its bound is 0",
                     dtype=str(y1.dtype))


class Bounds(list):
    """``NodeBound`` s, and ``exposed``: each graph output's largest difference between
    the two models in the runs that exposed the nodes' values. A runtime whose outputs
    change when values are exposed (measured: onnxruntime 1.32, float16 MatMulNBits with
    accuracy_level 4 and bias Adds, off by 4.4 in a plain run, 0.04 exposed) is not
    described by those runs: a check compares this with its own run's difference."""

    exposed: dict[str, float]

    def __init__(self) -> None:
        super().__init__()
        self.exposed = {}


def _max_abs(a: np.ndarray, b: np.ndarray) -> float:
    return max_abs_difference(a, b)


def _plan(checked: onnx.ModelProto, original_ir: ir.Model) -> tuple[Bounds, list[ir.Node]]:
    """The original's fused nodes that cannot be bounded (as ``NodeBound`` s) and those
    that can (each run on onnxruntime in both models, its A and output exposed)."""
    sites = [s for s in graph.walk(original_ir) if read.is_fused(s.node)]
    out = Bounds()
    have = _main_values(checked) if sites else set()
    wanted: list[ir.Node] = []
    for s in sites:
        node = s.node
        name = node.name or node.outputs[0].name
        if s.graph != "main":
            out.append(NodeBound(name, node.op_type, "unbounded", hidden=True,
                                 detail=f"inside {s.graph}: its values are not outputs"))
            continue
        if node.outputs[0].name not in have:
            out.append(NodeBound(name, node.op_type, "unbounded", detail=f"its output "
                                 f"{node.outputs[0].name} is not in the checked model"))
            continue
        if node.op_type == "MatMulNBits" and not read.read(node, s.opsets).constant:
            out.append(NodeBound(name, node.op_type, "unbounded",
                                 detail="its weight is not constant"))
            continue
        wanted.append(node)
    return out, wanted


def _names(wanted: list[ir.Node]) -> list[str]:
    """What the bounds read: a MatMulNBits' A and output, a GatherBlockQuantized's output
    (its first input is the table)."""
    return sorted({v for n in wanted for v in (
        (n.inputs[0].name, n.outputs[0].name) if n.op_type == "MatMulNBits"
        else (n.outputs[0].name,))})


def bound_values(checked: onnx.ModelProto, original: onnx.ModelProto,
                 original_ir: ir.Model) -> dict[int, list[str]]:
    """The values ``node_bounds`` reads from onnxruntime's run of each model (keyed by
    ``id`` of the model's proto): a check may keep them in the runs it compares, and hand
    those to ``node_bounds`` (``ran``) in place of two more runs."""
    names = _names(_plan(checked, original_ir)[1])
    return {id(proto): [v for v in names if v in _main_values(proto)]
            for proto in (original, checked)}


def node_bounds(checked: onnx.ModelProto, original: onnx.ModelProto,
                checked_ir: ir.Model, original_ir: ir.Model,
                feeds: Mapping[str, np.ndarray], checked_dir: Path | None = None,
                original_dir: Path | None = None,
                ran: Mapping[int, Mapping[str, np.ndarray]] | None = None) -> list[NodeBound]:
    """Every fused node of the original compared on onnxruntime between the two models,
    each against its bound. Nodes outside the main graph (subgraphs, functions) cannot be
    exposed as outputs: they are "unbounded". ``ran``: onnxruntime's runs of the two models
    (by ``id`` of their protos) that kept ``bound_values``; without them, each model runs
    once more with those values exposed."""
    out, wanted = _plan(checked, original_ir)
    if not wanted:
        return out
    names = _names(wanted)
    runs = []
    for proto, where in ((original, original_dir), (checked, checked_dir)):
        exposed = [v for v in names if v in _main_values(proto)]
        kept = (ran or {}).get(id(proto))
        if kept is not None and all(v in kept for v in exposed):
            runs.append(kept)
            continue
        try:
            # beside the reference evaluator's runs at LLM size: pieces of its share
            runs.append(runners.run_ort_beside(for_ort(_with_outputs(proto, exposed))[0],
                                               feeds, (), 0, external_dir=where))
        except runners.RuntimeFailure as e:
            out += [NodeBound(n.name or n.outputs[0].name, n.op_type, "unbounded",
                              detail=f"onnxruntime cannot run it: {e}") for n in wanted]
            return out
    got1, got2 = runs
    for o in original.graph.output:
        if o.name in got1 and o.name in got2:
            out.exposed[o.name] = _max_abs(np.asarray(got1[o.name]), np.asarray(got2[o.name]))
    checked_producers = {o.name: n for g in checked_ir.graphs() for n in g for o in n.outputs}
    for node in wanted:
        try:
            out.append(_one(node, got1, got2, checked_producers))
        except (KernelError, ValueError, KeyError) as e:  # a finding, never a traceback
            out.append(NodeBound(node.name or node.outputs[0].name, node.op_type,
                                 "unbounded", detail=f"{type(e).__name__}: {e}"))
    return out


def _one(node: ir.Node, got1: dict[str, np.ndarray], got2: dict[str, np.ndarray],
         checked_producers: dict[str, ir.Node]) -> NodeBound:
    a_name, y_name = node.inputs[0].name, node.outputs[0].name
    y1, y2 = got1[y_name], got2[y_name]
    if node.op_type == "GatherBlockQuantized":
        return _gather_bound(node, y1, y2)
    a1, a2 = got1[a_name], got2.get(a_name)
    if a2 is None:
        return NodeBound(node.name or y_name, node.op_type, "unbounded",
                         detail=f"its input {a_name} is not in the checked model")
    twin = checked_producers.get(y_name)
    twin = twin if twin is not None and read.is_fused(twin) else None
    return _matmul_bound(node, twin, a1, a2, y1, y2)
