"""Where an onnxruntime release computes differently on one CPU code path: data keyed by
(release, path), with the emulations that reproduce it.

The kernel follows the specification on every CPU; these entries explain a runtime's
difference from it (``check`` names the entry and the size beside its verdict) and let the
tests assert a runtime bit for bit through the entry of the path they run on. An entry
never decides a verdict. Paths are named by ``dqtool.runtimes.cpu_path``; measurements are
in docs/semantics.md ("CPU code paths").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# The u8 × s8 integer operators whose MLAS GEMM saturates pair sums without VNNI (and the
# QDQ patterns onnxruntime fuses into them at ORT_ENABLE_ALL). ConvInteger is not among
# them: measured exact on the same path (docs/semantics.md).
U8S8_OPS: tuple[str, ...] = (
    "ai.onnx:MatMulInteger", "ai.onnx:QLinearMatMul", "ai.onnx:QLinearConv",
    "com.microsoft:QGemm", "com.microsoft:MatMulIntegerToFloat",
    "com.microsoft:DynamicQuantizeMatMul", "com.microsoft:QAttention",
    "com.microsoft:DynamicQuantizeLSTM")
# onnxruntime's Softmax operator: its float rounding differs by path. (QAttention and
# DynamicQuantizeLSTM, whose exp, tanh and softmax are MLAS's too, were bit-identical on the
# same path once their u8s8 GEMM was emulated: 1,246 outputs, DQTOOL_SLOW seeds.)
FLOAT_ROUTINE_OPS: tuple[str, ...] = ("ai.onnx:Softmax",)


@dataclass(frozen=True)
class PathDeviation:
    key: str  # stable name: "u8s8-pair-saturation", "float-routines"
    runtime: str
    releases: tuple[str, ...]  # "1.32": every 1.32.x
    measured: str  # the versions and how the path was run
    paths: tuple[str, ...]  # cpu_path names
    ops: tuple[str, ...]  # "domain:Op"
    spec: str
    runtime_gives: str
    # The size: the largest difference from the kernel measured on that path, in ulps of
    # a float output's row (``ort_facts.row_ulps``) and in steps of an integer output.
    # ``check`` passes a float output within ``ulps``, and an integer output within
    # ``steps``, as this deviation (its own rerun cannot apply the arm64 emulations, which
    # live with the integer family's MLAS routines); None where the entry changes no such
    # output, or where check reruns the node with the entry's exact emulation
    # (u8s8-pair-saturation).
    ulps: int | None = None
    steps: int | None = None
    # element types ("float16") a node of ``ops`` must read for the entry to apply to it
    # (a constant input of that type: a MatMulNBits' scales); empty: any node of ``ops``
    types: tuple[str, ...] = ()

    def applies(self, runtime: str, version: str, path: str, op: str | None = None) -> bool:
        release = ".".join(version.split(".")[:2])
        return (runtime == self.runtime and release in self.releases and path in self.paths
                and (op is None or op in self.ops))

    def describe(self, version: str, path_description: str) -> str:
        return f"{self.runtime} {version} on this CPU ({path_description}) " \
               f"{self.runtime_gives}"



DEVIATIONS: tuple[PathDeviation, ...] = (
    PathDeviation(
        key="u8s8-pair-saturation", runtime="onnxruntime", releases=("1.32",),
        measured="1.32.0 under qemu-x86_64 -cpu Haswell (2026-11-28)",
        paths=("x86-64-avx2",), ops=U8S8_OPS,
        spec="integer accumulation of (a - a_zp)(b - b_zp) is exact in int32",
        runtime_gives="saturates u8×s8 pair sums in int16: each two adjacent products of "
                      "the raw codes along the reduction axis are added and clamped to "
                      "[-32768, 32767] before the int32 sum (vpmaddubsw); the zero points "
                      "are applied afterwards, exactly (emulated by u8s8_matmul and "
                      "u8s8_conv, bit for bit)"),
    PathDeviation(
        key="float-routines", runtime="onnxruntime", releases=("1.32",),
        measured="1.32.0 under qemu-x86_64 -cpu Haswell (2026-11-28): 10 shapes, "
                 "2 ulps at most",
        paths=("x86-64-avx2",), ops=FLOAT_ROUTINE_OPS,
        spec="ONNX leaves the float rounding of exp and softmax open; the kernel computes "
             "MLAS's routines as onnxruntime runs them with AVX-512 (docs/semantics.md)",
        runtime_gives="rounds its Softmax operator's float sums otherwise (AVX2 kernels): "
                      "up to 2 ulps of the row apart",
        ulps=2),
    # ARM64, measured on the path qemu's Neoverse N1 takes (arm64-dotprod): onnxruntime's
    # integer accumulation is exact there (the QLinearConv and MatMulInteger probes give
    # the spec), its float stages are rounded otherwise than on x86-64. Each entry is
    # reproduced bit for bit by an emulation (``dqtool.families.integer.mlas.neon_*``,
    # and the tests' LSTM and attention built on them); the sizes are the kernel's.
    PathDeviation(
        key="fma-scale-bias", runtime="onnxruntime", releases=("1.32",),
        measured="1.32.0 under qemu-aarch64 -cpu neoverse-n1 (2026-11-28): 200 random "
                 "cases of each, 2 ulps of the row at most (none without a bias)",
        paths=("arm64-dotprod",),
        ops=("com.microsoft:MatMulIntegerToFloat", "com.microsoft:DynamicQuantizeMatMul"),
        spec="int32 accumulation is exact; the contrib operator's float32(acc)·scale + "
             "bias leaves its rounding open: the kernel rounds the product, then the sum, "
             "as onnxruntime's x86-64 build does",
        runtime_gives="fuses float32(acc)·scale + bias into one rounding (NEON FMA; "
                      "emulated by mlas.neon_scale_bias)",
        ulps=2),
    PathDeviation(
        key="qlinear-add-mul", runtime="onnxruntime", releases=("1.32",),
        measured="1.32.0 under qemu-aarch64 -cpu neoverse-n1 (2026-11-28): every pair of "
                 "8-bit codes for 7 scale sets, 1 step at most",
        paths=("arm64-dotprod",), ops=("com.microsoft:QLinearAdd", "com.microsoft:QLinearMul"),
        spec="the contrib operators dequantize, add or multiply and requantize; where a "
             "result falls on a tie the float order decides: the kernel follows "
             "onnxruntime's x86-64 build",
        runtime_gives="computes QLinearAdd in fixed point (22-bit multipliers of the scale "
                      "ratios, ties rounded away from zero) and QLinearMul with its last "
                      "multiply and add fused: ties can land one step away (emulated by "
                      "mlas.neon_qlinear_add and neon_qlinear_mul)",
        steps=1),
    PathDeviation(
        key="fma-lstm", runtime="onnxruntime", releases=("1.32",),
        measured="1.32.0 under qemu-aarch64 -cpu neoverse-n1 (2026-11-28): 40 seeds × 3 "
                 "directions × 1 and 2 threads (240 cases), 46 ulps of the row at most",
        paths=("arm64-dotprod",), ops=("com.microsoft:DynamicQuantizeLSTM",),
        spec="integer stages exact; ONNX leaves the float rounding of the gates open: the "
             "kernel rounds as onnxruntime's x86-64 build does",
        runtime_gives="fuses the recurrent product's scaling into its sum with X·W, the "
                      "peephole products into the gates, C_prev·f into + i·g and "
                      "Affine's and HardSigmoid's alpha·x + beta (one rounding each); the "
                      "hidden state, quantized again at every step, carries the difference "
                      "on",
        ulps=46),
    PathDeviation(
        key="neon-softmax", runtime="onnxruntime", releases=("1.32",),
        measured="1.32.0 under qemu-aarch64 -cpu neoverse-n1 (2026-11-28): rows of 1 to "
                 "69 values and the tests' 10 lengths up to 100, 5 ulps of the row at most",
        paths=("arm64-dotprod",), ops=("ai.onnx:Softmax",),
        spec="ONNX leaves the float rounding of exp and softmax open; the kernel computes "
             "MLAS's routines as onnxruntime runs them on x86-64",
        runtime_gives="sums the exp terms in 4-lane vectors, not 8 (emulated by "
                      "mlas.neon_softmax)",
        ulps=5),
    PathDeviation(
        key="neon-attention", runtime="onnxruntime", releases=("1.32",),
        measured="1.32.0 under qemu-aarch64 -cpu neoverse-n1 (2026-11-28): 280 random "
                 "cases, 123 ulps of the row at most (output; 19 for present)",
        paths=("arm64-dotprod",), ops=("com.microsoft:QAttention",),
        spec="integer stage exact; ONNX leaves the float rounding of the attention open: "
             "the kernel computes it as onnxruntime's x86-64 build does",
        runtime_gives="fuses the Q/K/V scaling with its bias, sums the softmax in 4 lanes "
                      "and takes its general SGEMM kernel for single rows and columns too "
                      "(x86-64 has kernels of their own); a difference in the scores "
                      "grows through the softmax",
        ulps=123),
    PathDeviation(
        key="neon-layer-norm", runtime="onnxruntime", releases=("1.32",),
        measured="1.32.0 under qemu-aarch64 -cpu neoverse-n1 (2026-11-28): 60 random "
                 "cases, 5 ulps of the row at most",
        paths=("arm64-dotprod",), ops=("com.microsoft:QEmbedLayerNormalization",),
        spec="the dequantization is the spec's; the float order of the embedding sum and "
             "the layer normalisation is open: the kernel follows onnxruntime's x86-64 "
             "build",
        runtime_gives="rounds the embedding sum and layer normalisation otherwise (not "
                      "emulated: fusing the sum's and the final scale-and-shift's "
                      "multiply-adds reproduced 15 of 20 cases, not all)",
        ulps=5),
    PathDeviation(
        key="neon-fp16-matmulnbits", runtime="onnxruntime", releases=("1.32",),
        measured="1.32.0 under qemu-aarch64 -cpu neoverse-n1 (2026-11-28): a float16 node "
                 "of K 256, N 64, 8 rows, 4-bit blocks of 32: its outputs 0.0857 at most "
                 "from the exact sum of A times the float16 weight, against 0.0109 on "
                 "x86-64 (AVX-512); closest to float16 products summed in float16 (0.039 "
                 "apart, 17% equal), not to float32 sums (0.086 apart)",
        paths=("arm64-dotprod",), ops=("com.microsoft:MatMulNBits",),
        spec="MatMulNBits is A @ dequant(B) in A's type; the precision of its sums is "
             "open: the rounding bound of check --against assumes float32 sums, as "
             "onnxruntime's x86-64 build makes them (docs/fused.md)",
        runtime_gives="computes a float16 MatMulNBits in float16 arithmetic (NEON fp16 "
                      "products and sums): its outputs may lie beyond the float32-sum "
                      "bound from the converted model's (not emulated)",
        types=("float16",)),
)


def applicable(runtime: str, version: str, path: str, op: str | None = None
               ) -> tuple[PathDeviation, ...]:
    return tuple(d for d in DEVIATIONS if d.applies(runtime, version, path, op))


def entry(key: str, release: str, runtime: str = "onnxruntime") -> PathDeviation | None:
    """The entry ``key`` measured for ``release`` ("1.32"), on whichever path."""
    return next((d for d in DEVIATIONS if d.key == key and d.runtime == runtime
                 and release in d.releases), None)


# ---- the emulation of u8s8 pair saturation ----------------------------------------------

def _pair_sums(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a`` (…, M, K) raw u8 codes and ``b`` (…, K, N) raw s8 codes: the int32 sums of
    the products, two adjacent ones along K clamped to int16 first (K padded to even)."""
    a = np.asarray(a).astype(np.int64)
    b = np.asarray(b).astype(np.int64)
    if a.shape[-1] % 2:
        a = np.concatenate([a, np.zeros((*a.shape[:-1], 1), np.int64)], axis=-1)
        b = np.concatenate([b, np.zeros((*b.shape[:-2], 1, b.shape[-1]), np.int64)], axis=-2)
    pairs = (a[..., 0::2, None] * b[..., 0::2, :][..., None, :, :]
             + a[..., 1::2, None] * b[..., 1::2, :][..., None, :, :])
    return np.clip(pairs, -32768, 32767).sum(axis=-2)


