"""pack: DequantizeLinear → MatMul / Gather into MatMulNBits / GatherBlockQuantized; and the
round trip upgrade → pack gives back the original tensors."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
import pytest
from click.testing import CliRunner
from helpers.fused import bits_of, gbq_model, in_function, nbits_inputs, nbits_model, run_ort
from onnx_ir import from_onnx_text as model

import dqtool
from dqtool.cli import cli
from dqtool.families.fused import packing


def _roundtrip(proto: onnx.ModelProto, opset: int = 21, **kw) -> onnx.ModelProto:
    m = dqtool.upgrade(ir.serde.deserialize_model(proto), opset).model
    report = dqtool.pack(m, **kw)
    out = ir.serde.serialize_model(report.model)
    onnx.checker.check_model(out)
    return out


def _inits(proto: onnx.ModelProto) -> dict[str, bytes]:
    return {t.name: (t.data_type, tuple(t.dims), onnx.numpy_helper.to_array(t).tobytes())
            for t in proto.graph.initializer}


def _node(proto, op):
    return next(n for n in proto.graph.node if n.op_type == op)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize(("bits", "zp", "k", "block"), [
    (4, "packed", 100, 32), (4, "none", 64, 32), (4, "float", 100, 32), (8, "packed", 64, 16),
    (8, "none", 256, 128), (4, "packed", 20, 32), (2, "packed", 96, 32), (2, "none", 64, 32),
    (4, "packed", 33, 32), (2, "packed", 34, 32), (4, "none", 51, 128), (2, "none", 30, 64)])
def test_upgrade_then_pack_restores_the_original_tensors(dtype, bits, zp, k, block):
    rng = np.random.default_rng(bits * 100 + k)
    n = 10
    inputs = nbits_inputs(rng, k, n, bits, block, dtype, zp)
    kb = -(-k // block)
    # onnxruntime's quantizer pads a ragged last block with code 0, past codes it leaves in
    # the byte holding K's last one (K·bits not a multiple of 8), and the unused slots of
    # the last zero-point byte with 2^(bits-1): so do the originals here. (The byte's codes
    # past K came back 0, and a K under one block came back with the smallest block >= K.)
    codes = packing.unpack(inputs["B"].reshape(n, -1), bits)
    codes[:, k:] = 0
    end = -(-k // (8 // bits)) * (8 // bits)
    codes[:, k:end] = rng.integers(1, 1 << bits, size=(n, end - k), dtype=np.uint8)
    inputs["B"] = packing.pack(codes, bits).reshape(n, kb, -1)
    if zp == "packed":
        z = packing.unpack(inputs["zero_points"], bits)[:, :kb]
        inputs["zero_points"] = packing.pack(z, bits, 1 << (bits - 1))
    bias = rng.random(n).astype(dtype)
    original = nbits_model(k, n, bits, block, inputs, dtype=dtype, bias=bias)
    back = _roundtrip(original, 25 if bits == 2 else 21)
    node = _node(back, "MatMulNBits")
    assert [n.op_type for n in back.graph.node] == ["MatMulNBits"]
    attrs = {a.name: a.i for a in node.attribute}
    assert attrs == {"K": k, "N": n, "bits": bits, "block_size": block}
    got = _inits(back)
    want = _inits(original)
    b_name, s_name = node.input[1], node.input[2]
    assert got[b_name] == want["B"]
    assert got[s_name] == want["scales"]  # type, shape (flat for float zero points), bytes
    if zp == "none":
        assert len([i for i in node.input if i]) == 4  # A, B, scales, bias
    else:
        assert got[node.input[3]] == want["zero_points"]
    assert got[node.input[5]] == want["bias"]
    eye = {"A": np.eye(k, dtype=dtype)}
    assert np.array_equal(bits_of(run_ort(original, eye)[0]), bits_of(run_ort(back, eye)[0]))


@pytest.mark.parametrize("opset", [21, 25])
def test_a_2bit_hqq_round_trip_comes_back_at_2_bits(opset):
    """Below opset 25 upgrade widens 2-bit codes to uint8 (int2 / uint2 are opset 25's) and
    notes the width; pack of the float-zero-point chain read the note no more than an
    8-bit weight, and wrote bits=8 with float zero points, which onnxruntime refuses."""
    rng = np.random.default_rng(7)
    k, n, block = 64, 12, 32
    inputs = nbits_inputs(rng, k, n, 2, block, np.float32, "float")
    original = nbits_model(k, n, 2, block, inputs)
    back = _roundtrip(original, opset)
    node = _node(back, "MatMulNBits")
    assert {a.name: a.i for a in node.attribute} == {"K": k, "N": n, "bits": 2,
                                                     "block_size": block}
    got, want = _inits(back), _inits(original)
    assert [got[i] for i in node.input[1:4]] == [want["B"], want["scales"],
                                                 want["zero_points"]]
    eye = {"A": np.eye(k, dtype=np.float32)}
    assert np.array_equal(bits_of(run_ort(original, eye)[0]), bits_of(run_ort(back, eye)[0]))


def test_an_8bit_float_zero_point_chain_is_left_with_the_reason():
    rng = np.random.default_rng(8)
    inputs = nbits_inputs(rng, 64, 12, 8, 32, np.float32, "float")
    up = dqtool.upgrade(ir.serde.deserialize_model(nbits_model(64, 12, 8, 32, inputs)), 21)
    report = dqtool.pack(up.model)
    assert report.packed == []
    assert [s.why for s in report.skipped] == [
        "8-bit codes with float zero points: onnxruntime's CPU kernel rejects such a "
        "MatMulNBits (FU007)"]
    assert not any(n.op_type == "MatMulNBits" for n in report.model.graph)


def test_pack_signed_per_axis_weight_and_options():
    m = model("""
        <ir_version: 10, opset_import: ["" : 21]>
        g (float[2, 20] a) => (float[2, 3] y)
        <int4[20, 3] w = {1,-2,3,-4,5,-6,7,-8,0,1,2,3,4,5,6,7,-1,-2,-3,-4,1,1,1,1,1,1,1,1,1,1,
          2,2,2,2,2,2,2,2,2,2,3,3,3,3,3,3,3,3,3,3,4,4,4,4,4,4,4,4,4,4},
         float[3] s = {0.5, 0.25, 2.0}>
        { wf = DequantizeLinear <axis = 1> (w, s)
          y = MatMul(a, wf) }
    """)
    w_codes = m.graph.initializers["w"].const_value.numpy()
    a = np.random.default_rng(0).random((2, 20)).astype(np.float32)
    (want,) = dqtool.reference_evaluator(m).run(None, {"a": a})
    report = dqtool.pack(m, accuracy_level=0, zero_points="packed")
    proto = ir.serde.serialize_model(report.model)
    node = _node(proto, "MatMulNBits")
    assert {a.name: a.i for a in node.attribute} == {"K": 20, "N": 3, "bits": 4,
                                                     "block_size": 32}
    assert len(node.input) == 4  # zero points written: every one 8 (signed 0 + 8)
    (got,) = run_ort(proto, {"a": a})
    assert np.allclose(got, want, rtol=1e-6)
    w = dqtool.dequantize_matmul_nbits(
        *(onnx.numpy_helper.to_array(next(t for t in proto.graph.initializer if t.name == i))
          for i in node.input[1:4]), K=20, N=3, bits=4, block_size=32)
    assert [t.name for t in proto.graph.initializer if t.name in ("w", "s")] == []
    w_ref = dqtool.dequantize(w_codes, np.array([0.5, 0.25, 2.0], np.float32), axis=1)
    assert np.array_equal(bits_of(w), bits_of(w_ref))


def test_pack_leaves_what_it_cannot_express_with_the_reason():
    m = model("""
        <ir_version: 10, opset_import: ["" : 21]>
        g (float[2, 32] a) => (float[2, 32] y)
        <uint8[32, 32] w = {5}, float[32, 2] s = {1.0}>
        { wf = DequantizeLinear <axis = 1, block_size = 16> (w, s)
          y = MatMul(a, wf) }
    """)
    m.graph.initializers["w"].const_value = ir.tensor(np.full((32, 32), 5, np.uint8), name="w")
    m.graph.initializers["s"].const_value = ir.tensor(np.ones((32, 2), np.float32), name="s")
    _left_with(m, "blocks run along N")


def _left_with(m: ir.Model, why: str) -> None:
    """pack packs nothing of ``m`` and says ``why``."""
    report = dqtool.pack(m)
    assert report.packed == [] and why in report.skipped[0].why, report.skipped


def test_a_dequantize_whose_output_type_is_not_its_scales_is_left():
    # float16 scales, output_dtype float, A float only through a Cast (no value_info):
    # MatMulNBits takes A, scales and Y of one type, and the packed node was one
    # onnxruntime refuses to load ("bound to different types"), written with exit 0.
    m = model("""
        <ir_version: 10, opset_import: ["" : 23]>
        g (float16[1, 32] x) => (float[1, 4] y)
        <uint8[32, 4] w = {5}, float16[4] s = {15360, 15360, 15360, 15360}>
        { a = Cast <to = 1> (x)
          wf = DequantizeLinear <axis = 1, output_dtype = 1> (w, s)
          y = MatMul(a, wf) }
    """)
    m.graph.initializers["w"].const_value = ir.tensor(np.full((32, 4), 5, np.uint8), name="w")
    _left_with(m, "makes float from float16 scales (output_dtype)")


def test_an_empty_weight_is_left():
    # K = 0: pack wrote a MatMulNBits with K 0 that check's kernel could not run.
    m = model("""
        <ir_version: 10, opset_import: ["" : 21]>
        g (float[1, 0] x) => (float[1, 3] y) <float s = {0.1}, int8 z = {1}>
        { wf = DequantizeLinear (w, s, z)
          y = MatMul(x, wf) }
    """)
    m.graph.initializers["w"] = ir.Value(name="w", const_value=ir.tensor(
        np.zeros((0, 3), np.int8), name="w"))
    m.graph.node(0).replace_input_with(0, m.graph.initializers["w"])
    _left_with(m, "the weight is empty (0, 3)")


@pytest.mark.parametrize("kind", ["int4", "uint4"])
def test_gather_round_trip_reuses_the_stored_table(kind):
    rng = np.random.default_rng(3)
    lo, hi = (-8, 8) if kind == "int4" else (0, 16)
    t = ml_dtypes.int4 if kind == "int4" else ml_dtypes.uint4
    table = rng.integers(lo, hi, size=(12, 64)).astype(t)
    zps = rng.integers(lo, hi, size=(12, 2)).astype(t)
    original = gbq_model(table, (rng.random((12, 2)) + 0.1).astype(np.float32), zps)
    back = _roundtrip(original)
    node = _node(back, "GatherBlockQuantized")
    assert {a.name: a.i for a in node.attribute} == {"gather_axis": 0, "quantize_axis": 1,
                                                     "block_size": 32}
    want, got = _inits(original), _inits(back)
    assert got[node.input[0]] == want["data"] and got[node.input[3]] == want["zero_points"]
    idx = {"indices": np.array([1, 11, 0, 5, 5], np.int64)}
    assert np.array_equal(bits_of(run_ort(original, idx)[0]), bits_of(run_ort(back, idx)[0]))


def test_gather_8bit_table_gets_explicit_zero_point():
    rng = np.random.default_rng(4)
    table = rng.integers(0, 256, size=(6, 32), dtype=np.uint8)
    original = gbq_model(table, np.ones((6, 1), np.float32), None, bits=8)
    back = _roundtrip(original)
    node = _node(back, "GatherBlockQuantized")
    assert len(node.input) == 4  # 128, the uint8 default, made explicit by upgrade, kept
    idx = {"indices": np.array([0, 5, 2, 2, 1], np.int64)}
    assert np.array_equal(run_ort(original, idx)[0], run_ort(back, idx)[0])


def test_cli_pack(tmp_path):
    rng = np.random.default_rng(5)
    src = tmp_path / "m.onnx"
    up = tmp_path / "up.onnx"
    onnx.save(nbits_model(64, 5, 4, 32, nbits_inputs(rng, 64, 5, 4, 32)), src)
    runner = CliRunner()
    assert runner.invoke(cli, ["upgrade", str(src), "--opset", "21", "-o", str(up)]).exit_code == 0
    r = runner.invoke(cli, ["pack", str(up), "--accuracy-level", "4"])
    assert r.exit_code == 0, r.output
    assert "1 packed, 0 left" in r.output
    out = onnx.load(tmp_path / "up.packed.onnx")
    node = _node(out, "MatMulNBits")
    assert {a.name: a.i for a in node.attribute}["accuracy_level"] == 4
    r = runner.invoke(cli, ["pack", str(tmp_path / "missing.onnx")])
    assert r.exit_code == 2 and r.output.count("\n") == 1


def test_cli_pack_onto_its_input_names_an_option_pack_has(tmp_path):
    # Writing over the input is refused and names --in-place, which pack has.
    rng = np.random.default_rng(6)
    src = tmp_path / "m.onnx"
    onnx.save(nbits_model(64, 5, 4, 32, nbits_inputs(rng, 64, 5, 4, 32)), src)
    before = src.read_bytes()
    r = CliRunner().invoke(cli, ["pack", str(src), "-o", str(src)])
    assert r.exit_code == 2 and r.output.count("\n") == 1, r.output
    assert "pass --in-place" in r.output and "output is the input" in r.output
    assert src.read_bytes() == before


def test_pack_takes_every_writer_option(tmp_path):
    """pack writes like every other command: --in-place (atomically), --external-data,
    --shard-size; the packed weights are the same bytes each way."""
    import shutil

    from click.testing import CliRunner

    from dqtool.cli import cli

    src = tmp_path / "m.onnx"
    shutil.copy("models/ort_matmulnbits_4bit_sym_b32.onnx", tmp_path / "orig.onnx")
    up = CliRunner().invoke(cli, ["upgrade", str(tmp_path / "orig.onnx"), "--opset", "21",
                                  "-o", str(src)])
    assert up.exit_code == 0, up.output
    ext = tmp_path / "ext.onnx"
    r = CliRunner().invoke(cli, ["pack", str(src), "-o", str(ext), "--external-data"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "ext.onnx.data").is_file()
    r = CliRunner().invoke(cli, ["pack", str(src), "--in-place"])
    assert r.exit_code == 0, r.output
    inline = onnx.load(str(src))
    external = onnx.load(str(ext))
    assert [n.op_type for n in inline.graph.node] == [n.op_type for n in external.graph.node]
    assert "MatMulNBits" in [n.op_type for n in inline.graph.node]
    for a, b in zip(inline.graph.initializer, external.graph.initializer, strict=True):
        assert onnx.numpy_helper.to_array(a).tobytes() == onnx.numpy_helper.to_array(b).tobytes()
    r = CliRunner().invoke(cli, ["pack", str(src), "--in-place", "-o", str(ext)])
    assert r.exit_code == 2


def _nbits_consts(proto: onnx.ModelProto) -> list[tuple]:
    inits = _inits(proto)
    return [(tuple(sorted((a.name, onnx.helper.get_attribute_value(a)) for a in n.attribute)),
             tuple(inits.get(i) for i in n.input[1:4]))
            for n in proto.graph.node if n.op_type == "MatMulNBits"]


def test_codes_widened_by_upgrade_pack_back_at_their_width():
    # opset 21 has no uint2 (25 has): upgrade widens 2-bit codes to uint8, blocked; pack
    # gives back the original width, bytes and all.
    bits = 2
    rng = np.random.default_rng(bits)
    original = nbits_model(128, 16, bits, 32, nbits_inputs(rng, 128, 16, bits, 32), m=3)
    up = dqtool.upgrade(ir.serde.deserialize_model(original), 21).model
    x = next(n for n in up.graph if n.op_type == "DequantizeLinear").inputs[0]
    assert x.dtype == ir.DataType.UINT8
    packed = ir.serde.serialize_model(dqtool.pack(up).model)
    assert _nbits_consts(packed) == _nbits_consts(original)
    # a code that no longer fits the narrow width: 8 bits stay (exact either way)
    up2 = dqtool.upgrade(ir.serde.deserialize_model(original), 21).model
    x2 = next(n for n in up2.graph if n.op_type == "DequantizeLinear").inputs[0]
    codes = x2.const_value.numpy().copy()
    codes[0, 0] = 200
    x2.const_value = ir.tensor(codes, name=x2.name)
    packed2 = ir.serde.serialize_model(dqtool.pack(up2).model)
    [node] = [n for n in packed2.graph.node if n.op_type == "MatMulNBits"]
    assert onnx.helper.get_attribute_value(
        next(a for a in node.attribute if a.name == "bits")) == 8


def test_a_2bit_table_widened_by_upgrade_packs_back_at_its_width():
    # GatherBlockQuantized uint8 bits=2 at opset 21: upgrade widens to uint8; pack gave
    # back bits=8 (4x the bytes). A code that no longer fits 2 bits keeps 8.
    rng = np.random.default_rng(12)
    kb = 4
    scales = (rng.random((6, kb)) + 0.5).astype(np.float32)
    zps = packing.pack(rng.integers(0, 4, size=(6, kb), dtype=np.uint8), 2)
    table = packing.pack(rng.integers(0, 4, size=(6, 64), dtype=np.uint8), 2)
    original = gbq_model(table, scales, zps, block=16, bits=2, n_indices=3, opset=21)
    idx = np.array([5, 0, 3], np.int64)
    (want,) = run_ort(original, {"indices": idx})
    for fits in (True, False):
        up = dqtool.upgrade(ir.serde.deserialize_model(original), 21).model
        x = next(n for n in up.graph if n.op_type == "DequantizeLinear").inputs[0]
        assert x.dtype == ir.DataType.UINT8
        if not fits:
            codes = x.const_value.numpy().copy()
            codes[0, 0] = 200
            x.const_value = ir.tensor(codes, name=x.name)
        packed = ir.serde.serialize_model(dqtool.pack(up).model)
        node = _node(packed, "GatherBlockQuantized")
        assert onnx.helper.get_attribute_value(
            next(a for a in node.attribute if a.name == "bits")) == (2 if fits else 8)
        if fits:
            got = {onnx.numpy_helper.to_array(t).tobytes() for t in packed.graph.initializer}
            assert got == {onnx.numpy_helper.to_array(t).tobytes()
                           for t in original.graph.initializer}
            (y,) = run_ort(packed, {"indices": idx})
            assert np.array_equal(bits_of(y), bits_of(want))


def test_a_table_blocked_along_its_gather_axis_packs_back():
    # MatMulNBitsQuantizer with quant_axes=(("Gather", 0),) writes gather_axis =
    # quantize_axis = 0; onnxruntime runs it, and pack gives it back
    rng = np.random.default_rng(8)
    table = rng.integers(-8, 8, size=(64, 12)).astype(ml_dtypes.int4)
    scales = (rng.random((2, 12)) * 0.1 + 0.01).astype(np.float32)
    original = gbq_model(table, scales, None, quantize_axis=0, gather_axis=0, block=32)
    feeds = {"indices": np.array([0, 63, 31, 32, 5], np.int64)}
    want = run_ort(original, feeds)[0]
    packed = _roundtrip(original)
    [node] = [n for n in packed.graph.node if n.op_type == "GatherBlockQuantized"]
    attrs = {a.name: a.i for a in node.attribute}
    assert attrs["gather_axis"] == 0 and attrs["quantize_axis"] == 0
    assert bits_of(run_ort(packed, feeds)[0]).tolist() == bits_of(want).tolist()


@pytest.mark.parametrize("name", ["ort_matmulnbits_4bit_sym_b32", "ort_matmulnbits_4bit_asym_b128",
                                  "ort_matmulnbits_8bit_b32", "ort_matmulnbits_2bit_b32"])
def test_streamed_upgrade_and_pack_in_many_bands_on_two_writers(name, tmp_path, monkeypatch):
    # onnxruntime's quantizer's models, saved with external data as a large model is: every
    # weight is written band by band (bands of 64 bytes here, so each weight takes many),
    # by two writer threads; the round trip gives back the stored bytes.
    monkeypatch.setattr(packing, "STREAM_BYTES", 64)
    monkeypatch.setenv("DQTOOL_THREADS", "2")
    src = f"models/{name}.onnx"
    opset = "25" if "2bit" in name else "21"
    up, back = tmp_path / "up.onnx", tmp_path / "back.onnx"
    r = CliRunner().invoke(cli, ["upgrade", src, "--opset", opset, "-o", str(up),
                                 "--external-data"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "up.onnx.data").stat().st_size > 0
    r = CliRunner().invoke(cli, ["pack", str(up), "-o", str(back), "--external-data"])
    assert r.exit_code == 0, r.output
    original, packed = onnx.load(src), onnx.load(str(back))
    assert _nbits_consts(packed) == _nbits_consts(original)
    # and the upgraded codes are the stored ones, transposed
    upgraded = onnx.load(str(up))
    inits = {t.name: t for t in upgraded.graph.initializer}
    for node in (n for n in original.graph.node if n.op_type == "MatMulNBits"):
        attrs = {a.name: a.i for a in node.attribute}
        b = onnx.numpy_helper.to_array(
            next(t for t in original.graph.initializer if t.name == node.input[1]))
        want = packing.nbits_to_onnx(b, attrs["K"], attrs["N"], attrs["bits"]).tobytes()
        dq = next(n for n in upgraded.graph.node if n.op_type == "DequantizeLinear"
                  and n.name.startswith(node.name))
        x = inits[dq.input[0]]
        got = onnx.numpy_helper.to_array(x)
        stored = packing.pack(got.reshape(-1).view(np.uint8) & ((1 << attrs["bits"]) - 1),
                              attrs["bits"]).tobytes() if attrs["bits"] < 8 \
            else got.tobytes()
        assert stored == want, node.name


@pytest.mark.parametrize("name", ["ort_matmulnbits_4bit_asym_b128", "ort_matmulnbits_4bit_sym_b32"])
def test_an_external_data_model_is_written_while_it_is_converted(name, tmp_path, monkeypatch):
    # A model with external data whose fused ops hold most of its bytes: upgrade and pack
    # hand each new weight to the data file's writers as they make it (data_writer.EarlyWriter)
    # and the save puts the rest after them. The tensors are those of a save after the
    # conversion (the model converted in memory, then saved), and the round trip gives back
    # the stored bytes.
    from dqtool import storage
    from dqtool.storage import data_writer

    monkeypatch.setattr(packing, "STREAM_BYTES", 64)
    monkeypatch.setenv("DQTOOL_THREADS", "2")
    src = tmp_path / "src.onnx"
    onnx.save(onnx.load(f"models/{name}.onnx"), str(src), save_as_external_data=True,
              location="src.onnx.data", size_threshold=0)
    early: list[str] = []
    submit = data_writer.EarlyWriter.submit

    def spy(self, tensor) -> None:
        early.append(tensor.name)
        submit(self, tensor)

    monkeypatch.setattr(data_writer.EarlyWriter, "submit", spy)
    up, back = tmp_path / "up.onnx", tmp_path / "back.onnx"
    r = CliRunner().invoke(cli, ["upgrade", str(src), "--opset", "21", "-o", str(up)])
    assert r.exit_code == 0, r.output
    n_nodes = sum(n.op_type == "MatMulNBits" for n in onnx.load(str(src)).graph.node)
    assert len([e for e in early if e.endswith("/x")]) == n_nodes, early
    upgraded = onnx.load(str(up))
    # converted, then saved: no early writes
    in_memory = dqtool.upgrade(storage.load(src), 21).model
    storage.save(in_memory, tmp_path / "mem.onnx", external=True)
    want = {t.name: onnx.numpy_helper.to_array(t).tobytes()
            for t in onnx.load(str(tmp_path / "mem.onnx")).graph.initializer}
    assert {t.name: onnx.numpy_helper.to_array(t).tobytes()
            for t in upgraded.graph.initializer} == want
    early.clear()
    r = CliRunner().invoke(cli, ["pack", str(up), "-o", str(back)])
    assert r.exit_code == 0, r.output
    assert early, "pack wrote nothing early"
    assert _nbits_consts(onnx.load(str(back))) == _nbits_consts(onnx.load(str(src)))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["src.onnx", "src.onnx.data", "up.onnx", "up.onnx.data", "back.onnx",
         "back.onnx.data", "mem.onnx", "mem.onnx.data"])


def test_a_conversion_that_fails_after_writing_early_leaves_nothing(tmp_path, monkeypatch):
    # The conversion made (and began writing) every new weight, then failed: the writers
    # stop, the temporary folder goes, the output is not written.
    import threading

    from dqtool.convert import pipeline

    src = tmp_path / "src.onnx"
    onnx.save(onnx.load("models/ort_matmulnbits_4bit_sym_b32.onnx"), str(src),
              save_as_external_data=True, location="src.onnx.data", size_threshold=0)
    run = pipeline.run

    def fails(*args, **kwargs):
        run(*args, **kwargs)
        raise RuntimeError("interrupted (test)")


    started = []
    from dqtool.storage import driver

    start = driver.start_early_writer
    monkeypatch.setattr(driver, "start_early_writer", lambda *a: started.append(start(*a))
                        or started[-1])
    monkeypatch.setattr(pipeline, "run", fails)
    with pytest.raises(RuntimeError, match="interrupted"):
        dqtool.upgrade(src, 21, tmp_path / "up.onnx")
    assert len(started) == 1 and started[0].placed  # weights were being written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src.onnx", "src.onnx.data"]
    assert not [t for t in threading.enumerate() if t.name.startswith("dqtool-external")]


def test_pack_of_a_model_object_writes_the_output_it_is_given(tmp_path):
    # dqtool.pack(model, OUT) packed the model and wrote nothing, saying nothing.
    rng = np.random.default_rng(21)
    original = nbits_model(64, 8, 4, 32, nbits_inputs(rng, 64, 8, 4, 32))
    up = dqtool.upgrade(ir.serde.deserialize_model(original), 21).model
    out = tmp_path / "p.onnx"
    report = dqtool.pack(up, out)
    assert report.written == [str(out)]
    written = onnx.load(out)
    assert [n.op_type for n in written.graph.node] == ["MatMulNBits"]
    assert _nbits_consts(written) == _nbits_consts(original)


def test_every_weight_pack_leaves_is_listed_with_why():
    # upgrade's per-axis rows below opset 21, a table under --no-gather, a weight a MatMul
    # and another node read: each was left with "skipped: []" and "0 left". (A weight two
    # MatMuls share is packed: test_a_weight_two_matmulnbits_share_stays_one.)
    rng = np.random.default_rng(22)
    original = nbits_model(64, 8, 4, 32, nbits_inputs(rng, 64, 8, 4, 32), opset=13)
    low = dqtool.upgrade(ir.serde.deserialize_model(original), 13).model
    report = dqtool.pack(low)
    assert report.packed == [] and len(report.skipped) == 1
    assert "feeds Reshape" in report.skipped[0].why and "--opset 21" in report.skipped[0].why

    table = rng.integers(-8, 8, size=(6, 32)).astype(ml_dtypes.int4)
    gbq = gbq_model(table, (rng.random((6, 1)) + 0.5).astype(np.float32), None, opset=21)
    up = dqtool.upgrade(ir.serde.deserialize_model(gbq), 21).model
    report = dqtool.pack(up, gather=False)
    assert report.packed == [] and [s.why for s in report.skipped] == ["--no-gather"]

    original = nbits_model(64, 8, 4, 32, nbits_inputs(rng, 64, 8, 4, 32))
    up = dqtool.upgrade(ir.serde.deserialize_model(original), 21).model
    dq = next(n for n in up.graph if n.op_type == "DequantizeLinear")
    second = ir.node("Relu", [dq.outputs[0]], name="second")
    up.graph.append(second)
    second.outputs[0].name, second.outputs[0].dtype = "Y2", ir.DataType.FLOAT
    up.graph.outputs.append(second.outputs[0])
    report = dqtool.pack(up)
    assert report.packed == [] and "2 uses" in report.skipped[0].why


@pytest.mark.parametrize(("given", "want"), [(None, 4), (0, None), (1, 1)])
def test_upgrade_then_pack_keeps_accuracy_level_unless_told(tmp_path, given, want):
    # upgrade → pack dropped accuracy_level=4, changing onnxruntime's outputs; check took
    # the difference for onnxruntime's own rounding.
    rng = np.random.default_rng(23)
    original = nbits_model(64, 8, 4, 32, nbits_inputs(rng, 64, 8, 4, 32), accuracy_level=4)
    src, up = tmp_path / "m.onnx", tmp_path / "u.onnx"
    onnx.save(original, src)
    dqtool.upgrade(src, 21, up)  # through a file: the note is saved with the model
    out = tmp_path / "p.onnx"
    dqtool.pack(up, out, accuracy_level=given)
    node = _node(onnx.load(out), "MatMulNBits")
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert attrs.get("accuracy_level") == want


def test_pack_of_an_onnx_ir_model_that_used_external_data_writes_external_data(tmp_path):
    # It wrote the output inline: its new tensors no longer said where the model came from.
    rng = np.random.default_rng(24)
    original = nbits_model(256, 64, 4, 32, nbits_inputs(rng, 256, 64, 4, 32))
    up = dqtool.upgrade(ir.serde.deserialize_model(original), 21).model
    src = tmp_path / "u.onnx"
    ir.save(up, src, external_data="u.onnx.data")
    out = tmp_path / "o" / "p.onnx"
    out.parent.mkdir()
    report = dqtool.pack(ir.load(src), out)
    assert sorted(p.name for p in out.parent.iterdir()) == ["p.onnx", "p.onnx.data"]
    assert report.written[-1] == str(out)


def test_pack_gives_back_the_original_names_where_they_are_free():
    rng = np.random.default_rng(9)
    original = nbits_model(64, 12, 4, 32, nbits_inputs(rng, 64, 12, 4, 32))
    up = dqtool.upgrade(ir.serde.deserialize_model(original), 21).model
    assert "B" not in up.graph.initializers  # upgrade's own names for its constants
    back = ir.serde.serialize_model(dqtool.pack(up).model)
    node = _node(back, "MatMulNBits")
    assert (node.name, list(node.input)) == ("mm", ["A", "B", "scales", "zero_points"])
    # a name something else has now is left alone: the input A renamed "B"
    up = dqtool.upgrade(ir.serde.deserialize_model(original), 21).model
    up.graph.inputs[0].name = "B"
    back = ir.serde.serialize_model(dqtool.pack(up).model)
    node = _node(back, "MatMulNBits")
    assert node.input[0] == "B" and node.input[1] != "B"
    assert node.input[2:] == ["scales", "zero_points"]
    onnx.checker.check_model(back)


def test_pack_gives_back_the_names_of_tables_it_takes_as_stored_and_of_unnamed_nodes():
    """A uint8-packed GatherBlockQuantized table is renamed by upgrade (a new view of the
    same bytes) and taken as stored by pack: its name comes back too; and a MatMulNBits
    without a name comes back without one."""
    rng = np.random.default_rng(10)
    table = rng.integers(0, 256, (16, 32), dtype=np.uint8)  # 16 rows of 64 4-bit codes
    scales = (rng.random((16, 2)) + .1).astype(np.float32)
    zps = rng.integers(0, 256, (16, 1), dtype=np.uint8)
    original = gbq_model(table, scales, zps, block=32)
    back = _roundtrip(original)
    node = _node(back, "GatherBlockQuantized")
    assert (node.name, list(node.input)) == ("gbq", ["data", "indices", "scales",
                                                     "zero_points"])
    assert _inits(back) == _inits(original)
    # without zero points: the default (8) upgrade made explicit is left out again
    original = gbq_model(table, scales, None, block=32)
    back = _roundtrip(original)
    assert _inits(back) == _inits(original)
    assert list(_node(back, "GatherBlockQuantized").input) == ["data", "indices", "scales"]
    ids = {"indices": np.array([0, 3, 15, 7, 3], np.int64)}
    assert np.array_equal(run_ort(back, ids)[0], run_ort(original, ids)[0])
    inputs = nbits_inputs(rng, 64, 12, 4, 32)
    original = nbits_model(64, 12, 4, 32, inputs)
    original.graph.node[0].name = ""
    back = _roundtrip(original)
    assert [n.name for n in back.graph.node] == [""]


def _shared_weight_model(accuracy: tuple[int, int] = (0, 0), zp: str = "packed",
                         n: int = 40, seed: int = 21) -> onnx.ModelProto:
    """Two MatMulNBits taking the same B, scales and zero points (one weight, two uses)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    w = nbits_inputs(rng, 64, n, 4, 32, zp=zp)  # (whole blocks: no padding codes to keep)
    nodes = [helper.make_node("MatMulNBits", [a, "W", "W_scales", "W_zp"], [y], name=name,
                              domain="com.microsoft", K=64, N=n, bits=4, block_size=32,
                              **({"accuracy_level": acc} if acc else {}))
             for (a, y, name), acc in zip((("x", "p", "mmA"), ("z", "q", "mmB")), accuracy,
                                          strict=True)]
    nodes.append(helper.make_node("Add", ["p", "q"], ["y"], name="add"))
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(v, TensorProto.FLOAT, [64, 64])
                     for v in ("x", "z")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, n])],
        [numpy_helper.from_array(w["B"], "W"), numpy_helper.from_array(w["scales"], "W_scales"),
         numpy_helper.from_array(w["zero_points"], "W_zp")])
    return helper.make_model(graph, ir_version=10, opset_imports=[
        helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])


