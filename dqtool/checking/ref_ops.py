"""The operators a check's reference evaluator runs in place of onnx's own: MatMul and Gemm
on C-contiguous inputs, and float16 MatMul without NumPy's scalar loop (the same bits,
``half_matmul``)."""

from __future__ import annotations

import numpy as np
import onnx

from dqtool.checking import half_matmul


def _layout_free_ops() -> list[type]:
    """MatMul and Gemm on C-contiguous inputs. NumPy hands a transposed or reshaped view to
    BLAS as is, and BLAS sums in another order for it: the same values gave outputs 2e-6
    apart when a converted model made its weight through Reshape/Transpose. On contiguous
    copies the result depends on the values alone, as a comparison between models needs."""
    from onnx.reference.ops.op_gemm import Gemm_7
    from onnx.reference.ops.op_matmul import MatMul

    class _MatMul(MatMul):
        def _run(self, a, b):  # type: ignore[override]
            if half_matmul.applies(a, b):
                return (half_matmul.matmul(a, b),)
            return super()._run(np.ascontiguousarray(a), np.ascontiguousarray(b))

    class _Gemm(Gemm_7):
        def _run(self, a, b, c=None, alpha=None, beta=None, transA=None,  # type: ignore[override]
                 transB=None):
            return super()._run(np.ascontiguousarray(a), np.ascontiguousarray(b), c, alpha,
                                beta, transA, transB)

    # ReferenceEvaluator keys new_ops by (op_domain, class name).
    return [type("MatMul", (_MatMul,), {"op_domain": ""}),
            type("Gemm", (_Gemm,), {"op_domain": ""})]


def new_ops(model: onnx.ModelProto) -> list[type]:
    # Gemm before opset 7 has `broadcast`, which the Gemm-7 implementation lacks.
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    ops = _layout_free_ops()
    return ops if opset >= 7 else ops[:1]
