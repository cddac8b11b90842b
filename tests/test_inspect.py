"""``dqtool inspect``: the census of every sample model matches an independent count."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner

import dqtool
from dqtool.cli import cli

MODELS = Path(__file__).resolve().parent.parent / "models"
SAMPLES = sorted(MODELS.glob("*.onnx")) + sorted(MODELS.glob("*/*.onnx"))

_Q_OPS = ("DequantizeLinear", "QuantizeLinear")
_FUSED_OPS = ("MatMulNBits", "GatherBlockQuantized")  # com.microsoft, inspect's kind "fused"


def _independent_census(path: Path) -> Counter:
    """Count Q/DQ nodes by (domain, op) straight from the protobuf, walking subgraphs and
    functions by hand."""
    proto = onnx.load(str(path), load_external_data=False)
    found: Counter = Counter()

    def visit(nodes):
        for n in nodes:
            if n.op_type in _Q_OPS and n.domain in ("", "ai.onnx", "com.microsoft", "opmx",
                                                    "pmx"):
                found[(n.domain or "ai.onnx", n.op_type)] += 1
            if n.op_type in _FUSED_OPS and n.domain == "com.microsoft":
                found[(n.domain, n.op_type)] += 1
            for a in n.attribute:
                if a.HasField("g"):
                    visit(a.g.node)
                for g in a.graphs:
                    visit(g.node)

    visit(proto.graph.node)
    for f in proto.functions:
        visit(f.node)
    return found


def _initializer_types(path: Path) -> dict[str, str]:
    proto = onnx.load(str(path), load_external_data=False)
    out = {}
    for t in proto.graph.initializer:
        out[t.name] = onnx.TensorProto.DataType.Name(t.data_type).lower()
    return out


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
def test_census_matches_independent_count(path):
    report = dqtool.inspect(path)
    ours = Counter((n.spec.domain, n.spec.op) for n in report.nodes)
    assert ours == _independent_census(path)
    assert sum(ours.values()) + len(report.integer_nodes) > 0


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
def test_weight_types_match_initializers(path):
    """Every DQ fed by an initializer reports the initializer's element type."""
    init_types = _initializer_types(path)
    proto = onnx.load(str(path), load_external_data=False)
    by_name = {n.name: n for n in proto.graph.node}
    for n in dqtool.inspect(path).nodes:
        node = by_name.get(n.name)
        if node is None or n.graph != "main" or n.spec.domain in ("opmx", "pmx"):
            continue
        if n.spec.is_dequantize and node.input[0] in init_types:
            np_name = init_types[node.input[0]]
            want = {"float32": "float", "float4_e2m1fn": "float4e2m1"}.get(np_name, np_name)
            assert n.spec.quant_type.replace("_", "") == want.replace("_", ""), n.name


