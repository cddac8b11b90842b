"""``fold`` of a DequantizeLinear of rows gathered from a constant table (``table → Gather →
DequantizeLinear``, as onnxruntime's dynamic quantizer stores embeddings): moved before
the Gather and the table folded, the same values (found in models shipped in PyPI wheels,
whose embeddings fold left quantized)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

import dqtool
from dqtool.checking import check
from dqtool.cli import cli

TABLE = np.random.default_rng(0).integers(0, 256, (10, 6), dtype=np.uint8)


def _model(path, *, scale=None, zp=None, extra_use=False, table_input=False,
           output_is_dq=False, in_function=False):
    """ids → Gather(table) → DequantizeLinear → Add(1) (or the DQ's output itself)."""
    scale = np.float32(0.05) if scale is None else scale
    zp = np.uint8(128) if zp is None else zp
    inits = [numpy_helper.from_array(np.asarray(scale), "s"),
             numpy_helper.from_array(np.asarray(zp), "z"),
             numpy_helper.from_array(np.ones(6, np.float32), "one")]
    table = numpy_helper.from_array(TABLE, "table")
    nodes = [helper.make_node("Gather", ["table", "ids"], ["rows"], name="gather"),
             helper.make_node("DequantizeLinear", ["rows", "s", "z"], ["emb"], name="dq")]
    outputs = [helper.make_tensor_value_info("emb" if output_is_dq else "y",
                                             TensorProto.FLOAT, [3, 6])]
    if not output_is_dq:
        nodes.append(helper.make_node("Add", ["emb", "one"], ["y"], name="add"))
    if extra_use:
        nodes.append(helper.make_node("Cast", ["rows"], ["rows_i"], to=TensorProto.INT32))
        outputs.append(helper.make_tensor_value_info("rows_i", TensorProto.INT32, [3, 6]))
    inputs = [helper.make_tensor_value_info("ids", TensorProto.INT64, [3])]
    functions = []
    if table_input:
        inputs.append(helper.make_tensor_value_info("table", TensorProto.UINT8, [10, 6]))
        inits.append(table)
    elif in_function:
        consts = [helper.make_node("Constant", [], [t.name], value=t) for t in [table, *inits]]
        f = helper.make_function("local", "Embed", ["ids"], [o.name for o in outputs],
                                 consts + nodes, [helper.make_opsetid("", 13)])
        functions, inits = [f], []
        nodes = [helper.make_node("Embed", ["ids"], [o.name for o in outputs],
                                  domain="local")]
    else:
        inits.append(table)
    g = helper.make_graph(nodes, "g", inputs, outputs, inits)
    opsets = [helper.make_opsetid("", 13)] + (
        [helper.make_opsetid("local", 1)] if in_function else [])
    onnx.save(helper.make_model(g, opset_imports=opsets, functions=functions, ir_version=8),
              path)
    return path


def _ops(model: onnx.ModelProto) -> list[str]:
    nodes = model.functions[0].node if model.functions else model.graph.node
    return [n.op_type for n in nodes]


@pytest.mark.parametrize("output_is_dq", [False, True])
def test_the_table_is_folded_and_gathered(tmp_path, output_is_dq):
    src = _model(tmp_path / "m.onnx", output_is_dq=output_is_dq)
    out = tmp_path / "f.onnx"
    report = dqtool.fold(str(src), str(out))
    (folded,) = report.folded
    assert folded.before_gather and folded.shape == (10, 6)
    m = onnx.load(out)
    assert "DequantizeLinear" not in _ops(m) and "Gather" in _ops(m)
    table = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    gather = next(n for n in m.graph.node if n.op_type == "Gather")
    want = (TABLE.astype(np.float32) - 128) * np.float32(0.05)
    assert np.array_equal(table[gather.input[0]], want)
    # the graph output keeps its name and type
    assert [o.name for o in m.graph.output] == ["emb" if output_is_dq else "y"]
    onnx.checker.check_model(m, full_check=True)
    assert check(str(out), against=str(src)).passed


def test_cli_says_so_and_json_has_it(tmp_path):
    src = _model(tmp_path / "m.onnx")
    r = CliRunner().invoke(cli, ["fold", str(src), "-o", str(tmp_path / "f.onnx")])
    assert r.exit_code == 0, r.output
    assert "moved before the Gather, the table folded" in r.output
    r = CliRunner().invoke(cli, ["fold", str(src), "-o", str(tmp_path / "g.onnx"), "--json"])
    assert json.loads(r.stdout)["folded"][0]["before_gather"] is True


def test_in_a_function_the_table_becomes_a_constant(tmp_path):
    src = _model(tmp_path / "m.onnx", in_function=True)
    out = tmp_path / "f.onnx"
    report = dqtool.fold(str(src), str(out))
    assert [f.before_gather for f in report.folded] == [True]
    m = onnx.load(out)
    assert "DequantizeLinear" not in _ops(m)
    assert check(str(out), against=str(src)).passed


@pytest.mark.parametrize(("kw", "why"), [
    ({"scale": np.full(6, 0.05, np.float32), "zp": np.full(6, 128, np.uint8)}, "Gather"),
    ({"extra_use": True}, "Gather"),
    ({"table_input": True}, "Gather"),
])
def test_left_where_moving_it_would_not_be_the_same(tmp_path, kw, why):
    # per-axis scale (varies along the gathered rows' last axis: a per-axis form over
    # the table would need its own axis mapping); the rows read by another node too; the
    # table a graph input (overridable at run time)
    src = _model(tmp_path / "m.onnx", **kw)
    out = tmp_path / "f.onnx"
    report = dqtool.fold(str(src), str(out))
    assert not report.folded
    assert [why in left.reason for left in report.left] == [True]
    m = onnx.load(out)
    assert _ops(m)[:2] == ["Gather", "DequantizeLinear"]


def test_a_selection_that_leaves_it_leaves_the_model_as_it_was(tmp_path):
    src = _model(tmp_path / "m.onnx")
    out = tmp_path / "f.onnx"
    report = dqtool.fold(str(src), str(out), op_types=["MatMul"])
    assert not report.folded and "not --op-types MatMul" in report.left[0].reason
    m = onnx.load(out)
    assert _ops(m) == ["Gather", "DequantizeLinear", "Add"]


def test_codes_packed_across_rows_are_left(tmp_path):
    """opmx packs four int4 codes per int16 along dim 0: the Gather reads packed rows, and
    moved after it the node would gather logical ones (wrong values and shape; found by a
    review)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.integers(-32768, 32767, (2, 16)).astype(np.int16),
                                     "T"),
             numpy_helper.from_array(np.array(0.5, np.float16), "s"),
             numpy_helper.from_array(np.array([1, 0], np.int64), "idx")]
    nodes = [helper.make_node("Gather", ["T", "idx"], ["rows"], axis=0),
             helper.make_node("DequantizeLinear", ["rows", "s"], ["y"], name="dq",
                              domain="opmx", float_zeropoint=0, group_size=0,
                              has_zeropoint=0, quant_axis=1, quant_data_type="int4",
                              quant_method="")]
    g = helper.make_graph(nodes, "g", [], [helper.make_tensor_value_info(
        "y", TensorProto.FLOAT16, None)], inits)
    src = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g, ir_version=7, opset_imports=[
        helper.make_opsetid("", 13), helper.make_opsetid("opmx", 1)]), src)
    report = dqtool.fold(str(src), str(tmp_path / "f.onnx"))
    assert not report.folded and "computed by Gather" in report.left[0].reason


@pytest.mark.parametrize("in_function", [False, True])
def test_the_quantized_table_goes(tmp_path, in_function):
    """Nothing reads the uint8 table once its float one is gathered: it goes, and is listed
    as removed (it stayed, unused; found by a new-user trial)."""
    src = _model(tmp_path / "m.onnx", in_function=in_function)
    out = tmp_path / "f.onnx"
    report = dqtool.fold(str(src), str(out))
    assert "table" in report.removed
    m = onnx.load(out)
    if in_function:
        assert "table" not in [o for n in m.functions[0].node for o in n.output]
    else:
        assert {t.name: t.data_type for t in m.graph.initializer} == {
            "one": TensorProto.FLOAT, "emb/table": TensorProto.FLOAT}
