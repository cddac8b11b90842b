"""dqtool.reference_evaluator on real models from onnxruntime's quantizer agrees with
onnxruntime (CPU, ORT_DISABLE_ALL): every Q/DQ value bit for bit, on several inputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from dqtool import reference_evaluator
from dqtool.checking import inputs, runners

MODELS = Path(__file__).resolve().parent.parent / "models"
QDQ = ["ort_qdq_per_tensor", "ort_qdq_per_channel", "ort_qdq_contrib", "ort_qdq_int16"]
WEIGHT_ONLY = ["ort_int4_blocked_qdq", "ort_uint4_blocked_ragged_qdq"]  # MatMul ends them


def _with_qdq_outputs(model: onnx.ModelProto) -> tuple[list[str], list[str]]:
    """Adds every Q/DQ result as a graph output; returns (the model's own outputs, Q/DQ)."""
    finals = [o.name for o in model.graph.output]
    qdq = [n.output[0] for n in model.graph.node
           if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    for name in qdq:
        if name not in finals:
            model.graph.output.append(onnx.ValueInfoProto(name=name))
    return finals, qdq


@pytest.mark.parametrize("name", QDQ + WEIGHT_ONLY)
def test_real_quantizer_models_agree_with_onnxruntime(name: str) -> None:
    model = onnx.load(MODELS / f"{name}.onnx")
    finals, qdq = _with_qdq_outputs(model)
    domains = {n.domain for n in model.graph.node if n.op_type == "DequantizeLinear"}
    assert qdq and (name != "ort_qdq_contrib" or domains == {"com.microsoft"})
    evaluator = reference_evaluator(model)
    outputs = [o.name for o in model.graph.output]
    for seed in range(3):
        feeds, _ = inputs.generate(model, seed=seed)
        ort = runners.run_ort(model, feeds)
        ref = dict(zip(outputs, evaluator.run(outputs, feeds), strict=True))
        for q in qdq:  # every Q/DQ value: bit for bit
            assert np.asarray(ref[q]).tobytes() == ort[q].tobytes(), (name, q, seed)
        for o in finals:
            if name in QDQ:  # the model ends in Q→DQ: bit for bit too
                assert np.asarray(ref[o]).tobytes() == ort[o].tobytes(), (name, o, seed)
            else:  # a float MatMul ends it: BLAS and MLAS sum in different orders
                np.testing.assert_allclose(ref[o], ort[o], rtol=1e-5, atol=1e-6)
