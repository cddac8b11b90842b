"""Streaming inline save and lean inline load: the bytes written are exactly protobuf's
serialization of the same model; a loaded model's large tensors stay in its file.
DQTOOL_SLOW=1 runs many more random graphs."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto as TP
from onnx import helper as h

from dqtool import storage
from dqtool.errors import InputError
from dqtool.storage import inline_read, inline_write

MODELS = Path(__file__).resolve().parent.parent / "models"
ALL_MODELS = sorted(MODELS.glob("*.onnx")) + sorted(MODELS.glob("*/*.onnx"))
EXAMPLES = 300 if os.environ.get("DQTOOL_SLOW") else 25


@pytest.fixture
def stream_everything(monkeypatch):
    """Every tensor streamed and every raw payload left in the file, however small."""
    monkeypatch.setattr(inline_write, "STREAM_MIN_BYTES", 1)
    monkeypatch.setattr(inline_read, "MIN_FILE_BYTES", 0)
    monkeypatch.setattr(inline_read, "MIN_TENSOR_BYTES", 1)


def _reference(model: ir.Model) -> bytes:
    """What protobuf's serializer writes for the model, every tensor's bytes inline (an
    inline save holds external tensors' bytes, not references)."""
    external = [(v, v.const_value) for g in model.graphs() for v in g.initializers.values()
                if isinstance(v.const_value, ir.ExternalTensor)]
    try:
        for v, t in external:
            v.const_value = ir.Tensor(t.numpy(), dtype=t.dtype, name=v.name,
                                      doc_string=t.doc_string,
                                      metadata_props=dict(t.metadata_props))
        return ir.to_proto(model).SerializeToString()
    finally:
        for v, t in external:
            v.const_value = t


def _streamed(model: ir.Model, tmp_path: Path) -> bytes:
    out = tmp_path / "streamed.onnx"
    inline_write.write(model, out)
    return out.read_bytes()


def _mapped(model: ir.Model) -> int:
    return sum(isinstance(v.const_value, inline_read.MappedTensor)
               for v in model.graph.initializers.values())


@pytest.mark.parametrize("path", ALL_MODELS, ids=lambda p: p.name)
def test_every_model_streams_to_protobufs_bytes(path, tmp_path, stream_everything):
    model = storage.load(path)
    if path.parent.name != "external_data":  # inline: every raw payload left in the file
        assert _mapped(model) == sum(
            1 for t in onnx.load(path).graph.initializer if t.HasField("raw_data"))
    assert _streamed(model, tmp_path) == _reference(model)
    # its tensors in memory (typed fields become raw data): protobuf's bytes again
    _to_memory(model)
    assert _streamed(model, tmp_path) == _reference(model)


def _to_memory(model: ir.Model) -> None:
    for g in model.graphs():
        for v in g.initializers.values():
            t = v.const_value
            if t is not None and t.dtype != ir.DataType.STRING:
                v.const_value = ir.Tensor(t.numpy(), dtype=t.dtype, name=v.name,
                                          doc_string=t.doc_string,
                                          metadata_props=dict(t.metadata_props))


def test_lean_load_leaves_payloads_in_the_file(tmp_path, stream_everything):
    src = MODELS / "ort_qdq_per_channel.onnx"
    lean = storage.load(src)
    whole = onnx.load(src)
    raw = [t for t in whole.graph.initializer if t.HasField("raw_data")]
    assert _mapped(lean) == len(raw) > 0
    for t in whole.graph.initializer:
        got = lean.graph.initializers[t.name].const_value
        assert isinstance(got, inline_read.MappedTensor) == t.HasField("raw_data")
        np.testing.assert_array_equal(got.numpy(), onnx.numpy_helper.to_array(t))
        if t.HasField("raw_data"):
            assert got.tobytes() == t.raw_data
            data = src.read_bytes()
            assert data[got.offset:got.offset + got.length] == t.raw_data
    assert _streamed(lean, tmp_path) == _reference(lean)


def test_lean_load_is_skipped_for_small_files():
    model = storage.load(MODELS / "ort_qdq_per_channel.onnx")
    assert _mapped(model) == 0


def test_payload_not_matching_its_dims_is_refused(tmp_path, stream_everything):
    q = TP(name="q", data_type=TP.INT8, dims=[4, 4], raw_data=b"\x01" * 12)  # 16 needed
    node = h.make_node("DequantizeLinear", ["q", "s"], ["y"])
    s = h.make_tensor("s", TP.FLOAT, [], [0.5])
    g = h.make_graph([node], "g", [], [h.make_tensor_value_info("y", TP.FLOAT, [4, 4])],
                     initializer=[q, s])
    path = tmp_path / "bad.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 13)]), path)
    try:
        model = storage.load(path)
    except InputError:
        return  # refused where it is read
    # loaded the ordinary way: the tensor is not mapped to the file
    assert _mapped(model) == 0


def test_truncated_file_gets_the_ordinary_error(tmp_path, stream_everything):
    data = (MODELS / "ort_qdq_per_channel.onnx").read_bytes()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match=r"cut\.onnx"):
        storage.load(path)


