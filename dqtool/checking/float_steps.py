"""The quantization step of a float output that no constant scale measures.

A dynamically quantized model's float output (an integer accumulator ``Cast`` to float and
multiplied by a run-time scale) has no fixed step. The unit dqtool measures it in is the
step the tensor itself would be quantized with at run time: DynamicQuantizeLinear's uint8
scale ``(max(0, max y) - min(0, min y)) / 255`` of the original's output. One step there is
one code of the next run-time quantizer that could read the tensor, which is what a
difference of "one quantization step" means for an 8-bit model.

The accumulator's own unit (``a_scale·w_scale``, what one unit of the int32 sum is worth) is
far finer: one flipped input code moves an output by ``|w - w_zp|`` such units, so counting
in it overstates a difference by the size of the weights (``docs/integer-ops.md`` has the
numbers measured on a real model).
"""

from __future__ import annotations

import numpy as np


def dynamic_step(values: np.ndarray | None) -> float | None:
    """DynamicQuantizeLinear's scale of ``values`` (float32 arithmetic, as onnxruntime
    computes it); None for an empty, non-finite or all-zero tensor."""
    if values is None:
        return None
    a = np.asarray(values)
    if a.size == 0 or a.dtype.kind != "f" or not np.isfinite(a).all():
        return None
    a = a.astype(np.float32)
    hi = np.maximum(np.float32(0), a.max())
    lo = np.minimum(np.float32(0), a.min())
    step = float(np.float32(hi - lo) / np.float32(255))
    return step if step > 0 else None
