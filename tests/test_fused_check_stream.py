"""``check MODEL`` on several fused nodes at once: their pieces run as one stream
(onnxruntime in probe threads, ahead of the kernel), a block probe's output compared where
its weights lie. A weight onnxruntime reads differently (a block's scale one ulp off, a code
changed) is a mismatch of exactly its node, at its columns; a correct model is bit-exact."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from helpers.fused import nbits_inputs
from onnx import TensorProto, helper, numpy_helper

import dqtool
from dqtool.checking import runners
from dqtool.errors import KernelError
from dqtool.families.fused import kernel, packing, selfcheck

K, N, BLOCK = 200, 24, 32  # ragged: the last of 7 blocks has 8 rows
LAYERS = 6


def _layers(dtype=np.float16, zp: str = "packed") -> tuple[onnx.ModelProto, list[dict]]:
    """A GatherBlockQuantized table and LAYERS MatMulNBits (K, N) on the graph's input;
    their weights' inputs in order."""
    rng = np.random.default_rng(21)
    nodes, inits, weights = [], [], []
    table = rng.integers(-8, 8, size=(16, 64)).astype(ml_dtypes.int4)
    inits += [numpy_helper.from_array(table, "table"),
              numpy_helper.from_array((rng.random((16, 2)) * 0.1 + 0.01).astype(dtype),
                                      "table_scales")]
    nodes.append(helper.make_node("GatherBlockQuantized", ["table", "ids", "table_scales"],
                                  ["e"], name="embed", domain="com.microsoft", gather_axis=0,
                                  quantize_axis=1, block_size=32, bits=4))
    outs = []
    for i in range(LAYERS):
        w = nbits_inputs(rng, K, N, 4, BLOCK, dtype, zp)
        weights.append(w)
        names = ["A", f"B{i}", f"s{i}"]
        inits += [numpy_helper.from_array(w["B"], f"B{i}"),
                  numpy_helper.from_array(w["scales"], f"s{i}")]
        if w["zero_points"] is not None:
            names.append(f"z{i}")
            inits.append(numpy_helper.from_array(w["zero_points"], f"z{i}"))
        nodes.append(helper.make_node("MatMulNBits", names, [f"y{i}"], name=f"mm{i}",
                                      domain="com.microsoft", K=K, N=N, bits=4,
                                      block_size=BLOCK))
        outs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT16
                                                  if dtype == np.float16 else
                                                  TensorProto.FLOAT, [2, N]))
    t = TensorProto.FLOAT16 if dtype == np.float16 else TensorProto.FLOAT
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("A", t, [2, K]),
                     helper.make_tensor_value_info("ids", TensorProto.INT64, [3])],
        [*outs, helper.make_tensor_value_info("e", t, [3, 64])], inits)
    model = helper.make_model(graph, ir_version=10, opset_imports=[
        helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    return model, weights


def _fused(report) -> list:
    return [n for n in report.nodes if "com.microsoft" in n.op]


@pytest.fixture
def small_pieces(monkeypatch):
    # 5 columns of W a piece: every node in 5 pieces, several in flight at once
    monkeypatch.setattr(selfcheck, "PROBE_BYTES", 5 * 7 * BLOCK * 2)


@pytest.mark.parametrize(("dtype", "zp"), [(np.float16, "packed"), (np.float16, "none"),
                                           (np.float32, "float")])
def test_a_correct_model_is_bit_exact_node_by_node(small_pieces, dtype, zp):
    model, _ = _layers(dtype, zp)
    nodes = _fused(dqtool.check(model))
    assert [n.name for n in nodes] == ["embed", *(f"mm{i}" for i in range(LAYERS))]
    assert [n.status for n in nodes] == ["bit-exact"] * (LAYERS + 1), [n.reason for n in nodes]


def _reading(monkeypatch, change):
    """``index(weights)``: onnxruntime reads that node's probe arrays changed by
    ``change(arrays, n0)`` (``n0``: the piece's first column), the kernel the model's:
    their weights disagree exactly there."""
    real = selfcheck._probe_session
    b_node = {}

    def session(model, arrays):
        n0 = b_node.get(arrays["B"].tobytes())
        if n0 is not None:
            arrays = {k: v.copy() for k, v in arrays.items()}
            change(arrays, n0)
        return real(model, arrays)

    def index(weights: dict) -> None:
        # each piece's B as the probe lays it out (block-major), by its first column
        b = weights["B"]
        step = selfcheck.PROBE_BYTES // (7 * BLOCK * 2)
        for n0 in range(0, N, step):
            n1 = min(N, n0 + step)
            laid = np.ascontiguousarray(b[n0:n1].transpose(1, 0, 2)).reshape((n1 - n0) * 7,
                                                                              1, -1)
            b_node[laid.tobytes()] = n0

    monkeypatch.setattr(selfcheck, "_probe_session", session)
    return index


@pytest.mark.parametrize(("col", "block"), [(22, 6), (0, 0), (13, 3)])
def test_one_blocks_scale_one_ulp_off_in_a_late_node_is_its_mismatch(
        small_pieces, monkeypatch, col, block):
    model, weights = _layers()
    late = LAYERS - 2
    step = 5
    first = col // step * step
    width = min(N, first + step) - first

    def one_ulp(arrays, n0):
        if n0 == first:  # row j·width + c of the probe: block j of column first + c
            s = arrays["scales"]
            s[block * width + col - first] = np.nextafter(s[block * width + col - first],
                                                          np.float16(np.inf))

    _reading(monkeypatch, one_ulp)(weights[late])
    nodes = _fused(dqtool.check(model))
    statuses = {n.name: n.status for n in nodes}
    assert statuses == {"embed": "bit-exact", **{f"mm{i}": "mismatch" if i == late
                                                 else "bit-exact" for i in range(LAYERS)}}
    [bad] = [n for n in nodes if n.status == "mismatch"]
    # the weights of that block the changed scale moves: every code off its zero point
    w = weights[late]
    scales = w["scales"].copy()
    scales[col, block] = np.nextafter(scales[col, block], np.float16(np.inf))
    want = kernel.dequantize_matmul_nbits(w["B"], w["scales"], w["zero_points"], K=K, N=N,
                                          bits=4, block_size=BLOCK)
    moved = kernel.dequantize_matmul_nbits(w["B"], scales, w["zero_points"], K=K, N=N,
                                           bits=4, block_size=BLOCK)
    differ = int((want.view(np.uint16) != moved.view(np.uint16)).sum())
    rows = min(BLOCK, K - block * BLOCK)
    assert 0 < differ <= rows
    assert f"differ in {differ} of {K * width} elements of columns {first}.." \
        f"{first + width - 1} of W" in bad.reason
    assert bad.comparison is not None and bad.comparison.mismatched == differ


def test_a_changed_code_is_its_nodes_mismatch_at_its_weight(small_pieces, monkeypatch):
    model, weights = _layers()
    late, col, row = LAYERS - 1, 17, 197  # the ragged last block's 6th row
    first, width = 15, 5
    j, r = divmod(row, BLOCK)

    def code(arrays, n0):
        if n0 == first:
            b = arrays["B"].reshape(7 * width, -1)  # (block-major rows, BLOCK // 2 bytes)
            codes = packing.unpack(b[j * width + col - first][None], 4)[0]
            codes[r] = (codes[r] + 5) % 16
            b[j * width + col - first] = packing.pack(codes[None], 4)[0]

    _reading(monkeypatch, code)(weights[late])
    nodes = _fused(dqtool.check(model))
    [bad] = [n for n in nodes if n.status != "bit-exact"]
    assert bad.name == f"mm{late}" and bad.status == "mismatch"
    assert f"differ in 1 of {K * width} elements of columns 15..19 of W (worst at " \
        f"({row}, {col - first})" in bad.reason


def test_rows_past_k_of_a_ragged_block_are_not_compared(small_pieces, monkeypatch):
    # the last block's codes past K (padding, no weight) read differently: no finding
    model, weights = _layers()

    def padding(arrays, n0):
        b = arrays["B"].reshape(7, -1, BLOCK // 2)
        b[6, :, 4:] ^= 0x33  # codes 8.. of the last block: rows 200.. of W

    for i in range(LAYERS):
        _reading(monkeypatch, padding)(weights[i])
    nodes = _fused(dqtool.check(model))
    assert all(n.status == "bit-exact" for n in nodes), [n.reason for n in nodes]


def test_a_node_onnxruntime_cannot_run_is_kernel_only_alone(small_pieces, monkeypatch):
    model, weights = _layers()
    real = selfcheck._probe_session
    bad_b = weights[2]["B"][5:10].transpose(1, 0, 2).tobytes()

    def session(model, arrays):
        if arrays["B"].tobytes() == bad_b:  # its second piece
            raise runners.RuntimeFailure("no kernel for this probe")
        return real(model, arrays)

    monkeypatch.setattr(selfcheck, "_probe_session", session)
    nodes = _fused(dqtool.check(model))
    assert [(n.name, n.status) for n in nodes if n.status != "bit-exact"] == [
        ("mm2", "kernel-only")]
    assert nodes[3].reason == "onnxruntime cannot run this node: no kernel for this probe"


def test_a_kernel_error_is_its_nodes_error_and_onnxruntimes_failure_comes_first(
        small_pieces, monkeypatch):
    model, weights = _layers()
    real_kernel, real_session = kernel.dequantize_matmul_nbits, selfcheck._probe_session

    def refusing(b, *a, **kw):
        if np.array_equal(b, weights[1]["B"][10:15]) or \
                np.array_equal(b, weights[4]["B"][0:5]):
            raise KernelError("refused")
        return real_kernel(b, *a, **kw)

    failing_b = weights[4]["B"][0:5].transpose(1, 0, 2).tobytes()

    def session(model, arrays):
        if arrays["B"].tobytes() == failing_b:
            raise runners.RuntimeFailure("cannot run")
        return real_session(model, arrays)

    monkeypatch.setattr(selfcheck.kernel, "dequantize_matmul_nbits", refusing)
    monkeypatch.setattr(selfcheck, "_probe_session", session)
    nodes = {n.name: n for n in _fused(dqtool.check(model))}
    assert nodes["mm1"].status == "error" and nodes["mm1"].reason == "KernelError: refused"
    assert nodes["mm4"].status == "kernel-only"  # as when onnxruntime ran first
    assert all(nodes[f"mm{i}"].status == "bit-exact" for i in (0, 2, 3, 5))


def test_views_compare_as_words_and_excuse_what_same_excuses():
    rng = np.random.default_rng(3)
    want = rng.integers(0, 0x7BFF, (64, 12), dtype=np.uint16).view(np.float16)
    got = np.ascontiguousarray(want.reshape(2, 32, 12).transpose(1, 0, 2)).reshape(32, 24)
    assert not selfcheck._blocks_differ(got, want, 32)
    got2 = got.copy()
    got2.view(np.uint16)[7, 13] ^= 1  # W[32 + 7, 1]: one ulp
    assert selfcheck._blocks_differ(got2, want, 32)
    signed = want.copy()
    signed[39, 1] = np.float16(-0.0)
    zero = got.copy()
    zero[7, 13] = 0  # +0 read for a -0 weight: excused, as _same does
    assert not selfcheck._blocks_differ(zero, signed, 32)
    nan = want.copy()
    nan.view(np.uint16)[5, 3] = 0x7E01
    nan_got = np.ascontiguousarray(nan.reshape(2, 32, 12).transpose(1, 0, 2)).reshape(32, 24)
    nan_got.view(np.uint16)[5, 3] = 0x7E00  # another NaN payload
    assert not selfcheck._blocks_differ(nan_got, nan, 32)
    # odd widths fall back to narrower words
    odd = want[:, :5].copy()
    odd_got = np.ascontiguousarray(odd.reshape(2, 32, 5).transpose(1, 0, 2)).reshape(32, 10)
    assert not selfcheck._blocks_differ(odd_got, odd, 32)
    odd_got.view(np.uint16)[31, 9] ^= 0x8000
    assert selfcheck._blocks_differ(odd_got, odd, 32)
