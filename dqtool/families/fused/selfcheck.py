"""``dqtool check MODEL``: every fused node's dequantization on onnxruntime against the
kernel, bit for bit, as the Q/DQ self-check does for DequantizeLinear.

- MatMulNBits: an identity A makes each output ``1 · w`` — exactly one weight, rounded once
  to the output type. Without ``g_idx`` the weight's blocks along K are laid side by side:
  one node of ``K = block_size`` and ``N·k_blocks`` columns, the same bytes of B (each
  row of B' one block of one column), its scales and zero points in the same order, fed an
  identity of ``block_size`` rows: every weight from one run, O(block·K·N) in place of the
  O(K²·N) of an identity of K rows (no bias, ``accuracy_level`` 0). With ``g_idx`` (a row
  may use any block) the node itself is fed every row of an identity of K, in chunks.
- GatherBlockQuantized: the node alone, fed every index of its gathered axis (in chunks);
  the output is the table, which the kernel dequantizes from the same rows.

Every weight is compared; none is sampled (since 2026-11-28). The nodes' pieces run as one
stream (``check_nodes``): onnxruntime's runs in two threads of their own, a few pieces
ahead of the kernel's dequantization and the comparison in the caller's thread
(onnxruntime and NumPy's large operations release the GIL). A block probe's output is
compared with W where each weight lies, as integer words through views; only a piece that
differs is laid out as W for ``_same`` and the report.
"""

from __future__ import annotations

import functools
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
from onnx import TensorProto, helper, numpy_helper

from dqtool import graph, storage
from dqtool.checking import compare, runners
from dqtool.checking.models import ort_max_ir
from dqtool.checking.selfcheck import BIT_EXACT, ERROR, KERNEL_ONLY, MISMATCH, SKIPPED, NodeCheck
from dqtool.families.fused import kernel, packing, read

CHUNK_BYTES = 16 << 20  # output bytes per onnxruntime run
# Output bytes per run of the block probe (a session each, whose cost is mostly per byte:
# onnxruntime prepacks B). Pieces this size keep two runs and the kernel's side in flight
# within ~600 MB on the 1.8 GB bench model (2026-11-28, docs/benchmarks.md).
PROBE_BYTES = 32 << 20
# float32-sized bytes per run of GatherBlockQuantized: a table past runners.STREAM_BYTES
# opens its session again each run, so few, large runs
GATHER_BYTES = 64 << 20
_FLOAT = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float16): TensorProto.FLOAT16}


def numeric(proto: onnx.ModelProto, model: ir.Model, feeds: Mapping[str, np.ndarray],
            notes: list[str], external_dir: Path | None = None) -> list[NodeCheck]:
    del proto, feeds, external_dir  # each node runs alone, from its own constants
    sites = [site for site in graph.walk(model) if read.is_fused(site.node)]
    return check_nodes(sites, model.ir_version)


def _ints(node: ir.Node) -> dict[str, int]:
    return {k: v.as_int() for k, v in node.attributes.items() if v.type == ir.AttributeType.INT}


def _model(node_proto: onnx.NodeProto, inputs: list[onnx.ValueInfoProto],
           inits: list[onnx.TensorProto], ir_version: int) -> onnx.ModelProto:
    g = helper.make_graph([node_proto], "fused_alone", inputs,
                          [onnx.ValueInfoProto(name="y")], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21),
                                            helper.make_opsetid("com.microsoft", 1)])
    top = ort_max_ir()
    m.ir_version = min(ir_version, top) if ir_version else top
    return m


def _chunks(total: int, step: int) -> list[tuple[int, int]]:
    """Chunks ``[r0, r1)`` of ``range(total)``, ``step`` rows each."""
    return [(r, min(r + step, total)) for r in range(0, total, step)]


@dataclass(frozen=True)
class _Piece:
    """Some weights of one node: ``ort()`` (in a probe thread) and ``kernel()``; optional
    ``differs`` (False: all ``_same``, seen through views) and ``laid_out`` (one layout)."""

    ort: Callable[[], np.ndarray]
    kernel: Callable[[], np.ndarray]
    where: str
    differs: Callable[[np.ndarray, np.ndarray], bool] | None = None
    laid_out: Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]] | None = None


@dataclass
class _Node:
    base: dict[str, str]
    how: str = ""
    verdict: NodeCheck | None = None

    def failed(self, e: BaseException) -> None:
        if isinstance(e, runners.RuntimeFailure):
            self.verdict = NodeCheck(**self.base, status=KERNEL_ONLY,
                                     reason=f"onnxruntime cannot run this node: {e}")
        else:  # the kernel refusing a node is a finding, not a crash
            self.verdict = NodeCheck(**self.base, status=ERROR,
                                     reason=f"{type(e).__name__}: {e}")


