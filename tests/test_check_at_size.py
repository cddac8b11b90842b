"""``check --against`` at LLM size: what it does once, what it skips when it cannot say
anything, and that a planted wrong weight still fails."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
from helpers.fused import nbits_inputs, nbits_model

import dqtool


def _save(model: onnx.ModelProto | ir.Model, path) -> str:
    if isinstance(model, ir.Model):
        ir.save(model, path)
    else:
        onnx.save(model, path)
    return str(path)


def _fp16_pair(tmp_path, m: int = 4):
    rng = np.random.default_rng(7)
    original = nbits_model(256, 64, 4, 32, nbits_inputs(rng, 256, 64, 4, 32, np.float16),
                           dtype=np.float16, m=m)
    src = _save(original, tmp_path / "orig.onnx")
    up = _save(dqtool.upgrade(ir.load(src), 21).model, tmp_path / "up.onnx")
    return src, up


def _sums_in_float16() -> bool:
    """onnxruntime on this CPU's path sums a float16 MatMulNBits in float16
    (``code_paths``: neon-fp16-matmulnbits, arm64-dotprod): beyond the float32-sum bound,
    a known deviation the reference evaluator decides."""
    from dqtool.checking import path_deviations

    return any(d.key == "neon-fp16-matmulnbits"
               for d in path_deviations.for_op("com.microsoft:MatMulNBits"))


def _counted_runs(monkeypatch) -> list[str]:
    """Each onnxruntime run of a whole model from here on: "whole" (one session) or
    "streamed" (in pieces)."""
    from dqtool.checking import runners, stream_ort

    runs: list[str] = []
    real_run, real_streamed = runners.run_ort, stream_ort.StreamedOrt.__call__
    monkeypatch.setattr(runners, "run_ort",
                        lambda *a, **k: runs.append("whole") or real_run(*a, **k))
    monkeypatch.setattr(stream_ort.StreamedOrt, "__call__",
                        lambda *a, **k: runs.append("streamed") or real_streamed(*a, **k))
    return runs


def test_outputs_that_compare_nothing_are_not_bounded_and_still_fail(tmp_path):
    """NaN in every element of both models: nothing differs for a bound to explain, so no
    onnxruntime run is spent on one; the verdict fails unless accepted."""
    src, up = _fp16_pair(tmp_path)
    nan = {"A": np.full((4, 256), np.nan, np.float16)}
    report = dqtool.check(up, against=src, inputs=nan)
    assert not report.passed and report.bounds == ()
    assert all(o.compared_nothing for c in report.comparisons for o in c.outputs)
    assert dqtool.check(up, against=src, inputs=nan, accept_nonfinite=True).passed
    # finite inputs whose onnxruntime outputs differ are still bounded
    finite = dqtool.check(up, against=src)
    assert finite.passed
    ort = next(c for c in finite.comparisons if c.runtime == "onnxruntime")
    if any(o.max_abs for o in ort.outputs):  # 1 ulp apart on x86-64 (2026-11-28)
        assert [b.status for b in finite.bounds] == \
            ["beyond" if _sums_in_float16() else "within"]


def test_one_block_scale_off_by_one_ulp_fails(tmp_path):
    """The weight comparison reads the converted DequantizeLinear through the kernel
    directly: one block's scale one ulp off is found, in that weight, by its values."""
    src, up = _fp16_pair(tmp_path)
    model = ir.load(up)
    scale = next(v for v in model.graph.initializers.values() if v.name.endswith("scale"))
    values = scale.const_value.numpy().copy()
    values.flat[-1] = np.nextafter(values.flat[-1], np.float16(np.inf))
    scale.const_value = ir.tensor(values, name=scale.name)
    bad = _save(model, tmp_path / "bad.onnx")
    assert dqtool.check(up, against=src).passed
    report = dqtool.check(bad, against=src)
    assert not report.passed
    assert [(w.node, w.status) for w in report.weights] == [("mm", "differ")]
    # the block's 32 weights, but those whose code is the zero point (0 either way)
    count, of = report.weights[0].detail.split(" elements")[0].split(" of ")
    assert 0 < int(count) <= 32 and of == "16384"


