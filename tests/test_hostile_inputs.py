"""Hostile operator attributes, element types, dims and output names (the hostile campaign
of 2026-11): every command answers one line with exit 2, or a finding, never a traceback;
and a large weight in a file is checked a band at a time, never read whole."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
import pytest
from helpers.fused import gbq_model, nbits_inputs, nbits_model
from helpers.integer import one_node
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from dqtool import registry, storage
from dqtool.checking import check, models, runners, selfcheck
from dqtool.cli import main
from dqtool.storage import tensor_reads

H = 1 << 62
MAX = (1 << 63) - 1


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Run ``dqtool argv`` in this process: (exit code, stdout, stderr). An exception that
    leaves ``main`` (a traceback for a user) fails the test by itself."""
    try:
        main(argv)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def _assert_clean(argv: list[str], code: int, err: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert code in (0, 1, 2), (argv, code, err)
    assert "Traceback" not in err, (argv, err)
    assert len(lines) <= 1, (argv, err)
    if code == 2:
        assert lines and lines[0].startswith("dqtool: error: "), (argv, err)


def _every_command(model: Path, out: Path) -> list[list[str]]:
    m, o = str(model), str(out)
    return [["inspect", m], ["inspect", "--json", m], ["lint", m],
            ["lint", "--target", "onnxruntime", m], ["check", m], ["check", m, "--against", m],
            ["fold", m, "-o", o], ["upgrade", m, "--opset", "21", "-o", o],
            ["downgrade", m, "--opset", "13", "-o", o], ["pack", m, "-o", o],
            ["qdq", m, "-o", o], ["qoperator", m, "-o", o]]


def _with_attribute(model: onnx.ModelProto, attr: onnx.AttributeProto) -> onnx.ModelProto:
    node = model.graph.node[0]
    kept = [a for a in node.attribute if a.name != attr.name]
    del node.attribute[:]
    node.attribute.extend([*kept, attr])
    return model


def _nbits(**attrs: object) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    model = nbits_model(32, 8, 4, 16, nbits_inputs(rng, 32, 8, 4, 16))
    for name, value in attrs.items():
        model = _with_attribute(model, helper.make_attribute(name, value))
    return model


def _gbq(uint8: bool = False, **attrs: object) -> onnx.ModelProto:
    rng = np.random.default_rng(1)
    table = rng.integers(0, 256, (10, 32)).astype(np.uint8) if uint8 else \
        rng.integers(0, 16, (10, 64)).astype(ml_dtypes.uint4)
    model = gbq_model(table, (rng.random((10, 2)) * 0.1).astype(np.float32), None)
    for name, value in attrs.items():
        model = _with_attribute(model, helper.make_attribute(name, value))
    return model


def _dq(scale: onnx.TensorProto | None = None, zero_point: onnx.TensorProto | None = None,
        x: onnx.TensorProto | None = None, opset: int = 21, **attrs: object
        ) -> onnx.ModelProto:
    """w (int8 [4, 8], or ``x``) → DequantizeLinear(scale, zero point) → MatMul."""
    inits = [x or numpy_helper.from_array(np.arange(32, dtype=np.int8).reshape(4, 8), "w"),
             scale or numpy_helper.from_array(np.float32(0.1), "s")]
    names = ["w", "s"]
    if zero_point is not None:
        inits.append(zero_point)
        names.append("z")
    nodes = [helper.make_node("DequantizeLinear", names, ["y"], name="dq", **attrs),
             helper.make_node("MatMul", ["a", "y"], ["o"], name="mm")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("a", TP.FLOAT, [2, 4])],
                          [helper.make_tensor_value_info("o", TP.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def _run_all(tmp_path: Path, model: onnx.ModelProto, capsys: pytest.CaptureFixture[str]
             ) -> dict[str, tuple[int, str, str]]:
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    before = path.read_bytes()
    (tmp_path / "out").mkdir()
    got = {}
    for argv in _every_command(path, tmp_path / "out" / "o.onnx"):
        code, out, err = _cli(argv, capsys)
        _assert_clean(argv, code, err)
        if code == 2:
            assert not list((tmp_path / "out").iterdir()), argv  # nothing written
        got[" ".join(argv[:2] if argv[1].startswith("-") else argv[:1])] = (code, out, err)
    assert path.read_bytes() == before
    return got


# -- attributes out of range: the codec's problems, every command clean ----------------------
@pytest.mark.parametrize(("name", "value"), [("N", -8), ("N", 0), ("K", -32), ("K", 0)])
def test_matmul_nbits_with_k_or_n_not_positive_is_an_invalid_node(tmp_path, capsys, name,
                                                                   value):
    # upgrade and fold failed with a TypeError (no geometry, and no problem either)
    got = _run_all(tmp_path, _nbits(**{name: value}), capsys)
    code, out, _ = got["lint --target"]
    assert code == 1 and "FU002" in out and f"{name}={value}" in out
    assert got["upgrade"][0] == 0 and "kept" in got["upgrade"][1]


HOSTILE_FUSED = {
    "nbits bits -4": lambda: _nbits(bits=-4), "nbits bits 0": lambda: _nbits(bits=0),
    "nbits bits huge": lambda: _nbits(bits=H),
    "nbits block -16": lambda: _nbits(block_size=-16),
    "nbits block 0": lambda: _nbits(block_size=0),
    "nbits block huge": lambda: _nbits(block_size=H), "nbits K huge": lambda: _nbits(K=H),
    "nbits N huge": lambda: _nbits(N=H),
    "gbq bits -4": lambda: _gbq(bits=-4), "gbq uint8 bits 0": lambda: _gbq(True, bits=0),
    "gbq uint8 bits 3": lambda: _gbq(True, bits=3),
    "gbq block 0": lambda: _gbq(block_size=0), "gbq block huge": lambda: _gbq(block_size=H),
    "gbq quantize_axis -5": lambda: _gbq(quantize_axis=-5),
    "gbq quantize_axis huge": lambda: _gbq(True, quantize_axis=H),
    "gbq gather_axis huge": lambda: _gbq(gather_axis=H),
    "gbq gather_axis -huge": lambda: _gbq(gather_axis=-H),
}


@pytest.mark.parametrize("case", HOSTILE_FUSED)
def test_hostile_fused_attributes_are_findings(tmp_path, capsys, case):
    got = _run_all(tmp_path, HOSTILE_FUSED[case](), capsys)
    code, out, _ = got["lint --target"]
    assert code == 1 and "FU00" in out


def _conv(**attrs: object) -> onnx.ModelProto:
    rng = np.random.default_rng(2)
    f32, u8 = (lambda v: np.array(v, np.float32)), (lambda v: np.array(np.uint8(v)))
    x = rng.integers(0, 256, (1, 2, 5, 5)).astype(np.uint8)
    w = rng.integers(-128, 128, (3, 2, 3, 3)).astype(np.int8)
    return one_node("QLinearConv", [("x", x), ("xs", f32(0.02)), ("xz", u8(3)), ("w", w),
                                    ("ws", f32(0.01)), ("wz", np.array(np.int8(0))),
                                    ("ys", f32(0.5)), ("yz", u8(7))], TP.UINT8,
                    **{"kernel_shape": [3, 3], **attrs})


def _ms_unary(op: str, **attrs: object) -> onnx.ModelProto:
    x = np.random.default_rng(3).integers(0, 256, (1, 3, 6, 6)).astype(np.uint8)
    f32, u8 = (lambda v: np.array(v, np.float32)), (lambda v: np.array(np.uint8(v)))
    return one_node(op, [("x", x), ("xs", f32(0.02)), ("xz", u8(3)), ("ys", f32(0.1)),
                         ("yz", u8(4))], TP.UINT8, domain="com.microsoft", **attrs)


HOSTILE_INTEGER = {
    "conv group 0": lambda: _conv(group=0), "conv group -1": lambda: _conv(group=-1),
    "conv group huge": lambda: _conv(group=H), "conv strides 0": lambda: _conv(strides=[0, 0]),
    "conv pads -5": lambda: _conv(pads=[-5] * 4), "conv pads huge": lambda: _conv(pads=[H] * 4),
    "conv kernel huge": lambda: _conv(kernel_shape=[H, H]),
    "conv dilations 0": lambda: _conv(dilations=[0, 0]),
    "pool kernel 0": lambda: _ms_unary("QLinearAveragePool", kernel_shape=[0, 0]),
    "pool kernel huge": lambda: _ms_unary("QLinearAveragePool", kernel_shape=[H, H]),
    "softmax axis huge": lambda: _ms_unary("QLinearSoftmax", axis=H),
    "softmax opset -13": lambda: _ms_unary("QLinearSoftmax", opset=-13),
    "reduce axes huge": lambda: _ms_unary("QLinearReduceMean", axes=[H], keepdims=1),
    "dq axis huge": lambda: _dq(numpy_helper.from_array(np.ones(4, np.float32), "s"), axis=H),
    "dq block -32": lambda: _dq(numpy_helper.from_array(np.ones((4, 2), np.float32), "s"),
                                axis=1, block_size=-32),
    "dq block huge": lambda: _dq(numpy_helper.from_array(np.ones((4, 2), np.float32), "s"),
                                 axis=1, block_size=H),
    "dq output_dtype 9999": lambda: _dq(output_dtype=9999),
}


@pytest.mark.parametrize("case", HOSTILE_INTEGER)
def test_hostile_integer_and_qdq_attributes_never_fail_a_command(tmp_path, capsys, case):
    _run_all(tmp_path, HOSTILE_INTEGER[case](), capsys)


# -- attribute types: refused when the model is loaded ----------------------------------------
WRONG_TYPES = {
    # ai.onnx operators: onnx's schemas
    "DequantizeLinear axis STRING": (lambda: _dq(axis="1"), "'axis' is STRING"),
    "QLinearConv group STRING": (lambda: _conv(group="1"), "'group' is STRING"),
    # com.microsoft ones: the families' attribute_types (qoperator, qdq and lint's target
    # failed on these: '<' between str and int, float('x'), as_int of a FLOAT)
    "QGemm alpha STRING": (lambda: _qgemm(alpha="x"), "'alpha' is STRING"),
    "QGemm transB FLOAT": (lambda: _qgemm(transB=1.0), "'transB' is FLOAT"),
    "QLinearSoftmax opset STRING": (lambda: _ms_unary("QLinearSoftmax", opset="13"),
                                    "'opset' is STRING"),
    "MatMulNBits K FLOAT": (lambda: _nbits(K=32.0), "'K' is FLOAT"),
    "GatherBlockQuantized quantize_axis INTS": (lambda: _gbq(quantize_axis=[1]),
                                                "'quantize_axis' is INTS"),
}


def _qgemm(**attrs: object) -> onnx.ModelProto:
    rng = np.random.default_rng(4)
    a = rng.integers(0, 256, (4, 6)).astype(np.uint8)
    b = rng.integers(-128, 128, (6, 5)).astype(np.int8)
    f32, u8 = (lambda v: np.array(v, np.float32)), (lambda v: np.array(np.uint8(v)))
    return one_node("QGemm", [("a", a), ("as", f32(0.02)), ("az", u8(1)), ("b", b),
                              ("bs", f32(0.01)), ("bz", np.array(np.int8(0))),
                              ("c", np.zeros(5, np.int32)), ("ys", f32(0.3)), ("yz", u8(2))],
                    TP.UINT8, domain="com.microsoft", **attrs)


@pytest.mark.parametrize("case", WRONG_TYPES)
def test_an_attribute_of_the_wrong_type_is_refused_by_every_command(tmp_path, capsys, case):
    build, message = WRONG_TYPES[case]
    got = _run_all(tmp_path, build(), capsys)
    for argv, (code, _, err) in got.items():
        assert code == 2 and message in err and "defines it as" in err, (argv, err)


def test_the_attribute_types_are_onnxruntimes() -> None:
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_c

    schemas = {(s.domain, s.name): s for s in ort_c.get_all_operator_schema()}
    compared = 0
    for family in registry.all_families():
        for op, types in family.attribute_types.items():
            for domain in family.domains:
                schema = schemas.get((domain, op))
                if schema is None:  # opmx: not an onnxruntime operator
                    continue
                ort = {name: str(a.type).rsplit(".", 1)[-1]
                       for name, a in schema.attributes.items()}
                assert types == ort, op
                compared += 1
    assert compared >= 14


# -- string (bool, complex) tensors in numeric roles ------------------------------------------
def _strings(name: str, dims: list[int]) -> onnx.TensorProto:
    return helper.make_tensor(name, TP.STRING, dims, [b"a"] * int(np.prod(dims, dtype=int)))


def _string_graph_input() -> onnx.ModelProto:
    model = _dq()
    del model.graph.initializer[0]
    model.graph.input.append(helper.make_tensor_value_info("w", TP.STRING, [4, 8]))
    return model


def _string_constant() -> onnx.ModelProto:
    model = _dq()
    del model.graph.initializer[1]
    model.graph.node.insert(0, helper.make_node("Constant", [], ["s"],
                                                value=_strings("v", [])))
    return model


def _replaced(model: onnx.ModelProto, tensor: onnx.TensorProto) -> onnx.ModelProto:
    for t in model.graph.initializer:
        if t.name == tensor.name:
            t.CopyFrom(tensor)
    return model


STRINGS = {
    "DequantizeLinear scale": lambda: _dq(_strings("s", [])),
    "DequantizeLinear-13 scale": lambda: _dq(_strings("s", []), opset=13),
    "DequantizeLinear zero point": lambda: _dq(zero_point=_strings("z", [])),
    "DequantizeLinear x": lambda: _dq(x=_strings("w", [4, 8])),
    "DequantizeLinear x, a graph input": _string_graph_input,
    "DequantizeLinear scale, a Constant": _string_constant,
    "QLinearConv w scale": lambda: _replaced(_conv(), _strings("ws", [])),
    "MatMulNBits scales": lambda: _replaced(_nbits(), _strings("scales", [8, 2])),
    "GatherBlockQuantized data": lambda: _replaced(_gbq(True), _strings("data", [10, 32])),
}


@pytest.mark.parametrize("case", STRINGS)
def test_a_string_tensor_where_numbers_are_read_is_refused(tmp_path, capsys, case):
    # lint (float of b'a') and check (no TensorProto type for NumPy's bytes) failed on them
    got = _run_all(tmp_path, STRINGS[case](), capsys)
    for argv, (code, _, err) in got.items():
        assert code == 2 and "a string tensor" in err, (argv, err)


@pytest.mark.parametrize("dtype", [np.bool_, np.complex64])
def test_a_bool_or_complex_scale_is_a_finding(tmp_path, capsys, dtype):
    got = _run_all(tmp_path, _dq(numpy_helper.from_array(np.ones((), dtype), "s")), capsys)
    code, out, _ = got["lint"]
    assert code == 1 and "DQ010" in out


# -- dims ---------------------------------------------------------------------------------------
def _empty(name: str, dims: list[int], data_type: int = TP.INT8) -> onnx.TensorProto:
    return onnx.TensorProto(name=name, data_type=data_type, dims=dims, raw_data=b"")


def _absurd_input() -> onnx.ModelProto:
    model = _string_graph_input()
    model.graph.input[1].CopyFrom(helper.make_tensor_value_info("w", TP.INT8, [0, MAX, MAX]))
    return model


ABSURD = {
    "weight [0, 2^63-1, 2^63-1]": lambda: _dq(x=_empty("w", [0, MAX, MAX])),
    "weight [0, 2^62, 2^62, 2^62]": lambda: _dq(x=_empty("w", [0, H, H, H])),
    "scale [0, 2^63-1, 2^63-1]": lambda: _dq(_empty("s", [0, MAX, MAX], TP.FLOAT)),
    "graph input [0, 2^63-1, 2^63-1]": _absurd_input,
}


@pytest.mark.parametrize("case", ABSURD)
def test_dims_past_what_numpy_can_shape_are_refused(tmp_path, capsys, case):
    # check and fold failed in NumPy: "array is too big"
    got = _run_all(tmp_path, ABSURD[case](), capsys)
    for argv, (code, _, err) in got.items():
        assert code == 2 and "more than 2^48 elements" in err, (argv, err)


def test_absurd_dims_of_an_external_tensor_are_refused(tmp_path, capsys):
    model = _dq()
    w = model.graph.initializer[0]
    w.CopyFrom(_empty("w", [0, MAX, MAX]))
    w.ClearField("raw_data")
    w.data_location = TP.EXTERNAL
    for k, v in (("location", "w.bin"), ("offset", "0"), ("length", "0")):
        w.external_data.add(key=k, value=v)
    (tmp_path / "w.bin").write_bytes(b"")
    onnx.save(model, tmp_path / "m.onnx")
    code, _, err = _cli(["check", str(tmp_path / "m.onnx")], capsys)
    assert code == 2 and "more than 2^48 elements" in err and len(err.splitlines()) == 1


# -- output names that are not UTF-8 ------------------------------------------------------------
def _weight_model(folder: Path, external: bool) -> Path:
    model = _dq(x=numpy_helper.from_array(np.arange(4096, dtype=np.int8).reshape(64, 64), "w"),
                scale=numpy_helper.from_array(np.float32(0.5), "s"))
    model.graph.input[0].CopyFrom(helper.make_tensor_value_info("a", TP.FLOAT, [2, 64]))
    path = folder / "m.onnx"
    if external:
        onnx.save(model, path, save_as_external_data=True, location="m.data", size_threshold=0)
    else:
        onnx.save(model, path)
    return path


@pytest.mark.parametrize("verb", [["fold"], ["fold", "--external-data"],
                                  ["upgrade", "--opset", "21"], ["downgrade", "--opset", "13"]],
                         ids=" ".join)
@pytest.mark.parametrize("external", [False, True], ids=["inline", "external"])
def test_an_output_name_that_is_not_utf8(tmp_path, verb, external):
    """Its data file's location would be made from it, and a location is text in the model:
    with external data it is refused before anything is written (onnx_ir failed mid-save);
    without, the model is written under that name."""
    (tmp_path / "in").mkdir()
    (tmp_path / "out").mkdir()
    model = _weight_model(tmp_path / "in", external)
    before = {p.name: p.read_bytes() for p in (tmp_path / "in").iterdir()}
    out = os.fsencode(tmp_path / "out") + b"/o\xff\xfe.onnx"
    argv = [os.fsencode(sys.executable), b"-m", b"dqtool", verb[0].encode(),
            os.fsencode(model), *(a.encode() for a in verb[1:]), b"-o", out]
    res = subprocess.run(argv, capture_output=True, timeout=300)
    err = res.stderr.decode("utf-8")
    assert "Traceback" not in err
    assert {p.name: p.read_bytes() for p in (tmp_path / "in").iterdir()} == before
    written = os.listdir(os.fsencode(tmp_path / "out"))
    if external or "--external-data" in verb:
        assert res.returncode == 2 and len(err.splitlines()) == 1, err
        assert err.startswith("dqtool: error: ") and "not valid UTF-8" in err
        assert written == []
    else:
        assert res.returncode == 0, err
        assert written == [b"o\xff\xfe.onnx"]
        loaded = onnx.load(out.decode(errors="surrogateescape"))
        assert not any(t.data_location == TP.EXTERNAL for t in loaded.graph.initializer)


# -- a large weight in a file: checked a band at a time -----------------------------------------
def _external_weight(folder: Path, q: np.ndarray, scale: np.ndarray, **attrs: object) -> Path:
    qv = ir.Value(name="W_q", const_value=ir.tensor(q))
    sv = ir.Value(name="W_s", const_value=ir.tensor(scale))
    dq = ir.node("DequantizeLinear", [qv, sv], attributes=attrs, name="dq")
    y = dq.outputs[0]
    y.name, y.dtype, y.shape = "Y", ir.DataType.FLOAT, ir.Shape(q.shape)
    g = ir.Graph([], [y], nodes=[dq], initializers=[qv, sv], opset_imports={"": 21}, name="g")
    path = folder / "m.onnx"
    ir.save(ir.Model(g, ir_version=10), path, external_data="m.data", size_threshold_bytes=0)
    return path


# (codes, shape, scale shape, attributes, rows in a band: 4096 bytes of output, or more
# where whole blocks along axis 0 or whole bytes of 4-bit codes need more)
WEIGHTS = {
    "per-tensor": (np.int8, (256, 64), (), {}, 16),
    "per-axis 0": (np.int8, (256, 64), (256,), {"axis": 0}, 16),
    "per-axis 1": (np.int8, (256, 64), (64,), {"axis": 1}, 16),
    "int4 blocked 0": (ml_dtypes.int4, (256, 64), (16, 64), {"axis": 0, "block_size": 16},
                       16),
    "uint4 blocked 1, wide": (ml_dtypes.uint4, (48, 512), (48, 16),
                              {"axis": 1, "block_size": 32}, 8),
    "int8 blocked 0, wide": (np.int8, (64, 1024), (2, 1024), {"axis": 0, "block_size": 32},
                             32),
}


@pytest.mark.parametrize("case", WEIGHTS)
def test_a_weight_in_a_file_is_checked_a_band_at_a_time(tmp_path, monkeypatch, case):
    """Through onnx_ir the weight was mapped whole and every page a slice touched stayed
    resident: an int8[2^31] weight in a sparse 2 GiB file took 2.42 GB of RSS; read a band
    at a time, 0.35 GB (docs/benchmarks.md, 2026-11-28)."""
    dtype, shape, s_shape, attrs, band_rows = WEIGHTS[case]
    rng = np.random.default_rng(5)
    info = ml_dtypes.iinfo(dtype)
    q = rng.integers(info.min, info.max + 1, shape).astype(dtype)
    scale = (rng.random(s_shape) + 0.01).astype(np.float32)
    path = _external_weight(tmp_path, q, scale, **attrs)
    budget = 4096
    monkeypatch.setattr(models, "MAX_IN_PROTO", 1024)  # its tensors stay in their file
    monkeypatch.setattr(selfcheck, "PIECE_BYTES", budget)
    monkeypatch.setattr(selfcheck, "WHOLE_RUN_MAX_BYTES", 1024)

    real_numpy = ir.ExternalTensor.numpy

    def whole(self: ir.ExternalTensor) -> np.ndarray:
        assert self.name != "W_q", "the weight was read whole"
        return real_numpy(self)

    monkeypatch.setattr(ir.ExternalTensor, "numpy", whole)
    reads: list[int] = []
    real_from_file = tensor_reads.from_file

    def from_file(path, dtype, count, offset):
        reads.append(count * np.dtype(dtype).itemsize)
        return real_from_file(path, dtype, count, offset)

    monkeypatch.setattr(tensor_reads, "from_file", from_file)
    monkeypatch.setattr(storage, "from_file", from_file)  # as check reads it
    runs: list[int] = []
    real_run = runners.run_ort
    monkeypatch.setattr(runners, "run_ort", lambda model, feeds, outputs=None, **k: (
        runs.append(int(np.prod(model.graph.initializer[0].dims))) or real_run(
            model, feeds, outputs, **k)))
    report = check(path)
    assert [n.status for n in report.nodes] == ["bit-exact"], report.to_json()
    # Each band read once, on its own (a band larger than the budget is cut along its
    # columns before it is run).
    bits = ml_dtypes.iinfo(dtype).bits
    assert sum(reads) == q.size * bits // 8
    assert reads == [band_rows * q[0].size * bits // 8] * (shape[0] // band_rows), reads
    assert sum(runs) == q.size and max(runs) * 4 <= budget, runs  # every run one slice
