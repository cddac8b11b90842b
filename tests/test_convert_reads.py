"""A conversion that rewrites a weight (``downgrade`` widening int4 codes to int8, blocked
to per-axis) reads it from its file on its own map: through the tensor, onnx_ir mapped the
whole data file and kept every weight it was asked for, unpacked, until the save was done
(a 985 MB int4 model's downgrade took 2.9 GB)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
import pytest

import dqtool
from dqtool import storage
from dqtool.checking import check
from dqtool.storage import inline_read, inline_write

K, BLOCK, LAYERS = 64, 16, 4


def _model(path, external: bool) -> None:
    """LAYERS DequantizeLinear (int4 (K, K), blocked along K) → MatMul in a chain, opset 21;
    every block of a column has the column's scale, so opset 13's per-axis form is exact."""
    rng = np.random.default_rng(1)
    x = ir.Value(name="X", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([2, K]))
    nodes, inits, y = [], [], x
    for i in range(LAYERS):
        q = rng.integers(-8, 8, (K, K), dtype=np.int8)
        s = np.repeat((rng.random((1, K)) + 0.01).astype(np.float32), K // BLOCK, axis=0)
        qv = ir.Value(name=f"w{i}", const_value=ir.tensor(q.astype(ml_dtypes.int4)))
        sv = ir.Value(name=f"s{i}", const_value=ir.tensor(s))
        dq = ir.node("DequantizeLinear", [qv, sv], {"axis": 0, "block_size": BLOCK},
                     name=f"dq{i}")
        mm = ir.node("MatMul", [y, dq.outputs[0]], name=f"mm{i}")
        nodes += [dq, mm]
        inits += [qv, sv]
        y = mm.outputs[0]
        y.name, y.dtype, y.shape = f"y{i}", ir.DataType.FLOAT, ir.Shape([2, K])
    g = ir.Graph([x], [y], nodes=nodes, initializers=inits, opset_imports={"": 21}, name="g")
    if external:
        ir.save(ir.Model(g, ir_version=10), path, external_data=path.name + ".data",
                size_threshold_bytes=0)
    else:
        ir.save(ir.Model(g, ir_version=10), path)


@pytest.mark.parametrize("external", [True, False])
def test_downgrade_reads_each_weight_on_its_own_map(tmp_path, monkeypatch, external):
    monkeypatch.setattr(inline_read, "MIN_FILE_BYTES", 0)
    monkeypatch.setattr(inline_read, "MIN_TENSOR_BYTES", 256)
    monkeypatch.setattr(inline_write, "STREAM_MIN_BYTES", 1)
    src = tmp_path / "m.onnx"
    _model(src, external)
    model = storage.load(src)
    weights = [v.const_value for v in model.graph.initializers.values()
               if v.const_value.dtype == ir.DataType.INT4]
    kind = ir.ExternalTensor if external else inline_read.MappedTensor
    assert len(weights) == LAYERS and all(isinstance(t, kind) for t in weights)
    report = dqtool.downgrade(model, 13, str(tmp_path / "out.onnx"))
    assert any("int8" in c.how for c in report.changes)
    files = [t if external else t._file for t in weights]
    assert all(t._array is None for t in files)  # onnx_ir caches what it loaded there
    out = onnx.load(str(tmp_path / "out.onnx"))
    assert {t.data_type for t in out.graph.initializer} >= {onnx.TensorProto.INT8}
    assert check(str(tmp_path / "out.onnx"), against=str(src)).passed


@pytest.mark.parametrize("qtype", ["int8", "uint8", "int4", "uint4"])
@pytest.mark.parametrize(("k", "n", "block"), [(64, 40, 16), (50, 24, 16), (96, 8, 32)])
def test_blocked_weights_laid_out_as_rows_give_the_same_outputs(tmp_path, qtype, k, n, block):
    """Blocked along K with scales that vary by block: below opset 21 the codes become rows
    (N · blocks, block) of a per-axis DequantizeLinear, the columns of x transposed on
    64-bit words (``transposes``); a ragged K is padded with the last block's zero point."""
    rng = np.random.default_rng(k + n)
    dtype = {"int8": np.int8, "uint8": np.uint8, "int4": ml_dtypes.int4,
             "uint4": ml_dtypes.uint4}[qtype]
    lo, hi = {"int8": (-128, 128), "uint8": (0, 256), "int4": (-8, 8), "uint4": (0, 16)}[qtype]
    kb = -(-k // block)
    q = rng.integers(lo, hi, (k, n)).astype(dtype)
    s = (rng.random((kb, n)) + 0.01).astype(np.float32)
    z = rng.integers(lo, hi, (kb, n)).astype(dtype)
    x = ir.Value(name="X", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([3, k]))
    vals = [ir.Value(name=nm, const_value=ir.tensor(a)) for nm, a in (("q", q), ("s", s),
                                                                      ("z", z))]
    dq = ir.node("DequantizeLinear", vals, {"axis": 0, "block_size": block}, name="dq")
    mm = ir.node("MatMul", [x, dq.outputs[0]], name="mm")
    y = mm.outputs[0]
    y.name, y.dtype, y.shape = "Y", ir.DataType.FLOAT, ir.Shape([3, n])
    g = ir.Graph([x], [y], nodes=[dq, mm], initializers=vals, opset_imports={"": 21},
                 name="g")
    src = tmp_path / "m.onnx"
    ir.save(ir.Model(g, ir_version=10), src)
    report = dqtool.downgrade(str(src), 13, str(tmp_path / "out.onnx"))
    assert any(f"per-axis rows ({n * kb}, {block})" in c.how for c in report.changes), \
        [c.how for c in report.changes]
    assert check(str(tmp_path / "out.onnx"), against=str(src)).passed


def _empty_weight(tmp_path, x_shape: tuple[int, int], s_shape: tuple[int, int]):
    """A DequantizeLinear of uint8 x (no elements), blocked along axis 0 by 3, opset 21."""
    from onnx import TensorProto, helper, numpy_helper

    dq = helper.make_node("DequantizeLinear", ["x", "s"], ["w"], axis=0, block_size=3)
    g = helper.make_graph([dq], "g", [], [helper.make_tensor_value_info(
        "w", TensorProto.FLOAT, list(x_shape))], [
        numpy_helper.from_array(np.zeros(x_shape, np.uint8), "x"),
        numpy_helper.from_array(np.ones(s_shape, np.float32), "s")])
    src = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10),
              src)
    return src


