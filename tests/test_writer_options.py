"""Every command that writes a model takes the same writer options, with the same effect."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner

from dqtool.cli import cli

MODELS = Path(__file__).resolve().parent.parent / "models"
WRITER = {"-o", "--output", "--in-place", "--json", "--external-data", "--shard-size",
          "--progress", "--no-progress"}
COMMANDS = {"fold": [], "upgrade": ["--opset", "21"], "downgrade": ["--opset", "13"]}


def _options(command: str) -> set[str]:
    cmd = cli.get_command(None, command)  # type: ignore[arg-type]
    return {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_writer_has_the_writer_options(command):
    assert _options(command) >= WRITER


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_external_data_and_shards(command, tmp_path):
    src = MODELS / ("ort_qdq_per_channel.onnx" if command != "downgrade"
                    else "ort_int4_blocked_qdq.onnx")
    out = tmp_path / "o.onnx"
    r = CliRunner().invoke(cli, [command, str(src), *COMMANDS[command], "-o", str(out),
                                 "--shard-size", "100B", "--json", "--no-progress"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["external_data"] is True
    files = {Path(f) for f in doc["files"]}
    data = files - {out}
    # onnx_ir shards the tensors past its external-data threshold, one file each here
    # (each is larger than 100 bytes); one such tensor keeps the plain name.
    assert out in files and data and all(f.exists() for f in data)
    assert len(data) == 1 or all("-of-" in f.name for f in data)
    if command == "fold":
        assert len(data) == 3
    onnx.checker.check_model(onnx.load(str(out)))

    forced = tmp_path / "e.onnx"
    r = CliRunner().invoke(cli, [command, str(src), *COMMANDS[command], "-o", str(forced),
                                 "--external-data", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["external_data"] is True
    assert any(t.data_location == onnx.TensorProto.EXTERNAL
               for t in onnx.load(str(forced), load_external_data=False).graph.initializer)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_bad_shard_size_is_one_line_exit_2(command, tmp_path):
    r = CliRunner().invoke(cli, [command, str(MODELS / "ort_qdq_per_channel.onnx"),
                                 *COMMANDS[command], "-o", str(tmp_path / "o.onnx"),
                                 "--shard-size", "lots"])
    assert r.exit_code == 2 and "--shard-size: cannot read 'lots'" in r.output
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_external_data_of_only_small_tensors_leaves_no_empty_data_file(command, tmp_path):
    # Every tensor stays inline (each is at most 256 bytes): an empty OUT.data was left
    # beside the model, referenced by nothing, and the report said external_data: true.
    src = tmp_path / "m.onnx"
    proto = onnx.load(MODELS / "dq21_int4_blocked_ragged.onnx")
    assert max(len(t.raw_data) for t in proto.graph.initializer) <= 256
    onnx.save(proto, src, save_as_external_data=True, all_tensors_to_one_file=True,
              location="m.data", size_threshold=0)
    assert (tmp_path / "m.data").stat().st_size > 0
    out = tmp_path / "o.onnx"
    args = COMMANDS[command] if command != "downgrade" else ["--opset", "21"]
    r = CliRunner().invoke(cli, [command, str(src), *args, "-o", str(out),
                                 "--external-data", "--json", "--no-progress"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["files"] == [str(out)] and doc["external_data"] is False
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.data", "m.onnx", "o.onnx"]
    onnx.checker.check_model(onnx.load(out))
