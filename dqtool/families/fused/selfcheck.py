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

Every weight is compared; none is sampled (before 2026-11-28 a node past 2^24 weights was
checked on a sample of its rows or indices).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
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
# Output bytes per run of the block probe: most weights in one run (a session each)
PROBE_BYTES = 64 << 20
_FLOAT = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float16): TensorProto.FLOAT16}


def numeric(proto: onnx.ModelProto, model: ir.Model, feeds: Mapping[str, np.ndarray],
            notes: list[str], external_dir: Path | None = None) -> list[NodeCheck]:
    del proto, feeds, external_dir  # each node runs alone, from its own constants
    out = []
    for site in graph.walk(model):
        if read.is_fused(site.node):
            out.append(check_node(site, model.ir_version))
    return out


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


def check_node(site: graph.Site, ir_version: int) -> NodeCheck:
    node = site.node
    base = {"name": node.name or "", "graph": site.graph,
            "op": f"com.microsoft:{node.op_type}-1"}
    spec = read.read(node, site.opsets)
    if spec.errors:
        return NodeCheck(**base, status=SKIPPED, reason="invalid: " + "; ".join(
            p.message for p in spec.errors))
    if not spec.constant:
        return NodeCheck(**base, status=SKIPPED, reason="its weight is computed at run "
                         "time: only a constant weight is compared")
    try:
        if node.op_type == "MatMulNBits" and graph.input_value(node, 4) is None:
            pieces, how = _by_blocks(node, ir_version), "blocks side by side, identity A " \
                "of block_size rows, one weight per output"
        elif node.op_type == "MatMulNBits":
            pieces, how = _matmul_nbits(node, ir_version), "identity A, one weight per output"
        else:
            pieces, how = _gather(node, ir_version), "every index gathered"
        for got, want, where in pieces:
            if _same(want, got, node.op_type == "MatMulNBits"):
                continue
            stats = compare.compare("y", want, got)
            return NodeCheck(**base, status=MISMATCH, comparison=stats, reason=(
                f"kernel and onnxruntime differ in {stats.mismatched} of {stats.size} "
                f"elements of {where} (worst at {stats.worst_index}: kernel "
                f"{stats.worst_actual!r}, onnxruntime {stats.worst_expected!r})"))
    except runners.RuntimeFailure as e:
        return NodeCheck(**base, status=KERNEL_ONLY,
                         reason=f"onnxruntime cannot run this node: {e}")
    except Exception as e:  # the kernel refusing a node is a finding, not a crash
        return NodeCheck(**base, status=ERROR, reason=f"{type(e).__name__}: {e}")
    return NodeCheck(**base, status=BIT_EXACT, reason=how)


Piece = tuple[np.ndarray, np.ndarray, str]  # (onnxruntime, kernel, which rows)


def _probe_proto(node: ir.Node, inputs: list[str], **ints: int) -> onnx.NodeProto:
    """``node`` as a probe: its attributes (``ints`` replacing some) without
    ``accuracy_level`` (a quantized identity A would not be exact), on ``inputs``, output
    ``y``."""
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