def test_streamed_runs_keep_what_the_bounds_read(tmp_path, monkeypatch):
    """At LLM size (a model that streams) onnxruntime runs each model once: the runs the
    outputs are compared on keep each fused node's A and output, and the bounds read them
    there (each run of a converted LLM is onnxruntime dequantizing every weight)."""
    from dqtool.checking import against, runners

    src, up = _fp16_pair(tmp_path, m=8)
    runs = _counted_runs(monkeypatch)
    separate = dqtool.check(up, against=src)  # small: not streamed, the bounds run again
    # (on a path with a MatMulNBits deviation, one more: the original's own distance)
    assert runs == ["whole"] * (5 if _sums_in_float16() else 4) and separate.passed
    monkeypatch.setattr(runners, "STREAM_BYTES", 0)
    runs.clear()
    once = dqtool.check(up, against=src)
    # (after them, on a path with a MatMulNBits deviation: the original's own distance)
    own = ["whole", "streamed"] if _sums_in_float16() else []
    assert runs == ["streamed"] * 2 + own and once.passed
    assert any(n.startswith("onnxruntime ran each model once") for n in once.notes)
    assert [b.to_json() for b in once.bounds] == [b.to_json() for b in separate.bounds]
    assert [b.status for b in once.bounds] == ["beyond" if _sums_in_float16() else "within"]
    # past the budget, nothing is kept and the bounds run the models again
    monkeypatch.setattr(against, "KEEP_BYTES", 0)
    runs.clear()
    again = dqtool.check(up, against=src)
    assert runs == ["streamed"] * 4 + own
    assert [b.to_json() for b in again.bounds] == [b.to_json() for b in separate.bounds]
    assert not any(n.startswith("onnxruntime ran each model once") for n in again.notes)


def _chain() -> onnx.ModelProto:
    """x → a1 → a2 → y, each an Add of a constant; a piece per node when forced."""
    return onnx.parser.parse_model("""<ir_version: 8, opset_import: ["" : 17]>
        g (float[2,3] x) => (float[2,3] y) <float[3] c1 = {1.0, 2.0, 3.0},
                                            float[3] c2 = {4.0, 5.0, 6.0},
                                            float[3] c3 = {7.0, 8.0, 9.0}> {
            a1 = Add(x, c1)
            a2 = Add(a1, c2)
            y = Add(a2, c3)
        }""")


def test_a_streamed_run_keeps_values_within_its_budget_and_drops_them_past_it(monkeypatch):
    from dqtool.checking import runners, stream_ort

    monkeypatch.setattr(stream_ort, "PIECE_BYTES", 1)  # a piece per node
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    run = stream_ort.StreamedOrt(_chain(), lambda piece: runners._whole_ort(piece, None))
    kept = run({"x": x}, None, ["a1", "a2"], 1 << 20)
    assert sorted(kept) == ["a1", "a2", "y"]
    np.testing.assert_array_equal(kept["a1"], x + np.float32([1, 2, 3]))
    np.testing.assert_array_equal(kept["a2"], x + np.float32([5, 7, 9]))
    np.testing.assert_array_equal(kept["y"], x + np.float32([12, 15, 18]))
    # a1 alone is 24 bytes: past a budget of 30 once a2 is made, a2 (still to be read by
    # the last piece) is dropped without breaking the run
    dropped = run({"x": x}, None, ["a1", "a2"], 30)
    assert sorted(dropped) == ["y"]
    np.testing.assert_array_equal(dropped["y"], x + np.float32([12, 15, 18]))


def test_products_through_float32_stay_above_the_exact_ones():
    from fractions import Fraction

    from dqtool.families.fused import bound

    rng = np.random.default_rng(3)
    for k, scale in ((7, 1.0), (300, 1e-30), (64, 1e30), (33, 1e-44), (5000, 1.0)):
        x = np.abs(rng.standard_normal((2, k))) * scale
        w = np.abs(rng.standard_normal((k, 3))).astype(np.float32)
        got = bound._products_above(x, w)
        for r in range(2):
            for c in range(3):
                exact = sum(Fraction(float(x[r, i])) * Fraction(float(w[i, c]))
                            for i in range(k))
                assert Fraction(float(got[r, c])) >= exact
                # looser by at most ~4e-6 of itself, whatever K (blocks of 64 terms)
                assert float(got[r, c]) <= float(exact) * (1 + 5e-6) + k * 2.0 ** -140
    # past float32's range: float64 products; a non-finite x: its own (inf) products
    big = np.full((1, 4), 1e38)
    assert np.isfinite(bound._products_above(big, np.full((4, 1), 1e3, np.float32))).all()
    inf = bound._products_above(np.array([[np.inf, 1.0]]), np.ones((2, 1), np.float32))
    assert inf[0, 0] == np.inf


