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
        assert [b.status for b in finite.bounds] == ["within"]


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
    assert runs == ["whole"] * 4 and separate.passed
    monkeypatch.setattr(runners, "STREAM_BYTES", 0)
    runs.clear()
    once = dqtool.check(up, against=src)
    assert runs == ["streamed"] * 2 and once.passed
    assert any(n.startswith("onnxruntime ran each model once") for n in once.notes)
    assert [b.to_json() for b in once.bounds] == [b.to_json() for b in separate.bounds]
    assert [b.status for b in once.bounds] == ["within"]
    # past the budget, nothing is kept and the bounds run the models again
    monkeypatch.setattr(against, "KEEP_BYTES", 0)
    runs.clear()
    again = dqtool.check(up, against=src)
    assert runs == ["streamed", "streamed", "whole", "streamed", "whole", "streamed"]
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
    for k, scale in ((7, 1.0), (300, 1e-30), (64, 1e30), (33, 1e-44)):
        x = np.abs(rng.standard_normal((2, k))) * scale
        w = np.abs(rng.standard_normal((k, 3))).astype(np.float32)
        got = bound._products_above(x, w)
        for r in range(2):
            for c in range(3):
                exact = sum(Fraction(float(x[r, i])) * Fraction(float(w[i, c]))
                            for i in range(k))
                assert Fraction(float(got[r, c])) >= exact
                assert float(got[r, c]) <= float(exact) * (1 + 1e-4) + k * 2.0 ** -140
    # past float32's range: float64 products
    big = np.full((1, 4), 1e38)
    assert np.isfinite(bound._products_above(big, np.full((4, 1), 1e3, np.float32))).all()


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
