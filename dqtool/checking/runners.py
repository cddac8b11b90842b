"""The two runtimes a check uses: onnxruntime and dqtool's reference evaluator.

onnxruntime always runs on CPU with every graph optimization disabled: its default level
fuses DequantizeLinear→MatMul into MatMulNBits and moves the outputs it is meant to judge.
onnxruntime is imported only here, and only when a check runs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from dqtool.checking import liveness, ref_ops, stream_ort, stream_ref
from dqtool.checking.models import EXTERNAL_FOLDER_KEY, in_memory_container
from dqtool.messages import one_line

ORT_LEVEL = "ORT_DISABLE_ALL"
ORT_PROVIDER = "CPUExecutionProvider"


class RuntimeFailure(Exception):
    """A runtime could not load or run a model; the message is one line, ``detail`` the
    runtime's own whole message (where a caller looks for a limit it names)."""

    def __init__(self, message: str, detail: str | None = None,
                 unsupported: bool = False) -> None:
        super().__init__(message)
        self.detail = message if detail is None else detail
        # the runtime has no implementation of what the model asks (a kernel's
        # NotImplementedError): a gap to report, not a wrong result
        self.unsupported = unsupported


def _first_line(e: BaseException) -> str:
    return one_line(e, 300)


def _failure(e: BaseException) -> RuntimeFailure:
    return RuntimeFailure(_first_line(e), str(e), isinstance(e, NotImplementedError))


@dataclass(frozen=True)
class Runtime:
    name: str  # "onnxruntime" or "reference"
    description: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description}


def ort_runtime() -> Runtime:
    try:
        import onnxruntime as ort
    except ImportError as e:  # a broken install must not hide the kernel-only result
        return Runtime("onnxruntime", f"unavailable ({_first_line(e)})")
    # Imported here: the CPU-path probe loads onnxruntime, which a check that never runs it
    # (a refused request) must not pay for.
    from dqtool.runtimes import cpu_path

    return Runtime("onnxruntime", f"onnxruntime {ort.__version__}, {ORT_PROVIDER}, "
                   f"graph optimization {ORT_LEVEL}; CPU path "
                   f"{cpu_path.probe().description}")


def reference_runtime() -> Runtime:
    return Runtime("reference", f"dqtool.reference_evaluator (onnx {onnx.__version__} "
                   "ReferenceEvaluator, every Q/DQ dialect on dqtool's kernel)")


Session = Callable[[Mapping[str, np.ndarray], Sequence[str] | None], dict[str, np.ndarray]]


def _session(sess: Any, all_outputs: list[str]) -> Session:
    """``session(feeds, outputs)`` over either runtime's session object (both have
    ``run(names, feeds)``); a failure becomes a RuntimeFailure."""

    def run(feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None
            ) -> dict[str, np.ndarray]:
        names = list(outputs) if outputs is not None else all_outputs
        try:
            values = sess.run(names, dict(feeds))
        except Exception as e:
            raise _failure(e) from None
        return dict(zip(names, (np.asarray(v) for v in values), strict=True))

    return run


