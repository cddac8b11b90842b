"""Benchmark ``dqtool fold`` against onnxruntime and onnxscript, each run as a user would.

Run: ``.venv/bin/python bench/bench_fold.py`` (``DQTOOL_BENCH_QUICK=1``: small smoke run;
``DQTOOL_BENCH_RUNS=N``: best of N runs per tool, default 3, 1 when quick).

Builds weight models (X @ DequantizeLinear(W), weights in external data) in a temporary
folder and times, in a fresh process each, with wall time and peak RSS of that process:

* dqtool: ``dqtool fold MODEL -o OUT --external-data``;
* onnxruntime: an ``InferenceSession`` with ``ORT_ENABLE_BASIC`` (constant folding),
  ``session.disable_quant_qdq=1`` (so its constant folding does not skip DequantizeLinear)
  and ``optimized_model_filepath`` + ``session.optimized_model_external_initializers_file_name``;
* onnxscript: ``onnxscript.optimizer.fold_constants`` with ``should_fold`` forcing
  DequantizeLinear and no size limits, then ``onnx_ir.save`` with external data.

Prints times, peak memory, ratios against the best peer, and PASS/MISS per target
(``docs/benchmarks.md#fold``). Each output is checked: no DequantizeLinear left. Tools run
in turn within each round, so a burst of load on a shared machine hits them alike; each
keeps its best round. Also printed: the startup floor, a fresh process importing what
``dqtool fold`` imports and doing nothing, which bounds how fast the CLI can be on small
models.
"""

from __future__ import annotations

import compileall
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx_ir as ir

QUICK = os.environ.get("DQTOOL_BENCH_QUICK") == "1"
RUNS = max(1, int(os.environ.get("DQTOOL_BENCH_RUNS") or (1 if QUICK else 3)))
PY = sys.executable
DQTOOL = str(Path(PY).with_name("dqtool"))


@dataclass
class Case:
    name: str
    shape: tuple[int, int]
    kind: str  # "int8-per-axis" | "int4-blocked"
    count: int = 1  # weights in the model
    time_ratio: float | None = None  # target: dqtool time <= ratio x best peer
    mem_ratio: float | None = None  # target: dqtool peak <= ratio x best peer
    max_seconds: float | None = None
    max_rss_mb: float | None = None
    peers: bool = True


def cases() -> list[Case]:
    if QUICK:
        return [Case("int8 per-axis 1024x1024", (1024, 1024), "int8-per-axis", 1, 0.5, 1.0),
                Case("int4 blocked 1024x1024", (1024, 1024), "int4-blocked", 1, 0.5, 1.0),
                Case("int8 2048x2048", (2048, 2048), "int8-per-axis", 1, 0.33, 0.5)]
    return [
        Case("int8 per-axis 4096x4096", (4096, 4096), "int8-per-axis", 1, 0.5, 1.0),
        Case("int4 blocked 4096x4096", (4096, 4096), "int4-blocked", 1, 0.5, 1.0),
        Case("int8 16384x8192 (128 MB -> 512 MB)", (16384, 8192), "int8-per-axis", 1, 0.33,
             0.5),
        Case("int8 640 MB -> 2.56 GB (10 x 8192x8192)", (8192, 8192), "int8-per-axis", 10,
             max_seconds=3.0, max_rss_mb=1024, peers=False),
    ]


