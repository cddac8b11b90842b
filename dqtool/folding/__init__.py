"""Folding constant DequantizeLinear nodes into initializers, exactly and at any size.

``fold`` is the entry point (``dqtool fold`` calls it); ``DequantizeFoldPass`` is the
onnx_ir pass doing the rewrite, usable in a ``PassManager``; ``FoldedTensor`` is the lazy
value it writes. Importing this package never imports onnxruntime.
"""

from __future__ import annotations

from dqtool.folding.api import DTYPES, default_output, fold
from dqtool.folding.compute import FoldedTensor, Folding
from dqtool.folding.dequantize_fold_pass import DequantizeFoldPass
from dqtool.folding.report import FoldedNode, FoldReport, LeftNode
from dqtool.folding.selection import Selection

__all__ = [
    "DTYPES",
    "DequantizeFoldPass",
    "FoldReport",
    "FoldedNode",
    "FoldedTensor",
    "Folding",
    "LeftNode",
    "Selection",
    "default_output",
    "fold",
]