def _skipped(site: graph.Site, state: _Node) -> bool:
    """Is the node left out of the comparison (its verdict set)?"""
    spec = read.read(site.node, site.opsets)
    if spec.errors:
        state.verdict = NodeCheck(**state.base, status=SKIPPED, reason="invalid: "
                                  + "; ".join(p.message for p in spec.errors))
    elif not spec.constant:
        state.verdict = NodeCheck(**state.base, status=SKIPPED, reason="its weight is "
                                  "computed at run time: only a constant weight is compared")
    return state.verdict is not None


def _pieces(node: ir.Node, ir_version: int, state: _Node) -> Iterator[_Piece]:
    if node.op_type == "MatMulNBits" and graph.input_value(node, 4) is None:
        state.how = "blocks side by side, identity A of block_size rows, one weight per " \
            "output"
        return _by_blocks(node, ir_version)
    if node.op_type == "MatMulNBits":
        state.how = "identity A, one weight per output"
        return _matmul_nbits(node, ir_version)
    state.how = "every index gathered"
    return _gather(node, ir_version)


def _stream(sites: list[graph.Site], ir_version: int, nodes: list[_Node]
            ) -> Iterator[tuple[_Node, _Piece | BaseException]]:
    """Every node's pieces in order; a node whose pieces cannot be made gives the
    exception in their place (after the pieces made before it, which may decide first)."""
    for site, state in zip(sites, nodes, strict=True):
        if _skipped(site, state):
            continue
        try:
            for piece in _pieces(site.node, ir_version, state):
                if state.verdict is not None:  # a mismatch already found: the rest unread
                    break
                yield state, piece
        except Exception as e:
            yield state, e


# onnxruntime runs this many pieces ahead of the kernel's comparisons: it works on the next
# piece while the kernel dequantizes and compares this one (both release the GIL), and at
# most this many of its outputs wait, which bounds the memory held.
AHEAD = 2
# onnxruntime's runs (one thread each, ``_probe_session``) are most of the work: two at a
# time keep both cores busy while the kernel's side waits for them
WORKERS = 2


def check_nodes(sites: list[graph.Site], ir_version: int) -> list[NodeCheck]:
    """Every fused node of ``sites`` checked, their pieces in one stream: onnxruntime's
    side in ``WORKERS`` threads, up to ``AHEAD`` pieces ahead of the kernel's side. Each
    node's verdict is its first piece's failure or mismatch, in the pieces' order, as when
    each piece ran alone."""
    nodes = [_Node({"name": s.node.name or "", "graph": s.graph,
                    "op": f"com.microsoft:{s.node.op_type}-1"}) for s in sites]
    stream = _stream(sites, ir_version, nodes)
    pending: deque[tuple[_Node, _Piece | BaseException, Future[np.ndarray] | None]] = deque()

    def submit() -> None:
        while len(pending) <= AHEAD:
            item = next(stream, None)
            if item is None:
                return
            state, piece = item
            job = pool.submit(piece.ort) if isinstance(piece, _Piece) else None
            pending.append((state, piece, job))

    with ThreadPoolExecutor(WORKERS, thread_name_prefix="dqtool-probe") as pool:
        submit()
        while pending:
            state, piece, job = pending.popleft()
            submit()  # the next run starts before this piece's kernel side
            if state.verdict is not None:
                if job is not None:
                    job.cancel()
                continue
            if not isinstance(piece, _Piece):
                state.failed(piece)
                continue
            assert job is not None
            _compare(state, piece, job)
    for state in nodes:
        if state.verdict is None:
            state.verdict = NodeCheck(**state.base, status=BIT_EXACT, reason=state.how)
    return [state.verdict for state in nodes if state.verdict is not None]


def _compare(state: _Node, piece: _Piece, job: Future[np.ndarray]) -> None:
    """One piece: the kernel's weights computed while onnxruntime runs, then compared. As
    when they ran one after the other, onnxruntime's failure is the verdict before the
    kernel's."""
    try:
        want = piece.kernel()
    except Exception as kernel_error:
        ort_error = job.exception()
        state.failed(kernel_error if ort_error is None else ort_error)
        return
    try:
        got = job.result()
        if piece.differs is not None and not piece.differs(got, want):
            return
        if piece.laid_out is not None:
            got, want = piece.laid_out(got, want)
        if _same(want, got, state.base["op"].endswith(":MatMulNBits-1")):
            return
        stats = compare.compare("y", want, got)
    except Exception as e:
        state.failed(e)
        return
    state.verdict = NodeCheck(**state.base, status=MISMATCH, comparison=stats, reason=(
        f"kernel and onnxruntime differ in {stats.mismatched} of {stats.size} "
        f"elements of {piece.where} (worst at {stats.worst_index}: kernel "
        f"{stats.worst_actual!r}, onnxruntime {stats.worst_expected!r})"))