@pytest.mark.parametrize("how", ["upgrade 21", "downgrade 13", "fold"])
def test_a_weight_two_matmulnbits_share_stays_one(how):
    """upgrade wrote the codes twice (and fold two float weights), pack then gave back the
    original weight and a second copy under another name: now one DequantizeLinear feeds
    both MatMuls, and pack gives back the original model, names and all."""
    original = _shared_weight_model()
    m = ir.serde.deserialize_model(original)
    if how == "fold":
        out = dqtool.fold(m).model
    else:
        verb, opset = how.split()
        out = getattr(dqtool, verb)(m, int(opset)).model
    proto = ir.serde.serialize_model(out)
    onnx.checker.check_model(proto, full_check=True)
    ops = [n.op_type for n in proto.graph.node]
    assert ops.count("MatMul") == 2 and ops.count("DequantizeLinear") == (0 if how == "fold"
                                                                         else 1)
    weights = [t for t in proto.graph.initializer if len(t.dims) == 2 and t.dims[0] * t.dims[1]
               >= 64 * 40]
    assert len(weights) == 1, [t.name for t in weights]
    eye = {"x": np.eye(64, dtype=np.float32), "z": np.eye(64, dtype=np.float32)}
    assert np.array_equal(bits_of(run_ort(original, eye)[0]), bits_of(run_ort(proto, eye)[0]))
    if how == "upgrade 21":
        back = ir.serde.serialize_model(dqtool.pack(out).model)
        assert [(n.name, n.op_type, list(n.input)) for n in back.graph.node] == \
            [(n.name, n.op_type, list(n.input)) for n in original.graph.node]
        assert _inits(back) == _inits(original)