def test_in_place_save_of_a_mapped_model(tmp_path, stream_everything):
    path = tmp_path / "m.onnx"
    path.write_bytes((MODELS / "ort_qdq_per_channel.onnx").read_bytes())
    model = storage.load(path)
    assert _mapped(model)
    expected = _reference(model)
    storage.save(model, path)  # reads the old file while the new one is written
    assert path.read_bytes() == expected
    assert not [p for p in tmp_path.iterdir() if p.name != "m.onnx"]


# Random graphs: every tensor type, raw and typed fields, subgraphs and functions.
BITS = {TP.UINT4: 4, TP.INT4: 4, TP.FLOAT4E2M1: 4, TP.UINT2: 2, TP.INT2: 2,
        TP.FLOAT6E2M3: 6, TP.FLOAT6E3M2: 6}
RAW_ONLY = {TP.FLOAT8E8M0, *BITS}  # no typed field written by onnx's helper here
ALL_TYPES = [v for _, v in TP.DataType.items() if v != TP.UNDEFINED]


def _random_tensor(draw, name: str) -> onnx.TensorProto:
    dtype = draw(st.sampled_from(ALL_TYPES))
    dims = draw(st.lists(st.integers(0, 5), max_size=3))
    n = int(np.prod(dims, dtype=np.int64))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    if dtype == TP.STRING:
        t = h.make_tensor(name, dtype, dims, [b"s%d" % i for i in range(n)])
    elif draw(st.booleans()) or dtype in RAW_ONLY:  # raw_data
        if dtype in BITS:  # packed by onnx (padding bits zero)
            codes = rng.integers(0, 2 ** BITS[dtype], n).astype(np.uint8)
            t = h.make_tensor(name, dtype, dims, codes, raw=True)
        else:
            raw = rng.integers(0, 256, n * h.tensor_dtype_to_np_dtype(dtype).itemsize,
                               dtype=np.uint8)
            if dtype == TP.BOOL:
                raw &= 1
            t = TP(name=name, data_type=dtype, dims=dims, raw_data=raw.tobytes())
    else:  # a typed field (float_data, int32_data, int64_data, ...)
        np_type = h.tensor_dtype_to_np_dtype(dtype)
        if np.issubdtype(np_type, np.complexfloating):
            vals = (rng.random(n) + 1j * rng.random(n)).astype(np_type)
        elif np.issubdtype(np_type, np.integer) or np_type == np.bool_:
            vals = rng.integers(0, 2, n)
        else:
            vals = rng.random(n).astype(np.float32)
        t = h.make_tensor(name, dtype, dims, vals.tolist())
    if draw(st.booleans()):
        t.doc_string = draw(st.text(max_size=5))
    if draw(st.booleans()):
        entry = t.metadata_props.add()
        entry.key, entry.value = "k", draw(st.text(max_size=5))
    return t


