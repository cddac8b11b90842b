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