def test_check_alone_probes_a_gather_table_kept_in_its_file(tmp_path, monkeypatch):
    """A GatherBlockQuantized table in external data is run on onnxruntime too (its probe
    model carries the table's bytes): it was "kernel-only", onnxruntime finding no file,
    and its weights went unverified there."""
    import ml_dtypes
    from helpers.fused import gbq_model

    from dqtool import checking

    rng = np.random.default_rng(5)
    table = rng.integers(-8, 8, (64, 128)).astype(ml_dtypes.int4)
    scales = (rng.random((64, 4)) * 0.1 + 0.01).astype(np.float16)
    path = tmp_path / "gbq.onnx"
    onnx.save(gbq_model(table, scales, None), path, save_as_external_data=True,
              all_tensors_to_one_file=True, location="gbq.onnx.data", size_threshold=0)
    monkeypatch.chdir(tmp_path.parent)  # not the model's folder
    # read from its file, as a model past 256 MiB of external data is
    monkeypatch.setattr(checking, "KEEP_IN_FILES_BYTES", 0)
    report = dqtool.check(str(path))
    assert any("kept in its files" in n for n in report.notes)
    assert [(n.name, n.status) for n in report.nodes] == [("gbq", "bit-exact")]
    assert report.passed


def test_upgrade_check_at_llm_size_runs_each_model_once_on_onnxruntime(tmp_path,
                                                                          monkeypatch):
    """``upgrade --check`` streams as ``check --against`` does: onnxruntime beside the
    reference evaluator, its runs keeping what the bounds read; the same verdicts."""
    from dqtool.checking import runners

    rng = np.random.default_rng(0)
    src = _save(nbits_model(256, 64, 4, 32, nbits_inputs(rng, 256, 64, 4, 32, np.float16),
                            dtype=np.float16, m=8), tmp_path / "orig.onnx")
    runs = _counted_runs(monkeypatch)
    small = dqtool.upgrade(src, 21, tmp_path / "a.onnx", check=True).check
    assert runs == ["whole"] * 2  # the bounds run both models again (the comparison
    # opens sessions of its own)
    monkeypatch.setattr(runners, "STREAM_BYTES", 0)
    runs.clear()
    large = dqtool.upgrade(src, 21, tmp_path / "b.onnx", check=True).check
    assert runs == ["streamed"] * 2
    assert small.ok and large.ok and large.runtimes == small.runtimes
    assert large.runtimes["onnxruntime (CPU, ORT_DISABLE_ALL)"].startswith(
        "fused weights identical; final Y: ")


def test_a_bound_that_says_nothing_is_unbounded_not_within():
    """accuracy_level 3 (A rounded to bfloat16, u = 2^-8): from K = 256 terms n·u ≥ 1 and
    the classic bound is infinite; a node that differs is then not bounded (it was
    "within" whatever its difference)."""
    from dqtool.families.fused import bound

    rng = np.random.default_rng(4)
    k, n = 512, 8
    inputs = nbits_inputs(rng, k, n, 4, 32)
    node = ir.serde.deserialize_model(nbits_model(k, n, 4, 32, inputs, m=1,
                                                  accuracy_level=3)).graph.node(0)
    a = rng.standard_normal((1, k)).astype(np.float32)
    y = rng.standard_normal((1, n)).astype(np.float32)
    y2 = y.copy()
    y2[0, 3] += np.float32(1000.0)
    got = bound._matmul_bound(node, node, a, a, y, y2)
    assert got.status == "unbounded" and "no finite rounding bound" in got.detail
    assert bound._matmul_bound(node, node, a, a, y, y.copy()).status == "within"


