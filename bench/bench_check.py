"""Benchmark: ``check`` and ``check --against`` at LLM size, against ``upgrade`` in the same run.

    .venv/bin/python bench/bench_check.py                  # the model of bench_fused.py
    DQTOOL_BENCH_QUICK=1 .venv/bin/python bench/bench_check.py
    DQTOOL_BENCH_7B=1 .venv/bin/python bench/bench_check.py  # hidden 4096, MLP 11008, 32 layers
    DQTOOL_BENCH_NORM=0 (or 1) ...  # only the variant whose outputs overflow (or are finite)

The model is bench_fused.py's (float16, one GatherBlockQuantized embedding, 32 layers of 7
MatMulNBits, 4-bit, block 128; ~1.8 GB of external data), or its 7B-class variant, in two
variants: as bench_fused.py builds it, whose outputs overflow float16 for any input (no
normalization: the checks run with ``--accept-nonfinite``, and onnxruntime's outputs
compare nothing, so no bound is computed), and with a LayerNormalization before each
MatMulNBits (``DQTOOL_BENCH_NORM=1``), whose outputs are finite and differ on onnxruntime
between the two models (its MatMulNBits and MatMul sum in their own orders): there the
check bounds every fused node. Each command runs as the installed ``dqtool`` script in its
own process, its wall time and peak RSS read by ``wait4``: ``upgrade --opset 21``
(``UPGRADE_RUNS`` times, the median counts: one run just after the model is written met a
busy disk at 12.8 s against 1.5-2.8 s otherwise, docs/benchmarks.md), then
``check UP --against MODEL``, ``check MODEL`` and ``upgrade --check``; for the finite
variant also ``check`` of UP with one block's scale of the last layer one ulp off
(``--against MODEL``: it must fail, exit 1).

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


def plant(up: Path, out: Path) -> None:
    """``up`` copied to ``out`` with one block's scale of the last down projection one ulp
    up (float16): the weight comparison must find it."""
    import shutil

    import numpy as np
    import onnx

    m = onnx.load(str(up), load_external_data=False)
    shutil.copy(up, out)
    data = out.with_name(out.name + ".data")
    shutil.copy(up.with_name(up.name + ".data"), data)
    last = max((t.name for t in m.graph.initializer if t.name.endswith(".down/scale")),
               key=lambda name: int(name.split(".")[0][1:]))  # "l31", not "l9" (text order)
    t = next(t for t in m.graph.initializer if t.name == last)
    offset = int({e.key: e.value for e in t.external_data}["offset"]) + 2 * 1000
    with open(data, "r+b") as f:
        f.seek(offset)
        v = np.frombuffer(f.read(2), np.float16)
        f.seek(offset)
        f.write(np.nextafter(v, np.float16(np.inf)).astype(np.float16).tobytes())
    m_out = onnx.load(str(out), load_external_data=False)
    for e in (e for t in m_out.graph.initializer for e in t.external_data
              if e.key == "location"):
        e.value = data.name
    onnx.save(m_out, str(out))


def variant(norm: bool) -> None:
    bench_fused.NORM = norm
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
        commands = [("check --against", ("check", str(up), "--against", str(model))),
                    ("check", ("check", str(model))),
                    ("upgrade --check", ("upgrade", str(model), "--opset", "21", "-o",
                                         str(folder / "up2.onnx"), "--check"))]
        if norm:
            plant(up, folder / "planted.onnx")
            commands.append(("planted --against", ("check", str(folder / "planted.onnx"),
                                                   "--against", str(model))))
        for label, args in commands:
            if SEVEN_B and label in ("check", "upgrade --check"):
                continue
            checking = args[0] == "check"
            t2, rss2, code2, out = run(*args, *(("--accept-nonfinite", "--json") if checking
                                                else ()))
            doc = json.loads(out) if out.strip().startswith("{") else {}
            verdict = ("passed" if doc.get("passed") else "FAILED") if checking else \
                ("passed" if code2 == 0 else "FAILED")
            rows.append((label, t2, rss2, code2, verdict))
            for path in folder.glob("up2.onnx*"):
                path.unlink()
    base = rows[0][1]
    size = "7B-class (D 4096, F 11008)" if SEVEN_B else f"D {bench_fused.D}, F {bench_fused.F}"
    kind = "finite outputs (a LayerNormalization before each MatMulNBits)" if norm else \
        "outputs overflowing float16"
    print(f"model: {size}, {bench_fused.LAYERS} layers, block {bench_fused.BLOCK}, {kind}")
    for label, t, rss, code, verdict in rows:
        line = f"{label:22s} {t:8.1f} s {rss:8.0f} MB  {t / base:6.1f}x upgrade  exit {code}"
        if label.startswith("planted"):
            line += f"  {verdict}  {'PASS' if code == 1 else 'MISS'} (must fail, exit 1)"
        elif label != rows[0][0]:
            limit_t = 180.0 if SEVEN_B else 10 * base
            limit_m = 2048 if SEVEN_B else 1024
            ok = t <= limit_t and rss <= limit_m
            line += f"  {verdict}  {'PASS' if ok else 'MISS'} (≤ {limit_t:.0f} s, ≤ {limit_m} MB)"
        print(line)


def main() -> None:
    if SEVEN_B:
        bench_fused.D, bench_fused.F = 4096, 11008
    chosen = os.environ.get("DQTOOL_BENCH_NORM")
    for norm in (False, True) if chosen is None else (chosen != "0",):
        variant(norm)


if __name__ == "__main__":
    main()
