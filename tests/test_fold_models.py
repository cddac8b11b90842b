"""Fold every sample model: no constant DequantizeLinear is left and the outputs are
bit-identical to the original's (onnxruntime, ORT_DISABLE_ALL) or, where onnxruntime cannot
run the original, each folded constant equals the DQ output the kernel's evaluator gives."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from helpers import assert_bitwise_equal, feeds, run_ort, sha256

from dqtool import codecs, graph
from dqtool.folding import fold

MODELS = Path(__file__).resolve().parent.parent / "models"
VALID = sorted(p for p in MODELS.glob("*.onnx") if not p.name.startswith("invalid_"))
VALID.append(MODELS / "external_data" / "model.onnx")
INVALID = sorted(MODELS.glob("invalid_*.onnx"))


@cache
def ort_runs(path: Path) -> bool:
    try:
        run_ort(path, feeds(path))
    except Exception:
        return False
    return True


def constant_dqs(model: ir.Model) -> list[str]:
    return [s.node.name for s in graph.walk(model)
            if s.node.op_type == "DequantizeLinear" and codecs.is_quant_node(s.node)
            and codecs.read_node(s.node, s.opsets).constant]


def dq_outputs_by_evaluator(path: Path, names: list[str]) -> dict[str, np.ndarray]:
    """The original's DQ outputs (main graph) from onnx's evaluator with dqtool's kernels."""
    from dqtool import reference_evaluator

    m = onnx.load(str(path))
    m.graph.output.extend(onnx.helper.make_empty_tensor_value_info(n) for n in names)
    sess = reference_evaluator(m)
    values = sess.run(names, feeds(path))
    return dict(zip(names, values, strict=True))


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.name)
def test_fold_sample(path: Path, tmp_path: Path) -> None:
    before = sha256(path)
    out = tmp_path / "folded.onnx"
    report = fold(path, out)
    assert sha256(path) == before  # the input is never touched
    assert report.exit_code == 0
    folded = ir.load(out)
    assert constant_dqs(folded) == []
    assert all(not n.refused for n in report.left)
    if ort_runs(path) and not path.name.startswith("ort_matmulnbits_"):
        inputs = feeds(path)
        assert_bitwise_equal(run_ort(path, inputs), run_ort(out, inputs))
        return
    if path.name.startswith("ort_matmulnbits_"):
        # MatMulNBits sums in its own order: the folded MatMul's outputs differ by rounding
        # (tests/test_fused_models.py compares them with a tolerance, and the weights).
        return
    main = [n for n in report.folded if n.graph == "main"]
    if not main:
        return
    want = dq_outputs_by_evaluator(path, [n.output for n in main])
    for n in main:
        got = folded.graph.initializers[n.output].const_value.numpy()
        assert got.dtype == want[n.output].dtype
        assert got.tobytes() == want[n.output].tobytes(), n.name


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.name)
def test_invalid_constant_nodes_are_refused(path: Path, tmp_path: Path) -> None:
    report = fold(path, tmp_path / "out.onnx")
    refused = report.refused
    if not refused:  # e.g. the node is not constant: nothing selected was refused
        assert report.exit_code == 0
        return
    assert report.exit_code == 1
    assert all(n.reason for n in refused)
    # a refused node is left exactly as it was
    assert constant_dqs(ir.load(tmp_path / "out.onnx"))


def test_weight_pairs_fold_and_free_their_float_weights(tmp_path: Path) -> None:
    report = fold(MODELS / "qdq_weight_q_const.onnx", tmp_path / "o.onnx")
    assert report.folded and all(n.pair for n in report.folded)
    m = ir.load(tmp_path / "o.onnx")
    assert not [n for n in m.graph if n.op_type == "QuantizeLinear"]
    assert not any(name in m.graph.initializers for name in ("W1", "W2", "W3"))


def test_opmx_domain_import_dropped(tmp_path: Path) -> None:
    report = fold(MODELS / "opmx_int4_zp.onnx", tmp_path / "o.onnx")
    assert "opmx" not in report.opset_imports
    assert "opmx" not in ir.load(tmp_path / "o.onnx").opset_imports