def _by_blocks(node: ir.Node, ir_version: int) -> Iterator[Piece]:
    """Columns ``n0..n1`` of W at a time: their blocks side by side as one node of
    ``K = block_size`` (module docstring), the output ``(block, k_blocks·(n1-n0))`` read
    back as ``W[:, n0:n1]``."""
    a = _ints(node)
    k, n, bits, block = a["K"], a["N"], a.get("bits", 4), a["block_size"]
    kb = -(-k // block)
    b = storage.stored_values(node.inputs[1]).reshape(n, kb, -1)
    scales = storage.stored_values(node.inputs[2]).reshape(n, kb)
    zp_v = graph.input_value(node, 3)
    zp = None if zp_v is None else storage.stored_values(zp_v)
    zp_codes, float_zp = kernel.matmul_nbits_zero_points(zp, n, kb, bits)
    dtype = np.dtype(scales.dtype)
    eye = np.eye(block, dtype=dtype)
    step = max(1, PROBE_BYTES // max(1, kb * block * dtype.itemsize))
    for n0, n1 in _chunks(n, step):
        m = (n1 - n0) * kb
        # block-major (row j·(n1-n0) + c: block j of column c), so that the output's
        # blocks are whole rows of W: read back by moving rows, not single weights
        inits = [numpy_helper.from_array(np.ascontiguousarray(
                     b[n0:n1].transpose(1, 0, 2)).reshape(m, 1, -1), "B"),
                 numpy_helper.from_array(np.ascontiguousarray(scales[n0:n1].T).reshape(m),
                                         "scales")]
        names = ["A", "B", "scales"]
        zp_arg = None
        if zp is not None:
            if float_zp:  # as stored, one offset per block
                zp_arg = np.asarray(zp).reshape(n, kb)[n0:n1]
                side = np.ascontiguousarray(zp_arg.T).reshape(m)
            else:  # one block per row: one code a byte, in its low bits
                zp_arg = np.asarray(zp).reshape(n, -1)[n0:n1]
                side = packing.pack(zp_codes[n0:n1].T.reshape(m, 1), bits)
            inits.append(numpy_helper.from_array(side, "zero_points"))
            names.append("zero_points")
        proto = _probe_proto(node, names, K=block, N=m)
        model = _model(proto, [helper.make_tensor_value_info(
            "A", _FLOAT.get(dtype, 16), [block, block])], inits, ir_version)
        got = runners.ort_session(model)({"A": eye}, ["y"])["y"]
        del model, inits
        # got[r, j·(n1-n0) + c] = W[j·block + r, n0 + c]
        got = got.reshape(block, kb, n1 - n0).transpose(1, 0, 2).reshape(kb * block, -1)[:k]
        want = kernel.dequantize_matmul_nbits(b[n0:n1], scales[n0:n1], zp_arg, K=k,
                                              N=n1 - n0, bits=bits, block_size=block)
        yield np.ascontiguousarray(got), want, f"columns {n0}..{n1 - 1} of W"


def _matmul_nbits(node: ir.Node, ir_version: int) -> Iterator[Piece]:
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
    session = runners.ort_session(model)
    rows = max(block, (CHUNK_BYTES // max(1, n * dtype.itemsize)) // block * block)
    chunks = _chunks(k, rows)
    zp_codes, float_zp = kernel.matmul_nbits_zero_points(zp, n, kb, bits)

    def pieces() -> Iterator[Piece]:
        for r0, r1 in chunks:
            eye = np.zeros((r1 - r0, k), dtype)
            eye[np.arange(r1 - r0), np.arange(r0, r1)] = 1
            got = session({"A": eye}, ["y"])["y"]
            if g_idx is not None:  # rows may use any block: the whole weight, then rows
                want = kernel.dequantize_matmul_nbits(b, scales, zp, K=k, N=n, bits=bits,
                                                      block_size=block, g_idx=g_idx)[r0:r1]
            else:
                b0, b1 = r0 // block, -(-r1 // block)
                zps = zp_codes[:, b0:b1]
                zp_arg = zps.astype(dtype) if float_zp else packing.pack(zps, bits)
                want = kernel.dequantize_matmul_nbits(
                    b[:, b0:b1], scales.reshape(n, kb)[:, b0:b1], zp_arg, K=r1 - r0, N=n,
                    bits=bits, block_size=block)
            yield got, want, f"rows {r0}..{r1 - 1} of W"

    return pieces()


def _gather(node: ir.Node, ir_version: int) -> Iterator[Piece]:
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
    session = runners.ort_session(model)
    # a table past runners.STREAM_BYTES opens its session again each run: few, large runs
    step = max(1, PROBE_BYTES // max(1, 4 * per_index))
    chunks = _chunks(dim, step)
    kw = {"quantize_axis": a.get("quantize_axis", 1), "block_size": block, "bits": bits}

    def pieces() -> Iterator[Piece]:
        for r0, r1 in chunks:
            idx = np.arange(r0, r1, dtype=np.int64)
            got = session({"indices": idx}, ["y"])["y"]
            if ga != qa:  # blocks run along another axis: the gathered rows alone
                sl = [slice(None)] * data.ndim
                sl[ga] = slice(r0, r1)
                want = kernel.dequantize_gather_block_quantized(
                    data[tuple(sl)], scales[tuple(sl)],
                    None if zp is None else zp[tuple(sl)], **kw)
            else:
                want = kernel.dequantize_gather_block_quantized(
                    data, scales, zp, indices=idx, gather_axis=ga, **kw)
            yield got, want, f"indices {r0}..{r1 - 1}"

    return pieces()


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
    """A constant as stored (int4/uint4 stay 4-bit)."""
    t = ir.serde.serialize_tensor(graph.constant_tensor(value))
    t.name = name
    return t
