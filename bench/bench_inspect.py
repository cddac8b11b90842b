"""Benchmark: ``dqtool inspect`` on a large external-data model.

Target: a 2 GB external-data model inspects in under 2 s and 300 MB peak RSS.
The peer measured in the same run is ``onnx.load`` with its external data, what a user
without dqtool does to look inside such a model.

DQTOOL_BENCH_QUICK=1 uses a 256 MB model for a smoke run.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

QUICK = bool(os.environ.get("DQTOOL_BENCH_QUICK"))
TOTAL = (256 if QUICK else 2048) * 2**20
N_WEIGHTS = 64


def build(folder: Path) -> Path:
    """N_WEIGHTS int8 per-axis weights in one external file, written without holding it
    in memory (the file is sparse: the bench measures reading metadata, not the disk)."""
    rows = 4096
    cols = TOTAL // N_WEIGHTS // rows
    data = folder / "model.onnx.data"
    inits, nodes, outs = [], [], []
    with open(data, "wb") as f:
        f.truncate(TOTAL)
    for i in range(N_WEIGHTS):
        w = TensorProto(name=f"w{i}", data_type=TensorProto.INT8, dims=[rows, cols])
        w.data_location = TensorProto.EXTERNAL
        for k, v in (("location", data.name), ("offset", str(i * rows * cols)),
                     ("length", str(rows * cols))):
            w.external_data.add(key=k, value=v)
        s = numpy_helper.from_array(np.full(rows, 0.01, np.float32), f"s{i}")
        z = numpy_helper.from_array(np.zeros(rows, np.int8), f"z{i}")
        inits += [w, s, z]
        nodes.append(helper.make_node("DequantizeLinear", [w.name, s.name, z.name], [f"y{i}"],
                                      axis=0, name=f"dq{i}"))
        outs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [rows, cols]))
    g = helper.make_graph(nodes, "big", [], outs, inits)
    path = folder / "model.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=7),
              path)
    return path


def run(cmd: list[str]) -> tuple[float, float]:
    """Wall seconds and peak RSS (MB) of a child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    # ru_maxrss of children is the max over all children so far: run the smallest first.
    return wall, max(peak, before) / 1024


def main() -> int:
    with tempfile.TemporaryDirectory() as d:
        path = build(Path(d))
        ours = run([sys.executable, "-m", "dqtool", "inspect", "--json", str(path)])
        peer = run([sys.executable, "-c", f"import onnx; onnx.load({str(path)!r})"])
    size = TOTAL / 2**30
    print(f"model: {N_WEIGHTS} DequantizeLinear, {size:.2f} GiB external data")
    print(f"dqtool inspect --json : {ours[0]:6.2f} s  {ours[1]:7.0f} MB peak")
    print(f"onnx.load (peer)      : {peer[0]:6.2f} s  {peer[1]:7.0f} MB peak")
    print(f"ratio time {ours[0] / peer[0]:.2f}x")
    ok = ours[0] < 2.0 and ours[1] < 300
    print(f"target <2 s and <300 MB: {'PASS' if ok else 'MISS'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