def test_a_weight_of_zero_columns_is_laid_out_as_rows(tmp_path):
    # x (6, 0): no square of codes to transpose (it divided by zero there).
    from dqtool import transposes

    assert transposes.transpose_codes(np.zeros((5, 0), np.uint8), 5, 0, 8).shape == (0, 5)
    assert transposes.transpose_codes_numpy(np.zeros((8, 0), np.uint8), 8, 0, 8).shape == \
        (0, 8)
    src = _empty_weight(tmp_path, (6, 0), (2, 0))
    dqtool.downgrade(str(src), 19, str(tmp_path / "out.onnx"), per_axis=True)
    assert check(str(tmp_path / "out.onnx"), against=str(src)).passed


def test_pack_reads_a_weight_without_a_length_as_its_own_bytes(tmp_path):
    # External data that names no length: the tensor's own bytes, not the rest of the
    # file (pack took B from there and wrote wrong weights, its check failing).
    from helpers.fused import nbits_inputs, nbits_model

    rng = np.random.default_rng(4)
    original = nbits_model(64, 40, 4, 32, nbits_inputs(rng, 64, 40, 4, 32, zp="none"))
    onnx.save(original, tmp_path / "nbits.onnx")
    dqtool.upgrade(str(tmp_path / "nbits.onnx"), 21, str(tmp_path / "up.onnx"),
                   external_data=True)
    m = onnx.load(str(tmp_path / "up.onnx"), load_external_data=False)
    for t in m.graph.initializer:
        kept = [e for e in t.external_data if e.key != "length"]
        del t.external_data[:]
        t.external_data.extend(kept)
    assert any(t.external_data for t in m.graph.initializer)
    onnx.save(m, tmp_path / "up.onnx")
    dqtool.pack(str(tmp_path / "up.onnx"), str(tmp_path / "back.onnx"))
    back = onnx.load(str(tmp_path / "back.onnx"))
    want = {t.name: onnx.numpy_helper.to_array(t).tobytes() for t in original.graph.initializer}
    got = {t.name: onnx.numpy_helper.to_array(t).tobytes() for t in back.graph.initializer}
    assert got == want


def test_a_blocked_weight_with_no_block_is_refused_with_the_reason(tmp_path):
    # x (0, 4), scale (0, 4): a per-axis scale needs 4 values and there are none (it was a
    # traceback from the save).
    src = _empty_weight(tmp_path, (0, 4), (0, 4))
    from click.testing import CliRunner

    from dqtool.cli import cli

    r = CliRunner().invoke(cli, ["downgrade", str(src), "--opset", "19", "--per-axis", "-o",
                                 str(tmp_path / "out.onnx")])
    assert r.exit_code == 1, r.output
    assert "blocked scale of shape (0, 4) holds no value" in r.output
    assert "Traceback" not in r.output and not (tmp_path / "out.onnx").exists()


