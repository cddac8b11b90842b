"""Test helpers, in one package: building and saving models (``build``), onnxruntime runs
and bit-for-bit comparisons for the kernel (``kernel``) and fold (``fold``) tests, and the
small DQ models of the check and lint tests (``lint``).

    from helpers import node_model, save, MODELS
"""

from .build import MODELS, make_model, node_model, onnx_type, save, tensor
from .fold import assert_bitwise_equal, feeds, ort_runs, run_ort, sha256
from .kernel import assert_bits_equal, bits, ort_dequantize, ort_quantize, run_ort_node
from .lint import dq_model, matmul_model

__all__ = [
           "MODELS",
           "assert_bits_equal",
           "assert_bitwise_equal",
           "bits",
           "dq_model",
           "feeds",
           "make_model",
           "matmul_model",
           "node_model",
           "onnx_type",
           "ort_dequantize",
           "ort_quantize",
           "ort_runs",
           "run_ort",
           "run_ort_node",
           "save",
           "sha256",
           "tensor",
]