@st.composite
def random_models(draw) -> onnx.ModelProto:
    names = iter(f"t{i}" for i in range(1000))

    def graph(depth: int, outputs: list[str]) -> onnx.GraphProto:
        inits = [_random_tensor(draw, next(names)) for _ in range(draw(st.integers(0, 4)))]
        nodes = []
        for out in outputs:
            if depth < 2 and draw(st.booleans()):
                then = graph(depth + 1, [next(names)])
                other = graph(depth + 1, [next(names)])
                nodes.append(h.make_node("If", ["cond"], [out], then_branch=then,
                                         else_branch=other))
            elif inits:
                nodes.append(h.make_node("Identity", [inits[0].name], [out]))
            else:
                c = _random_tensor(draw, next(names))
                nodes.append(h.make_node("Constant", [], [out], value=c))
        outs = [h.make_value_info(o, onnx.TypeProto()) for o in outputs]
        return h.make_graph(nodes, f"g{depth}", [], outs, initializer=inits,
                            doc_string=draw(st.text(max_size=3)))

    g = graph(0, ["y"])
    g.input.append(h.make_tensor_value_info("cond", TP.BOOL, []))
    fn = h.make_function("local", "f", ["a"], ["b"],
                         [h.make_node("Identity", ["a"], ["b"])],
                         [h.make_opsetid("", 21)])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 21),
                                           h.make_opsetid("local", 1)],
                         functions=[fn] if draw(st.booleans()) else [])
    model.ir_version = 10
    if draw(st.booleans()):
        h.set_model_props(model, {"p": draw(st.text(max_size=4))})
    return model


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(proto=random_models())
def test_random_graphs_stream_to_protobufs_bytes(proto, tmp_path_factory, monkeypatch):
    monkeypatch.setattr(inline_write, "STREAM_MIN_BYTES", 1)
    monkeypatch.setattr(inline_read, "MIN_FILE_BYTES", 0)
    monkeypatch.setattr(inline_read, "MIN_TENSOR_BYTES", 1)
    tmp = tmp_path_factory.mktemp("random")
    path = tmp / "m.onnx"
    path.write_bytes(proto.SerializeToString())
    # as onnx_ir serializes the model read from protobuf (typed fields kept as they are)
    model = storage.load(path)
    assert _streamed(model, tmp) == _reference(model)
    # tensors in memory (ir.Tensor from NumPy): the same bytes as protobuf writes
    _to_memory(model)
    assert _streamed(model, tmp) == _reference(model)


def test_a_computed_tensor_streams_in_chunks(tmp_path, monkeypatch):
    """A lazily computed tensor writes itself; the length is known before its bytes."""
    monkeypatch.setattr(inline_write, "STREAM_MIN_BYTES", 1)
    value = np.arange(3 * 70_000, dtype=np.float32).reshape(3, 70_000)
    calls = []

    def compute():
        calls.append(1)
        return ir.Tensor(value)

    lazy = ir.LazyTensor(compute, dtype=ir.DataType.FLOAT, shape=ir.Shape(value.shape),
                         name="w")
    w = ir.Value(name="w", const_value=lazy, type=ir.TensorType(ir.DataType.FLOAT),
                 shape=ir.Shape(value.shape))
    g = ir.Graph([], [w], nodes=[], initializers=[w], opset_imports={"": 21}, name="g")
    model = ir.Model(g, ir_version=10)
    got = _streamed(model, tmp_path)
    assert len(calls) == 1
    assert got == ir.to_proto(model).SerializeToString()
    np.testing.assert_array_equal(
        onnx.numpy_helper.to_array(onnx.load_from_string(got).graph.initializer[0]), value)