def _last_axis_model(path, qtype: str, external: bool, v: int = 48, d: int = 64,
                     block: int = 16) -> dict[str, np.ndarray]:
    """An embedding-like DequantizeLinear: x (v, d) blocked along its last axis, scales
    and zero points varying by block, read by a Gather; returns the stored initializers."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(v + d)
    dtype = {"int8": np.int8, "int4": ml_dtypes.int4, "uint4": ml_dtypes.uint4}[qtype]
    lo, hi = {"int8": (-128, 128), "int4": (-8, 8), "uint4": (0, 16)}[qtype]
    arrays = {"q": rng.integers(lo, hi, (v, d)).astype(dtype),
              "s": (rng.random((v, d // block)) + 0.01).astype(np.float16),
              "z": rng.integers(lo, hi, (v, d // block)).astype(dtype)}
    g = helper.make_graph(
        [helper.make_node("DequantizeLinear", ["q", "s", "z"], ["w"], name="dq", axis=1,
                          block_size=block),
         helper.make_node("Gather", ["w", "ids"], ["y"], name="gather", axis=0)], "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [3, d])],
        [numpy_helper.from_array(a, k) for k, a in arrays.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    if external:
        onnx.save_model(m, path, save_as_external_data=True, location=path.name + ".data",
                        size_threshold=0)
    else:
        onnx.save_model(m, path)
    return {k: onnx.numpy_helper.from_array(a).raw_data for k, a in arrays.items()}


@pytest.mark.parametrize("qtype", ["int8", "int4", "uint4"])
@pytest.mark.parametrize("external", [True, False])
def test_rows_of_a_weight_blocked_along_its_last_axis_are_its_stored_bytes(
        tmp_path, monkeypatch, qtype, external):
    """Blocked along the last axis (an embedding), x's rows are x reshaped: the per-axis
    form keeps x, its scale and its zero point as stored. From a file they are copied
    there by the save and never read as values (a 32000 x 4096 int4 embedding's
    `--per-axis` held 348 MB; now 132)."""
    from dqtool import graph

    src = tmp_path / "m.onnx"
    stored = _last_axis_model(src, qtype, external)
    if external:
        monkeypatch.setattr(graph, "tensor_values", lambda t: pytest.fail(
            f"{t.name} read as values"))
    out = tmp_path / "out.onnx"
    report = dqtool.upgrade(str(src), 21, str(out), per_axis=True)
    assert any("per-axis rows (192, 16)" in c.how for c in report.changes), \
        [c.how for c in report.changes]
    monkeypatch.undo()
    got = {t.name: t for t in onnx.load(str(out)).graph.initializer}
    assert {k: got[f"{k}_rows"].raw_data for k in stored} == stored
    assert list(got["q_rows"].dims) == [192, 16] and list(got["s_rows"].dims) == [192]
    assert check(str(out), against=str(src)).passed


def test_rows_of_a_last_axis_weight_in_a_function_are_its_values(tmp_path):
    """In a function the constants are Constant nodes (saved inline): the rows are read."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    q = rng.integers(-8, 8, (4, 32)).astype(ml_dtypes.int4)
    s = (rng.random((4, 2)) + 0.01).astype(np.float32)
    consts = [helper.make_node("Constant", [], [n], value=numpy_helper.from_array(a, n))
              for n, a in (("q", q), ("s", s))]
    f = helper.make_function(
        "local", "Proj", ["x"], ["y"],
        [*consts, helper.make_node("DequantizeLinear", ["q", "s"], ["w"], axis=1,
                                   block_size=16),
         helper.make_node("MatMul", ["x", "w"], ["y"])],
        [helper.make_opsetid("", 21)])
    g = helper.make_graph([helper.make_node("Proj", ["x"], ["y"], domain="local")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 32])])
    src = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g, functions=[f], ir_version=10, opset_imports=[
        helper.make_opsetid("", 21), helper.make_opsetid("local", 1)]), src)
    out = tmp_path / "out.onnx"
    dqtool.upgrade(str(src), 21, str(out), per_axis=True)
    fn = onnx.load(str(out)).functions[0]
    rows = {n.output[0]: onnx.numpy_helper.to_array(n.attribute[0].t)
            for n in fn.node if n.op_type == "Constant"}
    assert np.array_equal(rows["q_rows"].astype(np.int8), q.astype(np.int8).reshape(8, 16))
    assert check(str(out), against=str(src)).passed