def _options(ort: Any, external_dir: Path | None) -> Any:
    """Session options every check's onnxruntime session has: CPU graph as written
    (``ORT_DISABLE_ALL``), quiet (failures reach us as exceptions), and with
    ``external_dir`` the model's external tensors read from that folder."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 4
    if external_dir is not None:
        so.add_session_config_entry(EXTERNAL_FOLDER_KEY, str(external_dir))
    return so


def _ort_options(external_dir: Path | None) -> tuple[Any, Any]:
    try:
        import onnxruntime as ort
    except ImportError as e:
        raise RuntimeFailure(f"onnxruntime cannot be imported: {_first_line(e)}") from None
    so = _options(ort, external_dir)
    # Without the arena, a run's values go back to the system when freed (results never
    # depend on the allocator).
    so.enable_cpu_mem_arena = False
    # Nodes in the order that frees values soonest: the default order ran all 500 weight
    # DequantizeLinear of a 2.4 GB model first (11.6 GB held; 2.4 GB this way). The order
    # never changes a value.
    so.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    return ort, so


def _whole_ort(model: onnx.ModelProto, external_dir: Path | None) -> Session:
    ort, so = _ort_options(external_dir)
    try:
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=[ORT_PROVIDER])
    except Exception as e:  # onnxruntime raises its own exception types
        raise _failure(e) from None
    return _session(sess, [o.name for o in sess.get_outputs()])


# Initializers handed to onnxruntime from memory (``ort_session_from_memory``): the types
# it maps from NumPy
_FROM_MEMORY = (np.dtype(np.uint8), np.dtype(np.float16), np.dtype(np.float32))


def ort_session_from_memory(model: onnx.ModelProto, arrays: Mapping[str, np.ndarray],
                            threads: int = 0) -> Session:
    """An onnxruntime session (``ort_session``'s options) of ``model`` with ``arrays`` as
    initializers, handed over in memory where onnxruntime maps their type (read in place:
    they must outlive the session's runs), else copied into the model; ``threads``: its
    intra-op threads (0: onnxruntime's choice). Serializing a 50 MB probe's arrays into
    its model took longer than the session's own creation (2026-11-28,
    docs/benchmarks.md)."""
    ort, options = _ort_options(None)
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1 if threads == 1 else 0
    names, values = [], []
    for name, array in arrays.items():
        if array.dtype in _FROM_MEMORY and array.flags.c_contiguous:
            model.graph.initializer.append(_in_memory(name, array))
            names.append(name)
            values.append(ort.OrtValue.ortvalue_from_numpy(array))
        else:
            model.graph.initializer.append(onnx.numpy_helper.from_array(array, name))
    if names:
        options.add_external_initializers(names, values)
    try:
        sess = ort.InferenceSession(model.SerializeToString(), options,
                                    providers=[ORT_PROVIDER])
    except Exception as e:  # onnxruntime raises its own exception types
        raise _failure(e) from None
    return _session(sess, [o.name for o in sess.get_outputs()])


def _in_memory(name: str, array: np.ndarray) -> onnx.TensorProto:
    """An initializer whose data onnxruntime is given from memory: external, its location
    a name only (never read: ``add_external_initializers`` supplies it)."""
    t = onnx.TensorProto(name=name, dims=array.shape,
                         data_type=onnx.helper.np_dtype_to_tensor_dtype(array.dtype),
                         data_location=onnx.TensorProto.EXTERNAL)
    t.external_data.extend(onnx.StringStringEntryProto(key=k, value=v) for k, v in (
        ("location", "in-memory"), ("offset", "0"), ("length", str(array.nbytes))))
    return t


def ort_session(model: onnx.ModelProto, external_dir: Path | None = None) -> Session:
    """An onnxruntime session for several runs, ``session(feeds, outputs)`` (a large model
    loads once); with ``external_dir`` the model's external tensors are left in their files
    and onnxruntime reads them from that folder (only the graph is serialized). A model
    past ``STREAM_BYTES`` of weights runs in pieces, one session each (``stream_ort``)."""
    if streams(model):
        _ort_options(external_dir)  # onnxruntime missing: the same failure, at once
        return _streamed(stream_ort.StreamedOrt(
            model, lambda piece: _whole_ort(piece, external_dir),
            _reporter("onnxruntime", model)))
    return _whole_ort(model, external_dir)


# A model whose main-graph initializers pass this many bytes (``liveness.value_bytes``: 4
# an element, what they may cost dequantized) runs streamed on both runtimes: node by node
# on the reference evaluator, in pieces on onnxruntime. Below it a whole run holds little.
STREAM_BYTES = 256 << 20


def streams(model: onnx.ModelProto) -> bool:
    return sum(liveness.value_bytes(t) for t in model.graph.initializer) > STREAM_BYTES


def _streamed(run: Callable[..., dict[str, np.ndarray]]) -> Session:
    def session(feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None
                ) -> dict[str, np.ndarray]:
        try:
            return run(feeds, outputs)
        except RuntimeFailure:
            raise
        except Exception as e:
            raise _failure(e) from None

    return session


# Where a streamed run reports its pieces: ``progress(text)``; set by ``reporting``.
_PROGRESS: list[Callable[[str], None]] = []


class reporting:
    """Streamed runs report ``runtime model: done/total`` to ``callback`` meanwhile."""

    def __init__(self, callback: Callable[[str], None] | None) -> None:
        self.callback = callback

    def __enter__(self) -> None:
        if self.callback is not None:
            _PROGRESS.append(self.callback)

    def __exit__(self, *exc: object) -> None:
        if self.callback is not None:
            _PROGRESS.remove(self.callback)


def _reporter(runtime: str, model: onnx.ModelProto) -> Callable[[int, int], None] | None:
    if not _PROGRESS:
        return None
    callback = _PROGRESS[-1]
    name = model.graph.name or "model"
    unit = "pieces" if runtime == "onnxruntime" else "nodes"
    step = {"n": -1.0}

    def report(done: int, total: int) -> None:
        # at most ~100 lines a run: every piece, every 1% of the nodes
        if done == total or done >= step["n"] + total / 100:
            step["n"] = done
            callback(f"{runtime}, graph {name}: {done}/{total} {unit}")

    return report


def ort_graph(model: onnx.ModelProto, external_dir: Path | None = None
              ) -> onnx.ModelProto | None:
    """The graph onnxruntime runs for ``model`` (on CPU, ``ORT_DISABLE_ALL``): what it saves
    as its optimized model, with the nodes and casts its session inserted (tensors left out:
    written to a temporary file beside it and not read). None where it cannot say."""
    import tempfile

    try:
        import onnxruntime as ort
    except ImportError:
        return None
    with tempfile.TemporaryDirectory(prefix="dqtool-ort-graph-") as tmp:
        so = _options(ort, external_dir)
        so.optimized_model_filepath = str(Path(tmp) / "graph.onnx")
        so.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                    "tensors.bin")
        so.add_session_config_entry(
            "session.optimized_model_external_initializers_min_size_in_bytes", "0")
        try:
            ort.InferenceSession(model.SerializeToString(), so, providers=[ORT_PROVIDER])
            return onnx.load(str(Path(tmp) / "graph.onnx"), load_external_data=False)
        except Exception:  # no graph is an answer too (the caller says so)
            return None


# onnxruntime's name for a value its session computes in float32 in place of a float16
# one (its CPU provider lacks the float16 kernel); the Cast it would put back is dropped
# where the next reader computes in float32 too.
_FLOAT32_PREFIX = "InsertedPrecisionFreeCast_"
_HALF = (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)


def roundings_skipped(model: onnx.ModelProto, ran: onnx.ModelProto) -> list[str]:
    """The float16/bfloat16 values ``model``'s main graph computes that onnxruntime's graph
    of it (``ort_graph``) never makes: it computes them in float32 (its own
    ``InsertedPrecisionFreeCast_`` values) or reads a Cast's float32 input in place of the
    Cast's rounded output, so the model's roundings to float16 never happen."""
    names = {v for n in ran.graph.node for v in n.output} | \
        {i.name for i in ran.graph.input} | {t.name for t in ran.graph.initializer}
    skipped = []
    for node in model.graph.node:
        half_cast = node.op_type == "Cast" and node.domain in ("", "ai.onnx") and any(
            a.name == "to" and a.i in _HALF for a in node.attribute)
        for out in node.output:
            if out and out not in names and (half_cast or _FLOAT32_PREFIX + out in names):
                skipped.append(out)
    return skipped


def roundings_skipped_cause(models: Sequence[tuple[str, onnx.ModelProto, Path | None]]
                            ) -> str:
    """Why onnxruntime's plain runs of these (label, model, external folder) differ from
    runs that expose every fused node's values, where its own graph says so: the float16
    values it computes in float32 and never rounds (``roundings_skipped``); exposing a value
    makes it round it. "" when no graph skips a rounding."""
    parts = []
    for label, proto, external_dir in models:
        ran = ort_graph(proto, external_dir)
        skipped = roundings_skipped(proto, ran) if ran is not None else []
        if skipped:
            more = f" and {len(skipped) - 4} more" if len(skipped) > 4 else ""
            parts.append(f"{', '.join(skipped[:4])}{more} of {label}")
    if not parts:
        return ""
    return ("onnxruntime never rounds " + "; ".join(parts) + " to float16: its own graph "
            "computes them in float32 (no float16 CPU kernel for their nodes), against the "
            "model's arithmetic, which the reference runtime follows")


def run_ort(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray],
            outputs: Sequence[str] | None = None,
            external_dir: Path | None = None) -> dict[str, np.ndarray]:
    """Run once on onnxruntime (see ``ort_session``)."""
    return ort_session(model, external_dir)(feeds, outputs)


def run_ort_beside(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray],
                   keep: Sequence[str], budget: int,
                   external_dir: Path | None = None,
                   stop: threading.Event | None = None) -> dict[str, np.ndarray]:
    """Run once on onnxruntime, beside another runtime's run: a model that streams does
    in pieces of ``stream_ort.BESIDE_SHARE`` of the usual size, and keeps the values
    ``keep`` names as long as they hold at most ``budget`` bytes (``StreamedOrt``); a
    model that does not stream keeps nothing (a second run of it costs little). ``stop``
    set: a streamed run ends at its next piece (a ``RuntimeFailure``)."""
    if not streams(model):
        return run_ort(model, feeds, external_dir=external_dir)
    _ort_options(external_dir)  # onnxruntime missing: the same failure, at once
    run = stream_ort.StreamedOrt(model, lambda piece: _whole_ort(piece, external_dir),
                                 _reporter("onnxruntime", model),
                                 share=stream_ort.BESIDE_SHARE, stop=stop)
    return _streamed(lambda f, o: run(f, o, keep, budget))(feeds, None)


def reference_session(model: onnx.ModelProto, external_dir: Path | None = None) -> Session:
    """dqtool's reference evaluator for several runs, ``session(feeds, outputs)``; with
    ``external_dir`` the model's external tensors are memory-mapped from that folder, never
    read into the protobuf."""
    # Imported here: onnx's reference evaluator and its operators, which an
    # upgrade without --check (importing this module through dqtool.convert) never runs.
    from dqtool import reference_evaluator

    try:
        if streams(model):
            return _streamed(stream_ref.StreamedReference(
                model, external_dir, ref_ops.new_ops(model), _reporter("reference", model)))
        sess = reference_evaluator(model if external_dir is None
                                   else in_memory_container(model, external_dir),
                                   new_ops=ref_ops.new_ops(model))
    except Exception as e:  # a model the evaluator cannot load is a finding, not a crash
        raise _failure(e) from None

    return _session(sess, [o.name for o in model.graph.output])


def run_reference(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray],
                  outputs: Sequence[str] | None = None,
                  external_dir: Path | None = None) -> dict[str, np.ndarray]:
    """Run once on dqtool's reference evaluator (see ``reference_session``)."""
    return reference_session(model, external_dir)(feeds, outputs)
