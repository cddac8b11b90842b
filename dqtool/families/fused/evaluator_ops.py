"""ReferenceEvaluator operators for MatMulNBits and GatherBlockQuantized: dequantize with
the fused family's kernel, then the float MatMul (+ bias) or the gather, each in A's type as
the reference evaluator runs ai.onnx MatMul and Add (on contiguous arrays, as dqtool's
reference MatMul does): the operator is, by the schema, ``A @ dequant(B) + bias`` in A's
type. onnxruntime's CPU kernel computes a float16 node in float32 with the weight before
its rounding and rounds once at the end: close to this, not bit-identical; ``check
--against`` bounds that difference (``bound``)."""

from __future__ import annotations

import numpy as np
from onnx.reference.op_run import OpRun

from dqtool.checking import half_matmul
from dqtool.families.fused.kernel import (
    dequantize_gather_block_quantized,
    dequantize_matmul_nbits,
)

DOMAIN = "com.microsoft"


class MatMulNBits(OpRun):
    op_domain = DOMAIN
    op_schema = None  # only the node's own attributes reach _run; defaults are ours

    def _run(self, a, b, scales, zero_points=None, g_idx=None, bias=None, K=0, N=0, bits=4,
             block_size=0, **_ignored):
        w = dequantize_matmul_nbits(b, scales, zero_points, K=K, N=N, bits=bits,
                                    block_size=block_size, g_idx=g_idx)
        # Rounded to A's type before the bias, as MatMul then Add round: NumPy's matmul of
        # bfloat16 (ml_dtypes) returns float32, and the bias added to that rounded once.
        a, w = np.ascontiguousarray(a), np.ascontiguousarray(w.astype(a.dtype, copy=False))
        # float16: NumPy's own bits without its scalar loop (0.19-0.24 s against 0.035 s for
        # a 3072 x 8192 weight; docs/benchmarks.md, "Check at LLM size")
        y = half_matmul.matmul(a, w) if half_matmul.applies(a, w) else np.matmul(a, w)
        y = np.asarray(y, dtype=a.dtype)
        if bias is not None:
            y = np.asarray(y + bias.astype(a.dtype), dtype=a.dtype)
        return (y,)


class GatherBlockQuantized(OpRun):
    op_domain = DOMAIN
    op_schema = None

    def _run(self, data, indices, scales, zero_points=None, gather_axis=0, quantize_axis=1,
             block_size=128, bits=4, **_ignored):
        return (dequantize_gather_block_quantized(
            data, scales, zero_points, quantize_axis=quantize_axis, block_size=block_size,
            bits=bits, indices=indices, gather_axis=gather_axis),)


OPS = [MatMulNBits, GatherBlockQuantized]
