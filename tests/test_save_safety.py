"""What a save may write over, and what a crash or a concurrent writer leaves behind:
never a non-regular file, never a model beside another save's data, no leftovers after
the next run. DQTOOL_SLOW=1 kills and races more runs."""

from __future__ import annotations

import fcntl
import os
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import numpy_helper

from dqtool import storage
from dqtool.errors import InputError, UsageError
from dqtool.storage import commit, leftovers

PY = sys.executable
SLOW = bool(os.environ.get("DQTOOL_SLOW"))


def _model(path: Path, rows: int = 256, cols: int = 256, *, external: bool = False,
           seed: int = 0) -> Path:
    """X @ DequantizeLinear(W): an int8 per-axis weight of rows x cols."""
    rng = np.random.default_rng(seed)
    q = rng.integers(-128, 128, (rows, cols), dtype=np.int8)
    s = (rng.random(cols) + 0.01).astype(np.float32)
    x = ir.Value(name="X", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([1, rows]))
    qv = ir.Value(name="W_q", const_value=ir.tensor(q))
    sv = ir.Value(name="W_s", const_value=ir.tensor(s))
    dq = ir.node("DequantizeLinear", [qv, sv], attributes={"axis": 1}, name="dq")
    mm = ir.node("MatMul", [x, dq.outputs[0]], name="mm")
    mm.outputs[0].name, mm.outputs[0].dtype = "Y", ir.DataType.FLOAT
    g = ir.Graph([x], [mm.outputs[0]], nodes=[dq, mm], initializers=[qv, sv],
                 opset_imports={"": 21}, name="g")
    if external:
        ir.save(ir.Model(g, ir_version=10), path, external_data=f"{path.name}.data")
    else:
        ir.save(ir.Model(g, ir_version=10), path)
    return path


def _run(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "dqtool", *args], capture_output=True, text=True,
                          **kw)


def _weights(path: Path) -> dict[str, np.ndarray]:
    proto = onnx.load(path)  # with its external data: fails if a file is missing
    return {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if commit.TEMP_TAG in p.name)


# Never replace what is not a regular file.
@pytest.mark.parametrize("command", [["fold"], ["upgrade", "--opset", "23"],
                                     ["downgrade", "--opset", "19"]])
def test_fifo_and_socket_outputs_are_refused(tmp_path, command):
    src = _model(tmp_path / "m.onnx")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    sock_path = tmp_path / "sock"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(sock_path))
    try:
        for out, kind in [(fifo, "a FIFO"), (sock_path, "a socket")]:
            res = _run(command[0], str(src), *command[1:], "-o", str(out))
            assert res.returncode == 2, res.stderr
            assert res.stderr.strip().splitlines() == [
                f"dqtool: error: {out}: is {kind}, not a regular file; dqtool writes only "
                "regular files and never replaces anything else; nothing was written"]
        assert fifo.is_fifo() and sock_path.is_socket()
        assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "m.onnx", "sock"]
    finally:
        sock.close()


@pytest.mark.skipif(os.geteuid() != 0 or not os.access("/dev/null", os.W_OK),
                    reason="replacing a device node needs root")
@pytest.mark.parametrize("device", ["/dev/null", "/dev/full"])
def test_device_outputs_are_refused_as_root(tmp_path, device):
    before = os.stat(device)
    src = _model(tmp_path / "m.onnx")
    for command in (["fold"], ["upgrade", "--opset", "23"]):
        res = _run(command[0], str(src), *command[1:], "-o", device)
        assert res.returncode == 2
        assert res.stderr.strip() == (f"dqtool: error: {device}: is a character device, not "
                                      "a regular file; dqtool writes only regular files and "
                                      "never replaces anything else; nothing was written")
    after = os.stat(device)
    assert (after.st_ino, after.st_rdev, after.st_mode) == (before.st_ino, before.st_rdev,
                                                             before.st_mode)
    assert not [p for p in Path("/dev").iterdir() if commit.TEMP_TAG in p.name]