def test_json_document_fields(tmp_path):
    result = CliRunner().invoke(cli, ["inspect", "--json", str(MODELS / "dq13_int8_per_axis.onnx")],
                                env={"NO_COLOR": "1", "COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["opset_imports"] == {"ai.onnx": 13}
    assert isinstance(doc["ir_version"], int)
    node = doc["nodes"][0]
    for key in ("name", "op_type", "domain", "version", "graph", "x_type", "scale_type",
                "output_type", "granularity", "axis", "block_size", "has_zero_point",
                "constant", "problems"):
        assert key in node
    assert (node["domain"], node["version"], node["x_type"], node["granularity"]) == (
        "ai.onnx", 13, "int8", "per-axis")
    assert doc["summary"]["lowest_onnx_opset"] == 13


def test_subgraph_and_function_nodes_are_found():
    sub = dqtool.inspect(MODELS / "dq_in_if_subgraph.onnx")
    graphs = sorted(n.graph for n in sub.nodes)
    assert len(graphs) == 2 and all("/" in g and g.startswith("main/") for g in graphs)
    fn = dqtool.inspect(MODELS / "dq_in_function.onnx")
    assert [n.graph.startswith("function:") for n in fn.nodes] == [True]


def test_blocked_ragged_and_bytes():
    r = dqtool.inspect(MODELS / "dq21_int4_blocked_ragged.onnx")
    (n,) = r.nodes
    assert (n.spec.granularity, n.spec.block_size, n.spec.x_shape) == ("blocked", 4, (10, 4))
    # int4 (10,4) packs to 20 bytes, + 3x4 float scale = 48; folded float32 = 160
    assert n.bytes_folded == 160
    zp = 6 if n.spec.zero_point != "none" else 0  # int4 (3,4) zero point packs to 6 bytes
    assert n.bytes_stored == 20 + 48 + zp


def test_invalid_models_report_problems_but_exit_0():
    for name, fragment in [("invalid_ort_axis_opset11.onnx", "attribute 'axis'"),
                           ("invalid_nncf_uint4_opset17.onnx", "uint4"),
                           ("invalid_dq13_axis_out_of_range.onnx", "out of range"),
                           ("invalid_dq21_block_scale_shape.onnx", "block_size"),
                           ("invalid_dq19_float8_nonzero_zp.onnx", "must be zero")]:
        result = CliRunner().invoke(cli, ["inspect", "--json", str(MODELS / name)])
        assert result.exit_code == 0
        problems = [p for n in json.loads(result.stdout)["nodes"] for p in n["problems"]]
        assert any(fragment in p for p in problems), (name, problems)


def test_contrib_and_opmx_lowest_opset():
    assert dqtool.inspect(MODELS / "ms_qdq_contrib.onnx").summary["lowest_onnx_opset"] == 21
    assert dqtool.inspect(MODELS / "ort_qdq_contrib.onnx").summary["lowest_onnx_opset"] == 13
    assert dqtool.inspect(MODELS / "opmx_int4_packed.onnx").summary["lowest_onnx_opset"] == 21


def test_table_output_names_nodes_and_summary():
    result = CliRunner().invoke(cli, ["inspect", str(MODELS / "ort_qdq_per_channel.onnx")],
                                env={"NO_COLOR": "1", "COLUMNS": "200"})
    assert result.exit_code == 0
    assert "DequantizeLinear" in result.stdout and "lowest ai.onnx opset" in result.stdout
    assert "per-axis" in result.stdout


FUNCTION_MODEL = """<ir_version: 10, opset_import: ["" : 21, "local" : 1]>
g (float[2,4] a) => (float[2,3] y1, float[2,3] y2)
  <int8[4,3] w1 = {1,2,3,4,5,6,7,8,9,10,11,12}, int8[4,3] w2 = {1,2,3,4,5,6,7,8,9,10,11,12},
   float[3] s = {0.5, 0.25, 1.0}> {
  y1 = local.QMatMul (a, w1, s)
  y2 = local.QMatMul (a, w2, s)
}
<domain: "local", opset_import: ["" : 21]>
QMatMul (x, w, s) => (y) {
  wf = DequantizeLinear <axis=1> (w, s)
  y = MatMul (x, wf)
}"""


def test_function_inputs_take_the_type_their_call_sites_agree_on():
    import onnx_ir as ir

    report = dqtool.inspect(ir.from_onnx_text(FUNCTION_MODEL))
    (n,) = report.nodes
    assert n.graph == "function:local.QMatMul"
    assert (n.spec.quant_type, n.spec.scale_type, n.spec.granularity, n.spec.axis) == (
        "int8", "float", "per-axis", 1)
    assert n.lowest_onnx_opset == 13
    assert not n.spec.constant  # constant only at its call sites


def test_table_shows_where_a_node_lives(tmp_path):
    import onnx_ir as ir

    path = tmp_path / "f.onnx"
    ir.save(ir.from_onnx_text(FUNCTION_MODEL), path)
    result = CliRunner().invoke(cli, ["inspect", str(path)],
                                env={"NO_COLOR": "1", "COLUMNS": "200"})
    assert "[function:local.QMatMul]" in result.stdout
    result = CliRunner().invoke(cli, ["inspect", str(MODELS / "dq_in_if_subgraph.onnx")],
                                env={"NO_COLOR": "1", "COLUMNS": "200"})
    assert "[main/If/then_branch]" in result.stdout
