"""upgrade: MatMulNBits / GatherBlockQuantized → ai.onnx DequantizeLinear, bit-identical."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from helpers.fused import bits_of, gbq_model, nbits_inputs, nbits_model, run_ort

import dqtool
from dqtool.cli import cli
from dqtool.families.fused import packing


def _upgrade(proto: onnx.ModelProto, opset: int = 21, **kw) -> tuple[onnx.ModelProto, object]:
    report = dqtool.upgrade(ir.serde.deserialize_model(proto), opset, **kw)
    out = ir.serde.serialize_model(report.model)
    onnx.checker.check_model(out, full_check=True)
    return out, report


def _ops(proto: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in proto.graph.node]


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize(("bits", "zp", "opset"), [
    (4, "packed", 21), (4, "none", 21), (4, "float", 21), (8, "packed", 21), (8, "none", 21),
    (2, "packed", 25), (2, "none", 25), (8, "packed", 19)])
@pytest.mark.parametrize(("k", "block"), [(64, 32), (100, 32), (20, 32)])
def test_upgraded_weight_is_bit_identical(dtype, bits, zp, opset, k, block):
    rng = np.random.default_rng(k + bits)
    n = 12
    inputs = nbits_inputs(rng, k, n, bits, block, dtype, zp)
    original = nbits_model(k, n, bits, block, inputs, dtype=dtype, opset=min(opset, 21))
    converted, report = _upgrade(original, opset)
    assert "MatMulNBits" not in _ops(converted) and "DequantizeLinear" in _ops(converted)
    # Blocked DequantizeLinear (21+) needs no Transpose: x is stored (K, N). Below 21 the
    # blocked weight is laid out as per-axis rows and transposed back (the usual lowering).
    assert ("Transpose" in _ops(converted)) == (opset < 21 and k > block)

    assert [c.status for c in report.changes] == ["changed"]
    eye = {"A": np.eye(k, dtype=dtype)}
    (want,) = run_ort(original, eye)
    (got,) = run_ort(converted, eye)
    assert np.array_equal(bits_of(want), bits_of(got))
    assert {o.domain for o in converted.opset_import} == {""}


@pytest.mark.parametrize("op", ["MatMulNBits", "GatherBlockQuantized"])
@pytest.mark.parametrize("opset", [13, 18])
def test_half_scales_below_19_are_read_as_float32_and_cast_back(op, opset):
    """DequantizeLinear takes float16 scales from 19: below, the scale is widened to float32
    (exact), the weight dequantized in float32 (the product is exact there) and cast back
    to float16: one rounding, the original's (until 2026-11-27, `b9a228a`: kept)."""
    rng = np.random.default_rng(12)
    if op == "MatMulNBits":
        inputs = nbits_inputs(rng, 64, 5, 8, 32, np.float16)
        original = nbits_model(64, 5, 8, 32, inputs, dtype=np.float16, opset=opset)
        feeds = {"A": np.eye(64, dtype=np.float16)}
    else:
        table = rng.integers(-8, 8, (16, 64)).astype(ml_dtypes.int4)
        scales = (rng.random((16, 2)) * 0.1 + 0.01).astype(np.float16)
        original = gbq_model(table, scales, None, opset=opset)
        feeds = {"indices": np.array([0, 3, 15, 7, 3], np.int64)}
    converted, report = _upgrade(original, opset)
    assert [c.status for c in report.changes] == ["changed"]
    assert "float16 scale → float" in report.changes[0].how
    assert "Cast" in _ops(converted) and op not in _ops(converted)
    onnx.checker.check_model(converted, full_check=True)
    dq = next(n for n in converted.graph.node if n.op_type == "DequantizeLinear")
    scale = next(t for t in converted.graph.initializer if t.name == dq.input[1])
    assert scale.data_type == onnx.TensorProto.FLOAT
    (want,) = run_ort(original, feeds)
    (got,) = run_ort(converted, feeds)
    assert got.dtype == np.float16 and np.array_equal(bits_of(want), bits_of(got))


