"""Benchmark: start-up of ``dqtool --version``.

Target: no slower than the peer below. ``--version`` reads package versions from installed
metadata, and probes the CPU code path onnxruntime takes with one one-node session (so it
imports onnxruntime, as the peer does; docs/benchmarks.md). Measured in the same run, best of
``DQTOOL_BENCH_REPEAT`` (default 7; 3 with DQTOOL_BENCH_QUICK=1):
- the floor: ``python -c pass``;
- the peer: asking the packages themselves (``import onnxruntime, onnx, numpy`` and printing
  their ``__version__``), what a script without ``--version`` would do.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

QUICK = bool(os.environ.get("DQTOOL_BENCH_QUICK"))
REPEAT = int(os.environ.get("DQTOOL_BENCH_REPEAT", "3" if QUICK else "7"))
BIN = os.path.join(os.path.dirname(sys.executable), "dqtool")


def best(cmd: list[str]) -> float:
    times = []
    for _ in range(REPEAT):
        t = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> int:
    floor = best([sys.executable, "-c", "pass"])
    ours = best([BIN, "--version"])
    peer = best([sys.executable, "-c", "import onnxruntime, onnx, numpy; "
                 "print(onnxruntime.__version__, onnx.__version__, numpy.__version__)"])
    print(f"python -c pass (floor)       : {floor:6.3f} s")
    print(f"dqtool --version             : {ours:6.3f} s")
    print(f"import the packages (peer)   : {peer:6.3f} s")
    print(f"ratio dqtool/peer {ours / peer:.2f}x, dqtool/floor {ours / floor:.1f}x")
    print(f"target <= the peer: {'PASS' if ours <= peer else 'MISS'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