def test_a_tensor_writing_the_wrong_length_fails(tmp_path, monkeypatch):
    monkeypatch.setattr(inline_write, "STREAM_MIN_BYTES", 1)

    class Short(ir.Tensor):
        def tofile(self, file):
            file.write(b"\0" * 4)

    w = ir.Value(name="w", const_value=Short(np.zeros(8, np.float32)))
    g = ir.Graph([], [w], nodes=[], initializers=[w], opset_imports={"": 21}, name="g")
    with pytest.raises(OSError, match="wrote 4 bytes, its type and shape need 32"):
        inline_write.write(ir.Model(g, ir_version=10), tmp_path / "x.onnx")


def test_a_loaded_model_reads_the_file_as_it_was_loaded(tmp_path, stream_everything):
    """Another run renaming a new file over the model's path (its save, an --in-place
    commit) does not change what the loaded model's tensors read."""
    path = tmp_path / "m.onnx"
    path.write_bytes((MODELS / "ort_qdq_per_channel.onnx").read_bytes())
    model = storage.load(path)
    assert _mapped(model)
    expected = _reference(model)
    replacement = tmp_path / "other.onnx"
    replacement.write_bytes((MODELS / "ort_qdq_per_tensor.onnx").read_bytes())
    os.replace(replacement, path)
    assert _streamed(model, tmp_path) == expected


FOLDABLE = [p for p in sorted(MODELS.glob("*.onnx")) if not p.name.startswith("invalid_")]


@pytest.mark.parametrize("path", FOLDABLE, ids=lambda p: p.name)
def test_fold_and_upgrade_write_the_same_bytes_lean_or_not(path, tmp_path, monkeypatch):
    """Tensors left in the input file and streamed out give the very bytes that tensors
    read into memory and serialized whole give."""
    import dqtool
    from dqtool.errors import DqtoolError

    def run(lean: bool, name: str) -> dict[str, bytes]:
        monkeypatch.setattr(inline_write, "STREAM_MIN_BYTES", 1 if lean else 1 << 40)
        monkeypatch.setattr(inline_read, "MIN_FILE_BYTES", 0 if lean else 1 << 40)
        monkeypatch.setattr(inline_read, "MIN_TENSOR_BYTES", 1)
        got = {}
        for command, call in (("fold", lambda out: dqtool.fold(path, out)),
                              ("upgrade", lambda out: dqtool.upgrade(path, 25, out))):
            out = tmp_path / f"{name}.{command}.onnx"
            try:
                call(out)
            except DqtoolError as e:
                got[command] = str(e).encode()
                continue
            got[command] = out.read_bytes()
        return got

    lean, whole = run(True, "lean"), run(False, "whole")
    assert lean.keys() == whole.keys()
    for command in lean:
        assert lean[command].replace(b"lean.", b"whole.") == whole[command], command


@pytest.fixture
def early(monkeypatch, stream_everything):
    from dqtool.storage import early_copy

    monkeypatch.setattr(early_copy, "MIN_BYTES", 0)
    return early_copy


def _kept_spy(monkeypatch) -> list[tuple[int, int]]:
    seen = []
    real = inline_write._in_place

    def spy(placed, copied):
        kept = real(placed, copied)
        seen.append((len(kept), sum(isinstance(p, inline_write.Payload) for _, p in placed)))
        return kept

    monkeypatch.setattr(inline_write, "_in_place", spy)
    return seen


def test_an_early_copy_of_the_input_is_kept_where_it_matches(tmp_path, early, monkeypatch):
    import dqtool

    src = tmp_path / "m.onnx"  # as onnx_ir writes it: its layout survives a re-save
    ir.save(ir.load(MODELS / "ort_qdq_per_channel.onnx"), src)
    dqtool.upgrade(src, 25, tmp_path / "plain.onnx")
    seen = _kept_spy(monkeypatch)
    copy = early.start_early_copy(src, tmp_path / "out.onnx")
    try:
        dqtool.upgrade(src, 25, tmp_path / "out.onnx", started_copy=copy)
    finally:
        copy.discard()
    assert seen and seen[0][0] == seen[0][1] > 0  # every payload was already in place
    assert (tmp_path / "out.onnx").read_bytes() == (tmp_path / "plain.onnx").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "out.onnx", "plain.onnx"]