def test_a_directory_output_is_refused(tmp_path):
    src = _model(tmp_path / "m.onnx")
    (tmp_path / "d").mkdir()
    res = _run("fold", str(src), "-o", str(tmp_path / "d"))
    assert res.returncode == 2
    assert "is a directory" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert list((tmp_path / "d").iterdir()) == []


@pytest.mark.parametrize("command", [["fold"], ["upgrade", "--opset", "23"], ["pack"]])
def test_a_read_only_model_is_not_replaced_even_in_place(tmp_path, command):
    src = _model(tmp_path / "m.onnx")
    other = tmp_path / "o.onnx"
    other.write_bytes(b"kept")
    before = src.read_bytes()
    for path in (src, other):
        os.chmod(path, 0o444)
    for out, extra in ((src, ["--in-place"]), (other, ["-o", str(other)])):
        res = _run(command[0], str(src), *command[1:], *extra)
        assert res.returncode == 2, res.stderr
        assert res.stderr.strip().splitlines() == [
            f"dqtool: error: {out}: is read-only; make it writable to replace it; nothing "
            "was written"]
    assert src.read_bytes() == before and stat.S_IMODE(os.stat(src).st_mode) == 0o444
    assert other.read_bytes() == b"kept"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "o.onnx"]


@pytest.mark.parametrize("command", [["upgrade", "--opset", "23"], ["downgrade", "--opset", "19"],
                                     ["fold"], ["pack"], ["qdq"]])
def test_in_place_with_another_output_is_refused_before_anything_is_written(tmp_path, command):
    # upgrade and downgrade used to overwrite the input and drop -o, exit 0.
    src = _model(tmp_path / "m.onnx", external=True)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    res = _run(command[0], str(src), *command[1:], "--in-place", "-o", str(tmp_path / "o.onnx"))
    assert res.returncode == 2, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "--in-place" in res.stderr
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


@pytest.mark.parametrize("command", [["upgrade", "--opset", "23"], ["fold"]])
def test_a_replaced_private_models_data_stays_private(tmp_path, command):
    # The model kept 600, its new data file came out 644 (world-readable weights).
    src = _model(tmp_path / "m.onnx", external=True)
    for p in tmp_path.iterdir():
        os.chmod(p, 0o600)
    res = _run(command[0], str(src), *command[1:], "--in-place")
    assert res.returncode == 0, res.stderr
    files = sorted(tmp_path.iterdir())
    assert len(files) == 2 and any(p.name.endswith(".data") for p in files)
    assert {p.name: stat.S_IMODE(os.stat(p).st_mode) for p in files} == {
        p.name: 0o600 for p in files}


def test_a_replaced_model_keeps_its_permissions(tmp_path):
    src = _model(tmp_path / "m.onnx")
    os.chmod(src, 0o600)
    res = _run("upgrade", str(src), "--opset", "23", "--in-place")
    assert res.returncode == 0, res.stderr
    assert stat.S_IMODE(os.stat(src).st_mode) == 0o600
    assert onnx.load(src).opset_import[0].version == 23