def test_nodes_that_share_a_weight_but_not_the_accuracy_level_keep_their_own():
    """The level is noted on the DequantizeLinear: one of them cannot note two."""
    original = _shared_weight_model((0, 4))
    out = dqtool.upgrade(ir.serde.deserialize_model(original), 21).model
    assert [n.op_type for n in out.graph].count("DequantizeLinear") == 2
    back = ir.serde.serialize_model(dqtool.pack(out).model)
    levels = [{a.name: a.i for a in n.attribute}.get("accuracy_level", 0)
              for n in back.graph.node if n.op_type == "MatMulNBits"]
    assert levels == [0, 4]


def test_a_weight_in_an_outer_scope_stays_there():
    """A MatMulNBits inside an If branch whose B and scales are the main graph's (outer
    scope): upgrade made its new constants in the branch, and pack left them there, so the
    round trip moved the weight into the subgraph. Both now keep the scope the weight was
    stored in."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(41)
    w = nbits_inputs(rng, 64, 16, 4, 32, zp="none")
    branch = helper.make_graph(
        [helper.make_node("MatMulNBits", ["A", "W", "W_scales"], ["y_then"], name="mm",
                          domain="com.microsoft", K=64, N=16, bits=4, block_size=32)],
        "then", [], [helper.make_tensor_value_info("y_then", TensorProto.FLOAT, None)])
    other = helper.make_graph(
        [helper.make_node("Identity", ["zeros"], ["y_else"])], "else", [],
        [helper.make_tensor_value_info("y_else", TensorProto.FLOAT, None)])
    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], name="if", then_branch=branch,
                          else_branch=other)], "g",
        [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
         helper.make_tensor_value_info("A", TensorProto.FLOAT, [64, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 16])],
        [numpy_helper.from_array(w["B"], "W"), numpy_helper.from_array(w["scales"], "W_scales"),
         numpy_helper.from_array(np.zeros((64, 16), np.float32), "zeros")])
    original = helper.make_model(graph, ir_version=10, opset_imports=[
        helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    up = dqtool.upgrade(ir.serde.deserialize_model(original), 21).model
    proto = ir.serde.serialize_model(up)
    onnx.checker.check_model(proto, full_check=True)
    then = proto.graph.node[0].attribute[0].g
    assert [t.name for t in then.initializer] == []
    assert {"mm/x", "mm/scale"} <= {t.name for t in proto.graph.initializer}
    feeds = {"c": np.array(True), "A": np.eye(64, dtype=np.float32)}
    assert np.array_equal(bits_of(run_ort(original, feeds)[0]), bits_of(run_ort(proto, feeds)[0]))
    back = ir.serde.serialize_model(dqtool.pack(up).model)
    assert [t.name for t in back.graph.node[0].attribute[0].g.initializer] == []
    assert _inits(back) == _inits(original)


def test_a_shared_weight_is_packed_for_all_its_matmuls_or_none():
    """pack gave the first MatMul's packed constants to every MatMul of a shared weight:
    one inside an If branch made them in its branch, and the main graph's MatMul read a
    value out of its scope (onnxruntime refused the model, written with exit 0); and a part
    packed stored the weight twice. Now the weight stays, with the reason, unless every
    MatMul is in its graph and takes it."""
    original = _shared_weight_model()
    cases = {}
    # (a) one MatMul's A is 1-D
    m = dqtool.upgrade(ir.serde.deserialize_model(original), 21).model
    mm = next(n for n in m.graph if n.op_type == "MatMul" and n.inputs[0].name == "z")
    mm.inputs[0].shape = ir.Shape([64])
    cases["1-D"] = m
    # (b) one MatMul inside an If branch, reading the main graph's weight
    proto = ir.serde.serialize_model(dqtool.upgrade(ir.serde.deserialize_model(original),
                                                    21).model)
    nodes = list(proto.graph.node)
    mm = next(n for n in nodes if n.op_type == "MatMul" and n.input[0] == "z")
    nodes.remove(mm)
    then = onnx.helper.make_graph([mm], "then", [], [onnx.helper.make_tensor_value_info(
        mm.output[0], onnx.TensorProto.FLOAT, None)])
    other = onnx.helper.make_graph([onnx.helper.make_node("Identity", ["x"], ["e"])], "else",
                                   [], [onnx.helper.make_tensor_value_info(
                                       "e", onnx.TensorProto.FLOAT, None)])
    proto.graph.input.append(onnx.helper.make_tensor_value_info("c", onnx.TensorProto.BOOL,
                                                                []))
    nodes.insert(len(nodes) - 1, onnx.helper.make_node(
        "If", ["c"], [mm.output[0]], name="if", then_branch=then, else_branch=other))
    del proto.graph.node[:]
    proto.graph.node.extend(nodes)
    cases["another graph"] = ir.serde.deserialize_model(proto)
    for why, case in cases.items():
        report = dqtool.pack(case)
        assert report.packed == [] and len(report.skipped) == 1, why
        assert "all of them or none" in report.skipped[0].why, report.skipped[0].why
        out = ir.serde.serialize_model(report.model)
        onnx.checker.check_model(out, full_check=True)
        assert [n.op_type for n in out.graph.node].count("DequantizeLinear") == 1


def test_hqq_nodes_sharing_a_weight_each_come_back():
    """Float zero points (HQQ's chain, which pack takes whole up to its last Reshape) are
    not shared by upgrade: a shared chain ended in two MatMuls and pack left it."""
    original = _shared_weight_model(zp="float", n=16, seed=43)
    back = _roundtrip(original)
    assert [n.op_type for n in back.graph.node] == ["MatMulNBits", "MatMulNBits", "Add"]
    eye = {"x": np.eye(64, dtype=np.float32), "z": np.eye(64, dtype=np.float32)}
    assert np.array_equal(bits_of(run_ort(original, eye)[0]), bits_of(run_ort(back, eye)[0]))


def test_a_block_size_note_that_is_not_a_number_is_ignored():
    rng = np.random.default_rng(44)
    original = nbits_model(51, 8, 4, 128, nbits_inputs(rng, 51, 8, 4, 128))
    up = dqtool.upgrade(ir.serde.deserialize_model(original), 21).model
    dq = next(n for n in up.graph if n.op_type == "DequantizeLinear")
    assert dq.metadata_props["dqtool.fused.block_size"] == "128"
    dq.metadata_props["dqtool.fused.block_size"] = "\u00b2"  # isdigit(), and int() raised
    back = ir.serde.serialize_model(dqtool.pack(up).model)
    node = _node(back, "MatMulNBits")
    assert {a.name: a.i for a in node.attribute}["block_size"] == 64  # smallest >= K


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize(("k", "n", "block"), [(96, 130, 32), (64, 133, 64), (256, 133, 64),
                                                (1024, 136, 32)])
def test_scales_written_to_a_data_file_are_the_stored_ones(dtype, k, n, block, tmp_path,
                                                           monkeypatch):
    # pack writes the scales ((k_blocks, N) in the DequantizeLinear) transposed band by
    # band into the data file (in C for whole 8-byte words of a row where k_blocks fills
    # whole squares, 4 rows of 2-byte or 2 of 4-byte elements; the rest in NumPy): each
    # comes back as stored, for 4-, 2- and 2-byte elements, k_blocks 3 and 1 (NumPy
    # alone; 1: one block spanning K, a per-axis DequantizeLinear), 4 (C, and a column
    # past the last word) and 32 (whole AVX-512 tiles of 2-byte elements).
    rng = np.random.default_rng(k + n)
    original = nbits_model(k, n, 4, block, nbits_inputs(rng, k, n, 4, block, dtype, "none"),
                           dtype=dtype)
    src, up, back = (str(tmp_path / f) for f in ("src.onnx", "up.onnx", "back.onnx"))
    onnx.save(original, src)
    dqtool.upgrade(src, 21, up, external_data=True)
    streamed = []
    write = packing.write_transposed
    monkeypatch.setattr(packing, "write_transposed",
                        lambda a, f: streamed.append(a.shape) or write(a, f))
    dqtool.pack(up, back, external_data=True)
    assert streamed == [(-(-k // block), n)]
    packed = onnx.load(back)
    assert (tmp_path / "back.onnx.data").stat().st_size > 0
    node = _node(packed, "MatMulNBits")
    got, want = _inits(packed), _inits(original)
    assert got[node.input[2]] == want["scales"]
    assert got[node.input[1]] == want["B"]


@pytest.mark.parametrize("zp", ["packed", "none"])
def test_pack_gives_back_the_names_inside_a_function(zp):
    # a MatMulNBits in a model-local function reads Constant nodes: upgrade notes their
    # names (the values' and the nodes'), and pack gives back both, as in a graph
    rng = np.random.default_rng(11)
    original = in_function(nbits_model(64, 16, 4, 32, nbits_inputs(rng, 64, 16, 4, 32,
                                                                    zp=zp), m=2))
    back = _roundtrip(original)

    def body(proto):
        return [(n.name, n.op_type, list(n.input), list(n.output))
                for n in proto.functions[0].node]

    def consts(proto):
        return {n.output[0]: onnx.numpy_helper.to_array(n.attribute[0].t).tobytes()
                for n in proto.functions[0].node if n.op_type == "Constant"}

    assert body(back) == body(original)
    assert consts(back) == consts(original)


def test_pack_gives_back_the_names_in_two_functions_with_the_same_local_names():
    """Each function is a namespace of its own: the second one's B and scales get their
    names back too (they came back as `…/matmul/B`: the first function had the names)."""
    rng = np.random.default_rng(12)
    one = in_function(nbits_model(64, 16, 4, 32, nbits_inputs(rng, 64, 16, 4, 32), m=2))
    two = onnx.FunctionProto()
    two.CopyFrom(one.functions[0])
    two.name = "QLinear2"
    for t in (n.attribute[0].t for n in two.node if n.op_type == "Constant"):
        t.raw_data = bytes(b ^ 0x11 for b in t.raw_data)  # other weights, the same names
    one.functions.append(two)
    call = onnx.helper.make_node("QLinear2", ["A"], ["q2"], domain="local")
    one.graph.node.insert(1, call)
    add = onnx.helper.make_node("Add", ["Z", "q2"], ["Z2"])
    one.graph.node.append(add)
    one.graph.output[0].name = "Z2"
    back = _roundtrip(one)

    def body(fn):
        return [(n.name, n.op_type, list(n.input), list(n.output)) for n in fn.node]

    def consts(fn):
        return {n.output[0]: onnx.numpy_helper.to_array(n.attribute[0].t).tobytes()
                for n in fn.node if n.op_type == "Constant"}

    for i in range(2):
        assert body(back.functions[i]) == body(one.functions[i])
        assert consts(back.functions[i]) == consts(one.functions[i])


def _tied(bytes_of_b: np.ndarray | None = None) -> onnx.ModelProto:
    """A tied embedding as scripts make it from an 8-bit lm_head: the Gather reads the
    MatMulNBits' own B (N, k_blocks, block) and scales, a blocked DequantizeLinear of the
    gathered rows feeds the MatMulNBits."""
    rng = np.random.default_rng(5)
    n, k, block = 64, 32, 16
    kb = k // block
    b = rng.integers(0, 256, (n, kb, block), dtype=np.uint8)
    s = (rng.random((n, kb)) * 0.1 + 0.01).astype(np.float32)
    z = np.full((n, kb), 128, np.uint8)
    h = onnx.helper
    nodes = [
        h.make_node("Gather", ["B", "ids"], ["gq"], name="embed_codes", axis=0),
        h.make_node("Reshape", ["gq", "rows"], ["gr"], name="embed_rows"),
        h.make_node("Gather", ["S", "ids"], ["gs"], name="embed_scales", axis=0),
        h.make_node("Gather", ["Z", "ids"], ["gz"], name="embed_zero_points", axis=0),
        h.make_node("DequantizeLinear", ["gr", "gs", "gz"], ["emb"], name="embed", axis=-1,
                    block_size=block),
        h.make_node("MatMulNBits", ["emb", "B", "S"], ["logits"], name="lm_head",
                    domain="com.microsoft", K=k, N=n, bits=8, block_size=block)]
    inits = [onnx.numpy_helper.from_array(b, "B"), onnx.numpy_helper.from_array(s, "S"),
             onnx.numpy_helper.from_array(z, "Z"),
             onnx.numpy_helper.from_array(np.array([5, k], np.int64), "rows")]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("ids", onnx.TensorProto.INT64,
                                                               [5])],
                         [h.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, [5, n])],
                         inits)
    return h.make_model(graph, ir_version=10, opset_imports=[
        h.make_opsetid("", 21), h.make_opsetid("com.microsoft", 1)])


def test_pack_gives_a_tied_weight_back_to_both_readers():
    # upgrade leaves B and S to the Gathers and makes the (K, N) codes for the MatMul; pack
    # makes B and S again, the same bytes: the MatMulNBits reads the stored ones, as it did.
    original = _tied()
    back = _roundtrip(original)
    assert _inits(back) == _inits(original)
    mm = _node(back, "MatMulNBits")
    assert list(mm.input) == ["emb", "B", "S"]
    feeds = {"ids": np.array([0, 5, 63, 7, 7])}
    assert np.array_equal(run_ort(back, feeds)[0], run_ort(original, feeds)[0])


def test_pack_keeps_its_own_weight_where_the_stored_one_differs():
    # The Gathers' B changed after the upgrade: not the MatMul's weight any more, so the
    # packed node gets its own B (S is still the same bytes, and shared).
    up = ir.serde.serialize_model(dqtool.upgrade(ir.serde.deserialize_model(_tied()),
                                                 21).model)
    b = next(t for t in up.graph.initializer if t.name == "B")
    changed = onnx.numpy_helper.to_array(b) ^ np.uint8(1)
    b.CopyFrom(onnx.numpy_helper.from_array(changed, "B"))
    back = ir.serde.serialize_model(dqtool.pack(ir.serde.deserialize_model(up)).model)
    onnx.checker.check_model(back)
    mm = _node(back, "MatMulNBits")
    assert mm.input[1] != "B" and mm.input[2] == "S"
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in back.graph.initializer}
    assert np.array_equal(inits[mm.input[1]],
                          onnx.numpy_helper.to_array(_tied().graph.initializer[0]))
    assert np.array_equal(inits["B"], changed)


def _branches_model() -> onnx.ModelProto:
    """An If whose two branches each hold a MatMulNBits of the main graph's one weight (as
    a merged decoder's past/no-past branches do)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(9)
    w = nbits_inputs(rng, 64, 40, 4, 32)

    def branch(name: str) -> onnx.GraphProto:
        node = helper.make_node("MatMulNBits", ["x", "W", "W_scales", "W_zp"], [f"y_{name}"],
                                name=f"mm_{name}", domain="com.microsoft", K=64, N=40,
                                bits=4, block_size=32)
        return helper.make_graph([node], name, [], [
            helper.make_tensor_value_info(f"y_{name}", TensorProto.FLOAT, [64, 40])])

    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], name="if", then_branch=branch("then"),
                          else_branch=branch("else"))], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64]),
         helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 40])],
        [numpy_helper.from_array(w["B"], "W"), numpy_helper.from_array(w["scales"], "W_scales"),
         numpy_helper.from_array(w["zero_points"], "W_zp")])
    return helper.make_model(graph, ir_version=10, opset_imports=[
        helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])