def test_an_early_copy_of_a_replaced_input_is_not_used(tmp_path, early, monkeypatch):
    import dqtool

    src = tmp_path / "m.onnx"
    src.write_bytes((MODELS / "ort_qdq_per_tensor.onnx").read_bytes())
    copy = early.start_early_copy(src, tmp_path / "out.onnx")
    copy.join()
    other = tmp_path / "other.onnx"
    other.write_bytes((MODELS / "ort_qdq_per_channel.onnx").read_bytes())
    os.replace(other, src)  # the input changes after the copy started
    dqtool.upgrade(src, 25, tmp_path / "plain.onnx")  # no early copy for this output
    seen = _kept_spy(monkeypatch)
    try:
        dqtool.upgrade(src, 25, tmp_path / "out.onnx", started_copy=copy)
    finally:
        copy.discard()
    assert seen == [] or seen[0][0] == 0
    assert (tmp_path / "out.onnx").read_bytes() == (tmp_path / "plain.onnx").read_bytes()


@pytest.mark.parametrize("args, code", [(["--opset", "25"], 0), (["--opset", "99"], 2)])
def test_the_cli_leaves_no_early_copy_behind(tmp_path, early, args, code):
    from click.testing import CliRunner

    from dqtool.cli import cli

    src = tmp_path / "m.onnx"
    src.write_bytes((MODELS / "ort_qdq_per_channel.onnx").read_bytes())
    r = CliRunner().invoke(cli, ["upgrade", str(src), *args, "-o", str(tmp_path / "o.onnx")])
    assert r.exit_code == code, r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == (["m.onnx", "o.onnx"] if code == 0
                                                         else ["m.onnx"])


@pytest.mark.parametrize("dtype", [TP.INT4, TP.UINT4, TP.FLOAT4E2M1])
@pytest.mark.parametrize("shape", [(7, 5), (8, 6), (9, 1)])
def test_4bit_rows_read_from_the_file_fold_as_in_memory(tmp_path, monkeypatch, dtype, shape):
    """Row blocks of a packed 4-bit weight read from the file (odd rows, a padding
    nibble) fold to the very bytes of the weight unpacked in memory."""
    import dqtool
    from dqtool.folding import compute

    rng = np.random.default_rng(int(dtype) + shape[0])
    codes = rng.integers(0, 16, shape).astype(np.uint8)
    q = h.make_tensor("q", dtype, shape, codes, raw=True)
    scale = h.make_tensor("s", TP.FLOAT, [], [0.25])
    node = h.make_node("DequantizeLinear", ["q", "s"], ["y"], name="dq")
    g = h.make_graph([node], "g", [], [h.make_tensor_value_info("y", TP.FLOAT, shape)],
                     initializer=[q, scale])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 23)])
    model.ir_version = 11
    src = tmp_path / "m.onnx"
    onnx.save(model, src)
    monkeypatch.setattr(compute, "CHUNK_ELEMENTS", 2)  # a few rows per block
    monkeypatch.setattr(inline_write, "STREAM_MIN_BYTES", 1)  # written block by block
    monkeypatch.setattr(inline_read, "MIN_FILE_BYTES", 1 << 40)
    dqtool.fold(src, tmp_path / "whole.onnx")
    monkeypatch.setattr(inline_read, "MIN_FILE_BYTES", 0)
    monkeypatch.setattr(inline_read, "MIN_TENSOR_BYTES", 1)
    mapped = storage.load(src)
    assert isinstance(mapped.graph.initializers["q"].const_value, inline_read.MappedTensor)
    dqtool.fold(src, tmp_path / "lean.onnx")
    assert (tmp_path / "lean.onnx").read_bytes() == (tmp_path / "whole.onnx").read_bytes()
    folded = onnx.numpy_helper.to_array(onnx.load(tmp_path / "lean.onnx").graph.initializer[0])
    expected = onnx.numpy_helper.to_array(q).astype(np.float32) * np.float32(0.25)
    np.testing.assert_array_equal(folded, expected)
