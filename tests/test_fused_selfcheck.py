"""``check MODEL`` alone: every fused node's weight on onnxruntime (identity A / every index
gathered) against the kernel, bit for bit; large weights in chunks, every weight compared."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from helpers.fused import gbq_model, nbits_inputs, nbits_model

import dqtool
from dqtool.cli import cli
from dqtool.families.fused import selfcheck


def _nodes(model):
    report = dqtool.check(model)
    return report, [n for n in report.nodes if "com.microsoft" in n.op]


@pytest.mark.parametrize(("k", "n", "bits", "block", "dtype", "zp"), [
    (64, 16, 4, 32, np.float32, "packed"),
    (200, 24, 4, 128, np.float32, "packed"),  # ragged last block
    (96, 8, 2, 32, np.float16, "packed"),
    (64, 8, 8, 16, np.float16, "none"),
    (128, 8, 4, 32, np.float16, "float"),
    (80, 12, 4, 16, np.float32, "none"),
])
def test_matmul_nbits_weights_match_onnxruntime(k, n, bits, block, dtype, zp):
    rng = np.random.default_rng(k + n + bits)
    bias = (rng.standard_normal(n)).astype(dtype)  # left out of the probe: the weight only
    model = nbits_model(k, n, bits, block, nbits_inputs(rng, k, n, bits, block, dtype, zp),
                        dtype=dtype, m=4, bias=bias, accuracy_level=4)
    report, [node] = _nodes(model)
    assert node.status == "bit-exact", node.reason
    assert node.op == "com.microsoft:MatMulNBits-1"
    assert node.reason == "blocks side by side, identity A of block_size rows, one weight " \
        "per output"
    assert report.passed


@pytest.mark.parametrize("table_type", ["int4", "uint8"])
def test_gather_block_quantized_table_matches_onnxruntime(table_type):
    rng = np.random.default_rng(7)
    if table_type == "int4":
        table = rng.integers(-8, 8, size=(12, 64)).astype(ml_dtypes.int4)
        zp = None
    else:
        table = rng.integers(0, 256, size=(12, 32), dtype=np.uint8)  # 64 4-bit codes a row
        zp = rng.integers(0, 256, size=(12, 1), dtype=np.uint8)
    scales = (rng.random((12, 2)) * 0.1 + 0.01).astype(np.float32)
    model = gbq_model(table, scales, zp, block=32, bits=4)
    _, [node] = _nodes(model)
    assert node.status == "bit-exact", node.reason
    assert node.reason == "every index gathered"


def _counting(monkeypatch) -> list[tuple[int, ...]]:
    """The shape of every probe run's input (block probes open their sessions through
    ``selfcheck._probe_session``, the others through ``runners.ort_session``)."""
    runs: list[tuple[int, ...]] = []

    def counted(real):
        def counting(m, *a, **kw):
            session = real(m, *a, **kw)

            def run(feeds, outputs=None):
                if m.graph.name == "fused_alone":
                    runs.append(next(iter(feeds.values())).shape)
                return session(feeds, outputs)
            return run
        return counting

    monkeypatch.setattr(selfcheck.runners, "ort_session", counted(selfcheck.runners.ort_session))
    monkeypatch.setattr(selfcheck, "_probe_session", counted(selfcheck._probe_session))
    return runs


def test_large_weights_go_in_column_chunks_of_block_rows_none_sampled(monkeypatch):
    rng = np.random.default_rng(9)
    k, n = 1024, 16
    model = nbits_model(k, n, 4, 32, nbits_inputs(rng, k, n, 4, 32), m=2)
    monkeypatch.setattr(selfcheck, "PROBE_BYTES", 5 * k * 4)  # 5 columns of W a run
    runs = _counting(monkeypatch)
    _, [node] = _nodes(model)
    assert node.status == "bit-exact" and "sampled" not in node.reason
    assert runs == [(32, 32)] * 4  # columns 0-4, 5-9, 10-14, 15: an identity of one block


@pytest.mark.parametrize(("row", "col"), [(1023, 15), (0, 0), (517, 9)])
def test_every_weight_of_a_large_node_is_compared(monkeypatch, row, col):
    # one weight off by one ulp anywhere, the last of the last chunk included, is found
    rng = np.random.default_rng(10)
    k, n = 1024, 16
    model = nbits_model(k, n, 4, 32, nbits_inputs(rng, k, n, 4, 32), m=2)
    monkeypatch.setattr(selfcheck, "PROBE_BYTES", 5 * k * 4)
    real = selfcheck.kernel.dequantize_matmul_nbits
    first = col // 5 * 5  # the chunk's first column

    def off(*a, **kw):
        w = real(*a, **kw).copy()
        if kw["N"] == min(5, n - first) and np.array_equal(a[0], model_b[first:first + 5]):
            w[row, col - first] = np.nextafter(w[row, col - first], np.float32(np.inf))
        return w

    model_b = onnx.numpy_helper.to_array(model.graph.initializer[0])
    monkeypatch.setattr(selfcheck.kernel, "dequantize_matmul_nbits", off)
    _, [node] = _nodes(model)
    assert node.status == "mismatch", node.reason
    assert f"columns {first}..{min(first + 4, n - 1)} of W" in node.reason


def test_large_tables_are_gathered_whole_in_chunks(monkeypatch):
    rng = np.random.default_rng(12)
    table = rng.integers(-8, 8, size=(40, 64)).astype(ml_dtypes.int4)
    scales = (rng.random((40, 2)) * 0.1 + 0.01).astype(np.float32)
    model = gbq_model(table, scales, None, block=32, bits=4)
    monkeypatch.setattr(selfcheck, "GATHER_BYTES", 7 * 64 * 4)  # 7 indices a run
    runs = _counting(monkeypatch)
    _, [node] = _nodes(model)
    assert node.status == "bit-exact" and node.reason == "every index gathered"
    # two probe threads: the runs in any order
    assert sorted(runs) == [(5,)] + [(7,)] * 5


def test_a_kernel_that_disagrees_is_reported_as_a_mismatch(monkeypatch, tmp_path):
    rng = np.random.default_rng(4)
    model = nbits_model(64, 8, 4, 32, nbits_inputs(rng, 64, 8, 4, 32), m=2)
    real = selfcheck.kernel.dequantize_matmul_nbits

    def off_by_one_ulp(*a, **kw):
        w = real(*a, **kw).copy()
        w[3, 5] = np.nextafter(w[3, 5], np.float32(np.inf))
        return w

    monkeypatch.setattr(selfcheck.kernel, "dequantize_matmul_nbits", off_by_one_ulp)
    src = tmp_path / "m.onnx"
    onnx.save(model, src)
    r = CliRunner().invoke(cli, ["check", str(src)], env={"COLUMNS": "250"})
    assert r.exit_code == 1
    assert "mismatch" in r.output and "differ in 1 of 512 elements" in r.output
    assert r.output.rstrip().endswith("FAILED")


def test_a_runtime_weight_is_skipped_with_the_reason():
    rng = np.random.default_rng(5)
    model = nbits_model(64, 8, 4, 32, nbits_inputs(rng, 64, 8, 4, 32), m=2)
    scales = model.graph.initializer[1]
    model.graph.initializer.remove(scales)
    model.graph.input.append(onnx.helper.make_tensor_value_info(
        "scales", onnx.TensorProto.FLOAT, list(scales.dims)))
    _, [node] = _nodes(model)
    assert node.status == "skipped" and "computed at run time" in node.reason


def test_a_negative_zero_weight_is_not_a_mismatch():
    # a code equal to its zero point times a negative scale is -0; the probe's output
    # 1·w + Σ 0·w_j is +0 there: the sign of a zero is not observable through a MatMul
    rng = np.random.default_rng(6)
    inputs = nbits_inputs(rng, 64, 8, 8, 32)
    inputs["scales"] = -inputs["scales"]
    inputs["B"][:, 0, :4] = 128  # codes equal to the default zero point
    inputs["zero_points"] = None
    model = nbits_model(64, 8, 8, 32, inputs, m=2)
    w = dqtool.dequantize_matmul_nbits(inputs["B"], inputs["scales"], K=64, N=8, bits=8,
                                       block_size=32)
    assert np.signbit(w[:4, 0]).all() and (w[:4, 0] == 0).all()
    _, [node] = _nodes(model)
    assert node.status == "bit-exact", node.reason