def build(case: Case, folder: Path) -> Path:
    rng = np.random.default_rng(0)
    rows, cols = case.shape
    x = ir.Value(name="X", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([1, rows]))
    inits, nodes, outs = [], [], []
    for i in range(case.count):
        if case.kind == "int4-blocked":
            q = rng.integers(-8, 8, case.shape, dtype=np.int8).astype(ml_dtypes.int4)
            s = rng.random((rows // 32, cols)).astype(np.float32) + 0.01
            attrs = {"axis": 0, "block_size": 32}
        else:
            q = rng.integers(-128, 128, case.shape, dtype=np.int8)
            s = rng.random(cols).astype(np.float32) + 0.01
            attrs = {"axis": 1}
        qv = ir.Value(name=f"W{i}_q", const_value=ir.tensor(q))
        sv = ir.Value(name=f"W{i}_s", const_value=ir.tensor(s))
        dq = ir.node("DequantizeLinear", [qv, sv], attributes=attrs, name=f"W{i}_dq")
        mm = ir.node("MatMul", [x, dq.outputs[0]], name=f"W{i}_mm")
        mm.outputs[0].name, mm.outputs[0].dtype = f"Y{i}", ir.DataType.FLOAT
        inits += [qv, sv]
        nodes += [dq, mm]
        outs.append(mm.outputs[0])
    g = ir.Graph([x], outs, nodes=nodes, initializers=inits, opset_imports={"": 21})
    path = folder / "model.onnx"
    ir.save(ir.Model(g, ir_version=10), path, external_data="model.onnx.data")
    return path


ORT = textwrap.dedent("""
    import sys, onnxruntime as ort
    src, out = sys.argv[1], sys.argv[2]
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.add_session_config_entry("session.disable_quant_qdq", "1")
    so.optimized_model_filepath = out
    so.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                "out.onnx.data")
    so.add_session_config_entry(
        "session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])
""")

ONNXSCRIPT = textwrap.dedent("""
    import sys, onnx_ir as ir, onnxscript.optimizer as opt
    src, out = sys.argv[1], sys.argv[2]
    model = ir.load(src)
    opt.fold_constants(model, input_size_limit=2**40, output_size_limit=2**40,
                       should_fold=lambda n: True if n.op_type == "DequantizeLinear" else None)
    ir.save(model, out, external_data="out.onnx.data")
""")

WRAP = ("import resource, subprocess, sys, time; t = time.perf_counter(); "
        "r = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
        "dt = time.perf_counter() - t; "
        "print(dt, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, r.returncode); "
        "sys.stdout.write(r.stdout); "
        "sys.stderr.write(r.stderr[-2000:] if r.returncode else '')")

# Per case: dqtool's own ``seconds`` (its --json report) of the best round: the fold's work
# (load, rewrite, compute and write), without interpreter start-up, imports and exit.
FOLD_WORK: dict[str, float] = {}


def measure(cmd: list[str]) -> tuple[float, float, bool]:
    """(seconds, peak RSS in MB, ok) of ``cmd`` in a fresh process."""
    return _measure(cmd)[0]


def _measure(cmd: list[str]) -> tuple[tuple[float, float, bool], str]:
    """``measure``, and what ``cmd`` printed on stdout."""
    res = subprocess.run([PY, "-c", WRAP, *cmd], capture_output=True, text=True)
    first, _, out = res.stdout.partition("\n")
    seconds, rss_kb, code = first.split()
    if int(code):
        print(f"    failed: {res.stderr.strip().splitlines()[-1:]}")
    return (float(seconds), int(rss_kb) / 1024, int(code) == 0), out


def _fold_work(stdout: str) -> float | None:
    try:
        return float(json.loads(stdout)["seconds"])
    except (ValueError, KeyError, TypeError):
        return None


def dq_left(path: Path) -> int:
    import onnx

    m = onnx.load(str(path), load_external_data=False)
    return sum(n.op_type == "DequantizeLinear" for n in m.graph.node)


def run_case(case: Case, folder: Path) -> dict:
    """Best (fastest) of ``RUNS`` rounds per tool, with that round's peak memory."""
    src = build(case, folder)
    runs: dict[str, tuple[float, float, bool]] = {}
    tools = {"dqtool": [DQTOOL, "fold", str(src), "-o", "{out}", "--external-data",
                        "--no-progress", "--json"]}
    if case.peers:
        tools["onnxruntime"] = [PY, "-c", ORT, str(src), "{out}"]
        tools["onnxscript"] = [PY, "-c", ONNXSCRIPT, str(src), "{out}"]
    for round_ in range(RUNS):
        for name, cmd in tools.items():
            out_dir = folder / name
            out_dir.mkdir(exist_ok=True)
            out = out_dir / "out.onnx"
            run, stdout = _measure([c.replace("{out}", str(out)) for c in cmd])
            if run[2] and round_ == 0 and dq_left(out):
                print(f"    {name}: {dq_left(out)} DequantizeLinear left in its output")
            for f in out_dir.iterdir():  # free the disk before the next tool
                f.unlink()
            best = runs.get(name)
            if best is None or (run[2], -run[0]) > (best[2], -best[0]):
                runs[name] = run
                if name == "dqtool":
                    FOLD_WORK[case.name] = _fold_work(stdout) or float("nan")
    return runs


# As the command line imports: dqtool.cli first (it defers sympy), then what fold needs.
STARTUP = "import dqtool.cli, dqtool.storage, dqtool.folding, dqtool.cli.fold_cmd"


def startup_floor() -> float:
    """Seconds for a fresh process to import what ``dqtool fold`` imports (best of 3)."""
    return min(measure([PY, "-c", STARTUP])[0] for _ in range(3))


def judge(case: Case, runs: dict) -> list[str]:
    t, m, ok = runs["dqtool"]
    verdicts = []
    peers = {k: v for k, v in runs.items() if k != "dqtool" and v[2]}
    if case.time_ratio and peers:
        best_t = min(v[0] for v in peers.values())
        best_m = min(v[1] for v in peers.values())
        verdicts.append(f"time {t / best_t:.2f}x best peer (target <= {case.time_ratio}) "
                        f"{'PASS' if ok and t <= case.time_ratio * best_t else 'MISS'}")
        verdicts.append(f"peak {m / best_m:.2f}x best peer (target <= {case.mem_ratio}) "
                        f"{'PASS' if ok and m <= case.mem_ratio * best_m else 'MISS'}")
    if case.max_seconds:
        verdicts.append(f"time {t:.2f} s (target <= {case.max_seconds} s) "
                        f"{'PASS' if ok and t <= case.max_seconds else 'MISS'}")
    if case.max_rss_mb:
        verdicts.append(f"peak {m:.0f} MB (target <= {case.max_rss_mb} MB) "
                        f"{'PASS' if ok and m <= case.max_rss_mb else 'MISS'}")
    return verdicts


def main() -> int:
    # Time the command as installed (pip compiles a wheel's bytecode), not a first run
    # under PYTHONDONTWRITEBYTECODE that compiles dqtool's sources every time.
    compileall.compile_dir(Path(__file__).resolve().parents[1] / "dqtool", quiet=1)
    results = []
    print(f"startup floor (fresh process, {STARTUP}): {startup_floor():.2f} s; "
          f"best of {RUNS} run(s) per tool")
    with tempfile.TemporaryDirectory(prefix="bench_fold.", dir=os.environ.get("TMPDIR")) as tmp:
        for i, case in enumerate(cases()):
            folder = Path(tmp) / f"case{i}"
            folder.mkdir()
            print(f"{case.name}:")
            runs = run_case(case, folder)
            for name, (t, m, ok) in runs.items():
                print(f"  {name:12s} {t:7.2f} s  {m:7.0f} MB  {'ok' if ok else 'FAILED'}")
            print(f"  (dqtool's fold work in process: {FOLD_WORK[case.name]:.2f} s; the rest "
                  "is start-up, imports and exit)")
            verdicts = judge(case, runs)
            for v in verdicts:
                print(f"  {v}")
            results.append({"case": case.name, "runs": runs, "verdicts": verdicts})
            for f in folder.rglob("*"):
                if f.is_file():
                    f.unlink()
    if os.environ.get("DQTOOL_BENCH_JSON"):
        print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