def test_a_weight_both_branches_of_an_if_read_is_stored_once():
    """upgrade stored the codes, scales and zero points once per branch: now the second
    branch's DequantizeLinear reads the first's constants (in the main graph, where both
    see them), and pack gives back the one original weight."""
    original = _branches_model()
    up = dqtool.upgrade(ir.serde.deserialize_model(original), 21)
    proto = ir.serde.serialize_model(up.model)
    onnx.checker.check_model(proto, full_check=True)
    assert len(proto.graph.initializer) == 3  # x, scale and zero point of one weight
    branches = [a.g for a in proto.graph.node[0].attribute]
    dq_inputs = [list(n.input) for g in branches for n in g.node
                 if n.op_type == "DequantizeLinear"]
    assert len(dq_inputs) == 2 and dq_inputs[0] == dq_inputs[1]
    assert any("stored once" in c.how for c in up.changes)
    for c in (True, False):  # an identity A: each output is one weight, bit for bit
        feeds = {"x": np.eye(64, dtype=np.float32), "c": np.array(c)}
        assert np.array_equal(bits_of(run_ort(proto, feeds)[0]),
                              bits_of(run_ort(original, feeds)[0]))
    back = ir.serde.serialize_model(dqtool.pack(up.model).model)
    assert _inits(back) == _inits(original)
    for g in (a.g for a in back.graph.node[0].attribute):
        assert [(n.op_type, list(n.input)) for n in g.node] == \
            [("MatMulNBits", ["x", "W", "W_scales", "W_zp"])]


@pytest.mark.parametrize("form", ["fused", "upgraded"])
def test_a_weight_both_branches_of_an_if_read_folds_once(form):
    """fold made one float weight per branch (inside each): the same constants folded the
    same way are one weight now, in the main graph, which both branches read."""
    original = _branches_model()
    m = ir.serde.deserialize_model(original)
    if form == "upgraded":
        m = dqtool.upgrade(m, 21).model
    report = dqtool.fold(m)
    assert len(report.folded) == 2
    proto = ir.serde.serialize_model(report.model)
    onnx.checker.check_model(proto, full_check=True)
    weights = [t for t in proto.graph.initializer if tuple(t.dims) == (64, 40)]
    assert len(weights) == 1 and weights[0].data_type == onnx.TensorProto.FLOAT
    branches = [a.g for a in proto.graph.node[0].attribute]
    assert all(len(g.initializer) == 0 for g in branches)
    for c in (True, False):  # an identity A: each output is one weight, bit for bit
        feeds = {"x": np.eye(64, dtype=np.float32), "c": np.array(c)}
        assert np.array_equal(bits_of(run_ort(proto, feeds)[0]),
                              bits_of(run_ort(original, feeds)[0]))
