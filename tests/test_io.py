"""Saving: atomic, never over a file the input reads, clear errors for bad output paths."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from dqtool import storage
from dqtool.errors import InputError, UsageError
from dqtool.storage import data_writer

MODELS = Path(__file__).resolve().parent.parent / "models"


def _copy_external(tmp: Path) -> Path:
    folder = tmp / "ext"
    shutil.copytree(MODELS / "external_data", folder)
    return folder / "model.onnx"


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}


def test_output_data_file_may_not_replace_the_inputs(tmp_path):
    src = _copy_external(tmp_path)
    renamed = src.with_name("in.onnx")
    src.rename(renamed)  # in.onnx reads model.onnx.data
    before = _digest(src.parent)
    model = storage.load(renamed)
    with pytest.raises(UsageError, match=r"which the input model in\.onnx reads"):
        storage.save(model, src.parent / "model.onnx")  # would write model.onnx.data
    assert _digest(src.parent) == before
    assert not list(src.parent.glob(".*"))  # no temporary folder left


def test_replacing_the_inputs_data_is_refused_before_anything_is_written(tmp_path,
                                                                           monkeypatch):
    src = _copy_external(tmp_path)
    renamed = src.with_name("in.onnx")
    src.rename(renamed)
    model = storage.load(renamed)

    def no_writing(*args, **kwargs):
        raise AssertionError("save started writing before refusing")

    monkeypatch.setattr(storage.commit, "Temp", no_writing)
    with pytest.raises(UsageError, match=r"would replace .*model\.onnx\.data"):
        storage.save(model, src.parent / "model.onnx")


def test_output_named_like_the_inputs_data_file_is_refused(tmp_path):
    src = _copy_external(tmp_path)
    model = storage.load(src)
    with pytest.raises(UsageError):
        storage.save(model, src.parent / "model.onnx.data")


def test_in_place_save_replaces_model_and_data_and_still_loads(tmp_path):
    src = _copy_external(tmp_path)
    model = storage.load(src)
    names = {init: v.const_value.numpy().copy() for init, v in model.graph.initializers.items()}
    storage.save(model, src)  # the caller approved in-place: the model file itself
    again = storage.load(src)
    for name, value in names.items():
        assert (again.graph.initializers[name].const_value.numpy() == value).all()


def test_output_to_a_directory_or_unwritable_place(tmp_path):
    model = storage.load(MODELS / "dq13_int8_per_axis.onnx")
    with pytest.raises(UsageError, match="is a directory"):
        storage.save(model, tmp_path)
    with pytest.raises(InputError, match="does not exist"):
        storage.save(model, tmp_path / "missing" / "m.onnx")


def test_save_writes_lowest_files_and_loads_back(tmp_path):
    model = storage.load(MODELS / "dq21_int4_blocked_ragged.onnx")
    written = storage.save(model, tmp_path / "m.onnx")
    assert [p.name for p in written] == ["m.onnx"]
    back = storage.load(tmp_path / "m.onnx")
    w = model.graph.initializers
    for name in w:
        assert (back.graph.initializers[name].const_value.numpy() ==
                w[name].const_value.numpy()).all()


def test_external_save_copies_unchanged_tensors_exactly_and_deterministically(tmp_path):
    src = _copy_external(tmp_path)
    model = storage.load(src)
    originals = {n: v.const_value.numpy().copy() for n, v in model.graph.initializers.items()}
    out1, out2 = tmp_path / "a" / "m.onnx", tmp_path / "b" / "m.onnx"
    out1.parent.mkdir()
    out2.parent.mkdir()
    storage.save(model, out1, external=True)
    storage.save(model, out2, external=True)
    assert (out1.read_bytes(), (out1.parent / "m.onnx.data").read_bytes()) == (
        out2.read_bytes(), (out2.parent / "m.onnx.data").read_bytes())
    back = storage.load(out1)
    for name, value in originals.items():
        assert (back.graph.initializers[name].const_value.numpy() == value).all()
    # the model object still points at its own source
    assert all(v.const_value is not None for v in model.graph.initializers.values())
    assert storage.load(src) is not None


def test_a_failed_data_write_leaves_nothing_behind(tmp_path, monkeypatch):
    src = _copy_external(tmp_path)
    model = storage.load(src)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    real_write = data_writer._write
    calls = []

    def failing_write(tensor, f, offset):
        calls.append(tensor.name)
        if len(calls) == 1:
            raise OSError(28, "No space left on device")
        return real_write(tensor, f, offset)

    monkeypatch.setattr(data_writer, "_write", failing_write)
    with pytest.raises(OSError, match="No space left") as raised:
        storage.save(model, out_dir / "m.onnx", external=True)
    # one line for the command line: the output, why, and that nothing was written
    assert str(raised.value) == (f"{out_dir / 'm.onnx'}: cannot write it (No space left on "
                                 "device); nothing was written")
    assert calls == ["W1_q"]
    assert list(out_dir.iterdir()) == []  # no output, no temporary folder
    # the model is left as it was: its tensors still read the input's data
    for v in model.graph.initializers.values():
        assert v.const_value.numpy() is not None


def test_written_data_matches_the_layout_the_model_names(tmp_path):
    src = _copy_external(tmp_path)
    model = storage.load(src)
    expected = {n: v.const_value.numpy().copy() for n, v in model.graph.initializers.items()}
    storage.save(model, tmp_path / "copy.onnx", external=True)
    again = storage.load(tmp_path / "copy.onnx")
    assert set(again.graph.initializers) == set(expected)
    for name, value in again.graph.initializers.items():
        got = value.const_value.numpy()
        assert got.dtype == expected[name].dtype
        assert got.tobytes() == expected[name].tobytes()


@pytest.mark.parametrize(("imports", "expected"), [
    ('"" : 13', 7),
    ('"" : 13, "ai.onnx.ml" : 3', 8),   # ai.onnx.ml 3 came with IR 8
    ('"" : 13, "com.microsoft" : 1', 7),  # a domain onnx does not know adds nothing
    ('"" : 21', 10),
    ('"ai.onnx" : 19', 9),
])
def test_lowest_ir_version_counts_every_known_domain(imports, expected):
    import onnx
    import onnx_ir as ir

    proto = onnx.parser.parse_model(f"""<ir_version: 10, opset_import: [{imports}]>
        g (float[2] x) => (float[2] y) {{ y = Identity(x) }}""")
    assert storage.lowest_ir_version(ir.serde.deserialize_model(proto)) == expected


def test_lowest_ir_version_sees_types_inside_nodes_and_functions():
    import onnx
    import onnx_ir as ir

    # float8 made by a Constant inside a function, at opset 13 + a function import:
    # no graph input, output or initializer has it, yet the model needs IR 9.
    proto = onnx.parser.parse_model("""<ir_version: 10, opset_import: ["" : 13, "local" : 1]>
        g (float[2] x) => (float[2] y) { y = local.f(x) }
        <domain: "local", opset_import: ["" : 13]>
        f (a) => (b) {
            c = Constant<value = float8e4m3fn[2] {56, 64}>()
            d = Cast<to = 1>(c)
            b = Add(a, d)
        }""")
    assert storage.lowest_ir_version(ir.serde.deserialize_model(proto)) == 9


def test_lowest_ir_version_counts_what_opsets_do_not_say():
    import onnx
    import onnx_ir as ir

    def lowest(text: str) -> int:
        return storage.lowest_ir_version(ir.serde.deserialize_model(onnx.parser.parse_model(text)))

    # opset 8 alone would allow IR 3, where every initializer had to be a graph input
    assert lowest("""<ir_version: 4, opset_import: ["" : 8]>
        g (float[2] x) => (float[2] y) <float[2] w = {1.0, 2.0}> { y = Add(x, w) }""") == 4
    # an ai.onnx.ml version newer than the installed onnx's table: its own IR version
    assert lowest("""<ir_version: 10, opset_import: ["" : 13, "ai.onnx.ml" : 99]>
        g (float[2] x) => (float[2] y) { y = Identity(x) }""") == onnx.IR_VERSION
    # node metadata came with IR 10
    proto = onnx.parser.parse_model("""<ir_version: 10, opset_import: ["" : 13]>
        g (float[2] x) => (float[2] y) { y = Identity(x) }""")
    proto.graph.node[0].metadata_props.add(key="origin", value="exporter")
    assert storage.lowest_ir_version(ir.serde.deserialize_model(proto)) == 10


def test_a_string_initializer_stays_inline_in_an_external_data_save(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    strings = [b"abcdefgh"] * 100  # 800 bytes: past the external-data threshold
    g = helper.make_graph(
        [helper.make_node("Identity", ["s"], ["y"])], "g", [],
        [helper.make_tensor_value_info("y", TensorProto.STRING, [100])],
        [helper.make_tensor("s", TensorProto.STRING, [100], strings)])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)],
                                ir_version=7), tmp_path / "m.onnx")
    storage.save(storage.load(tmp_path / "m.onnx"), tmp_path / "o.onnx", external=True)
    (init,) = onnx.load(tmp_path / "o.onnx").graph.initializer
    assert list(init.string_data) == strings


def test_the_data_writer_starts_with_no_small_lazy_tensor_left(tmp_path, monkeypatch):
    """The writer thread computes large lazy tensors while the caller serializes the small
    ones; onnx_ir's loading of an external tensor is not thread-safe, so every small
    tensor that could load one is materialized before the writer starts."""
    import numpy as np
    import onnx_ir as ir

    src = _copy_external(tmp_path)
    model = storage.load(src)
    external = next(v.const_value for v in model.graph.initializers.values()
                    if isinstance(v.const_value, ir.ExternalTensor))
    small = ir.LazyTensor(lambda: ir.Tensor(external.numpy().ravel()[:4].copy()),
                          dtype=external.dtype, shape=ir.Shape([4]), name="small_lazy")
    model.graph.initializers["small_lazy"] = ir.Value(name="small_lazy", const_value=small)
    seen = []
    real_start = data_writer._Writer.start

    def start(writer):
        seen.extend(type(v.const_value).__name__ for v in model.graph.initializers.values()
                    if v.const_value.nbytes <= data_writer.SIZE_THRESHOLD)
        real_start(writer)

    monkeypatch.setattr(data_writer._Writer, "start", start)
    storage.save(model, tmp_path / "o.onnx", external=True)
    assert seen and "LazyTensor" not in seen and "ExternalTensor" not in seen
    again = storage.load(tmp_path / "o.onnx")
    got = again.graph.initializers["small_lazy"].const_value.numpy()
    assert np.array_equal(got, external.numpy().ravel()[:4])
