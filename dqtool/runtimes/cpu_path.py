"""Which CPU code path the installed onnxruntime takes on this machine, probed.

onnxruntime's CPU kernels (MLAS) pick their code by instruction set at run time, so one
release computes some integer operators differently on different CPUs (docs/semantics.md,
"CPU code paths"). The path is named from two observations:

* NumPy's view of the CPU (``AVX512F``: MLAS's AVX-512 float routines). NumPy asks the
  CPU itself (cpuid), so an emulator such as ``qemu-x86_64 -cpu Haswell`` is seen as the
  CPU it emulates. On Linux ARM64, the kernel's hardware capabilities (``AT_HWCAP``,
  ``AT_HWCAP2`` in /proc/self/auxv), which MLAS reads too: dot product, int8 matrix
  multiply, SVE. NumPy 2.4 names no int8 matrix multiply (measured under
  ``qemu-aarch64 -cpu max``, whose HWCAP2 has it), hence the auxiliary vector.
* One tiny MatMulInteger session: ``[255, 255, 255, 255] · [127, 127, 127, 127]`` is
  129540 in exact arithmetic and 65534 where u8 × s8 pair sums saturate to int16 (x86
  without VNNI, ``vpmaddubsw``).

Deviations of a release from the specification are keyed by (release, path) in
``dqtool.runtimes.deviations``; the path never decides a verdict.
"""

from __future__ import annotations

import functools
import platform
import struct
from dataclasses import dataclass

# The paths dqtool knows by name; another machine gets a name of the same form.
DESCRIPTIONS: dict[str, str] = {
    "x86-64-avx512-vnni": "x86-64 AVX-512 with VNNI",
    "x86-64-avx512": "x86-64 AVX-512, no VNNI",
    "x86-64-avx2-vnni": "x86-64 AVX2 with AVX-VNNI",
    "x86-64-avx2": "x86-64 AVX2, no VNNI",
    "x86-64-sse": "x86-64 without AVX2",
    "arm64-sve": "arm64 with SVE",
    "arm64-i8mm": "arm64 NEON with int8 matrix multiply",
    "arm64-dotprod": "arm64 NEON with dot product",
    "arm64-neon": "arm64 NEON",
}

_EXACT, _SATURATED = 255 * 127 * 4, 2 * 32767


@dataclass(frozen=True)
class CpuPath:
    name: str  # a key of DESCRIPTIONS, or "<machine>" for another architecture
    u8s8_saturates: bool | None  # None: onnxruntime could not run the probe
    runtime: str | None  # "onnxruntime 1.32.0", None when not installed

    @property
    def description(self) -> str:
        return DESCRIPTIONS.get(self.name, self.name)

    def describe(self) -> str:
        """One line: the path and what the probe saw."""
        if self.runtime is None:
            return f"{self.description} (onnxruntime not installed: not probed)"
        if self.u8s8_saturates is None:
            return f"{self.description} ({self.runtime}: the u8×s8 probe could not run)"
        what = ("saturates u8×s8 pair sums in int16" if self.u8s8_saturates
                else "u8×s8 sums exact")
        return f"{self.description} ({self.runtime} {what})"



# Linux's arm64 hwcap bits (arch/arm64/include/uapi/asm/hwcap.h)
_AT_HWCAP, _AT_HWCAP2 = 16, 26
_ARM_HWCAPS = {"ASIMDDP": (_AT_HWCAP, 1 << 20), "SVE": (_AT_HWCAP, 1 << 22),
               "I8MM": (_AT_HWCAP2, 1 << 13)}


def arm_hwcaps(auxv: bytes) -> dict[str, bool]:
    """The ARM64 features MLAS picks its kernels by, from a little-endian 64-bit
    auxiliary vector (pairs of type and value)."""
    caps = dict(struct.iter_unpack("<QQ", auxv[:len(auxv) // 16 * 16]))
    return {name: bool(caps.get(at, 0) & bit) for name, (at, bit) in _ARM_HWCAPS.items()}


def _features() -> dict[str, bool]:
    from numpy._core._multiarray_umath import __cpu_features__

    features = dict(__cpu_features__)
    if platform.machine().lower() in ("aarch64", "arm64"):
        try:
            with open("/proc/self/auxv", "rb") as f:
                features.update(arm_hwcaps(f.read()))
        except OSError:  # not Linux: NumPy's view alone
            pass
    return features


def _u8s8_saturates() -> tuple[bool | None, str | None]:
    """(whether onnxruntime's MatMulInteger saturates u8 × s8 pair sums, its version)."""
    try:
        import numpy as np
        import onnxruntime as ort
        from onnx import TensorProto, helper, numpy_helper
    except ImportError:
        return None, None
    node = helper.make_node("MatMulInteger", ["a", "b"], ["y"])
    graph = helper.make_graph(
        [node], "u8s8", [helper.make_tensor_value_info("a", TensorProto.UINT8, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [1, 1])],
        [numpy_helper.from_array(np.full((4, 1), 127, np.int8), "b")])
    model = helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 13)])
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 4
    version = f"onnxruntime {ort.__version__}"
    try:
        sess = ort.InferenceSession(model.SerializeToString(), so,
                                    providers=["CPUExecutionProvider"])
        got = int(sess.run(None, {"a": np.full((1, 4), 255, np.uint8)})[0].ravel()[0])
    except Exception:  # onnxruntime raises its own types; the path stays unprobed
        return None, version
    return {_EXACT: False, _SATURATED: True}.get(got), version


def name_for(machine: str, features: dict[str, bool], saturates: bool | None) -> str:
    """The path's name from the architecture, NumPy's CPU features and the probe."""
    m = machine.lower()
    if m in ("x86_64", "amd64"):
        if features.get("AVX512F"):
            return "x86-64-avx512" if saturates else "x86-64-avx512-vnni"
        if features.get("AVX2"):
            return "x86-64-avx2" if saturates else "x86-64-avx2-vnni"
        return "x86-64-sse"
    if m in ("aarch64", "arm64"):
        # SVE first: MLAS's SVE softmax and exp kernels replace its NEON ones (under
        # qemu-aarch64 -cpu max, Softmax came out otherwise than with -cpu neoverse-n1)
        if features.get("SVE"):
            return "arm64-sve"
        if features.get("I8MM") or features.get("ASIMD_I8MM"):
            return "arm64-i8mm"
        if features.get("ASIMDDP"):
            return "arm64-dotprod"
        return "arm64-neon"
    return m


@functools.lru_cache(maxsize=1)
def probe() -> CpuPath:
    """This machine's path (one one-node onnxruntime session, once per process)."""
    saturates, runtime = _u8s8_saturates()
    return CpuPath(name_for(platform.machine(), _features(), saturates), saturates, runtime)