def test_layout_of_the_converted_weight():
    rng = np.random.default_rng(0)
    inputs = nbits_inputs(rng, 100, 6, 4, 32, zp="none")
    bias = np.arange(6, dtype=np.float32)
    converted, report = _upgrade(nbits_model(100, 6, 4, 32, inputs, bias=bias))
    assert _ops(converted) == ["DequantizeLinear", "MatMul", "Add"]
    inits = {t.name: t for t in converted.graph.initializer}
    dq = converted.graph.node[0]
    x, s, z = (inits[name] for name in dq.input)
    assert (x.data_type, list(x.dims)) == (onnx.TensorProto.UINT4, [100, 6])
    assert list(s.dims) == [4, 6] and list(z.dims) == [4, 6]
    assert {a.name: a.i for a in dq.attribute} == {"axis": 0, "block_size": 32}
    codes = packing.unpack(inputs["B"].reshape(6, -1), 4)[:, :100]
    stored = packing.onnx_packed_codes(np.frombuffer(x.raw_data, np.uint8), (100, 6), 4)
    assert np.array_equal(stored, codes.T)
    assert set(packing.onnx_packed_codes(np.frombuffer(z.raw_data, np.uint8), (4, 6), 4)
               .reshape(-1).tolist()) == {8}
    assert "default zero point made explicit" in report.changes[0].how


def test_per_axis_when_one_block_spans_k():
    rng = np.random.default_rng(1)
    converted, _ = _upgrade(nbits_model(20, 5, 8, 32, nbits_inputs(rng, 20, 5, 8, 32), opset=13),
                           13)
    dq = converted.graph.node[0]
    assert {a.name: a.i for a in dq.attribute} == {"axis": 1}


def test_blocked_8bit_below_21_is_laid_out_per_axis_and_exact():
    rng = np.random.default_rng(2)
    inputs = nbits_inputs(rng, 64, 5, 8, 32)
    original = nbits_model(64, 5, 8, 32, inputs, opset=13)
    converted, report = _upgrade(original, 13)
    assert "block_size" not in str(converted.graph.node[0].attribute)
    assert "per-axis rows" in report.changes[0].how
    eye = {"A": np.eye(64, dtype=np.float32)}
    assert np.array_equal(bits_of(run_ort(original, eye)[0]), bits_of(run_ort(converted, eye)[0]))


@pytest.mark.parametrize(("bits", "zp"), [(4, "packed"), (4, "none"), (2, "packed")])
def test_below_the_native_opset_codes_are_widened_exactly(bits, zp):
    rng = np.random.default_rng(3)
    original = nbits_model(64, 6, bits, 32, nbits_inputs(rng, 64, 6, bits, 32, zp=zp),
                           opset=17)
    converted, report = _upgrade(original, 17)
    assert "MatMulNBits" not in _ops(converted)
    assert "widened to 8 bits" in report.changes[0].how
    assert {t.data_type for t in converted.graph.initializer} <= {
        onnx.TensorProto.UINT8, onnx.TensorProto.FLOAT, onnx.TensorProto.INT64}
    eye = {"A": np.eye(64, dtype=np.float32)}
    assert np.array_equal(bits_of(run_ort(original, eye)[0]), bits_of(run_ort(converted, eye)[0]))


def test_gather_table_widened_below_21():
    rng = np.random.default_rng(13)
    table = rng.integers(-8, 8, size=(6, 64)).astype(ml_dtypes.int4)
    original = gbq_model(table, (rng.random((6, 2)) + 0.1).astype(np.float32), None, opset=17)
    converted, _ = _upgrade(original, 17)
    assert "GatherBlockQuantized" not in _ops(converted)
    idx = {"indices": np.array([5, 0, 2, 2, 1], np.int64)}
    assert np.array_equal(run_ort(original, idx)[0], run_ort(converted, idx)[0])


def test_keep_contrib_leaves_them():
    rng = np.random.default_rng(4)
    converted, report = _upgrade(nbits_model(64, 5, 4, 32, nbits_inputs(rng, 64, 5, 4, 32)),
                                 23, keep_contrib=True)
    assert _ops(converted) == ["MatMulNBits"]
    assert report.changes[0].why == "--keep-contrib"


def _with_g_idx(proto: onnx.ModelProto, g: np.ndarray) -> onnx.ModelProto:
    p = onnx.ModelProto()
    p.CopyFrom(proto)
    p.graph.initializer.append(onnx.numpy_helper.from_array(g.astype(np.int32), "g"))
    while len(p.graph.node[0].input) < 4:
        p.graph.node[0].input.append("")
    p.graph.node[0].input.append("g")
    return p


