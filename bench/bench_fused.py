"""Benchmark: an LLM-shaped model of ~2 GB of 4-bit MatMulNBits weights, to ai.onnx and back.

    .venv/bin/python bench/bench_fused.py             # full size (~2 GB model, ~13 GB disk)
    DQTOOL_BENCH_QUICK=1 .venv/bin/python bench/bench_fused.py
    DQTOOL_BENCH_LAYERS=4 .venv/bin/python bench/bench_fused.py   # full-size layers, 4 of them
    DQTOOL_BENCH_NORM=1 ...   # a LayerNormalization before each MatMulNBits: finite

The model (float16, external data): a GatherBlockQuantized embedding, then 32 layers of 7
MatMulNBits (q, k, v, o: D→D; gate, up: D→F; down: F→D), 4-bit symmetric, block 128. Its
data file is written a few MB at a time, never held in memory. Each command runs in its
own subprocess (the CLI), timed by wall clock, with its own peak RSS, between two timed
runs of its peer: copying the data file (copy, upgrade, copy, pack, copy, upgrade, ...;
a command's peer time is the mean of the copies on both sides of it). The copy's time
swings 0.5-4.5 s from one minute to the next on a shared machine (write-back of earlier
gigabytes, other tenants), so each command is measured DQTOOL_BENCH_REPEAT times (default
5) and the median of the ratios is what counts. This machine is a VM whose free memory goes back to
its host ~2 s after it is freed (free page reporting), and the first touch of such memory
waits for the host: a copy of the data file takes 1.5-2.3 s on it against 0.57-0.67 s on
memory freed just before. Every timed step (command and copy alike) therefore starts
right after touching and freeing as much memory as it will write plus 2.5 GB
(DQTOOL_BENCH_WARM_EXTRA_MB, 2560; 512 until 2026-11-27 (`7d93d2d`), when `pack` still drew
such memory in some rounds: 1.2-2.6 s with 1.3 s of system CPU against ~0.8 s and ~0.5 s,
none in rounds warmed 2.5 GB beyond; DQTOOL_BENCH_WARM=0: no warming, as before):

- ``upgrade --opset 21`` (→ DequantizeLinear + MatMul / Gather), then ``pack`` of that
  (→ back to MatMulNBits / GatherBlockQuantized): target ≤ 2× the copy, ≤ 300 MB each;
- ``fold --dtype float16`` (an fp16 checkpoint, 4× the bytes): ratio against copying the
  same number of bytes (measured: the data file copied into one file until it has as
  many bytes), ≤ 300 MB.
Every result is loaded by onnxruntime (the folded one only where the machine has the
memory for it; DQTOOL_BENCH_NO_ORT=1 skips the loads).
"""

from __future__ import annotations

import compileall
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper

QUICK = bool(os.environ.get("DQTOOL_BENCH_QUICK"))
# DQTOOL_BENCH_LAYERS: full-size layers but fewer of them (a quicker run that still
# measures the per-byte cost).
LAYERS = int(os.environ.get("DQTOOL_BENCH_LAYERS") or (2 if QUICK else 32))
D = 256 if QUICK else 3072  # hidden size
F = 512 if QUICK else 8192  # MLP size
V = 1024 if QUICK else 32000  # vocabulary
BLOCK = 128
# DQTOOL_BENCH_NORM=1: a LayerNormalization before each MatMulNBits, so that every value is
# finite
# (without, it overflows float16 for any input: a check compares nothing and bounds nothing)
NORM = os.environ.get("DQTOOL_BENCH_NORM", "0") != "0"
# Rounds of (upgrade, copy, pack, copy) after a first copy; fold (~6-12 s at full size)
# and its copy of as many bytes run FOLD_REPEAT times. The figures are medians of the
# rounds.
REPEAT = int(os.environ.get("DQTOOL_BENCH_REPEAT") or (1 if QUICK else 5))
FOLD_REPEAT = int(os.environ.get("DQTOOL_BENCH_FOLD_REPEAT") or (1 if QUICK else 2))
# Touch memory before each timed step (see above); bytes beyond what a step writes.
WARM = os.environ.get("DQTOOL_BENCH_WARM", "1") != "0"
WARM_EXTRA = int(os.environ.get("DQTOOL_BENCH_WARM_EXTRA_MB") or 2560) << 20

# What a user runs: the installed `dqtool` script next to this interpreter.
DQTOOL = Path(sys.executable).with_name("dqtool")


