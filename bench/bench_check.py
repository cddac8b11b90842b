"""Benchmark: ``check`` and ``check --against`` at LLM size, against ``upgrade`` in the same run.

    .venv/bin/python bench/bench_check.py                  # the model of bench_fused.py
    DQTOOL_BENCH_QUICK=1 .venv/bin/python bench/bench_check.py
    DQTOOL_BENCH_7B=1 .venv/bin/python bench/bench_check.py  # hidden 4096, MLP 11008, 32 layers

The model is bench_fused.py's (float16, one GatherBlockQuantized embedding, 32 layers of 7
MatMulNBits, 4-bit, block 128; ~1.8 GB of external data), or its 7B-class variant. Each
command runs as the installed ``dqtool`` script in its own process, its wall time and peak
RSS read by ``wait4``: ``upgrade --opset 21`` (``UPGRADE_RUNS`` times, the median counts:
one run just after the model is written met a busy disk at 12.8 s against 1.5-2.8 s
otherwise, docs/benchmarks.md), then ``check UP --against MODEL`` and ``check MODEL``.
The model's outputs overflow float16 for any input (no normalization between layers): the
checks run with ``--accept-nonfinite``, and the verdict is printed.

Targets (docs/benchmarks.md, "Check at LLM size"): ``check --against`` and ``check`` at
most 10x upgrade's time and 1 GB peak each; the 7B-class variant checked with --against
in at most 180 s and 2 GB.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_fused

SEVEN_B = bool(os.environ.get("DQTOOL_BENCH_7B"))
UPGRADE_RUNS = int(os.environ.get("DQTOOL_BENCH_UPGRADE_RUNS") or 3)
DQTOOL = Path(sys.executable).with_name("dqtool")


def run(*args: str) -> tuple[float, float, int, str]:
    """(wall s, peak RSS MB, exit code, stdout) of one dqtool command."""
    with tempfile.TemporaryFile("w+") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen([str(DQTOOL), *args], stdout=out, stderr=subprocess.DEVNULL)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        out.seek(0)
        return wall, usage.ru_maxrss / 1024, os.waitstatus_to_exitcode(status), out.read()


def main() -> None:
    if SEVEN_B:
        bench_fused.D, bench_fused.F = 4096, 11008
    with tempfile.TemporaryDirectory(prefix="dqtool-bench-check-") as tmp:
        folder = Path(tmp)
        model = bench_fused.build(folder)
        up = folder / "up.onnx"
        rows = []
        runs = []
        for _ in range(UPGRADE_RUNS):
            t, rss, code, _ = run("upgrade", str(model), "--opset", "21", "-o", str(up))
            assert code == 0, "upgrade failed"
            runs.append((t, rss))
        print("upgrade runs: " + ", ".join(f"{t:.2f} s" for t, _ in runs))
        t, rss = sorted(runs)[len(runs) // 2]
        rows.append(("upgrade --opset 21", t, rss, 0, ""))
        for label, args in (("check --against", ("check", str(up), "--against", str(model))),
                            ("check", ("check", str(model)))):
            if SEVEN_B and label == "check":
                continue
            t2, rss2, code2, out = run(*args, "--accept-nonfinite", "--json")
            doc = json.loads(out) if out.strip().startswith("{") else {}
            rows.append((label, t2, rss2, code2, "passed" if doc.get("passed") else "FAILED"))
    base = rows[0][1]
    size = "7B-class (D 4096, F 11008)" if SEVEN_B else f"D {bench_fused.D}, F {bench_fused.F}"
    print(f"model: {size}, {bench_fused.LAYERS} layers, block {bench_fused.BLOCK}")
    for label, t, rss, code, verdict in rows:
        line = f"{label:22s} {t:8.1f} s {rss:8.0f} MB  {t / base:6.1f}x upgrade  exit {code}"
        if label != rows[0][0]:
            limit_t = 180.0 if SEVEN_B else 10 * base
            limit_m = 2048 if SEVEN_B else 1024
            ok = t <= limit_t and rss <= limit_m
            line += f"  {verdict}  {'PASS' if ok else 'MISS'} (≤ {limit_t:.0f} s, ≤ {limit_m} MB)"
        print(line)


if __name__ == "__main__":
    main()
