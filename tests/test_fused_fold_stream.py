"""fold of MatMulNBits streamed to external data in many small chunks (codes read a band
of rows at a time, the next chunk computed while one is written, float16 rounded by the
fast cast) gives the weights of dqtool's kernel, bit for bit."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers.fused import nbits_inputs, nbits_model

import dqtool
from dqtool.folding import compute
from dqtool.kernel import half


@pytest.mark.parametrize(("k", "n", "bits", "block", "zp", "dtype", "store"), [
    (256, 64, 4, 32, "none", np.float16, "keep"),
    (200, 48, 4, 64, "packed", np.float16, "keep"),    # ragged last block
    (130, 17, 4, 64, "packed", np.float32, "float16"),  # odd N: bands off a byte
    (96, 40, 2, 32, "packed", np.float16, "keep"),
    (100, 24, 8, 32, "none", np.float32, "float16"),
    (64, 30, 8, 64, "packed", np.float16, "keep"),      # one block: per-axis
])
def test_streamed_fold_matches_the_kernel(tmp_path, monkeypatch, k, n, bits, block, zp,
                                          dtype, store) -> None:
    monkeypatch.setattr(compute, "CHUNK_ELEMENTS", 1024)  # many chunks
    monkeypatch.setattr(half, "WARM_UP_ELEMENTS", 0)
    monkeypatch.setattr(half, "MIN_ELEMENTS", 1)
    rng = np.random.default_rng(k * n + bits)
    inputs = nbits_inputs(rng, k, n, bits, block, dtype, zp)
    src = tmp_path / "m.onnx"
    onnx.save(nbits_model(k, n, bits, block, inputs, dtype=dtype), src)
    out = tmp_path / "f.onnx"
    report = dqtool.fold(str(src), str(out), dtype=store, external_data=True)
    assert report.prepared == ["mm"] and len(report.folded) == 1
    m = onnx.load(out, load_external_data=False)
    (w,) = [t for t in m.graph.initializer if t.dims == [k, n]]
    assert w.data_location == onnx.TensorProto.EXTERNAL  # streamed in chunks
    got = onnx.numpy_helper.to_array(w, base_dir=str(tmp_path))
    want = dqtool.dequantize_matmul_nbits(inputs["B"], inputs["scales"],
                                          inputs["zero_points"], K=k, N=n, bits=bits,
                                          block_size=block)
    if store == "float16":
        want = want.astype(np.float16)
    assert got.dtype == want.dtype
    assert np.array_equal(got.view(np.uint16 if got.itemsize == 2 else np.uint32),
                          want.view(np.uint16 if want.itemsize == 2 else np.uint32))