@pytest.mark.parametrize("command", [["fold"], ["upgrade", "--opset", "23"]])
def test_an_output_ending_in_a_slash_is_a_folder_not_a_file(tmp_path, command):
    src = _model(tmp_path / "m.onnx")
    res = _run(command[0], str(src), *command[1:], "-o", "newdir/", cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().splitlines() == [
        "dqtool: error: newdir/: output folder newdir/ does not exist (and an output ending "
        "in '/' names a folder, not a file)"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_output_path_keeps_plain_names():
    assert storage.output_path("a/b.onnx") == Path("a/b.onnx")
    with pytest.raises(InputError):
        storage.output_path("no-such-folder-here/")
    with pytest.raises(UsageError, match="is a directory"):
        storage.output_path("/tmp/")


# Crash leftovers.
def test_dead_runs_temporary_folders_are_removed_by_the_next_save(tmp_path):
    src = _model(tmp_path / "m.onnx")
    gone = subprocess.Popen(["true"])
    gone.wait()  # a process that has ended: its folder is a leftover
    dead = tmp_path / f".out.onnx{commit.TEMP_TAG}{gone.pid}-0badf00d"
    dead.mkdir()
    (dead / "out.onnx.data").write_bytes(b"\0" * 1000)
    live = tmp_path / f".out.onnx{commit.TEMP_TAG}{os.getpid()}-feedbeef"
    live.mkdir()
    fd = os.open(live, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a live run holds its folder
    # a live run's folder made a moment ago, before its lock is taken
    unlocked = tmp_path / f".out.onnx{commit.TEMP_TAG}{os.getpid()}-0dd0dd00"
    unlocked.mkdir()
    unrelated = tmp_path / ".out.onnx.abcdefgh"  # not dqtool's: never touched
    unrelated.mkdir()
    try:
        res = _run("fold", str(src), "-o", str(tmp_path / "out.onnx"))
        assert res.returncode == 0, res.stderr
        assert not dead.exists()
        assert live.exists() and unlocked.exists() and unrelated.exists()
    finally:
        os.close(fd)
    assert commit.clean_leftovers(tmp_path) == []  # a live process's: never removed


def test_a_dead_processs_folder_is_removed_even_if_its_pid_is_reused(tmp_path):
    """The lock decides: a folder nobody locks whose named process is gone is removed."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead = tmp_path / f".x.onnx{commit.TEMP_TAG}{gone.pid}-12345678"
    dead.mkdir()
    locked = tmp_path / f".x.onnx{commit.TEMP_TAG}{gone.pid}-87654321"
    locked.mkdir()
    fd = os.open(locked, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        assert commit.clean_leftovers(tmp_path) == [dead]
        assert locked.exists()
    finally:
        os.close(fd)


KILL_DURING_COMMIT = textwrap.dedent("""
    import os, signal, sys
    from dqtool.storage import commit
    from dqtool.cli import main

    where = os.environ["KILL_AT"]
    real_place, real_put = commit._place, commit._put_model

    def place(src, dst):  # the new data is in place, the old model still is
        real_place(src, dst)
        if where == "data":
            os.kill(os.getpid(), signal.SIGKILL)

    def put_model(src, out):  # about to put the model in place
        if where == "model":
            os.kill(os.getpid(), signal.SIGKILL)
        real_put(src, out)

    commit._place, commit._put_model = place, put_model
    sys.argv = ["dqtool", *sys.argv[1:]]
    main()
""")


# An inline save places no data file, so "data" is killed only with external data.
@pytest.mark.parametrize(("external", "in_place", "kill_at"), [
    pytest.param(external, in_place, kill_at,
                 id=f"{kill_at}-{'in-place' if in_place else 'out'}-"
                    f"{'external' if external else 'inline'}")
    for external in (False, True) for in_place in (False, True)
    for kill_at in ("model", "data") if external or kill_at == "model"])
def test_sigkill_inside_a_commit_leaves_the_old_pair(tmp_path, external, in_place, kill_at):
    src = _model(tmp_path / "m.onnx", external=external)
    out = src if in_place else _model(tmp_path / "out.onnx", external=external, seed=1)
    before = _weights(out)
    files_before = sorted(p.name for p in tmp_path.iterdir())
    args = ["fold", str(src), *(["--in-place"] if in_place else ["-o", str(out)])]
    script = tmp_path.parent / f"kill_{tmp_path.name}.py"
    script.write_text(KILL_DURING_COMMIT)
    res = subprocess.run([PY, str(script), *args], capture_output=True, text=True,
                         env={**os.environ, "KILL_AT": kill_at})
    assert res.returncode == -signal.SIGKILL, res.stderr
    after = _weights(out)  # the old model, with its own data, whole
    assert after.keys() == before.keys()
    for name, value in before.items():
        np.testing.assert_array_equal(after[name], value)
    # the next run removes what the killed one left, and writes the new pair
    assert _leftovers(tmp_path)
    res = _run(*args)
    assert res.returncode == 0, res.stderr
    assert not _leftovers(tmp_path)
    assert "W_q" not in _weights(out)  # folded
    names = sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".py"))
    referenced = {e.value for t in onnx.load(out, load_external_data=False).graph.initializer
                  for e in t.external_data if e.key == "location"}
    others = {n for n in files_before if n != out.name and not n.startswith(out.name)}
    assert set(names) == {out.name, *referenced, *others}, (names, referenced)


KILL_SCRIPT_MODEL_ROWS = 2048


@pytest.mark.parametrize("external", [False, True], ids=["inline", "external"])
@pytest.mark.parametrize("in_place", [False, True], ids=["out", "in-place"])
def test_sigkill_at_any_time_never_leaves_a_mix(tmp_path, external, in_place):
    src = _model(tmp_path / "m.onnx", KILL_SCRIPT_MODEL_ROWS, 1024, external=external)
    out = src if in_place else tmp_path / "out.onnx"
    old = _weights(src)
    args = ["fold", str(src), *(["--in-place"] if in_place else ["-o", str(out)])]
    rng = np.random.default_rng(1)
    delays = sorted(rng.uniform(0.2, 1.5, 12 if SLOW else 3))
    new = None
    for delay in delays:
        proc = subprocess.Popen([PY, "-m", "dqtool", *args], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if not out.exists():
            continue
        got = _weights(out)  # loads whole: the model's data is there
        if "W_q" in got:  # the old model (in place): its values untouched
            np.testing.assert_array_equal(got["W_q"], old["W_q"])
        else:
            new = new or got
            for name in got:
                np.testing.assert_array_equal(got[name], new[name])
        if in_place and "W_q" not in got:
            break  # the input is folded now
    res = _run(*args)
    assert res.returncode == 0 or (in_place and res.returncode in (0, 1)), res.stderr
    assert not _leftovers(tmp_path)


def test_concurrent_writers_leave_one_complete_model(tmp_path):
    src = _model(tmp_path / "m.onnx", 512, 512, external=True)
    out = tmp_path / "out.onnx"
    expected = {}
    for dtype in ("float32", "float16"):
        ref = tmp_path / f"ref_{dtype}.onnx"
        assert _run("fold", str(src), "-o", str(ref), "--dtype", dtype).returncode == 0
        expected[dtype] = _weights(ref)
    for _ in range(6 if SLOW else 2):
        procs = [subprocess.Popen([PY, "-m", "dqtool", "fold", str(src), "-o", str(out),
                                   "--dtype", dtype, "--external-data"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                 for dtype in ("float32", "float16", "float32", "float16")]
        for p in procs:
            assert p.wait() == 0, p.stderr.read()
        got = _weights(out)
        matches = [d for d, w in expected.items()
                   if w.keys() == got.keys()
                   and all(np.array_equal(w[k], got[k]) for k in w)]
        assert len(matches) == 1
        referenced = {e.value for t in onnx.load(out, load_external_data=False)
                      .graph.initializer for e in t.external_data if e.key == "location"}
        data = {p.name for p in tmp_path.iterdir() if p.name.startswith("out.onnx.")}
        assert data == referenced  # no data file of another writer left
        assert not _leftovers(tmp_path)


def test_without_file_locks_the_owners_pid_decides(tmp_path, monkeypatch):
    """A file system (or platform) without flock: saves still work, a live run's folder
    is kept, a dead run's removed."""
    monkeypatch.setattr(leftovers, "fcntl", None)
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead = tmp_path / f".o.onnx{commit.TEMP_TAG}{gone.pid}-12345678"
    live = tmp_path / f".o.onnx{commit.TEMP_TAG}{os.getpid()}-87654321"
    dead.mkdir()
    live.mkdir()
    model = storage.load(_model(tmp_path / "m.onnx"))
    assert [p.name for p in storage.save(model, tmp_path / "o.onnx")] == ["o.onnx"]
    assert not dead.exists() and live.exists()
