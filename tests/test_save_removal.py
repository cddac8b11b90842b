"""What a save removes (docs/saving.md, "What a save removes"): an old data file only when
it is named for the output and the replaced model was its only reader in the folder (and
the folder above); after a kill, only files the dead commit's journal names, by inode."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest

from dqtool import storage
from dqtool.storage import commit, data_readers, leftovers

PY = sys.executable


def _graph(seed: int) -> ir.Graph:
    rng = np.random.default_rng(seed)
    x = ir.Value(name="X", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([1, 64]))
    q = ir.Value(name="W_q", const_value=ir.tensor(rng.integers(-8, 8, (64, 64), dtype=np.int8)))
    s = ir.Value(name="W_s", const_value=ir.tensor((rng.random(64) + 0.1).astype(np.float32)))
    dq = ir.node("DequantizeLinear", [q, s], attributes={"axis": 1}, name="dq")
    mm = ir.node("MatMul", [x, dq.outputs[0]], name="mm")
    mm.outputs[0].name, mm.outputs[0].dtype = "Y", ir.DataType.FLOAT
    mm.outputs[0].shape = ir.Shape([1, 64])
    return ir.Graph([x], [mm.outputs[0]], nodes=[dq, mm], initializers=[q, s],
                    opset_imports={"": 21}, name="g")


def _save(path: Path, data: str, seed: int = 0) -> Path:
    """A model whose weights are in ``data`` (a name relative to the model's folder)."""
    ir.save(ir.Model(_graph(seed), ir_version=10), path, external_data=data,
            size_threshold_bytes=0)
    return path


def _loads(path: Path) -> bool:
    try:
        onnx.load(path)  # with its external data
        onnx.checker.check_model(str(path))
    except Exception:
        return False
    return True


def _fold(src: Path, out: Path) -> None:
    res = subprocess.run([PY, "-m", "dqtool", "fold", str(src), "-o", str(out),
                          "--external-data"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize(("name", "ours"), [
    ("x.onnx.data", True), ("x.onnx.0123abcd.data", True), ("x.onnx.deadbeef.data", True),
    ("x-00001-of-00002.onnx.data", True), ("x.onnx.0123abcd-00002-of-00002.data", True),
    ("x-00001-of-00002.onnx.deadbeef.data", True),
    ("x-shared.data", False), ("x.onnx.data.bak", False), ("x.onnx.0123abcg.data", False),
    ("x.onnx.123.data", False), ("y.onnx.data", False), ("sub/x.onnx.data", False),
    ("weights.bin", False), ("x.onnxdata", False)])
def test_names_dqtool_gives_an_outputs_data(name, ours):
    assert data_readers.named_for(name, "x.onnx") is ours


def test_a_sole_readers_old_data_is_removed(tmp_path):
    src = _save(tmp_path / "m.onnx", "m.onnx.data")
    out = _save(tmp_path / "x.onnx", "x.onnx.data", seed=1)
    _fold(src, out)
    assert not (tmp_path / "x.onnx.data").exists()
    assert _loads(out) and _loads(src)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["m.onnx", "m.onnx.data", "x.onnx", *commit.locations(out)])


def test_a_data_file_another_model_reads_under_a_fresh_name_survives(tmp_path):
    """Finding 2 (a) of 2026-11: other.onnx reads x.onnx.<hex>.data, no journal names it."""
    src = _save(tmp_path / "m.onnx", "m.onnx.data")
    other = _save(tmp_path / "other.onnx", "x.onnx.0123abcd.data", seed=2)
    _fold(src, tmp_path / "x.onnx")  # a new output
    _fold(src, tmp_path / "x.onnx")  # and replacing it
    assert _loads(other)


@pytest.mark.parametrize("shared", ["x-shared.data", "x.onnx.data"])
def test_a_data_file_the_replaced_model_shares_survives(tmp_path, shared):
    """Finding 2 (b): the old x.onnx and other.onnx read one file."""
    src = _save(tmp_path / "m.onnx", "m.onnx.data")
    out = _save(tmp_path / "x.onnx", shared, seed=1)
    other = tmp_path / "other.onnx"
    other.write_bytes(out.read_bytes())  # the same locations
    _fold(src, out)
    assert _loads(other)
    assert (tmp_path / shared).exists()


def test_a_model_one_folder_up_keeps_its_data(tmp_path):
    sub = tmp_path / "out"
    sub.mkdir()
    src = _save(tmp_path / "m.onnx", "m.onnx.data")
    out = _save(sub / "x.onnx", "x.onnx.data", seed=1)
    above = tmp_path / "above.onnx"
    proto = onnx.load(out, load_external_data=False)
    for t in proto.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = "out/x.onnx.data"
    onnx.save(proto, above)
    assert _loads(above)
    _fold(src, out)
    assert _loads(above) and _loads(out)


def test_an_unreadable_model_in_the_folder_keeps_everything(tmp_path):
    """A model that cannot be read might read the old data: nothing is removed."""
    src = _save(tmp_path / "m.onnx", "m.onnx.data")
    out = _save(tmp_path / "x.onnx", "x.onnx.data", seed=1)
    (tmp_path / "junk.onnx").write_bytes(b"\xff" * 100)
    _fold(src, out)
    assert (tmp_path / "x.onnx.data").exists() and _loads(out)


def test_a_name_alone_is_never_swept(tmp_path):
    """An unreferenced X.<hex>.data that no journal names is not dqtool's to remove."""
    src = _save(tmp_path / "m.onnx", "m.onnx.data")
    stray = tmp_path / "x.onnx.0badf00d.data"
    stray.write_bytes(b"\1" * 64)
    _fold(src, tmp_path / "x.onnx")
    _fold(src, tmp_path / "x.onnx")
    assert stray.read_bytes() == b"\1" * 64


KILL = textwrap.dedent("""
    import os, signal, sys
    from dqtool.storage import commit
    from dqtool.cli import main

    where = os.environ["KILL_AT"]
    real_place, real_put = commit._place, commit._put_model

    def place(src, dst):
        real_place(src, dst)
        if where == "data":  # the new data is in place, the old model still is
            os.kill(os.getpid(), signal.SIGKILL)

    def put_model(src, out):
        real_put(src, out)
        if where == "model":  # the new model is in place, the old data not yet removed
            os.kill(os.getpid(), signal.SIGKILL)

    commit._place, commit._put_model = place, put_model
    sys.argv = ["dqtool", *sys.argv[1:]]
    main()
""")


def _killed(tmp_path: Path, kill_at: str, *args: str) -> None:
    script = tmp_path.parent / f"kill_{tmp_path.name}.py"
    script.write_text(KILL)
    res = subprocess.run([PY, str(script), *args], capture_output=True, text=True,
                         env={**os.environ, "KILL_AT": kill_at})
    assert res.returncode == -signal.SIGKILL, res.stderr


def _temps(folder: Path) -> list[Path]:
    return [p for p in folder.iterdir() if leftovers.TEMP_TAG in p.name]


def test_a_kill_after_the_model_is_placed_leaks_nothing(tmp_path):
    """Finding 3: killed after the new model is in place and before the old data is
    removed; the next save removes the old x.onnx.data (the journal says so)."""
    src = _save(tmp_path / "m.onnx", "m.onnx.data")
    out = _save(tmp_path / "x.onnx", "x.onnx.data", seed=1)
    size = (tmp_path / "x.onnx.data").stat().st_size
    _killed(tmp_path, "model", "fold", str(src), "-o", str(out), "--external-data")
    assert _loads(out) and "W_q" not in {t.name for t in onnx.load(out).graph.initializer}
    assert (tmp_path / "x.onnx.data").stat().st_size == size  # not yet removed
    assert len(_temps(tmp_path)) == 1
    storage.save(ir.load(src), tmp_path / "y.onnx")  # any save into the folder finishes it
    assert not (tmp_path / "x.onnx.data").exists()
    assert not _temps(tmp_path) and _loads(out)


def test_a_kill_after_the_data_is_placed_leaks_nothing(tmp_path):
    src = _save(tmp_path / "m.onnx", "m.onnx.data")
    out = _save(tmp_path / "x.onnx", "x.onnx.data", seed=1)
    before = {p.name for p in tmp_path.iterdir()}
    _killed(tmp_path, "data", "fold", str(src), "-o", str(out), "--external-data")
    placed = {p.name for p in tmp_path.iterdir()} - before - {p.name for p in _temps(tmp_path)}
    assert len(placed) == 1 and _loads(out)  # the old pair, and the new data beside it
    commit.clean_leftovers(tmp_path)
    assert {p.name for p in tmp_path.iterdir()} == before


def test_the_sweep_removes_only_the_very_files_the_journal_names(tmp_path):
    """A file put under a journaled name since the kill (another inode), or a model that
    started to read one, stays."""
    src = _save(tmp_path / "m.onnx", "m.onnx.data")
    out = _save(tmp_path / "x.onnx", "x.onnx.data", seed=1)
    _killed(tmp_path, "model", "fold", str(src), "-o", str(out), "--external-data")
    old = tmp_path / "x.onnx.data"
    content = old.read_bytes()
    old.unlink()
    old.write_bytes(content)  # the same name and bytes, another file
    commit.clean_leftovers(tmp_path)
    assert old.read_bytes() == content and not _temps(tmp_path)

    out2 = _save(tmp_path / "z.onnx", "z.onnx.data", seed=3)
    _killed(tmp_path, "data", "fold", str(src), "-o", str(out2), "--external-data")
    placed = [p for p in tmp_path.iterdir() if p.name.startswith("z.onnx.")
              and p.name != "z.onnx.data"]
    assert len(placed) == 1
    reader = _save(tmp_path / "reader.onnx", "reader.onnx.data", seed=4)
    proto = onnx.load(reader, load_external_data=False)
    proto.graph.initializer[0].external_data[0].value = placed[0].name
    onnx.save(proto, tmp_path / "reader.onnx")
    commit.clean_leftovers(tmp_path)
    assert placed[0].exists() and not _temps(tmp_path)


def test_a_torn_or_foreign_journal_removes_nothing(tmp_path):
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead = tmp_path / f".x.onnx{leftovers.TEMP_TAG}{gone.pid}-0badf00d"
    dead.mkdir()
    victim = tmp_path / "x.onnx.data"
    victim.write_bytes(b"keep")
    (dead / leftovers.JOURNAL).write_text('{"out": "x.onnx", "model": null, "placed": '
                                          '[["x.onnx.data", 1, 2, 3, 4]], "remove": []}')
    assert commit.clean_leftovers(tmp_path) == [dead]
    assert victim.read_bytes() == b"keep"  # not the inode the journal names
    dead.mkdir()
    (dead / leftovers.JOURNAL).write_text("{not json")
    assert commit.clean_leftovers(tmp_path) == [] and dead.exists()
    assert victim.read_bytes() == b"keep"
