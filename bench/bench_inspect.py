"""Benchmark: ``dqtool inspect`` on a large external-data model, and on many nodes.

1. A 2 GB external-data model: target under 2 s and 300 MB peak RSS. The peer measured in
   the same run is ``onnx.load`` with its external data, what a user without dqtool does
   to look inside such a model. DQTOOL_BENCH_QUICK=1 uses a 256 MB model.
2. Growth in nodes: ``dqtool inspect`` (table and ``--json``) against ``dqtool lint`` (the
   peer: it reads every node of the same model the same way), both with default flags and
   output piped, on a Q/DQ chain (QuantizeLinear → DequantizeLinear → QuantizeLinear …) of
   2,000, 10,000 and 100,000 nodes and a flat graph of 50,000 DequantizeLinear (each
   reading initializers of its own, half of them graph outputs, half read by a Relu).
   Target: inspect at most 3× lint's time on every model. Printed per model: the best of
   DQTOOL_BENCH_REPEAT rounds (2; 3 with QUICK) of each command, the time per node net of
   a process's start-up (each command on a 2-node chain), and the ratios; a command that
   has not finished after DQTOOL_BENCH_TIMEOUT seconds (600) is stopped and shown as
   ">". DQTOOL_BENCH_QUICK=1 runs the chain at 2,000 and 10,000 and the flat graph at
   10,000 nodes.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's tools
from tools import many_nodes

QUICK = bool(os.environ.get("DQTOOL_BENCH_QUICK"))
TOTAL = (256 if QUICK else 2048) * 2**20
N_WEIGHTS = 64
REPEAT = int(os.environ.get("DQTOOL_BENCH_REPEAT", "3" if QUICK else "2"))
TIMEOUT = float(os.environ.get("DQTOOL_BENCH_TIMEOUT", "600"))
CHAINS = (2_000, 10_000) if QUICK else (2_000, 10_000, 100_000)
FLAT = 10_000 if QUICK else 50_000
RATIO_TARGET = 3.0


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


def build_chain(path: Path, n: int) -> Path:
    onnx.save(many_nodes.chain(n), path)
    return path


def build_flat(path: Path, n: int) -> Path:
    onnx.save(many_nodes.flat(n), path)
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


def external_data() -> None:
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


COMMANDS = {"lint": ["lint"], "inspect": ["inspect"], "inspect --json": ["inspect", "--json"]}


def timed(args: list[str], model: Path) -> float:
    """Wall seconds of ``dqtool ARGS MODEL`` (its output piped away, as a script reads it;
    lint's exit 1 for findings is fine), or inf when stopped at TIMEOUT."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}  # piped: 160 columns
    t = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-m", "dqtool", *args, str(model)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        return float("inf")
    if proc.returncode not in (0, 1):
        raise SystemExit(f"dqtool {' '.join(args)} failed: {proc.stderr.decode()[-500:]}")
    return time.perf_counter() - t


def best_times(model: Path) -> dict[str, float]:
    """The best of REPEAT rounds per command; a round runs each command once, in turn, so
    a slow minute of the shared machine weighs on all of them alike."""
    best = dict.fromkeys(COMMANDS, float("inf"))
    for round_ in range(REPEAT):
        for name, args in COMMANDS.items():
            if round_ and best[name] == float("inf"):
                continue  # stopped at TIMEOUT once: not waited for again
            best[name] = min(best[name], timed(args, model))
    return best


def _seconds(t: float) -> str:
    return f">{TIMEOUT:.0f} s" if t == float("inf") else f"{t:.2f} s"


def growth() -> bool:
    """Prints one line per model and command, then how the time per node of the chain
    grows with its length (1.0x: linear); True when every ratio meets the target."""
    ok = True
    per_node: dict[str, list[float]] = {name: [] for name in COMMANDS}
    with tempfile.TemporaryDirectory(prefix="dqtool-bench-") as d:
        folder = Path(d)
        start = best_times(build_chain(folder / "tiny.onnx", 2))
        print("start-up (2-node chain): " + ", ".join(f"{k} {_seconds(v)}"
                                                        for k, v in start.items()))
        models = [(f"chain {n:,}", n, build_chain(folder / f"chain{n}.onnx", n))
                  for n in CHAINS]
        models.append((f"flat {FLAT:,} DQ", FLAT, build_flat(folder / "flat.onnx", FLAT)))
        for label, n, path in models:
            times = best_times(path)
            for name, t in times.items():
                net = (t - start[name]) / n * 1e6
                if label.startswith("chain"):
                    per_node[name].append(net)
                line = f"{label:>15} {name:<15}: {_seconds(t):>9}  {net:7.1f} µs/node"
                if name != "lint":
                    ratio = t / times["lint"]
                    ok &= ratio <= RATIO_TARGET
                    line += f"  {ratio:5.2f}x lint"
                print(line)
            path.unlink()
    for name, nets in per_node.items():
        grown = nets[-1] / max(nets[0], 1e-9)
        print(f"chain {CHAINS[0]:,} -> {CHAINS[-1]:,} nodes, {name:<15}: time per node "
              + " -> ".join(f"{x:.1f}" for x in nets) + f" µs ({grown:.2f}x)")
    return ok


def main() -> int:
    external_data()
    ok = growth()
    print(f"target inspect <= {RATIO_TARGET:.0f}x lint on every model: "
          f"{'PASS' if ok else 'MISS'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
