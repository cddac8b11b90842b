"""A model is validated once, where it is loaded: every command refuses a broken model with
exit 2 and one line naming the file, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from dqtool import storage
from dqtool.errors import InputError

MARK = b"QQFUZZQQ"


def _model(opset: int = 21) -> onnx.ModelProto:
    w = numpy_helper.from_array(np.arange(-4, 4, dtype=np.int8).reshape(2, 4), "W_q")
    s = numpy_helper.from_array(np.full(4, 0.5, np.float32), "W_s")
    g = helper.make_graph(
        [helper.make_node("DequantizeLinear", ["W_q", "W_s"], ["W"], axis=1, name="dq"),
         helper.make_node("MatMul", ["X", "W"], ["Y"], name="mm")],
        "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 2])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 4])], [w, s])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def _save(tmp_path: Path, m: onnx.ModelProto, bad_utf8: bool = False) -> Path:
    data = m.SerializeToString()
    if bad_utf8:
        data = data.replace(MARK, b"\xff\xfe\xc3\x28\xa0\xa1\xe2\x28")
    p = tmp_path / "m.onnx"
    p.write_bytes(data)
    return p


def _broken(kind: str) -> tuple[onnx.ModelProto, bool, str]:
    """(model, whether MARK becomes invalid UTF-8, what the message says)."""
    m = _model()
    g = m.graph
    if kind == "utf8-node-name":
        g.node[0].name = MARK.decode()
        return m, True, "not valid UTF-8"
    if kind == "utf8-value":
        g.node[0].output[0] = MARK.decode()
        g.node[1].input[1] = MARK.decode()
        return m, True, "not valid UTF-8"
    if kind == "raw-short":
        g.initializer[0].raw_data = g.initializer[0].raw_data[:3]
        return m, False, "holds 3 bytes; its dims [2, 4] and type int8 need 8"
    if kind == "raw-odd-scale":
        g.initializer[1].raw_data += b"\x01"
        return m, False, "holds 17 bytes"
    if kind == "dims-huge":
        g.initializer[0].dims[0] = 2**40
        return m, False, "need 4398046511104"
    if kind == "dims-negative":
        g.initializer[0].dims[0] = -2
        return m, False, "negative dimension -2"
    if kind == "undefined-type":
        g.initializer[1].data_type = 0
        return m, False, "UNDEFINED"
    if kind == "unknown-type":
        g.initializer[1].data_type = 9999
        return m, False, "element type 9999 is not an ONNX type"
    if kind == "typed-count":
        t = g.initializer[1]
        t.ClearField("raw_data")
        t.float_data.extend([1.0, 2.0])
        return m, False, "holds 2 values in float_data"
    if kind == "input-type":
        g.input[0].type.tensor_type.elem_type = 9999
        return m, False, "element type 9999"
    if kind == "dangling":
        g.node[1].input[0] = "nowhere"
        return m, False, "reads 'nowhere', which no node, input or initializer defines"
    if kind == "defined-twice":
        g.node[1].output[0] = "W"
        return m, False, "value 'W' is defined twice"
    if kind == "output-twice":
        g.output.append(g.output[0])
        return m, False, "graph output 'Y' is listed twice"
    if kind == "cycle-listed-first":  # the closing value is made after its consumer
        g.node[0].input[1] = "W2"
        g.node.append(helper.make_node("Identity", ["W"], ["W2"], name="back"))
        return m, False, "cycle"
    if kind == "dq-reads-itself":
        g.node[0].input[0] = "W"
        return m, False, "cycle"
    if kind == "opset-zero":
        m.opset_import[0].version = 0
        return m, False, "declares ai.onnx opset 0, which does not exist"
    if kind == "opset-negative":
        m.opset_import[0].version = -3
        return m, False, "declares ai.onnx opset -3"
    if kind == "ir-too-new":
        m.ir_version = 1000
        return m, False, "IR version 1000 is newer"
    if kind == "attribute-type":
        g.node[0].attribute[0].type = 0
        return m, False, "attribute 'axis' has type 0"
    if kind == "recursive-function":
        m.functions.append(helper.make_function(
            "fz", "F", ["a"], ["b"], [helper.make_node("G", ["a"], ["b"], domain="fz")],
            [helper.make_opsetid("", 21)]))
        m.functions.append(helper.make_function(
            "fz", "G", ["a"], ["b"], [helper.make_node("F", ["a"], ["b"], domain="fz")],
            [helper.make_opsetid("", 21)]))
        m.opset_import.add(domain="fz", version=1)
        g.node.append(helper.make_node("F", ["Y"], ["Z"], domain="fz"))
        return m, False, "calls itself"
    raise AssertionError(kind)


KINDS = ["utf8-node-name", "utf8-value", "raw-short", "raw-odd-scale", "dims-huge",
         "dims-negative", "undefined-type", "unknown-type", "typed-count", "input-type",
         "dangling", "defined-twice", "output-twice", "cycle-listed-first", "dq-reads-itself",
         "opset-zero", "opset-negative", "ir-too-new", "recursive-function", "attribute-type"]


@pytest.mark.parametrize("kind", KINDS)
def test_load_refuses_a_broken_model_in_one_line(tmp_path, kind):
    m, utf8, want = _broken(kind)
    path = _save(tmp_path, m, utf8)
    with pytest.raises(InputError) as e:
        storage.load(path)
    assert str(e.value).startswith(f"{path}: ")
    assert want in str(e.value)
    assert "\n" not in str(e.value)


def test_the_unbroken_model_loads(tmp_path):
    model = storage.load(_save(tmp_path, _model()))
    assert [n.op_type for n in model.graph] == ["DequantizeLinear", "MatMul"]


def test_out_of_order_but_acyclic_is_not_a_cycle(tmp_path):
    m = _model()
    nodes = list(m.graph.node)
    del m.graph.node[:]
    m.graph.node.extend(reversed(nodes))  # MatMul listed before the DQ it reads
    storage.load(_save(tmp_path, m))


COMMANDS = [["inspect"], ["inspect", "--json"], ["lint"], ["check"], ["fold", "-o", "OUT"],
            ["upgrade", "--opset", "23", "-o", "OUT"], ["downgrade", "--opset", "19", "-o",
                                                        "OUT"]]


# Each command once, each with another kind of break (the fuzz harness runs the rest).
@pytest.mark.parametrize(("kind", "command"), list(zip(
    ["utf8-value", "raw-short", "undefined-type", "dangling", "cycle-listed-first",
     "opset-zero", "output-twice"], COMMANDS, strict=True)), ids=lambda c: "-".join(c[:2])
    if isinstance(c, list) else c)
def test_every_command_exits_2_with_one_line(tmp_path, kind, command):
    m, utf8, want = _broken(kind)
    path = _save(tmp_path, m, utf8)
    out = tmp_path / "out.onnx"
    argv = [a.replace("OUT", str(out)) for a in command]
    r = subprocess.run([sys.executable, "-m", "dqtool", argv[0], str(path), *argv[1:]],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith(f"dqtool: error: {path}: ")
    assert want in r.stderr
    assert not out.exists()


def test_library_warnings_and_logs_stay_quiet_unless_verbose(tmp_path):
    m = _model()
    m.graph.initializer[0].data_location = TensorProto.EXTERNAL  # with an unknown key
    t = m.graph.initializer[0]
    (tmp_path / "w.bin").write_bytes(t.raw_data)
    t.ClearField("raw_data")
    for k, v in (("location", "w.bin"), ("length", "8"), ("colour", "blue")):
        t.external_data.add(key=k, value=v)
    path = _save(tmp_path, m)
    quiet = subprocess.run([sys.executable, "-m", "dqtool", "inspect", str(path)],
                           capture_output=True, text=True, timeout=300)
    assert quiet.returncode == 0 and quiet.stderr == ""
    loud = subprocess.run([sys.executable, "-m", "dqtool", "-v", "inspect", str(path)],
                          capture_output=True, text=True, timeout=300)
    assert loud.returncode == 0 and "colour" in loud.stderr


def test_check_refuses_to_generate_a_huge_declared_input(tmp_path):
    m = _model()
    m.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 2**30  # X: float[1, 2^30]
    path = _save(tmp_path, m)
    r = subprocess.run([sys.executable, "-m", "dqtool", "check", str(path)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2
    assert r.stderr.startswith(f"dqtool: error: {path}: input X: shape (1, 1073741824)")
    assert "past 256 MiB" in r.stderr


def test_lint_of_an_integer_scale_reports_instead_of_crashing(tmp_path):
    m = _model()
    m.graph.initializer[1].CopyFrom(helper.make_tensor("W_s", TensorProto.UINT4, [4],
                                                       [1, 2, 3, 4]))
    path = _save(tmp_path, m)
    r = subprocess.run([sys.executable, "-m", "dqtool", "lint", str(path)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "DQ010" in r.stdout  # uint4 is not a scale type


def test_six_bit_data_with_padding_bits_set_is_refused(tmp_path):
    m = _model()
    m.graph.initializer.append(helper.make_tensor("f6", 27, [1], b"\xff", raw=True))
    m.graph.node.append(helper.make_node("Identity", ["f6"], ["f6_out"]))
    path = _save(tmp_path, m)
    with pytest.raises(InputError, match="nonzero padding bits"):
        storage.load(path)


def _sparse_initializer(m: onnx.ModelProto) -> onnx.ModelProto:
    w = m.graph.initializer[0]
    dense = numpy_helper.to_array(w)
    flat = np.flatnonzero(dense)
    m.graph.sparse_initializer.append(helper.make_sparse_tensor(
        numpy_helper.from_array(dense.reshape(-1)[flat], w.name),
        numpy_helper.from_array(flat.astype(np.int64), ""), list(dense.shape)))
    del m.graph.initializer[0]
    return m


def _sparse_constant(m: onnx.ModelProto) -> onnx.ModelProto:
    sp = _sparse_initializer(_model()).graph.sparse_initializer[0]
    del m.graph.initializer[0]
    m.graph.node.insert(0, helper.make_node("Constant", [], ["W_q"], name="c",
                                            sparse_value=sp))
    return m


@pytest.mark.parametrize(("make", "said"), [
    (_sparse_initializer, "main graph: sparse initializer 'W_q'"),
    (_sparse_constant, "node 'c': attribute 'sparse_value' is a sparse tensor")])
@pytest.mark.parametrize("command", [["inspect"], ["upgrade", "--opset", "23"], ["fold"],
                                     ["check"], ["pack"]])
def test_sparse_tensors_are_refused_by_every_command(tmp_path, make, said, command):
    # onnx_ir reads no sparse tensor: a sparse initializer was left out of every model
    # written (onnxruntime then refused it) and a sparse Constant ended check in a
    # traceback.
    m = make(_model())
    onnx.checker.check_model(m)
    p = _save(tmp_path, m)
    out = tmp_path / "out.onnx"
    args = [*command, str(p)] + (["-o", str(out)] if command[0] in ("upgrade", "fold",
                                                                     "pack") else [])
    r = subprocess.run([sys.executable, "-m", "dqtool", *args], capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and said in r.stderr
    assert "dqtool does not read sparse tensors" in r.stderr
    assert not out.exists()
