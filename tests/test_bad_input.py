"""Bad input: one line on stderr naming the file and the problem, exit 2, no traceback."""

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


def _external_model(folder: Path, location: str, data: bytes | None, length: int = 16) -> Path:
    """A DQ model whose int8 weight is external data at ``location``."""
    w = TensorProto(name="w", data_type=TensorProto.INT8, dims=[4, 4])
    w.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", "0"), ("length", str(length))):
        w.external_data.add(key=k, value=v)
    s = numpy_helper.from_array(np.array(0.5, np.float32), "s")
    node = helper.make_node("DequantizeLinear", ["w", "s"], ["y"], name="dq")
    g = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("y", 1, [4, 4])],
                          [w, s])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=7)
    path = folder / "m.onnx"
    onnx.save(m, path)
    if data is not None:
        (folder / "w.bin").write_bytes(data)
    return path


def _valid_model(path: Path, opset: int = 13) -> Path:
    s = numpy_helper.from_array(np.array(0.5, np.float32), "s")
    w = numpy_helper.from_array(np.arange(16, dtype=np.int8).reshape(4, 4), "w")
    node = helper.make_node("DequantizeLinear", ["w", "s"], ["y"], name="dq")
    g = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("y", 1, [4, 4])],
                          [w, s])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)],
                                ir_version=7), path)
    return path


def bad_inputs(tmp: Path) -> dict[str, tuple[Path, str]]:
    """name -> (path, text the message must contain)."""
    (tmp / "dir.onnx").mkdir()
    (tmp / "text.onnx").write_text("this is not an ONNX model\n")
    good = _valid_model(tmp / "good.onnx").read_bytes()
    (tmp / "truncated.onnx").write_bytes(good[: len(good) // 2])
    (tmp / "empty.onnx").write_bytes(b"")
    cases = {
        "missing": (tmp / "nope.onnx", "no such file"),
        "directory": (tmp / "dir.onnx", "directory"),
        "not onnx": (tmp / "text.onnx", "not"),
        "truncated": (tmp / "truncated.onnx", "not"),
        "empty": (tmp / "empty.onnx", "not an ONNX model"),
        "opset unknown": (_valid_model(tmp / "future.onnx", opset=99), "opset 99"),
    }
    for name, loc, data, want in [
        ("external missing", "w.bin", None, "missing"),
        ("external short", "w.bin", b"\0" * 8, "truncated"),
        ("external absolute", "/etc/passwd", None, "absolute"),
        ("external escapes", "../w.bin", None, "escapes"),
    ]:
        folder = tmp / name.replace(" ", "_")
        folder.mkdir()
        if loc == "../w.bin":
            (tmp / "w.bin").write_bytes(b"\0" * 16)
        cases[name] = (_external_model(folder, loc, data), want)
    return cases


CASES = ["missing", "directory", "not onnx", "truncated", "empty", "opset unknown",
         "external missing", "external short", "external absolute", "external escapes"]


@pytest.mark.parametrize("case", CASES)
def test_load_raises_input_error(tmp_path, case):
    path, want = bad_inputs(tmp_path)[case]
    with pytest.raises(InputError) as e:
        storage.load(path)
    assert want in str(e.value)
    assert str(path) in str(e.value)


def test_cli_bad_inputs_exit_2_with_one_line(tmp_path):
    # One subprocess per case would cost a second each; all cases in one script instead.
    cases = bad_inputs(tmp_path)
    for name in CASES:
        path, want = cases[name]
        r = subprocess.run([sys.executable, "-m", "dqtool", "inspect", str(path)],
                           capture_output=True, text=True)
        assert r.returncode == 2, (name, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1, (name, r.stderr)
        assert lines[0].startswith("dqtool: error: ") and want in lines[0], (name, lines)
        assert "Traceback" not in r.stderr and r.stdout == ""


def test_valid_external_data_loads(tmp_path):
    path = _external_model(tmp_path, "w.bin", bytes(range(16)))
    m = storage.load(path)
    w = m.graph.initializers["w"].const_value
    assert w.numpy().reshape(-1).tolist() == list(range(16))


def test_usage_error_exit_2():
    r = subprocess.run([sys.executable, "-m", "dqtool", "inspect"], capture_output=True,
                       text=True)
    assert r.returncode == 2 and "Missing argument" in r.stderr


def test_hard_linked_external_data_is_refused_in_one_line(tmp_path):
    path = _external_model(tmp_path, "w.bin", bytes(16))
    (tmp_path / "other.bin").hardlink_to(tmp_path / "w.bin")
    with pytest.raises(InputError, match="hard links"):
        storage.load(path)


def test_symlink_out_of_the_folder_is_refused_but_inside_is_read(tmp_path):
    outside = tmp_path / "blobs"
    outside.mkdir()
    (outside / "abc").write_bytes(bytes(range(16)))
    folder = tmp_path / "model"
    folder.mkdir()
    path = _external_model(folder, "w.bin", None)
    (folder / "w.bin").symlink_to(outside / "abc")
    with pytest.raises(InputError, match="symbolic link"):
        storage.load(path)
    (folder / "w.bin").unlink()
    (folder / "blob").write_bytes(bytes(range(16)))
    (folder / "w.bin").symlink_to("blob")
    assert storage.load(path).graph.initializers["w"].const_value.numpy().sum() == sum(range(16))