def _float16_chain(tmp_path) -> tuple[str, str]:
    """float32 → Cast → MatMulNBits → Add(bias) → MatMulNBits → Cast, float16 inside, and
    its upgrade: onnxruntime computes the converted model's MatMul and Add in float32 and
    never rounds A, Y1, Z, Y (no float16 CPU kernel for them)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1)
    k = n = 256
    nodes, inits = [helper.make_node("Cast", ["X"], ["A"], to=TensorProto.FLOAT16)], []
    for name, a, y in (("mm1", "A", "Y1"), ("mm2", "Z", "Y")):
        p = nbits_inputs(rng, k, n, 4, 32, np.float16)
        inits += [numpy_helper.from_array(p["B"], name + "B"),
                  numpy_helper.from_array(p["scales"], name + "s"),
                  numpy_helper.from_array(p["zero_points"], name + "z")]
        nodes.append(helper.make_node("MatMulNBits", [a, name + "B", name + "s", name + "z"],
                                      [y], name=name, domain="com.microsoft", K=k, N=n,
                                      bits=4, block_size=32))
        if name == "mm1":
            inits.append(numpy_helper.from_array(rng.standard_normal(n).astype(np.float16),
                                                 "bias"))
            nodes.append(helper.make_node("Add", ["Y1", "bias"], ["Z"]))
    nodes.append(helper.make_node("Cast", ["Y"], ["Yo"], to=TensorProto.FLOAT))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT,
                                                                     [4, k])],
                          [helper.make_tensor_value_info("Yo", TensorProto.FLOAT, [4, n])],
                          initializer=inits)
    src = _save(helper.make_model(g, ir_version=10, opset_imports=[
        helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]),
        tmp_path / "chain.onnx")
    return src, _save(dqtool.upgrade(ir.load(src), 21).model, tmp_path / "chain_up.onnx")


def test_kept_values_never_change_the_onnxruntime_run_compared(tmp_path, monkeypatch):
    """A value onnxruntime keeps in float32 is not kept by the compared run (making it an
    output would round it: onnxruntime's difference went 0.0963 → 0.125 and the note on
    the runs behind the bounds disappeared); the streamed check compares what the plain
    one does, and the bounds run the converted model again for those values."""
    from dqtool.checking import runners

    src, up = _float16_chain(tmp_path)

    def ort_stats(report):
        ort = next(c for c in report.comparisons if c.runtime == "onnxruntime")
        return [(o.max_abs, o.mismatched) for o in ort.outputs]

    plain = dqtool.check(up, against=src)
    monkeypatch.setattr(runners, "STREAM_BYTES", 0)
    streamed = dqtool.check(up, against=src)
    assert ort_stats(streamed) == ort_stats(plain)
    assert ort_stats(plain)[0][0] > 0  # onnxruntime's sums differ between the two models
    drift = [n.split(":")[0] for n in plain.notes if "when the nodes' values are exposed" in n]
    assert drift == [n.split(":")[0] for n in streamed.notes
                     if "when the nodes' values are exposed" in n]
    from dqtool.runtimes import cpu_path

    if cpu_path.probe().name.startswith("x86-64"):  # measured there (2026-11-28): its
        # graph keeps the converted model's Add and MatMul outputs in float32
        assert drift
        assert any(n.startswith("the bounds read each fused node's input and output from "
                                "onnxruntime's compared run of ") and "ran again" in n
                   for n in streamed.notes), streamed.notes
    a = dqtool.upgrade(src, 21, tmp_path / "a.onnx", check=True).check
    monkeypatch.setattr(runners, "STREAM_BYTES", 1 << 50)
    b = dqtool.upgrade(src, 21, tmp_path / "b.onnx", check=True).check
    assert a.runtimes == b.runtimes and a.ok and b.ok


def test_a_failure_beside_onnxruntime_stops_its_streamed_run(tmp_path, monkeypatch):
    """The reference evaluator failing (or Ctrl-C) while onnxruntime runs beside it: the
    error reaches the caller once onnxruntime's run has stopped at its next piece, not
    after the whole run (and its bounds)."""
    import threading

    import pytest

    from dqtool.checking import against, runners, stream_ort

    src, up = _float16_chain(tmp_path)
    monkeypatch.setattr(runners, "STREAM_BYTES", 0)
    monkeypatch.setattr(stream_ort, "PIECE_BYTES", 1)  # a piece per node
    started, pieces = threading.Event(), []
    real_piece = stream_ort.StreamedOrt._piece_model

    def piece(self, *a, **k):
        started.set()
        pieces.append(1)
        if len(pieces) == 1:  # hold onnxruntime at its first piece until the failure
            assert self.stop is not None and self.stop.wait(10)
        return real_piece(self, *a, **k)

    def failing_reference(*a, **k):
        assert started.wait(10)
        raise KeyboardInterrupt

    monkeypatch.setattr(stream_ort.StreamedOrt, "_piece_model", piece)
    monkeypatch.setattr(against, "_run_ref", failing_reference)
    with pytest.raises(KeyboardInterrupt):
        dqtool.check(up, against=src)
    assert len(pieces) == 1  # the converted model's first piece, then nothing