@pytest.mark.parametrize("zp", ["packed", "none"])
def test_g_idx_with_integer_or_no_zero_points_is_refused(zp):
    rng = np.random.default_rng(5)
    proto = nbits_model(64, 5, 4, 32, nbits_inputs(rng, 64, 5, 4, 32, zp=zp))
    for g, why in ((np.arange(64) // 32, "own path"), (np.arange(64) % 2, "act-order")):
        converted, report = _upgrade(_with_g_idx(proto, g))
        assert _ops(converted) == ["MatMulNBits"]
        assert why in report.changes[0].why


def test_trivial_g_idx_with_float_zero_points_is_dropped_exactly():
    rng = np.random.default_rng(5)
    inputs = nbits_inputs(rng, 64, 5, 4, 32, zp="float")
    original = _with_g_idx(nbits_model(64, 5, 4, 32, inputs, m=64), np.arange(64) // 32)
    converted, report = _upgrade(original)
    assert "MatMulNBits" not in _ops(converted)
    assert "g_idx" in report.changes[0].how
    eye = np.eye(64, dtype=np.float32)  # each output is one weight
    (want,) = run_ort(original, {"A": eye})
    (got,) = run_ort(converted, {"A": eye})
    assert np.array_equal(bits_of(got), bits_of(want))


def test_onnxruntime_g_idx_path_is_as_recorded():
    # The data behind the refusal above, for the installed release: with a trivial g_idx
    # onnxruntime ignores packed zero points and rounds differently without them.
    from dqtool.families.fused import ort_facts

    release = ".".join(ort.__version__.split(".")[:2])
    rng = np.random.default_rng(9)
    eye = np.eye(64, dtype=np.float32)
    same = {}
    for zp in ("packed", "none", "float"):
        inputs = nbits_inputs(rng, 64, 6, 4, 16, zp=zp)
        plain = nbits_model(64, 6, 4, 16, inputs, m=64)
        (without,) = run_ort(plain, {"A": eye})
        (with_g,) = run_ort(_with_g_idx(plain, np.arange(64) // 16), {"A": eye})
        same[zp] = np.array_equal(bits_of(with_g), bits_of(without))
    own_path = {"packed": False, "none": False, "float": True}
    if release in ort_facts.G_IDX_OWN_PATH:
        assert same == own_path
    else:  # not measured: it must be one of the two facts the table can record
        assert same in (own_path, {"packed": True, "none": True, "float": True}), (
            f"onnxruntime {release}: g_idx gives {same}; record it in ort_facts")
    w = dqtool.dequantize_matmul_nbits(inputs["B"], inputs["scales"], inputs["zero_points"],
                                       K=64, N=6, bits=4, block_size=16)
    assert np.array_equal(bits_of(without), bits_of(w))  # the definition, without g_idx


def test_onnxruntime_8bit_float_zero_points_are_as_recorded():
    """FU007's fact for the installed release: its CPU MatMulNBits refuses 8-bit codes with
    float zero points (data keyed by release, not a timeless claim)."""
    from dqtool.families.fused import ort_facts

    release = ".".join(ort.__version__.split(".")[:2])
    rng = np.random.default_rng(12)
    model = nbits_model(32, 4, 8, 16, nbits_inputs(rng, 32, 4, 8, 16, zp="float"))
    try:
        run_ort(model, {"A": np.eye(32, dtype=np.float32)})
        runs = True
    except Exception:  # onnxruntime's own exception types
        runs = False
    if release in ort_facts.FLOAT_ZP_8BIT_REJECTED:
        assert not runs
    else:
        assert runs, f"onnxruntime {release} refuses them too: record it in ort_facts"
    spec = dqtool.inspect(ir.serde.deserialize_model(model)).nodes[0].spec
    assert [p.code for p in spec.problems if p.code == "FU007"] == ["FU007"]


def test_accuracy_level_is_reported():
    rng = np.random.default_rng(6)
    _, report = _upgrade(nbits_model(64, 5, 4, 32, nbits_inputs(rng, 64, 5, 4, 32),
                                     accuracy_level=4))
    assert "accuracy_level=4" in report.changes[0].why


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize(("kind", "zp"), [("int4", True), ("int4", False), ("uint4", True),
                                          ("uint8-4", True), ("uint8-4", False),
                                          ("uint8-8", False), ("uint8-2", True)])
def test_gather_block_quantized_upgrade_is_exact(dtype, kind, zp):
    rng = np.random.default_rng(8)
    rows, cols, block, kb = 10, 96, 32, 3
    scales = (rng.random((rows, kb)) * 0.1 + 0.01).astype(dtype)
    if kind in ("int4", "uint4"):
        bits, signed = 4, kind == "int4"
        lo, hi = (-8, 8) if signed else (0, 16)
        t = ml_dtypes.int4 if signed else ml_dtypes.uint4
        table = rng.integers(lo, hi, size=(rows, cols)).astype(t)
        zps = rng.integers(lo, hi, size=(rows, kb)).astype(t) if zp else None
    else:
        bits = int(kind[-1])
        table = packing.pack(rng.integers(0, 1 << bits, size=(rows, cols), dtype=np.uint8), bits)
        zps = packing.pack(rng.integers(0, 1 << bits, size=(rows, kb), dtype=np.uint8), bits) \
            if zp else None
    original = gbq_model(table, scales, zps, block=block, bits=bits, opset=21)
    opset = 25 if bits == 2 else 21
    converted, _ = _upgrade(original, opset)
    assert _ops(converted) == ["DequantizeLinear", "Gather"]
    idx = {"indices": np.array([9, 0, 4, 4, 1], np.int64)}
    assert np.array_equal(bits_of(run_ort(original, idx)[0]), bits_of(run_ort(converted, idx)[0]))


def test_cli_upgrade_and_keep_contrib(tmp_path):
    rng = np.random.default_rng(9)
    src = tmp_path / "m.onnx"
    onnx.save(nbits_model(64, 5, 4, 32, nbits_inputs(rng, 64, 5, 4, 32)), src)
    runner = CliRunner()
    r = runner.invoke(cli, ["upgrade", str(src), "--opset", "21", "-o", str(tmp_path / "a.onnx")],
                      env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert r.exit_code == 0, r.output
    assert _ops(onnx.load(tmp_path / "a.onnx")) == ["DequantizeLinear", "MatMul"]
    r = runner.invoke(cli, ["upgrade", str(src), "--opset", "23", "--keep-contrib", "-o",
                            str(tmp_path / "b.onnx")])
    assert r.exit_code == 0, r.output
    assert _ops(onnx.load(tmp_path / "b.onnx")) == ["MatMulNBits"]


def _in_a_function(k: int, n: int, bits: int, block: int, seed: int,
                   opset: int = 21) -> onnx.ModelProto:
    """One MatMulNBits in a model-local function, its weight in Constant nodes; X (k, k)."""
    inputs = nbits_inputs(np.random.default_rng(seed), k, n, bits, block)
    consts = [onnx.helper.make_node("Constant", [], [name], value=onnx.numpy_helper.from_array(
        arr, name)) for name, arr in (("B", inputs["B"]), ("scales", inputs["scales"]),
                                      ("zero_points", inputs["zero_points"]))]
    body = [*consts, onnx.helper.make_node(
        "MatMulNBits", ["A", "B", "scales", "zero_points"], ["Y"], name="mm",
        domain="com.microsoft", K=k, N=n, bits=bits, block_size=block)]
    fn = onnx.helper.make_function("local", "Lin", ["A"], ["Y"], body, [
        onnx.helper.make_opsetid("", opset), onnx.helper.make_opsetid("com.microsoft", 1)])
    g = onnx.helper.make_graph(
        [onnx.helper.make_node("Lin", ["X"], ["Z"], domain="local")], "g",
        [onnx.helper.make_tensor_value_info("X", onnx.TensorProto.FLOAT, [k, k])],
        [onnx.helper.make_tensor_value_info("Z", onnx.TensorProto.FLOAT, [k, n])])
    return onnx.helper.make_model(g, ir_version=10, functions=[fn], opset_imports=[
        onnx.helper.make_opsetid("", opset), onnx.helper.make_opsetid("local", 1),
        onnx.helper.make_opsetid("com.microsoft", 1)])


def test_fused_node_inside_a_function_uses_constant_nodes():
    original = _in_a_function(32, 4, 4, 32, seed=14)
    report = dqtool.inspect(ir.serde.deserialize_model(original))
    assert report.summary["fused_nodes"] == 1 and report.nodes[0].graph.startswith("function")
    converted, _ = _upgrade(original)
    f_ops = [n.op_type for n in converted.functions[0].node]
    assert "MatMulNBits" not in f_ops and "DequantizeLinear" in f_ops
    eye = {"X": np.eye(32, dtype=np.float32)}
    assert np.array_equal(bits_of(run_ort(original, eye)[0]), bits_of(run_ort(converted, eye)[0]))
    back = ir.serde.serialize_model(dqtool.pack(ir.serde.deserialize_model(converted)).model)
    onnx.checker.check_model(back, full_check=True)
    assert [n.op_type for n in back.functions[0].node if n.op_type != "Constant"] == \
        ["MatMulNBits"]
    assert np.array_equal(bits_of(run_ort(original, eye)[0]), bits_of(run_ort(back, eye)[0]))


@pytest.mark.parametrize(("bits", "how", "opset"), [
    (2, "upgrade", 21), (4, "downgrade", 13), (2, "downgrade", 13), (4, "upgraded, then down", 13),
    (2, "fold", None), (4, "fold float16", None)])
def test_codes_widened_in_a_function_leave_no_narrow_constant(bits, how, opset):
    """2/4-bit codes a function's DequantizeLinear cannot take at the target are widened to
    8 bits; the Constant nodes of the narrow codes went unused but stayed, with their uint2
    / uint4 type (onnxruntime refused the model, onnx's checker too), and were put after
    the node that reads the wide ones. A downgrade of the upgraded model was refused for
    those Constants' type before its DequantizeLinear was widened."""
    original = _in_a_function(64, 6, bits, 32, seed=bits + 60)
    model = ir.serde.deserialize_model(original)
    if how == "upgrade":
        out = dqtool.upgrade(model, opset).model
    elif how == "downgrade":
        out = dqtool.downgrade(model, opset).model
    elif how.startswith("upgraded"):
        out = dqtool.downgrade(dqtool.upgrade(model, 21).model, opset).model
    else:
        out = dqtool.fold(model, dtype="float16" if how.endswith("float16") else "keep").model
    proto = ir.serde.serialize_model(out)
    onnx.checker.check_model(proto, full_check=True)
    body = proto.functions[0].node
    made = {o for node in body for o in node.output}
    read = {i for node in body for i in node.input} | set(proto.functions[0].output)
    assert made <= read, made - read  # no Constant left unused
    narrow = {onnx.TensorProto.UINT2, onnx.TensorProto.UINT4, onnx.TensorProto.INT2,
              onnx.TensorProto.INT4}
    assert not [n.output[0] for n in body if n.op_type == "Constant"
                and n.attribute[0].t.data_type in narrow]
    assert "MatMulNBits" not in [n.op_type for n in body]
    eye = {"X": np.eye(64, dtype=np.float32)}
    want, got = run_ort(original, eye)[0], run_ort(proto, eye)[0]
    if how == "fold float16":  # the weight rounded to float16, then multiplied in float32
        assert np.array_equal(got, want.astype(np.float16).astype(np.float32))
    else:
        assert np.array_equal(bits_of(want), bits_of(got))


@pytest.mark.parametrize(("bits", "zp", "opset"), [(4, "packed", 21), (4, "float", 21),
                                                   (8, "none", 21), (2, "packed", 25)])
def test_per_axis_follows_the_usual_lowering_exactly(bits, zp, opset):
    rng = np.random.default_rng(bits + 40)
    original = nbits_model(100, 6, bits, 32, nbits_inputs(rng, 100, 6, bits, 32, zp=zp))
    converted, report = _upgrade(original, opset, per_axis=True)
    dq = next(n for n in converted.graph.node if n.op_type == "DequantizeLinear")
    assert "block_size" not in {a.name for a in dq.attribute}
    assert "--per-axis" in report.changes[0].why
    eye = {"A": np.eye(100, dtype=np.float32)}
    assert np.array_equal(bits_of(run_ort(original, eye)[0]), bits_of(run_ort(converted, eye)[0]))


def test_new_nodes_never_take_a_name_the_model_already_has(tmp_path):
    """upgrade names its nodes after the one they replace (``mm/matmul``) and pack its
    MatMulNBits ``<MatMul's name>/nbits``: a model whose other nodes already have those
    names got two nodes of one name, which onnxruntime refuses to load."""
    import collections

    rng = np.random.default_rng(11)
    m = nbits_model(64, 64, 4, 32, nbits_inputs(rng, 64, 64, 4, 32), m=2)
    m.graph.node[0].output[0] = "h"
    m.graph.node.append(onnx.helper.make_node("Relu", ["h"], ["Y"], name="mm/matmul"))
    up = dqtool.upgrade(ir.serde.deserialize_model(m), 21).model
    names = [n.name for n in up.graph]
    assert [k for k, c in collections.Counter(names).items() if c > 1] == []
    assert "mm/matmul" in names  # the model's own node keeps its name
    proto = ir.serde.serialize_model(up)
    a = {"A": rng.random((2, 64)).astype(np.float32)}
    assert np.allclose(run_ort(proto, a)[0], run_ort(m, a)[0], rtol=1e-5, atol=1e-6)
    # pack: a QDQ model (no names noted) whose Relu is named as pack names MatMulNBits
    for n in up.graph:
        n.metadata_props.clear()
    relu = next(n for n in up.graph if n.op_type == "Relu")
    matmul = next(n for n in up.graph if n.op_type == "MatMul")
    relu.name = f"{matmul.name}/nbits"
    packed = ir.serde.serialize_model(dqtool.pack(up).model)
    names = [n.name for n in packed.graph.node]
    assert [k for k, c in collections.Counter(names).items() if c > 1] == []
    assert run_ort(packed, a)[0].shape == (2, 64)