def u8s8_matmul(a: np.ndarray, b: np.ndarray, a_zero_point: np.ndarray | None = None,
                b_zero_point: np.ndarray | None = None) -> np.ndarray:
    """int32 ``(a - a_zp) @ (b - b_zp)`` as onnxruntime computes it on a path with
    ``u8s8-pair-saturation``: the raw codes' products pair-saturated, then the zero points
    (a per-tensor or per-row a_zp, a per-tensor or per-column b_zp) applied exactly."""
    a = np.asarray(a)
    b = np.asarray(b)
    k = a.shape[-1]
    az = np.zeros((), np.int64) if a_zero_point is None else np.asarray(a_zero_point,
                                                                            np.int64)
    bz = np.zeros((), np.int64) if b_zero_point is None else np.asarray(b_zero_point,
                                                                            np.int64)
    if az.ndim == 1 and az.size > 1:
        az = az.reshape(-1, 1)
    raw = _pair_sums(a, b)
    a_rows = a.astype(np.int64).sum(axis=-1, keepdims=True)
    b_cols = b.astype(np.int64).sum(axis=-2, keepdims=True)
    acc = raw - az * b_cols - bz * a_rows + k * az * bz
    return acc.astype(np.int64).astype(np.int32)


def _patches(x: np.ndarray, kernel: Sequence[int], pads: Sequence[int],
             strides: Sequence[int], dilations: Sequence[int], fill: int) -> np.ndarray:
    """x (N, C, *spatial) → (N, *out, *kernel, C): each output position's window."""
    rank = len(kernel)
    padded = np.pad(x, [(0, 0), (0, 0)] + [(pads[i], pads[i + rank]) for i in range(rank)],
                    constant_values=fill)
    out = [(padded.shape[2 + i] - dilations[i] * (kernel[i] - 1) - 1) // strides[i] + 1
           for i in range(rank)]
    idx = np.ix_(*[np.arange(o) * s for o, s in zip(out, strides, strict=True)])
    windows = []
    for offs in np.ndindex(*kernel):
        at = (i + o * d for i, o, d in zip(idx, offs, dilations, strict=True))
        windows.append(padded[(slice(None), slice(None), *at)])
    w = np.stack(windows, axis=2)  # (N, C, K..., out...)
    w = w.reshape(x.shape[0], x.shape[1], *kernel, *out)
    order = [0, *list(range(2 + rank, 2 + 2 * rank)), *list(range(2, 2 + rank)), 1]
    return w.transpose(order)


