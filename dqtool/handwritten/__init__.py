"""Dequantization written by hand with plain operators: ``Cast(int8 → float) → Mul(scale)``,
``Cast → Sub(zero point) → Mul``, the Sub before the Cast in integers, a Reshape for
blocks, packed int4 unpacked with BitShift/BitwiseAnd (``docs/handwritten.md``).

* ``find(model)``: every such pattern, as ``Handwritten`` records (``to_json()``);
* ``rewrite(model, opset=None)``: each one into an ai.onnx DequantizeLinear, exactly, all
  or nothing (``RewriteReport``);
* ``fold_values(model)``: the float weight of each constant one, the bytes both runtimes
  compute (``Folded``).
"""

from __future__ import annotations

from dqtool.handwritten.fold import Folded, fold_values
from dqtool.handwritten.recognize import find
from dqtool.handwritten.records import Handwritten
from dqtool.handwritten.report import RewriteReport
from dqtool.handwritten.rewrite import insert_in_place, rewrite

__all__ = ["Folded", "Handwritten", "RewriteReport", "find", "fold_values", "insert_in_place",
           "rewrite"]
