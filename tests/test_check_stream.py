"""Streamed runs (``dqtool.checking.stream_ref``, ``stream_ort``): the same values as a whole
run, holding one piece at a time; and the float16 MatMul they use, bit for bit NumPy's."""

from __future__ import annotations

import glob
from pathlib import Path

import numpy as np
import onnx
import pytest

from dqtool.checking import half_matmul, inputs, liveness, models, runners, stream_ort
from dqtool.checking.compare import bit_identical
from dqtool.runtimes import cpu_path

ROOT = Path(__file__).resolve().parent.parent
# float16 models whose MatMul onnxruntime computes in float32 across nodes: a boundary
# between two such nodes rounds the value it carries (stream_ort's docstring), so the
# pieces of one node each that this test forces differ there; measured on these two with
# onnxruntime 1.32 on x86-64 (AVX2 and AVX-512 paths). On arm64-dotprod (under
# qemu-aarch64, 2026-11-28) the streamed and whole runs were bit-identical.
_ROUNDED_AT_BOUNDARIES = {"dq19_float8e4m3fn_fp16_scale.onnx", "dq23_int4_output_dtype.onnx"}
_ROUNDS_ON_THIS_PATH = cpu_path.probe().name.startswith("x86-64")


def _runs(path: str, streamed: bool, monkeypatch) -> dict[str, object]:
    monkeypatch.setattr(runners, "STREAM_BYTES", -1 if streamed else 1 << 50)
    monkeypatch.setattr(stream_ort, "PIECE_BYTES", 1)  # a piece per node where allowed
    loaded = models.load(path)
    feeds, _ = inputs.generate(loaded.proto, seed=0)
    out: dict[str, object] = {}
    for name, run, proto in (("onnxruntime", runners.run_ort, models.for_ort(loaded.proto)[0]),
                             ("reference", runners.run_reference, loaded.proto)):
        try:
            out[name] = run(proto, feeds, external_dir=loaded.external_dir)
        except runners.RuntimeFailure as e:
            out[name] = str(e)
    return out


def _sample_models() -> list[str]:
    out = []
    for p in sorted(glob.glob(str(ROOT / "models" / "*.onnx"))):
        try:
            inputs.generate(models.load(p).proto, seed=0)
        except Exception:  # models/ holds invalid ones on purpose
            continue
        out.append(p)
    return out


@pytest.mark.parametrize("path", _sample_models(), ids=lambda p: Path(p).name)
def test_streamed_runs_give_the_whole_runs_values(path, monkeypatch):
    whole, streamed = _runs(path, False, monkeypatch), _runs(path, True, monkeypatch)
    for runtime in ("onnxruntime", "reference"):
        a, b = whole[runtime], streamed[runtime]
        assert isinstance(a, str) == isinstance(b, str), (runtime, a, b)
        if isinstance(a, str):
            continue
        same = all(bit_identical(a[k], b[k]) for k in a)
        if runtime == "onnxruntime" and Path(path).name in _ROUNDED_AT_BOUNDARIES \
                and _ROUNDS_ON_THIS_PATH:
            assert not same  # if this changes, the set above is out of date
        else:
            assert same, (runtime, path)


def test_liveness_frees_a_value_after_its_last_reader_and_keeps_outputs():
    g = onnx.parser.parse_graph("""g (float[2] x) => (float[2] y, float[2] a) {
        a = Relu(x)
        b = Neg(a)
        y = Add(b, x)
    }""")
    live = liveness.Liveness.of(list(g.node), keep=["y", "a"])
    assert live.dying[0] == () and live.dying[1] == ()
    assert set(live.dying[2]) == {"b", "x"}  # "a" is asked for: it never dies


def test_subgraph_reads_keep_an_outer_value_alive():
    m = onnx.parser.parse_model("""<ir_version: 8, opset_import: ["" : 17]>
        g (bool c, float[2] x) => (float[2] y) {
            k = Neg(x)
            y = If(c) <then_branch = t () => (float[2] o) { o = Relu(k) },
                       else_branch = e () => (float[2] o) { o = Abs(k) }>
        }""")
    live = liveness.Liveness.of(list(m.graph.node), keep=["y"])
    assert live.last_use["k"] == 1  # read inside the If's branches, not as an input


def test_pieces_end_past_the_budget_and_never_where_a_value_cannot_be_carried():
    nodes = [onnx.helper.make_node("Relu", [f"v{i}"], [f"v{i + 1}"]) for i in range(6)]
    weights = {f"v{i}": 10 for i in range(6)}
    assert [(p.start, p.stop) for p in liveness.cut(nodes, weights, 20)] == \
        [(0, 2), (2, 4), (4, 6)]
    allowed = [True, False, False, True, True, True]
    assert [(p.start, p.stop) for p in liveness.cut(nodes, weights, 20, None, allowed)] == \
        [(0, 4), (4, 6)]


@pytest.mark.parametrize("shapes", [((1, 3072), (3072, 64)), ((3, 7), (7, 5)), ((7,), (7, 4)),
                                    ((2, 3, 9), (9, 4)), ((9,), (9,)), ((4, 2, 5), (4, 5, 3))])
def test_half_matmul_is_numpys_bit_for_bit(shapes):
    rng = np.random.default_rng(len(shapes[0]) * 31 + shapes[0][-1])
    for scale in (1e-6, 1.0, 300.0):
        a = (rng.standard_normal(shapes[0]) * scale).astype(np.float16)
        b = (rng.standard_normal(shapes[1]) * scale).astype(np.float16)
        want, got = np.matmul(a, b), half_matmul.matmul(a, b)
        assert want.shape == got.shape
        assert bit_identical(got, want)
    # The order of the sums shows: big + (-big) + 1 is 1 summed first to last, 0 from the
    # last (1 - big rounds to -big in float32), and the kernel follows NumPy's order.
    a = np.array([[65504, 65504, 1]], np.float16)
    b = np.array([[65504], [-65504], [1]], np.float16)
    assert np.matmul(a, b)[0, 0] == 1 and half_matmul.matmul(a, b)[0, 0] == 1
    assert half_matmul.matmul(a[:, ::-1], b[::-1])[0, 0] == 0
