"""Two folded weights computed at once by the data file's writers (FoldedTensor.streams):
weights sharing their quantized codes and their scale, read through onnx_ir from one
external file, fold to the kernel's values on every run."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import dqtool
from dqtool.folding import compute


@pytest.mark.parametrize("run", range(3))
def test_weights_sharing_tensors_fold_at_once(tmp_path, monkeypatch, run):
    monkeypatch.setenv("DQTOOL_THREADS", "2")
    monkeypatch.setattr(compute, "CHUNK_ELEMENTS", 4096)
    rng = np.random.default_rng(run)
    q = rng.integers(-128, 128, (512, 64)).astype(np.int8)  # int8: read through onnx_ir
    s = (rng.random(64) * 0.1 + 0.01).astype(np.float32)
    nodes, outs, inits = [], [], [numpy_helper.from_array(q, "q"),
                                  numpy_helper.from_array(s, "s")]
    for i in range(6):  # six DequantizeLinear of the same q and s, and six of their own
        own = f"q{i}"
        inits.append(numpy_helper.from_array((q + i).astype(np.int8), own))
        for x, w in (("q", f"W{i}"), (own, f"V{i}")):
            nodes.append(helper.make_node("DequantizeLinear", [x, "s"], [w], axis=1))
            nodes.append(helper.make_node("MatMul", ["A", w], [f"Y_{w}"]))
            outs.append(helper.make_tensor_value_info(f"Y_{w}", 1, [1, 64]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("A", 1, [1, 512])],
                              outs, inits)
    src = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)],
                                ir_version=10),
              src, save_as_external_data=True, location="m.data", size_threshold=0)
    out = tmp_path / "f.onnx"
    dqtool.fold(str(src), str(out), external_data=True)
    folded = {t.name: numpy_helper.to_array(t, base_dir=str(tmp_path))
              for t in onnx.load(out, load_external_data=False).graph.initializer}
    assert sorted(folded) == sorted(f"{k}{i}" for k in "WV" for i in range(6))
    for name, w in folded.items():  # W: the shared codes; Vi: q + i
        codes = q if name[0] == "W" else (q + int(name[1:])).astype(np.int8)
        want = dqtool.dequantize(codes, s, axis=1)
        assert np.array_equal(w.view(np.uint32), want.view(np.uint32)), name
