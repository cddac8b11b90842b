"""The float weight of each constant hand-written dequantization, for ``dqtool fold``.

``dqtool fold`` stores what the kernel computes, bit-identical to onnxruntime
(``docs/commands/fold.md``, Exactness): here the kernel runs on the exact DequantizeLinear
form of the pattern (``forms``), so the weight has the bytes both runtimes give the
rewritten model, and the original. For a float16/bfloat16 Mul the exact form is
``DequantizeLinear(output_dtype=float) → Cast``: the folded constant is that float32
product, and a Cast to the pattern's type must stay after it (onnxruntime drops the 16-bit
rounding of the original where the next operator has no 16-bit kernel; a 16-bit constant
would round, ``docs/handwritten.md#measured``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from dqtool import kernel, types
from dqtool.handwritten import forms
from dqtool.handwritten.recognize import Found, found
from dqtool.handwritten.records import Handwritten


@dataclass(frozen=True)
class Folded:
    """One pattern's constant: ``compute()`` gives it (reads the codes), of ``shape`` and
    ``dtype``, replacing the value ``record.output``; when ``cast_to`` is set a Cast to
    that type follows it. ``reason`` says why a pattern has no constant (then
    ``compute`` is None)."""

    record: Handwritten
    shape: tuple[int, ...] | None
    dtype: str | None  # ONNX type name: "float", "float16", …
    cast_to: str | None
    compute: Callable[[], np.ndarray] | None
    reason: str | None = None

    @property
    def foldable(self) -> bool:
        return self.compute is not None

    def weight(self) -> np.ndarray:
        """The pattern's value, in its own type (the Cast applied)."""
        assert self.compute is not None, self.reason
        arr = self.compute()
        return arr if self.cast_to is None else arr.astype(types.by_name(self.cast_to).dtype)


def _computer(f: Found, form: forms.Form) -> Callable[[], np.ndarray]:
    def compute() -> np.ndarray:
        x, scale, zp = forms.operands(f.match, form)
        g = form.layout
        return kernel.dequantize(x, scale, zp, axis=g.axis or 0, block_size=g.block_size
                                 if g.granularity == "blocked" else 0,
                                 output_dtype=np.float32 if form.wide_output else None)
    return compute


def folded(f: Found) -> Folded:
    r, form = f.record, f.decision.form
    if not r.rewritable:
        return Folded(r, None, None, None, None, "; ".join(r.reasons) or "not constant")
    if form is None:
        return Folded(r, None, None, None, None, "; ".join(r.reasons))
    return Folded(r, form.layout.shape, "float" if form.wide_output else form.float_type,
                  form.float_type if form.wide_output else None, _computer(f, form))


def fold_values(model: ir.Model) -> list[Folded]:
    """Each hand-written dequantization of ``model`` with its constant (or why none); the
    model is not modified, and no value is computed until ``compute()`` is called."""
    return [folded(f) for f in found(model)]
