"""dqtool's reference evaluator run node by node, each value freed after its last use.

onnx's ``ReferenceEvaluator.run`` keeps every value of a run, and every initializer from
the start: an LLM-shaped model's dequantized weights, all at once (13.9 GiB for the 1.8 GB
model of bench/bench_fused.py). Here the same operator instances run in the same order on
the same inputs, so every value is the one a whole run computes; what differs is what is
held: a large initializer is read from its file (or converted from the protobuf) when a
node first needs it, and every value, initializers included, is dropped after the last node
that reads it (``liveness``). A node with subgraphs is given the values so far, as onnx's
run gives them (its subgraphs read the scopes around them).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
from onnx import external_data_helper, helper

from dqtool import reference_evaluator, storage
from dqtool.checking import liveness

# An initializer of more bytes than this is read when first used and freed after its last
# use; smaller ones stay with the evaluator, as in a whole run.
LAZY_BYTES = 1 << 16

Progress = Callable[[int, int], None]


def _stored_bytes(t: onnx.TensorProto) -> int:
    if external_data_helper.uses_external_data(t):
        return 1 << 62  # in a file: never read ahead
    return t.ByteSize()


class StreamedReference:
    """``session(feeds, outputs)`` over ``proto`` (see the module docstring)."""

    def __init__(self, proto: onnx.ModelProto, external_dir: Path | None,
                 new_ops: list[type], progress: Progress | None = None) -> None:
        self.external_dir = external_dir
        self.progress = progress
        stripped = onnx.ModelProto()
        stripped.CopyFrom(proto)
        self.lazy: dict[str, onnx.TensorProto] = {}
        kept = []
        for t in stripped.graph.initializer:
            if _stored_bytes(t) > LAZY_BYTES:
                self.lazy[t.name] = t
            else:
                kept.append(t)
        if self.lazy:
            del stripped.graph.initializer[:]
            stripped.graph.initializer.extend(kept)
            inputs = {i.name for i in stripped.graph.input}
            stripped.graph.input.extend(
                helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                for t in self.lazy.values() if t.name not in inputs)
        self.evaluator = reference_evaluator(stripped, new_ops=new_ops)
        self.outputs = [o.name for o in proto.graph.output]

    def _load(self, name: str) -> np.ndarray:
        t = self.lazy[name]
        if external_data_helper.uses_external_data(t):
            base = "" if self.external_dir is None else str(self.external_dir)
            return storage.tensor_array(ir.serde.deserialize_tensor(t, base))
        return onnx.numpy_helper.to_array(t)

    def __call__(self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None
                 ) -> dict[str, np.ndarray]:
        names = list(outputs) if outputs is not None else self.outputs
        ev = self.evaluator
        nodes = ev.rt_nodes_
        live = liveness.Liveness.of([n.onnx_node for n in nodes], keep=names)
        results: dict[str, Any] = {"": None}
        results.update(ev.rt_inits_)
        results.update(feeds)
        for i, node in enumerate(nodes):
            for name in liveness.reads(node.onnx_node):
                if name not in results and name in self.lazy:
                    results[name] = self._load(name)
            missing = [n for n in node.input if n not in results]
            if missing:
                raise RuntimeError(f"Unable to find input {missing[0]!r} for node "
                                   f"{node.op_type} ({node.onnx_node.name!r})")
            inputs = [results[n] for n in node.input]
            got = node.run(*inputs, context=results) if node.need_context() \
                else node.run(*inputs)
            for name, value in zip(node.output, got, strict=False):
                results[name] = value
            for name in live.dying[i]:
                if name:
                    results.pop(name, None)
            if self.progress is not None:
                self.progress(i + 1, len(nodes))
        for name in names:
            if name not in results and name in self.lazy:
                results[name] = self._load(name)
        return {n: results[n] for n in names}
