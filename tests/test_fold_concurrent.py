"""Folded weights computed at once by the data file's writers (FoldedTensor.streams): a
folded value read by another's folding (a folded scale, a requantized weight), weights
sharing their codes and scale; every fold finishes and gives the kernel's values."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import dqtool


def _model(nodes, inits, path: Path, outputs: list[str], external: bool) -> Path:
    graph = helper.make_graph(
        [*nodes, *(helper.make_node("MatMul", ["A", w], [f"Y_{w}"]) for w in outputs)], "g",
        [helper.make_tensor_value_info("A", 1, [1, 64])],
        [helper.make_tensor_value_info(f"Y_{w}", 1, None) for w in outputs], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)],
                              ir_version=10)
    if external:
        onnx.save(model, path, save_as_external_data=True, location=f"{path.name}.data",
                  size_threshold=0)
    else:
        onnx.save(model, path)
    return path


def _fold(src: Path, out: Path) -> dict[str, np.ndarray]:
    """dqtool fold in its own process, two writer threads, small chunks; a hang fails."""
    code = ("import sys; from dqtool.folding import compute; compute.CHUNK_ELEMENTS = 256; "
            "import dqtool; dqtool.fold(sys.argv[1], sys.argv[2], external_data=True)")
    proc = subprocess.run([sys.executable, "-c", code, str(src), str(out)], timeout=120,
                          capture_output=True, text=True, env={"DQTOOL_THREADS": "2",
                                                                "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return {t.name: numpy_helper.to_array(t, base_dir=str(out.parent))
            for t in onnx.load(out, load_external_data=False).graph.initializer}


@pytest.mark.parametrize("external", [False, True])
def test_a_folded_scale_of_a_folded_weight(tmp_path, external):
    # DQ(sq) is W's scale: computing W reads the folded S whole, while a writer may be
    # writing S itself. This hung on the load lock.
    rng = np.random.default_rng(1)
    q = rng.integers(-128, 128, (64, 512)).astype(np.int8)
    sq = rng.integers(1, 100, (512,)).astype(np.uint8)
    ss = np.array(0.001, np.float32)
    nodes = [helper.make_node("DequantizeLinear", ["sq", "ss"], ["S"]),
             helper.make_node("DequantizeLinear", ["q", "S"], ["W"], axis=1),
             helper.make_node("Identity", ["S"], ["S2"])]
    inits = [numpy_helper.from_array(a, n) for a, n in ((q, "q"), (sq, "sq"), (ss, "ss"))]
    graph_out = helper.make_tensor_value_info("S2", 1, [512])
    src = _model(nodes, inits, tmp_path / "m.onnx", ["W"], external)
    proto = onnx.load(src)
    proto.graph.output.append(graph_out)  # S is written too, as its own initializer
    onnx.save(proto, src, save_as_external_data=external, location="m.onnx.data",
              size_threshold=0)
    folded = _fold(src, tmp_path / "f.onnx")
    s = dqtool.dequantize(sq, ss)
    assert np.array_equal(folded["S"], s)
    assert np.array_equal(folded["W"].view(np.uint32),
                          dqtool.dequantize(q, s, axis=1).view(np.uint32))


def test_a_requantized_weight(tmp_path):
    # DQ -> Q -> DQ: the second DQ's fold reads the first's value through the Q.
    rng = np.random.default_rng(2)
    q = rng.integers(-128, 128, (64, 256)).astype(np.int8)
    s1, s2 = np.array(0.02, np.float32), np.array(0.05, np.float32)
    nodes = [helper.make_node("DequantizeLinear", ["q", "s1"], ["F"]),
             helper.make_node("QuantizeLinear", ["F", "s2"], ["Q2"]),
             helper.make_node("DequantizeLinear", ["Q2", "s2"], ["W"]),
             helper.make_node("Identity", ["F"], ["F2"])]
    inits = [numpy_helper.from_array(a, n) for a, n in ((q, "q"), (s1, "s1"), (s2, "s2"))]
    src = _model(nodes, inits, tmp_path / "m.onnx", ["W", "F2"], True)
    folded = _fold(src, tmp_path / "f.onnx")
    f = dqtool.dequantize(q, s1)
    want = dqtool.dequantize(dqtool.quantize(f, s2), s2)  # no zero point: uint8, as ONNX
    assert np.array_equal(folded["W"].view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("run", range(2))
def test_weights_sharing_their_codes_and_scale(tmp_path, run):
    rng = np.random.default_rng(run)
    q = rng.integers(-128, 128, (64, 512)).astype(np.int8)
    s = (rng.random(512) * 0.1 + 0.01).astype(np.float32)
    nodes, inits = [], [numpy_helper.from_array(q, "q"), numpy_helper.from_array(s, "s")]
    for i in range(6):  # six DequantizeLinear of the same q and s, and six of their own
        inits.append(numpy_helper.from_array((q + i).astype(np.int8), f"q{i}"))
        nodes += [helper.make_node("DequantizeLinear", ["q", "s"], [f"W{i}"], axis=1),
                  helper.make_node("DequantizeLinear", [f"q{i}", "s"], [f"V{i}"], axis=1)]
    src = _model(nodes, inits, tmp_path / "m.onnx",
                 [f"{k}{i}" for k in "WV" for i in range(6)], True)
    folded = _fold(src, tmp_path / "f.onnx")
    assert sorted(folded) == sorted(f"{k}{i}" for k in "WV" for i in range(6))
    for name, w in folded.items():  # W: the shared codes; Vi: q + i
        codes = q if name[0] == "W" else (q + int(name[1:])).astype(np.int8)
        want = dqtool.dequantize(codes, s, axis=1)
        assert np.array_equal(w.view(np.uint32), want.view(np.uint32)), name