def u8s8_conv(x: np.ndarray, w: np.ndarray, x_zero_point: np.ndarray | None = None,
              w_zero_point: np.ndarray | None = None, *, group: int = 1,
              pads: Sequence[int] | None = None, strides: Sequence[int] | None = None,
              dilations: Sequence[int] | None = None) -> np.ndarray:
    """int32 convolution accumulator as onnxruntime computes a u8 × s8 convolution on a
    path with ``u8s8-pair-saturation``: each group a GEMM over the window, pair-saturated
    along it. QLinearConv lays the window out channels-last (kernel positions, then input
    channels) and computes a depthwise convolution (one input and one output channel per
    group) exactly. (ConvInteger is exact on the same path.)
    Explicit pads only (``auto_pad`` resolved by the caller)."""
    x = np.asarray(x)
    w = np.asarray(w)
    rank = w.ndim - 2
    kernel = list(w.shape[2:])
    pads = list(pads) if pads else [0] * (2 * rank)
    strides = list(strides) if strides else [1] * rank
    dilations = list(dilations) if dilations else [1] * rank
    xz = 0 if x_zero_point is None else int(np.asarray(x_zero_point).reshape(-1)[0])
    wz = np.zeros(w.shape[0], np.int64) if w_zero_point is None else np.broadcast_to(
        np.asarray(w_zero_point, np.int64).reshape(-1), (w.shape[0],))
    cg, mg = w.shape[1], w.shape[0] // group
    outs = []
    for g in range(group):
        xg = x[:, g * cg:(g + 1) * cg]
        wg = w[g * mg:(g + 1) * mg]
        cols = _patches(xg, kernel, pads, strides, dilations, xz)  # (N, *out, *k, Cg)
        shape = cols.shape[:1 + rank]
        b = wg.transpose(*range(2, 2 + rank), 1, 0).reshape(-1, mg)  # (K, Mg)
        a = cols.reshape(int(np.prod(shape)), -1)  # (positions, K)
        if cg == 1 and mg == 1:
            acc = (a.astype(np.int64) - xz) @ (b.astype(np.int64) - wz[g * mg:(g + 1) * mg])
        else:
            acc = u8s8_matmul(a, b, np.asarray(xz), wz[g * mg:(g + 1) * mg]).astype(np.int64)
        outs.append(acc.reshape(*shape, mg))
    y = np.concatenate(outs, axis=-1)  # (N, *out, M)
    return y.transpose(0, rank + 1, *range(1, rank + 1)).astype(np.int32)
