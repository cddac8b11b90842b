"""Dequantization written by hand through the commands: ``inspect`` lists it as its own
kind, ``upgrade --handwritten`` rewrites it into DequantizeLinear (bit-identical on
onnxruntime ORT_DISABLE_ALL and the reference evaluator), ``fold`` folds it, ``lint``
points to the rewrite; and ``qdq`` raises the opset itself where a rewritten node needs a
newer DequantizeLinear."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnx_ir as ir
from click.testing import CliRunner
from test_handwritten_models import S12, X8, cast_mul, feeds, run_ort, run_ref, same_bits
from test_handwritten_rewrite import S16, U8
from test_integer_to_qdq import DYNAMIC

import dqtool
from dqtool.cli import cli
from dqtool.handwritten import fold_values


def _save(tmp_path, m: onnx.ModelProto, name: str = "m.onnx"):
    path = tmp_path / name
    onnx.save(m, path)
    return path


def _ops(path) -> list[str]:
    return [n.op_type for n in onnx.load(path).graph.node]


def _per_axis_matmul() -> onnx.ModelProto:
    return cast_mul(U8, S12.reshape(1, 12), zp=np.arange(12, dtype=np.float32) + 120,
                    consumer="MatMul")


def test_inspect_lists_each_one_as_its_own_kind(tmp_path):
    path = _save(tmp_path, _per_axis_matmul())
    r = CliRunner().invoke(cli, ["inspect", str(path), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    [hand] = doc["handwritten"]
    assert (hand["codes_type"], hand["granularity"], hand["axis"]) == ("uint8", "per-axis", 1)
    assert hand["zero_point"] == "integer" and hand["exact"] and hand["min_opset"] == 13
    assert doc["summary"]["handwritten"] == 1 and doc["summary"]["handwritten_exact"] == 1
    assert doc["summary"]["dequantize_nodes"] == 0
    text = CliRunner().invoke(cli, ["inspect", str(path)]).output
    assert "1 hand-written dequantizations" in text and "per-axis 1" in text


def test_a_model_without_one_lists_none():
    report = dqtool.inspect(ir.from_proto(onnx.load("models/dq13_int8_per_axis.onnx")))
    assert report.handwritten == () and report.summary["handwritten"] == 0


def test_upgrade_rewrites_them_bit_identical(tmp_path):
    m = _per_axis_matmul()
    path = _save(tmp_path, m)
    out = tmp_path / "up.onnx"
    r = CliRunner().invoke(cli, ["upgrade", str(path), "--opset", "21", "--handwritten",
                                 "-o", str(out), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    [change] = [c for c in doc["changed"] if c["op"].startswith("hand-written")]
    assert change["status"] == "changed" and "DequantizeLinear" in change["how"]
    assert _ops(out) == ["DequantizeLinear", "MatMul"]
    up, inputs = onnx.load(out), feeds(m)
    assert same_bits(run_ort(up, inputs), run_ort(m, inputs))
    assert same_bits(run_ref(up, inputs), run_ref(m, inputs))


def test_upgrade_without_the_flag_leaves_them(tmp_path):
    path = _save(tmp_path, _per_axis_matmul())
    report = dqtool.upgrade(path, 21, tmp_path / "up.onnx")
    assert _ops(tmp_path / "up.onnx") == _ops(path) and not report.changes


def test_a_form_the_target_lacks_is_refused_and_nothing_written(tmp_path):
    # float16 needs DequantizeLinear(output_dtype=float) → Cast: opset 23
    m = cast_mul(U8, S16.reshape(1, 12), ft="float16", zp=np.float16(131), opset=21)
    path = _save(tmp_path, m)
    out = tmp_path / "up.onnx"
    r = CliRunner().invoke(cli, ["upgrade", str(path), "--opset", "21", "--handwritten",
                                 "-o", str(out)])
    assert r.exit_code == 1 and "needs opset 23" in r.output and not out.exists()
    r = CliRunner().invoke(cli, ["upgrade", str(path), "--opset", "23", "--handwritten",
                                 "-o", str(out)])
    assert r.exit_code == 0, r.output
    inputs = feeds(m)
    assert same_bits(run_ort(onnx.load(out), inputs), run_ort(m, inputs))


def test_fold_folds_them_to_the_weights_both_runtimes_compute(tmp_path):
    m = _per_axis_matmul()
    path = _save(tmp_path, m)
    out = tmp_path / "f.onnx"
    report = dqtool.fold(path, out)
    assert len(report.handwritten) == 1 and not report.handwritten_left
    assert len(report.folded) == 1
    ops = _ops(out)
    assert "Cast" not in ops and "Mul" not in ops and "DequantizeLinear" not in ops
    folded, inputs = onnx.load(out), feeds(m)
    assert same_bits(run_ort(folded, inputs), run_ort(m, inputs))
    assert same_bits(run_ref(folded, inputs), run_ref(m, inputs))
    weight = fold_values(ir.from_proto(m))[0].weight()
    stored = {t.name: onnx.numpy_helper.to_array(t) for t in folded.graph.initializer}
    assert any(a.shape == weight.shape and a.tobytes() == weight.tobytes()
               for a in stored.values())


def test_fold_follows_the_selection(tmp_path):
    path = _save(tmp_path, _per_axis_matmul())
    report = dqtool.fold(path, tmp_path / "f.onnx", op_types="Conv")
    assert report.handwritten == [] and len(report.handwritten_left) == 1
    assert "--op-types" in report.handwritten_left[0][1]
    assert _ops(tmp_path / "f.onnx") == _ops(path)


def test_lint_points_to_the_rewrite_and_the_rewrite_clears_it(tmp_path):
    path = _save(tmp_path, cast_mul(X8, S12.reshape(1, 12), consumer="MatMul"))
    r = CliRunner().invoke(cli, ["lint", str(path), "--target", "onnxruntime", "--format",
                                 "json"])
    found = [f for f in json.loads(r.output)["findings"] if f["code"] == "DQ113"]
    assert len(found) == 1 and "--handwritten" in found[0]["fix"]
    out = tmp_path / "up.onnx"
    assert CliRunner().invoke(cli, ["upgrade", str(path), "--opset", "21", "--handwritten",
                                    "-o", str(out)]).exit_code == 0
    r = CliRunner().invoke(cli, ["lint", str(out), "--target", "onnxruntime", "--format",
                                 "json"])
    assert not [f for f in json.loads(r.output)["findings"] if f["code"] == "DQ113"]


# onnxruntime's per-channel dynamic MLP, at opset 11 (per-axis DequantizeLinear needs 13)
DYNAMIC_11 = DYNAMIC.replace('"" : 13', '"" : 11').replace("ir_version: 8", "ir_version: 7")


def test_qdq_raises_the_opset_itself_where_a_node_needs_it(tmp_path):
    path = tmp_path / "dyn11.onnx"
    onnx.save(onnx.parser.parse_model(DYNAMIC_11), path)
    out = tmp_path / "q.onnx"
    r = CliRunner().invoke(cli, ["qdq", str(path), "-o", str(out), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["upgrade"]["to_opset"] == 13 and doc["upgrade"]["from_opset"] == 11
    assert not doc["refused"] and doc["changed"]
    q = onnx.load(out)
    assert [o.version for o in q.opset_import if o.domain == ""] == [13]
    assert "MatMulInteger" not in _ops(out)
    text = CliRunner().invoke(cli, ["qdq", str(path), "-o", str(tmp_path / "t.onnx")]).output
    assert "first, an exact upgrade to ai.onnx opset 13" in text


def test_qdq_at_an_opset_that_expresses_it_upgrades_nothing(tmp_path):
    path = tmp_path / "dyn13.onnx"
    onnx.save(onnx.parser.parse_model(DYNAMIC_11.replace('"" : 11', '"" : 13')), path)
    from dqtool.integer import api

    report = api.to_qdq(path)
    assert report.upgrade is None and not report.refusals
