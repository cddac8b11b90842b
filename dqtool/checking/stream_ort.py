"""A model run on onnxruntime in consecutive pieces, the values between them carried across.

onnxruntime runs every DequantizeLinear of constants before anything else, whatever the
execution order asked (docs/benchmarks.md, 2026-11-28: the 1.8 GB model of
bench/bench_fused.py converted to DequantizeLinear + MatMul held 14.8 GB in one session).
So a large model is cut into pieces of about ``PIECE_BYTES`` of weights (``liveness.cut``);
each piece is a model of its own (its nodes, the initializers they read, left in their
files, its inputs the values earlier pieces made, its outputs those later pieces or the
caller read) run in a session of its own that is closed before the next one opens. A piece
holds its own weights and the activations crossing it; every carried value is dropped
after the last piece that reads it.

A piece boundary makes a value a graph output, and onnxruntime rounds an output to its
type: where its whole-graph run computes a float16 value in float32 (a node with no float16
CPU kernel feeding another; ``runners.roundings_skipped``) and never rounds it, a boundary
there rounds it, as the model's arithmetic says. Pieces end where the values crossing are
made by nodes that compute in their own type (``_clean``) when such a place lies within
twice the budget, else where the budget ends; the run says how many values it rounded so.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper

from dqtool.checking import liveness

# Weights per piece, counted as ``liveness.value_bytes`` (4 bytes an element).
PIECE_BYTES = 256 << 20
# The share of it a run beside the reference evaluator's takes (``check --against`` at LLM
# size): a converted model's piece holds its weights dequantized twice (float16, and the
# float32 copy onnxruntime's MatMul reads), beside the reference's own weights. 2026-11-28,
# the finite bench model: 971 MB peak with 256 MiB pieces; the time the same with 128 MiB
# (docs/benchmarks.md).
BESIDE_SHARE = 0.5

Progress = Callable[[int, int], None]
OpenSession = Callable[[onnx.ModelProto], Any]  # a piece's model → an onnxruntime session

_HALF = frozenset({onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16})
# Types onnxruntime's Python API cannot hand back as NumPy arrays: never carried across.
_NOT_CARRIED = frozenset(
    getattr(onnx.TensorProto, name) for name in (
        "BFLOAT16", "INT4", "UINT4", "INT2", "UINT2", "FLOAT4E2M1", "FLOAT6E2M3", "FLOAT6E3M2",
        "FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ", "FLOAT8E8M0")
    if hasattr(onnx.TensorProto, name))


@functools.lru_cache(maxsize=1)
def _half_kernels() -> frozenset[tuple[str, str]]:
    """(domain, op) of the CPU kernels onnxruntime registers for a float16 type: their
    outputs are computed, and stored, in float16."""
    try:
        from onnxruntime.capi import _pybind_state as c

        return frozenset((k.domain or "", k.op_name) for k in c.get_all_opkernel_def()
                         if k.provider == "CPUExecutionProvider" and any(
                             "float16" in t for ts in k.type_constraints.values()
                             for t in ts))
    except Exception:  # an internal listing: without it every boundary is judged unclean
        return frozenset()


def _types(proto: onnx.ModelProto) -> dict[str, int]:
    """Element types onnx's inference knows for the main graph's values (none for what
    follows an operator it has no schema for)."""
    bare = onnx.ModelProto()
    bare.CopyFrom(proto)
    inits = list(bare.graph.initializer)
    del bare.graph.initializer[:]
    bare.graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                            for t in inits)
    with contextlib.suppress(Exception):  # a hint: what it cannot type stays unknown
        bare = onnx.shape_inference.infer_shapes(bare)
    return {v.name: v.type.tensor_type.elem_type
            for v in [*bare.graph.input, *bare.graph.value_info, *bare.graph.output]
            if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type}


def _unclean(nodes: Sequence[onnx.NodeProto], live: liveness.Liveness, keep: set[str],
             types: dict[str, int]) -> tuple[list[set[str]], list[set[str]]]:
    """For each node: the values a boundary after it would carry, and those of them that
    may be float16 computed in float32 by a whole run (a float16 or untyped value made by
    a node with no float16 CPU kernel)."""
    kernels = _half_kernels()
    producer: dict[str, onnx.NodeProto] = {}
    crossing: list[set[str]] = []
    unclean: list[set[str]] = []
    open_: set[str] = set()
    for i, node in enumerate(nodes):
        for o in node.output:
            if o:
                producer[o] = node
                open_.add(o)
        open_ = {v for v in open_ if live.last_use.get(v, -1) > i or v in keep}
        crossing.append(set(open_))
        unclean.append({v for v in open_
                        if types.get(v, onnx.TensorProto.FLOAT16) in _HALF
                        and (producer[v].domain or "", producer[v].op_type) not in kernels})
    return crossing, unclean


class Stopped(Exception):
    """A streamed run asked to stop (``StreamedOrt.stop``)."""


class StreamedOrt:
    """``session(feeds, outputs)`` running ``proto`` piece by piece (module docstring)."""

    def __init__(self, proto: onnx.ModelProto, open_session: OpenSession,
                 progress: Progress | None = None, share: float = 1.0,
                 stop: threading.Event | None = None) -> None:
        self.proto = proto
        self.stop = stop  # set: the run ends at the next piece (``Stopped``)
        self.share = share  # of PIECE_BYTES (as it is when the run starts) a piece takes
        self.open_session = open_session
        self.progress = progress
        self.outputs = [o.name for o in proto.graph.output]
        self.rounded = 0  # float16 values a boundary rounded that may not be in a whole run
        self._types: dict[str, int] | None = None

    def types(self) -> dict[str, int]:
        """``_types`` of the model, inferred once (the pieces and ``neutral`` both read it:
        onnx's shape inference over the whole graph)."""
        if self._types is None:
            self._types = _types(self.proto)
        return self._types

    def _pieces(self, keep: set[str]) -> tuple[list[liveness.Piece], list[set[str]],
                                                   list[set[str]]]:
        nodes = list(self.proto.graph.node)
        live = liveness.Liveness.of(nodes, keep=keep)
        weights = {t.name: liveness.value_bytes(t) for t in self.proto.graph.initializer}
        types = self.types()
        crossing, unclean = _unclean(nodes, live, keep, types)
        clean = [not u for u in unclean]
        allowed = [all(types.get(v) not in _NOT_CARRIED for v in c) for c in crossing]
        budget = max(1, int(PIECE_BYTES * self.share))
        return (liveness.cut(nodes, weights, budget, clean, allowed), crossing,
                unclean)

    def _piece_model(self, piece: liveness.Piece, available: Mapping[str, np.ndarray],
                     wanted: Sequence[str]) -> onnx.ModelProto:
        g = self.proto.graph
        nodes = g.node[piece.start:piece.stop]
        made = {o for n in nodes for o in n.output if o}
        read = {r for n in nodes for r in liveness.reads(n)} - made
        inits = [t for t in g.initializer if t.name in read]
        sparse = [s for s in g.sparse_initializer if s.values.name in read]
        constants = {t.name for t in inits} | {s.values.name for s in sparse}
        inputs = [helper.make_tensor_value_info(
            name, helper.np_dtype_to_tensor_dtype(available[name].dtype),
            list(available[name].shape)) for name in sorted(read - constants)
            if name in available]
        graph = helper.make_graph(list(nodes), f"{g.name}_piece{piece.start}", inputs,
                                  [onnx.ValueInfoProto(name=w) for w in wanted], inits,
                                  sparse_initializer=sparse)
        model = helper.make_model(graph, opset_imports=list(self.proto.opset_import),
                                  functions=list(self.proto.functions))
        model.ir_version = self.proto.ir_version
        return model

    def neutral(self, names: Sequence[str]) -> list[str]:
        """Those of ``names`` that onnxruntime holds in their own type whether or not they
        are outputs, so that keeping them changes nothing it computes: a graph input, a
        value not float16/bfloat16, a value made by a node with a float16 CPU kernel
        (other than a Cast), or one every reader of which has such a kernel (not a Cast:
        onnxruntime then rounds it for them). Any other float16 value its graph may keep in float32
        and never round, where making it an output would round it (2026-11-28, the
        reviewer's case: `Cast → MatMulNBits → Add → MatMulNBits → Cast`, onnxruntime's
        difference between the models 0.0963 plain, 0.125 with the values kept)."""
        kernels = _half_kernels()
        types = self.types()
        inputs = {i.name for i in self.proto.graph.input}
        producer = {o: n for n in self.proto.graph.node for o in n.output if o}
        readers: dict[str, list[onnx.NodeProto]] = {}
        for n in self.proto.graph.node:
            for r in liveness.reads(n):
                readers.setdefault(r, []).append(n)

        def half(n: onnx.NodeProto) -> bool:
            # a Cast is no witness: onnxruntime drops a Cast pair around a value it keeps
            # in float32 (MatMul → Cast to float16 → Cast to float: never rounded)
            return (n.domain or "", n.op_type) in kernels and n.op_type != "Cast"

        def kept_alike(v: str) -> bool:
            p = producer.get(v)
            if v in inputs:
                return True
            if p is None:
                return False
            if types.get(v) is not None and types[v] not in _HALF:
                return True
            return half(p) or \
                (bool(readers.get(v)) and all(map(half, readers[v])))

        return [v for v in names if kept_alike(v)]

    def __call__(self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None,
                 optional: Sequence[str] = (), budget: int = 0) -> dict[str, np.ndarray]:
        """``optional``: values kept too, those of them keeping changes nothing onnxruntime
        computes (``neutral``), while they hold at most ``budget`` bytes in all; past it,
        none of them. The caller finds the others missing."""
        names = list(outputs if outputs is not None else self.outputs)
        # the pieces and the values' lives as for the outputs alone: what is kept in
        # passing moves no boundary and frees nothing later than it would be freed
        pieces, crossing, unclean = self._pieces(set(names))
        live = liveness.Liveness.of(list(self.proto.graph.node), keep=names)
        made_here = {o for n in self.proto.graph.node for o in n.output if o} | set(feeds)
        extra = [o for o in self.neutral(list(dict.fromkeys(optional)))
                 if o not in names and o in made_here]
        names += extra
        keep = set(names)
        values: dict[str, np.ndarray] = dict(feeds)
        self.rounded = 0
        for k, piece in enumerate(pieces):
            if self.stop is not None and self.stop.is_set():
                raise Stopped("stopped: the check ended elsewhere")
            after = crossing[piece.stop - 1]
            made = {o for n in self.proto.graph.node[piece.start:piece.stop]
                    for o in n.output if o}
            wanted = sorted(v for v in made if v in after or v in keep)
            if k < len(pieces) - 1:
                self.rounded += len(unclean[piece.stop - 1])
            model = self._piece_model(piece, values, wanted)
            session = self.open_session(model)
            got = session({i.name: values[i.name] for i in model.graph.input}, wanted)
            del session, model
            values.update(got)
            for i in range(piece.start, piece.stop):
                for name in live.dying[i]:
                    if name not in keep:
                        values.pop(name, None)
            del got
            if extra and sum(values[o].nbytes for o in extra if o in values) > budget:
                for o in extra:  # over the budget: kept no longer, freed as it would be
                    keep.discard(o)
                    if live.last_use.get(o, -1) < piece.stop:
                        values.pop(o, None)
                names = names[:len(names) - len(extra)]
                extra = []
            liveness.release_freed()  # the piece's session and weights, back to the system
            if self.progress is not None:
                self.progress(k + 1, len(pieces))
        return {n: values[n] for n in names}