class DataWriter:
    """Appends tensors to one data file and returns their external-data TensorProtos."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.f = open(path, "wb")  # noqa: SIM115 - closed by close()
        self.offset = 0
        self.noise = np.random.default_rng(0).integers(0, 256, 4 << 20, dtype=np.uint8)

    def tensor(self, name: str, dtype: int, dims: list[int], nbytes: int,
               fill: bytes | None = None) -> TensorProto:
        if fill is None:  # random codes, written 4 MB at a time
            left = nbytes
            while left:
                chunk = self.noise[: min(left, self.noise.size)]
                self.f.write(chunk.tobytes())
                left -= chunk.size
        else:
            self.f.write(fill * (nbytes // len(fill)))
        t = TensorProto(name=name, data_type=dtype, dims=dims)
        t.data_location = TensorProto.EXTERNAL
        for key, value in (("location", self.path.name), ("offset", str(self.offset)),
                           ("length", str(nbytes))):
            t.external_data.add(key=key, value=value)
        self.offset += nbytes
        return t

    def close(self) -> None:
        self.f.close()


def build(folder: Path) -> Path:
    data = DataWriter(folder / "model.onnx.data")
    scale_fill = np.float16(0.01).tobytes()
    inits, nodes = [], []

    def nbits(name: str, x: str, k: int, n: int) -> str:
        kb = -(-k // BLOCK)
        if NORM:  # normalized inputs keep every value finite
            nodes.append(helper.make_node("LayerNormalization", [x, f"norm{k}.gamma"],
                                          [f"{name}.norm"], name=f"{name}.norm", axis=-1))
            x = f"{name}.norm"
        inits.append(data.tensor(f"{name}.B", TensorProto.UINT8, [n, kb, BLOCK // 2],
                                 n * kb * BLOCK // 2))
        inits.append(data.tensor(f"{name}.scales", TensorProto.FLOAT16, [n, kb], n * kb * 2,
                                 scale_fill))
        nodes.append(helper.make_node("MatMulNBits", [x, f"{name}.B", f"{name}.scales"],
                                      [name], name=name, domain="com.microsoft", K=k, N=n,
                                      bits=4, block_size=BLOCK))
        return name

    if NORM:
        inits += [data.tensor(f"norm{k}.gamma", TensorProto.FLOAT16, [k], k * 2,
                              np.float16(1.0).tobytes()) for k in sorted({D, F})]
    inits.append(data.tensor("embed.data", TensorProto.INT4, [V, D], V * D // 2))
    inits.append(data.tensor("embed.scales", TensorProto.FLOAT16, [V, D // BLOCK],
                             V * D // BLOCK * 2, scale_fill))
    nodes.append(helper.make_node("GatherBlockQuantized", ["embed.data", "ids", "embed.scales"],
                                  ["x0"], name="embed", domain="com.microsoft", gather_axis=0,
                                  quantize_axis=1, block_size=BLOCK))
    x = "x0"
    for i in range(LAYERS):
        p = f"l{i}"
        q, k, v = (nbits(f"{p}.{w}", x, D, D) for w in ("q", "k", "v"))
        nodes.append(helper.make_node("Add", [q, k], [f"{p}.qk"], name=f"{p}.add1"))
        nodes.append(helper.make_node("Add", [f"{p}.qk", v], [f"{p}.qkv"], name=f"{p}.add2"))
        o = nbits(f"{p}.o", f"{p}.qkv", D, D)
        g, u = nbits(f"{p}.gate", o, D, F), nbits(f"{p}.up", o, D, F)
        nodes.append(helper.make_node("Mul", [g, u], [f"{p}.gu"], name=f"{p}.mul"))
        x = nbits(f"{p}.down", f"{p}.gu", F, D)
    data.close()
    graph = helper.make_graph(
        nodes, "llm", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, "seq"])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT16, [1, "seq", D])], inits)
    model = helper.make_model(graph, ir_version=10, opset_imports=[
        helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    path = folder / "model.onnx"
    path.write_bytes(model.SerializeToString())
    return path


CPU: dict[str, float] = {}  # CPU seconds (user + system) of each command, by name


def meminfo_mb(key: str) -> float:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


WARMED: list[float] = []  # the fraction of each step's warm-up the free memory allowed


def warm(nbytes: int) -> None:
    """Touches ``nbytes`` + WARM_EXTRA of fresh memory, a write a page, and frees it: the
    step timed next draws memory the host backs now, whatever the previous step freed
    and how long ago. Never more than the free memory (less 256 MB), so that nothing
    cached (the step's input) is evicted for it. In a child process: a command started
    later inherits this process's peak RSS as its own (``ru_maxrss`` keeps the peak of
    the memory it was spawned from)."""
    if not WARM:
        return
    want = nbytes + WARM_EXTRA
    n = min(want, int((meminfo_mb("MemFree") - 256) * 2**20))
    WARMED.append(max(n, 0) / want)
    if n > 0:
        subprocess.run([sys.executable, "-c", "import sys, numpy as np; "
                        "np.empty(int(sys.argv[1]), np.uint8)[::4096] = 1", str(n)],
                       check=True)


def start_step(nbytes: int) -> None:
    """What precedes every timed step: a quiet disk (no write-back of the previous step
    left), then memory the host backs (``warm``)."""
    os.sync()
    warm(nbytes)


def run(*args: str, writes: int) -> tuple[float, float, str]:
    """(wall seconds, peak RSS MB, stdout) of one ``dqtool`` command in its own process (the
    installed script, as a user runs it), which writes about ``writes`` bytes; its CPU
    time (all threads, user + system: steadier than wall time on a shared machine) goes
    to ``CPU``. The process's own resource usage is read by ``wait4``."""
    start_step(writes)
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen([str(DQTOOL), *args], stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    CPU[args[0]] = usage.ru_utime + usage.ru_stime
    if proc.returncode != 0:
        raise SystemExit(f"dqtool {' '.join(args)} failed:\n{stderr[-2000:]}")
    return wall, usage.ru_maxrss / 1024, stdout


def copy_time(src: Path, dst: Path, nbytes: int | None = None) -> float:
    """Seconds to copy ``src`` to ``dst`` (``nbytes`` of it, repeated as needed: a peer
    that writes as many bytes as a command does)."""
    start_step(src.stat().st_size if nbytes is None else nbytes)
    t0 = time.perf_counter()
    if nbytes is None:
        shutil.copyfile(src, dst)
    else:
        with open(src, "rb") as fin, open(dst, "wb") as fout:
            size = src.stat().st_size
            done = 0
            while done < nbytes:
                n = os.copy_file_range(fin.fileno(), fout.fileno(), min(size, nbytes - done),
                                       0, done)
                if n <= 0:
                    raise SystemExit(f"copy of {src} stopped at {done} bytes")
                done += n
    wall = time.perf_counter() - t0
    dst.unlink()
    return wall


def data_bytes(model: Path) -> int:
    return sum(p.stat().st_size for p in model.parent.glob(model.name + "*")
               if p.name != model.name) or model.stat().st_size


def ort_loads(model: Path) -> str:
    if os.environ.get("DQTOOL_BENCH_NO_ORT"):
        return "skipped"
    code = ("import onnxruntime as o, sys; s = o.SessionOptions(); "
            "s.graph_optimization_level = o.GraphOptimizationLevel.ORT_DISABLE_ALL; "
            "o.InferenceSession(sys.argv[1], s, providers=['CPUExecutionProvider'])")
    proc = subprocess.run([sys.executable, "-c", code, str(model)], capture_output=True,
                          text=True)
    return "loads" if proc.returncode == 0 else "FAILS: " + proc.stderr.strip()[-300:]


def fused_count(model: Path) -> int:
    import onnx

    m = onnx.load(model, load_external_data=False)
    return sum(n.domain == "com.microsoft" for n in m.graph.node)


def available_mb() -> float:
    return meminfo_mb("MemAvailable")


def _median(xs: list[float]) -> float:
    return float(np.median(xs))


def main() -> int:
    compileall.compile_dir(Path(__file__).resolve().parents[1] / "dqtool", quiet=1)
    with tempfile.TemporaryDirectory(prefix="dqtool-bench-fused-") as tmp:
        folder = Path(tmp)
        src = build(folder)
        size = data_bytes(src)
        data = folder / "model.onnx.data"
        runs: dict[str, list[tuple[float, float, float]]] = {}  # (seconds, MB, peer seconds)
        cpu: dict[str, list[float]] = {"upgrade": [], "pack": [], "fold": []}
        copies: list[float] = []  # every copy of the data file, in order
        pending: list[tuple[str, float, float]] = []  # commands timed since the last copy

        def copy_now(nbytes: int | None = None) -> None:
            """A copy (the peer), which closes the commands timed since the one before: the
            peer of each is the mean of the copies on both sides of it. Why both: the
            copy's time drifts from one minute to the next (the disk's write-back, other
            tenants), and a command timed between two copies is compared with the
            machine's state across its own run, not only with what came before it."""
            c = copy_time(data, folder / "copy.data", nbytes)
            before = copies[-1] if copies else None
            copies.append(c)
            for name, t, rss in pending:
                runs.setdefault(name, []).append(
                    (t, rss, c if before is None else (before + c) / 2))
            pending.clear()

        def timed(name: str, *args: str, writes: int) -> None:
            t, rss, _ = run(name, *args, writes=writes)
            cpu[name].append(CPU[name])
            pending.append((name, t, rss))

        copy_now()
        for r in range(REPEAT):
            up, back = folder / f"up{r}.onnx", folder / f"back{r}.onnx"
            timed("upgrade", str(src), "--opset", "21", "-o", str(up), writes=size)
            copy_now()
            timed("pack", str(up), "-o", str(back), writes=size)
            copy_now()
            if r < REPEAT - 1:  # the last ones are checked below
                for m in (up, back):
                    for f in folder.glob(m.name + "*"):
                        f.unlink()
        folded = folder / "fp16.onnx"
        fold_guess = 4 * size  # float16 for every 4-bit code (the scales go)
        data_copies = list(copies)
        copies.clear()  # the fold's peer copies as many bytes as it writes
        for _ in range(FOLD_REPEAT):
            for f in folder.glob(folded.name + "*"):
                f.unlink()
            timed("fold", str(src), "--dtype", "float16", "-o", str(folded),
                  writes=fold_guess)
            # The fold writes ~4x the bytes: its peer is copying as many bytes, measured (a
            # machine's write speed drops once gigabytes wait for the disk, so the copy of
            # the data file scaled by 4 would flatter the peer). The first fold has only
            # the copy after it (its size is known once it is written).
            copy_now(data_bytes(folded))
        fold_bytes = data_bytes(folded)
        loads = {"upgrade": ort_loads(up), "pack": ort_loads(back)}
        loads["fold"] = ort_loads(folded) if available_mb() > 3 * fold_bytes / 2**20 \
            else "skipped (not enough free memory to load it)"
        ratios = {k: [t / peer for t, _, peer in v] for k, v in runs.items()}
        result = {
            "quick": QUICK, "layers": LAYERS, "matmulnbits": 7 * LAYERS, "repeat": REPEAT,
            "data_bytes": size, "fold_bytes": fold_bytes,
            "runs": {k: [{"s": round(t, 3), "rss_mb": round(m, 1), "copy_s": round(c, 3)}
                         for t, m, c in v] for k, v in runs.items()},
            "copies_s": {"data file": [round(c, 3) for c in data_copies],
                         "fold's bytes": [round(c, 3) for c in copies]},
            "median_ratio": {k: round(_median(v), 3) for k, v in ratios.items()},
            "peak_rss_mb": {k: round(max(m for _, m, _ in v), 1) for k, v in runs.items()},
            "cpu_s": {k: [round(x, 3) for x in v] for k, v in cpu.items()},
            "onnxruntime": loads,
            "warm": WARM, "warmed_least": round(min(WARMED, default=0.0), 3),
            # A spawned command's peak RSS counts at least this process's own peak (it
            # is spawned from this memory): every figure above is an upper bound.
            "bench_own_peak_rss_mb": round(
                resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "fused": {"source": fused_count(src), "upgraded": fused_count(up),
                      "packed": fused_count(back), "folded": fused_count(folded)},
        }
        print(json.dumps(result))
        print(f"data file {size / 2**30:.2f} GiB; fold writes {fold_bytes / 2**30:.2f} GiB; "
              f"each command timed between two copies (its peer: their mean), {REPEAT} rounds "
              f"({FOLD_REPEAT} for fold); "
              + (f"memory warmed before each step ({min(WARMED, default=0):.0%} of the "
                 f"wanted bytes at least)" if WARM else "memory not warmed"))
        for label, key in (("upgrade --opset 21", "upgrade"),
                           ("pack (back to MatMulNBits)", "pack"),
                           ("fold --dtype float16", "fold")):
            v = runs[key]
            times = " ".join(f"{t:5.2f}/{c:5.2f}" for t, _, c in v)
            print(f"{label:28s}: s/copy s {times}  -> median {_median(ratios[key]):.2f}x "
                  f"the copy{' of as many bytes' if key == 'fold' else ''}, "
                  f"{max(m for _, m, _ in v):4.0f} MB peak, "
                  f"{_median(cpu[key]):5.2f} s CPU")
        print("onnxruntime loads: " + ", ".join(f"{k} {v}" for k, v in loads.items()))
        print("fused ops: " + ", ".join(f"{k} {v}" for k, v in result["fused"].items()))
        if not QUICK:
            ok = all(_median(ratios[k]) <= 2 and max(m for _, m, _ in runs[k]) <= 300
                     for k in runs)
            print("target: median <= 2x the copy and <= 300 MB each: "
                  + ("PASS" if ok else "MISS"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
