"""``dqtool.fold``: fold constant dequantization into initializers, for models of any size."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path

import onnx_ir as ir

from dqtool import codecs, graph, handwritten, registry, storage, types
from dqtool.errors import UsageError
from dqtool.folding.dequantize_fold_pass import DequantizeFoldPass
from dqtool.folding.report import FoldedNode, FoldReport
from dqtool.folding.selection import Selection

DTYPES = ("keep", "float32", "float16", "bfloat16")
_DTYPE_NAMES = {"keep": "keep", "float32": "float", "float": "float", "float16": "float16",
                "bfloat16": "bfloat16"}


def default_output(src: str | os.PathLike) -> Path:
    """``<stem>.folded.onnx`` next to the input."""
    p = Path(src)
    return p.with_name(f"{p.stem}.folded.onnx")


def fold(
    model_or_path: ir.Model | str | os.PathLike,
    out: str | os.PathLike | None = None,
    *,
    op_types: Iterable[str] | str | None = None,
    include: Iterable[str] | str | None = None,
    exclude: Iterable[str] | str | None = None,
    x_types: Iterable[str] | str | None = None,
    min_elements: int = 0,
    dtype: str = "keep",
    dry_run: bool = False,
    external_data: bool | None = None,
    shard_size: int | None = None,
    in_place: bool = False,
    progress: Callable | None = None,
    prepack_guard: bool = True,
) -> FoldReport:
    """Replace every selected constant DequantizeLinear by a constant holding its output.

    ``model_or_path``: a path (loaded with external data memory-mapped) or an
    ``onnx_ir.Model``, which is folded in place (a dry run works on a clone). With a path,
    the result is written to ``out`` (default ``<stem>.folded.onnx`` next to the input;
    the input itself only with ``in_place``); with a model, only when ``out`` is given.
    Folded values are computed while saving, chunk by chunk. ``external_data``: True
    forces external data, None (default) uses it when the input did or the output would
    pass ~1.8 GB. ``shard_size`` splits external data into files of at most that many
    bytes. ``progress(tensor, info)`` is called per tensor written as external data.
    ``dtype`` other than "keep" stores ``Cast(y, dtype)`` of each node's output ``y``.
    ``prepack_guard`` puts an Identity between a folded weight and the MatMul/Gemm/RNN
    input onnxruntime would prepack, so its outputs stay bit-identical to the original's.

    Returns a ``FoldReport``; ``report.model`` is the folded model, ``report.exit_code``
    is 1 when a selected constant node had to be refused.
    """
    started = time.perf_counter()
    _refuse_bad_options(dtype)
    writing = storage.Writing(external_data or None, shard_size, progress)
    selection = Selection.from_options(op_types=op_types, include=include, exclude=exclude,
                                       x_types=x_types, min_elements=min_elements)
    req = storage.request(model_or_path, None if dry_run else out,
                          in_place=in_place and not dry_run,
                          default=None if dry_run else default_output)

    def transform(model: ir.Model, _early: object) -> tuple[FoldReport, ir.Model]:
        if req.path is None and dry_run:
            model = model.clone()
        return _fold_model(model, req, selection, dtype, dry_run, prepack_guard), model

    report, _, written = storage.Job(transform, writing).run(model_or_path, req)
    if req.out is not None:
        report.files = [str(f) for f in written]
        report.external_data = len(written) > 1  # none when every tensor stayed inline
    report.seconds = time.perf_counter() - started
    return report


def _fold_model(model: ir.Model, req: storage.Request, selection: Selection, dtype: str,
                dry_run: bool, prepack_guard: bool) -> FoldReport:
    before = storage.tensor_bytes(model)
    # Families that fold by rewriting first (MatMulNBits / GatherBlockQuantized into
    # DequantizeLinear + MatMul / Gather, exactly), then the pass folds the result.
    # Those nodes answer to --op-types by their own op type too (fused.fold.why_not).
    preparing = [f for f, _ in registry.fold_prepares()]
    own_types = {s.node.op_type for s in graph.walk(model)
                 if registry.owner(s.node.domain, s.node.op_type) in preparing}
    prepared, prepared_left, made, prefolded = _prepare(model, selection,
                                                        _DTYPE_NAMES[dtype])
    # Dequantization written by hand (Cast → Sub → Mul) becomes its exact DequantizeLinear
    # first, where the selection picks it; the pass folds it like any other.
    hand, hand_left, hand_made = handwritten.insert_in_place(
        model, lambda dq: selection.why_not(dq, codecs.read_node(dq, {"": dq.version or 0})))
    made = made + hand_made
    if made:
        selection = replace(selection, made=frozenset(made))
    fold_pass = DequantizeFoldPass(selection, _DTYPE_NAMES[dtype], prepack_guard)
    fold_pass(model)
    model.ir_version = storage.lowest_ir_version(model)
    return FoldReport(
        input=None if req.path is None else str(req.path),
        output=None if req.out is None else str(req.out),
        dry_run=dry_run, dtype=dtype, folded=prefolded + fold_pass.folded, left=fold_pass.left,
        removed=fold_pass.removed, kept=fold_pass.kept, guarded=fold_pass.guarded,
        fed_op_types=fold_pass.fed_op_types | own_types,
        bytes_before=before,
        bytes_after=storage.tensor_bytes(model), ir_version=model.ir_version,
        opset_imports=dict(model.opset_imports), model=None if dry_run else model,
        prepared=prepared, prepared_left=prepared_left, handwritten=hand,
        handwritten_left=hand_left,
    )


def _refuse_bad_options(dtype: str) -> None:
    if dtype not in _DTYPE_NAMES:
        raise UsageError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")


def _prepare(model: ir.Model, selection: Selection, store: str | None
             ) -> tuple[list[str], list[tuple[str, str]], list[str], list[FoldedNode]]:
    done: list[str] = []
    left: list[tuple[str, str]] = []
    made: list[str] = []
    folded: list[FoldedNode] = []
    dtype = None if store in (None, "keep") else types.by_name(store).dtype
    for _, prepare in registry.fold_prepares():
        prepared = prepare(model, selection, dtype)
        done += prepared.rewritten
        left += prepared.left
        made += prepared.made
        folded += prepared.folded
    return done, left, made, folded