def _probe_proto(node: ir.Node, inputs: list[str], **ints: int) -> onnx.NodeProto:
    """``node`` as a probe on ``inputs``, output ``y``: its attributes (``ints`` replacing
    some) without ``accuracy_level`` (a quantized identity A would not be exact)."""
    proto = ir.serde.serialize_node(node)
    del proto.input[:], proto.output[:]
    proto.input.extend(inputs)
    proto.output.append("y")
    for attr in list(proto.attribute):
        if attr.name == "accuracy_level":
            proto.attribute.remove(attr)
        elif attr.name in ints:
            attr.i = ints[attr.name]
    return proto


def _by_blocks(node: ir.Node, ir_version: int) -> Iterator[_Piece]:
    """Columns ``n0..n1`` of W at a time: their blocks side by side as one node of
    ``K = block_size`` (module docstring), the output ``(block, k_blocks·(n1-n0))``
    compared with ``W[:, n0:n1]`` where it lies (``_blocks_differ``)."""
    a = _ints(node)
    k, n, bits, block = a["K"], a["N"], a.get("bits", 4), a["block_size"]
    kb = -(-k // block)
    b = storage.stored_values(node.inputs[1]).reshape(n, kb, -1)
    scales = storage.stored_values(node.inputs[2]).reshape(n, kb)
    zp_v = graph.input_value(node, 3)
    zp = None if zp_v is None else storage.stored_values(zp_v)
    zp_codes, float_zp = kernel.matmul_nbits_zero_points(zp, n, kb, bits)
    dtype = np.dtype(scales.dtype)
    step = max(1, PROBE_BYTES // max(1, kb * block * dtype.itemsize))

    def probe(n0: int, n1: int) -> np.ndarray:
        m = (n1 - n0) * kb
        # block-major (row j·(n1-n0) + c: block j of column c), so that the output's
        # blocks are whole rows of W: compared where they lie, without moving weights
        arrays = {"B": np.ascontiguousarray(b[n0:n1].transpose(1, 0, 2)).reshape(m, 1, -1),
                  "scales": np.ascontiguousarray(scales[n0:n1].T).reshape(m)}
        if zp is not None:
            if float_zp:  # as stored, one offset per block
                arrays["zero_points"] = np.ascontiguousarray(
                    np.asarray(zp).reshape(n, kb)[n0:n1].T).reshape(m)
            else:  # one block per row: one code a byte, in its low bits
                arrays["zero_points"] = packing.pack(zp_codes[n0:n1].T.reshape(m, 1), bits)
        proto = _probe_proto(node, ["A", *arrays], K=block, N=m)
        model = _model(proto, [helper.make_tensor_value_info(
            "A", _FLOAT.get(dtype, 16), [block, block])], [], ir_version)
        return _probe_session(model, arrays)({"A": np.eye(block, dtype=dtype)}, ["y"])["y"]

    def weights(n0: int, n1: int) -> np.ndarray:
        zp_arg = None if zp is None else np.asarray(zp).reshape(n, kb if float_zp else -1)[n0:n1]
        return kernel.dequantize_matmul_nbits(b[n0:n1], scales[n0:n1], zp_arg, K=k,
                                              N=n1 - n0, bits=bits, block_size=block)

    def laid_out(got: np.ndarray, want: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        # got[r, j·nc + c] = W[j·block + r, n0 + c]
        nc = want.shape[1]
        got = got.reshape(block, kb, nc).transpose(1, 0, 2).reshape(kb * block, nc)[:k]
        return np.ascontiguousarray(got), want

    for n0, n1 in _chunks(n, step):
        yield _Piece(ort=functools.partial(probe, n0, n1),
                     kernel=functools.partial(weights, n0, n1),
                     where=f"columns {n0}..{n1 - 1} of W",
                     differs=functools.partial(_blocks_differ, block=block),
                     laid_out=laid_out)


def _probe_session(model: onnx.ModelProto, arrays: Mapping[str, np.ndarray]
                   ) -> runners.Session:
    """``model`` with ``arrays`` as its initializers, on onnxruntime in one thread: the
    kernel's side runs on the other core meanwhile, and a second thread did not make a run
    faster (a (128, 196608) probe: 75 ms on one, 68 ms on two; 2026-11-28, recorded in
    docs/benchmarks.md)."""
    return runners.ort_session_from_memory(model, arrays, threads=1)


def _blocks_differ(got: np.ndarray, want: np.ndarray, block: int) -> bool:
    """Does a weight of a block probe's output ``got`` ``(block, k_blocks·nc)`` differ from
    ``want`` = W ``(K, nc)`` (beyond ``_same``'s allowances)? Compared where each lies,
    through views: block j of column c is ``got[:, j·nc + c]``, ``want[j·block:, c]``."""
    k, nc = want.shape
    kb = -(-k // block)
    if got.dtype != want.dtype or got.size != block * kb * nc:
        return True
    got3 = got.reshape(block, kb, nc)
    whole = k // block
    if whole and not _equal(got3[:, :whole].transpose(1, 0, 2),
                            want[:whole * block].reshape(whole, block, nc)):
        return True
    rest = k - whole * block  # a ragged last block: its rows past K are no weights
    return bool(rest) and not _equal(got3[:rest, whole], want[whole * block:])


def _equal(got: np.ndarray, want: np.ndarray) -> bool:
    """``_same(want, got, True)`` of two views of one shape whose last axis is contiguous:
    compared as the widest unsigned words a row holds whole (8 bytes: four float16 weights
    a comparison), element by element only where words differ."""
    row = got.shape[-1] * got.itemsize
    word = next(w for w in (8, 4, 2, 1) if w % got.itemsize == 0 and row % w == 0)
    as_words = np.dtype(f"u{word}")
    if np.array_equal(got.view(as_words), want.view(as_words)):
        return True
    as_elements = np.dtype(f"u{got.itemsize}")
    differ = got.view(as_elements) != want.view(as_elements)
    return _same(want[differ], got[differ], True)


def _matmul_nbits(node: ir.Node, ir_version: int) -> Iterator[_Piece]:
    a = _ints(node)
    k, n, bits, block = a["K"], a["N"], a.get("bits", 4), a["block_size"]
    kb = -(-k // block)
    b = storage.stored_values(node.inputs[1]).reshape(n, kb, -1)
    scales = storage.stored_values(node.inputs[2])
    zp_v, g_v = graph.input_value(node, 3), graph.input_value(node, 4)
    zp = None if zp_v is None else storage.stored_values(zp_v)
    g_idx = None if g_v is None else storage.stored_values(g_v)
    dtype = np.dtype(scales.dtype)
    names = ["A", "B", "scales"]
    inits = [numpy_helper.from_array(b, "B"), numpy_helper.from_array(scales, "scales")]
    if zp is not None or g_idx is not None:
        names.append("zero_points" if zp is not None else "")
        if zp is not None:
            inits.append(numpy_helper.from_array(zp, "zero_points"))
    if g_idx is not None:
        names.append("g_idx")
        inits.append(numpy_helper.from_array(g_idx, "g_idx"))
    proto = _probe_proto(node, names)
    model = _model(proto, [helper.make_tensor_value_info("A", _FLOAT.get(dtype, 16),
                                                         ["rows", k])], inits, ir_version)
    session = _one_at_a_time(runners.ort_session(model))
    rows = max(block, (CHUNK_BYTES // max(1, n * dtype.itemsize)) // block * block)
    chunks = _chunks(k, rows)
    zp_codes, float_zp = kernel.matmul_nbits_zero_points(zp, n, kb, bits)

    def probe(r0: int, r1: int) -> np.ndarray:
        eye = np.zeros((r1 - r0, k), dtype)
        eye[np.arange(r1 - r0), np.arange(r0, r1)] = 1
        return session({"A": eye}, ["y"])["y"]

    def weights(r0: int, r1: int) -> np.ndarray:
        if g_idx is not None:  # rows may use any block: the whole weight, then rows
            return kernel.dequantize_matmul_nbits(b, scales, zp, K=k, N=n, bits=bits,
                                                  block_size=block, g_idx=g_idx)[r0:r1]
        b0, b1 = r0 // block, -(-r1 // block)
        zps = zp_codes[:, b0:b1]
        zp_arg = zps.astype(dtype) if float_zp else packing.pack(zps, bits)
        return kernel.dequantize_matmul_nbits(
            b[:, b0:b1], scales.reshape(n, kb)[:, b0:b1], zp_arg, K=r1 - r0, N=n,
            bits=bits, block_size=block)

    return (_Piece(ort=functools.partial(probe, r0, r1),
                   kernel=functools.partial(weights, r0, r1),
                   where=f"rows {r0}..{r1 - 1} of W") for r0, r1 in chunks)


def _gather(node: ir.Node, ir_version: int) -> Iterator[_Piece]:
    a = _ints(node)
    data = storage.stored_values(node.inputs[0])
    scales = storage.stored_values(node.inputs[2])
    zp_v = graph.input_value(node, 3)
    zp = None if zp_v is None else storage.stored_values(zp_v)
    bits, block = a.get("bits", 4), a.get("block_size", 128)
    logical = list(data.shape)
    if data.dtype == np.uint8 and bits != 8:
        logical[-1] *= 8 // bits
    rank = len(logical)
    ga, qa = a.get("gather_axis", 0) % rank, a.get("quantize_axis", 1) % rank
    dim = logical[ga]
    per_index = int(np.prod(logical, dtype=np.int64)) // max(1, dim)
    proto = ir.serde.serialize_node(node)
    del proto.input[:], proto.output[:]
    proto.input.extend(["data", "indices", "scales"])
    inits = [_tensor(node.inputs[0], "data"), _tensor(node.inputs[2], "scales")]
    if zp_v is not None:
        proto.input.append("zero_points")
        inits.append(_tensor(zp_v, "zero_points"))
    proto.output.append("y")
    model = _model(proto, [helper.make_tensor_value_info("indices", TensorProto.INT64,
                                                         ["n"])], inits, ir_version)
    session = _one_at_a_time(runners.ort_session(model))
    step = max(1, GATHER_BYTES // max(1, 4 * per_index))
    chunks = _chunks(dim, step)
    kw = {"quantize_axis": a.get("quantize_axis", 1), "block_size": block, "bits": bits}

    def probe(r0: int, r1: int) -> np.ndarray:
        return session({"indices": np.arange(r0, r1, dtype=np.int64)}, ["y"])["y"]

    def weights(r0: int, r1: int) -> np.ndarray:
        if ga != qa:  # blocks run along another axis: the gathered rows alone
            sl = [slice(None)] * data.ndim
            sl[ga] = slice(r0, r1)
            return kernel.dequantize_gather_block_quantized(
                data[tuple(sl)], scales[tuple(sl)], None if zp is None else zp[tuple(sl)],
                **kw)
        return kernel.dequantize_gather_block_quantized(
            data, scales, zp, indices=np.arange(r0, r1, dtype=np.int64), gather_axis=ga,
            **kw)

    return (_Piece(ort=functools.partial(probe, r0, r1),
                   kernel=functools.partial(weights, r0, r1),
                   where=f"indices {r0}..{r1 - 1}") for r0, r1 in chunks)


def _one_at_a_time(session: runners.Session) -> runners.Session:
    """A session the probe threads share, run by one at a time (a streamed one opens its
    pieces' sessions as it runs)."""
    lock = threading.Lock()

    def run(feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None
            ) -> dict[str, np.ndarray]:
        with lock:
            return session(feeds, outputs)

    return run


def _same(want: np.ndarray, got: np.ndarray, summed: bool) -> bool:
    """Bit for bit; for a MatMulNBits probe a zero's sign is not the weight's: its output
    ``1·w + Σ 0·w_j`` is +0 where the weight is -0 (a zero code times a negative scale)."""
    if compare.bit_identical(want, got):
        return True
    if not summed or want.shape != got.shape or want.dtype != got.dtype:
        return False
    view = np.dtype(f"u{want.dtype.itemsize}")
    same = want.view(view) == got.view(view)
    with np.errstate(invalid="ignore"):
        w, g = want.astype(np.float64), got.astype(np.float64)
        same |= ((w == 0) & (g == 0)) | (np.isnan(w) & np.isnan(g))
    return bool(same.all())


def _tensor(value: ir.Value, name: str) -> onnx.TensorProto:
    """A constant as stored (int4 stays 4-bit), its bytes in the proto: a file reference
    is relative to a folder the probe has not (before 2026-11-28 a table in a file was
    "kernel-only")."""
    tensor = graph.constant_tensor(value)
    t = ir.serde.serialize_tensor(tensor) if storage.file_range(tensor) is None else \
        onnx.TensorProto(dims=[int(d) for d in tensor.shape], data_type=int(tensor.dtype),
                         raw_data=storage.raw_bytes(tensor).tobytes())
    t.name = name
    return t
