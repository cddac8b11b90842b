"""External-data locations resolved as the operating system opens them: '..' after a
symbolic link, symbolic-link loops, overlong and missing components, a symlinked model
folder. Each is one line and exit 2 from every command, or read as the file it is."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from test_bad_input import _external_model

from dqtool import storage
from dqtool.errors import InputError

DATA = bytes(range(16))
DECOY = bytes([7] * 16)


def _escape_setup(tmp_path: Path) -> Path:
    """model/sub -> ../elsewhere/deep; model/w.bin is a decoy; elsewhere/w.bin is outside.
    'sub/../w.bin' is model/w.bin lexically, elsewhere/w.bin to the operating system."""
    (tmp_path / "elsewhere" / "deep").mkdir(parents=True)
    (tmp_path / "elsewhere" / "w.bin").write_bytes(DATA)
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "sub").symlink_to(tmp_path / "elsewhere" / "deep")
    path = _external_model(folder, "sub/../w.bin", DECOY)
    return path


def test_dotdot_after_a_symlink_that_leaves_the_folder_is_refused(tmp_path):
    path = _escape_setup(tmp_path)
    with pytest.raises(InputError, match="outside the model's folder"):
        storage.load(path)


@pytest.mark.parametrize("command", [["inspect"], ["check"], ["lint"], ["fold", "-o", "o.onnx"],
                                     ["upgrade", "--opset", "21", "-o", "o.onnx"]])
def test_every_command_refuses_it_in_one_line(tmp_path, command):
    path = _escape_setup(tmp_path)
    out = subprocess.run([sys.executable, "-m", "dqtool", command[0], str(path),
                          *command[1:]], capture_output=True, text=True, cwd=tmp_path,
                         timeout=120)
    assert out.returncode == 2, out.stderr
    assert "outside the model's folder" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "o.onnx").exists()


def test_dotdot_through_a_symlink_that_stays_inside_is_read(tmp_path):
    folder = tmp_path / "model"
    (folder / "a" / "b").mkdir(parents=True)
    (folder / "link").symlink_to(folder / "a" / "b")
    path = _external_model(folder, "link/../w2.bin", None)
    (folder / "a" / "w2.bin").write_bytes(DATA)  # link/.. is a, through the link
    (folder / "w2.bin").write_bytes(DECOY)
    w = storage.load(path).graph.initializers["w"].const_value.numpy()
    assert w.tobytes() == DATA


@pytest.mark.parametrize(("location", "links"), [
    ("loop/w.bin", [("loop", "loop2"), ("loop2", "loop")]),  # a folder in the path
    ("w.bin", [("w.bin", "w.bin")]),  # the data file itself
])
def test_a_symlink_loop_is_one_line(tmp_path, location, links):
    folder = tmp_path / "model"
    folder.mkdir()
    path = _external_model(folder, location, None)
    for link, to in links:
        (folder / link).symlink_to(folder / to)
    with pytest.raises(InputError, match="cannot be opened"):
        storage.load(path)


def test_an_overlong_location_is_one_line(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    path = _external_model(folder, "x" * 5000, None)
    with pytest.raises(InputError, match="cannot be opened"):
        storage.load(path)


def test_a_missing_folder_before_dotdot_is_one_line(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    path = _external_model(folder, "nowhere/../w.bin", DATA)
    with pytest.raises(InputError, match="missing"):
        storage.load(path)


def test_a_symlinked_model_folder_reads_its_own_data(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    _external_model(real, "w.bin", DATA)
    (tmp_path / "alias").symlink_to(real)
    w = storage.load(tmp_path / "alias" / "m.onnx").graph.initializers["w"].const_value.numpy()
    assert w.tobytes() == DATA


# Opened once, the opened file checked, read through it (``checked_files``): a name
# swapped after the check changes nothing that is read.
def _swap_before_open(monkeypatch, swap) -> None:
    from dqtool.storage import checked_files

    real_open = checked_files._open

    def opening(target):
        swap()  # another process, between the check and the open
        return real_open(target)

    monkeypatch.setattr(checked_files, "_open", opening)


def test_a_folder_swapped_for_a_link_out_between_check_and_open_is_refused(tmp_path,
                                                                           monkeypatch):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "w.bin").write_bytes(DATA)
    folder = tmp_path / "model"
    (folder / "sub").mkdir(parents=True)
    path = _external_model(folder, "sub/w.bin", DECOY)
    (folder / "w.bin").rename(folder / "sub" / "w.bin")

    def swap():
        (folder / "sub").rename(folder / "old")
        (folder / "sub").symlink_to(tmp_path / "elsewhere")

    _swap_before_open(monkeypatch, swap)
    with pytest.raises(InputError, match="changed while it was checked"):
        storage.load(path)


@pytest.mark.parametrize("swap_to", ["file", "link"])
def test_a_data_file_swapped_between_check_and_open_is_refused(tmp_path, monkeypatch,
                                                               swap_to):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "w.bin").write_bytes(DATA)
    folder = tmp_path / "model"
    folder.mkdir()
    path = _external_model(folder, "w.bin", DECOY)

    def swap():
        (folder / "w.bin").unlink()
        if swap_to == "file":
            (folder / "w.bin").write_bytes(DATA)  # another file under the checked name
        else:
            (folder / "w.bin").symlink_to(tmp_path / "elsewhere" / "w.bin")

    _swap_before_open(monkeypatch, swap)
    with pytest.raises(InputError, match=r"changed while it was checked|cannot be opened"):
        storage.load(path)


def test_reads_after_the_check_go_to_the_file_checked(tmp_path):
    """Renaming another file over the location after loading: the model still reads the
    bytes it was checked with (every read goes through the descriptor)."""
    folder = tmp_path / "model"
    folder.mkdir()
    path = _external_model(folder, "w.bin", DATA)
    model = storage.load(path)
    (folder / "other.bin").write_bytes(DECOY)
    (folder / "other.bin").replace(folder / "w.bin")
    assert model.graph.initializers["w"].const_value.numpy().tobytes() == DATA
    out = tmp_path / "folded.onnx"
    res = subprocess.run([sys.executable, "-m", "dqtool", "fold", str(path), "-o", str(out)],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr  # a fresh run reads what is there now
    got = storage.load(out).graph.initializers
    assert len(got) == 1


def test_a_file_used_as_a_folder_before_dotdot_is_refused(tmp_path):
    """'w.bin/../w.bin': realpath takes the file for a folder; the system does not."""
    folder = tmp_path / "model"
    folder.mkdir()
    path = _external_model(folder, "w.bin/../w.bin", DATA)
    with pytest.raises(InputError, match="cannot be opened: Not a directory"):
        storage.load(path)


@pytest.mark.parametrize("location", ["loop", "w\0.bin"])
def test_in_place_with_a_location_that_cannot_resolve_is_one_line(tmp_path, location):
    folder = tmp_path / "model"
    folder.mkdir()
    if location == "loop":
        (folder / "loop").symlink_to("loop")
    path = _external_model(folder, location, DATA)
    res = subprocess.run([sys.executable, "-m", "dqtool", "fold", str(path), "--in-place"],
                         capture_output=True, text=True)
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("dqtool: error: ")
