"""A conversion to QDQ run the way onnxruntime runs it by default: every optimization on,
its QDQ fusions turning the pattern back into integer operators."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx

from dqtool.checking import runners


def fused_run(original: onnx.ModelProto, converted: onnx.ModelProto,
              feeds: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """The converted model on onnxruntime with every optimization (QDQ fusions on) against
    the original on ORT_DISABLE_ALL."""
    try:
        import onnxruntime as ort

        want = runners.run_ort(original, feeds)
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.log_severity_level = 4
        sess = ort.InferenceSession(converted.SerializeToString(), so,
                                    providers=[runners.ORT_PROVIDER])
        names = [o.name for o in sess.get_outputs()]
        got = dict(zip(names, sess.run(names, feeds), strict=True))
    except Exception as e:  # a runtime that cannot run it is a finding, reported
        return {"identical": False, "mismatched": None, "error": str(e).splitlines()[0][:300]}
    mismatched = sum(int(np.sum(np.asarray(got[k]) != np.asarray(v))) for k, v in want.items()
                     if k in got)
    return {"identical": mismatched == 0 and set(want) <= set(got), "mismatched": mismatched,
            "error": None}
