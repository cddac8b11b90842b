"""``dqtool fold`` end to end: exit codes, files written (or not), external data."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest
from click.testing import CliRunner
from helpers import sha256

from dqtool.cli import cli

MODELS = Path(__file__).resolve().parent.parent / "models"
ENV = {"NO_COLOR": "1", "COLUMNS": "80"}


def run(*args: str):
    return CliRunner().invoke(cli, list(args), env=ENV)


def big_model(folder: Path, rows: int = 64, *, external: bool = True) -> Path:
    """Two int8 (rows, 32) per-axis weights in external data: X @ DQ(W) + X @ DQ(V)."""
    rng = np.random.default_rng(1)
    x = ir.Value(name="X", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([2, rows]))
    inits, nodes, mms = [], [], []
    for w in ("W", "V"):
        q = ir.Value(name=f"{w}_q",
                     const_value=ir.tensor(rng.integers(-128, 127, (rows, 32), np.int8)))
        s = ir.Value(name=f"{w}_s", const_value=ir.tensor(rng.random(32).astype(np.float32)))
        dq = ir.node("DequantizeLinear", [q, s], attributes={"axis": 1}, name=f"{w}_dq")
        dq.outputs[0].name = w
        mm = ir.node("MatMul", [x, dq.outputs[0]], name=f"{w}_mm")
        inits += [q, s]
        nodes += [dq, mm]
        mms.append(mm.outputs[0])
    add = ir.node("Add", mms, name="add")
    add.outputs[0].name, add.outputs[0].dtype = "Y", ir.DataType.FLOAT
    g = ir.Graph([x], add.outputs, nodes=[*nodes, add], initializers=inits,
                 opset_imports={"": 21})
    path = folder / "big.onnx"
    ir.save(ir.Model(g, ir_version=10), path,
            external_data="big.onnx.data" if external else None, size_threshold_bytes=64)
    return path


def test_default_output_next_to_input_and_input_untouched(tmp_path: Path) -> None:
    src = big_model(tmp_path)
    hashes = {p.name: sha256(p) for p in tmp_path.iterdir()}
    res = run("fold", str(src))
    assert res.exit_code == 0, res.output
    assert (tmp_path / "big.folded.onnx").is_file()
    assert {p.name: sha256(p) for p in tmp_path.iterdir() if p.name in hashes} == hashes
    assert "2 folded" in res.stdout


def test_streamed_external_output_equals_inline(tmp_path: Path, monkeypatch) -> None:
    from dqtool.folding import compute

    monkeypatch.setattr(compute, "CHUNK_ELEMENTS", 100)  # many chunks
    src = big_model(tmp_path, rows=50)
    res = run("fold", str(src), "-o", str(tmp_path / "ext.onnx"), "--external-data")
    assert res.exit_code == 0
    monkeypatch.setattr(compute, "CHUNK_ELEMENTS", 1 << 23)
    inline = big_model(tmp_path, rows=50, external=False)
    assert run("fold", str(inline), "-o", str(tmp_path / "in.onnx")).exit_code == 0
    a = ir.load(tmp_path / "ext.onnx").graph.initializers
    b = ir.load(tmp_path / "in.onnx").graph.initializers
    for name in ("W", "V"):
        assert a[name].const_value.numpy().tobytes() == b[name].const_value.numpy().tobytes()


def test_external_data_and_shards(tmp_path: Path) -> None:
    src = big_model(tmp_path, external=False)
    res = run("fold", str(src), "-o", str(tmp_path / "o.onnx"), "--shard-size", "4KiB",
              "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["external_data"] and len(doc["files"]) == 3  # two 8 KiB tensors, 4 KiB shards
    assert set(ir.load(tmp_path / "o.onnx").graph.initializers) >= {"W", "V"}
    res = run("fold", str(src), "-o", str(tmp_path / "e.onnx"), "--external-data")
    assert (tmp_path / "e.onnx.data").is_file()


def test_an_external_data_input_gives_an_external_data_output(tmp_path: Path) -> None:
    """Even when every external tensor of the input is folded away."""
    src = big_model(tmp_path, external=True)
    before = ir.load(src)
    assert any(isinstance(v.const_value, ir.ExternalTensor)
               for v in before.graph.initializers.values())
    res = run("fold", str(src), "-o", str(tmp_path / "o.onnx"), "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["external_data"] and (tmp_path / "o.onnx.data").is_file()
    out = ir.load(tmp_path / "o.onnx")
    assert all(isinstance(v.const_value, ir.ExternalTensor)
               for v in out.graph.initializers.values() if v.const_value.nbytes > 256)


def test_dry_run_writes_nothing(tmp_path: Path) -> None:
    src = big_model(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    res = run("fold", str(src), "--dry-run", "--json")
    assert res.exit_code == 0
    doc = json.loads(res.stdout)  # exactly one JSON document
    assert doc["dry_run"] and doc["summary"]["folded"] == 2
    assert doc["summary"]["bytes_after"] > doc["summary"]["bytes_before"]
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_in_place(tmp_path: Path) -> None:
    src = big_model(tmp_path, external=False)
    res = run("fold", str(src), "-o", str(src))
    assert res.exit_code == 2 and "--in-place" in res.stderr
    assert run("fold", str(src), "--in-place").exit_code == 0
    assert not [n for n in ir.load(src).graph if n.op_type == "DequantizeLinear"]


def _broken(tmp_path: Path, how: str) -> Path:
    src = big_model(tmp_path)
    data = tmp_path / "big.onnx.data"
    if how == "missing":
        data.unlink()
    elif how == "truncated":
        data.write_bytes(data.read_bytes()[:100])
    elif how == "escaping":
        text = src.read_bytes().replace(b"big.onnx.data", b"../x/onnx.data")
        src.write_bytes(text)
    return src


@pytest.mark.parametrize("how", ["missing", "truncated", "escaping"])
def test_bad_external_data_exits_2_one_line_nothing_written(tmp_path: Path, how: str) -> None:
    src = _broken(tmp_path, how)
    before = sorted(p.name for p in tmp_path.iterdir())
    res = run("fold", str(src), "-o", str(tmp_path / "o.onnx"))
    assert res.exit_code == 2
    assert res.stdout == ""
    assert len(res.stderr.strip().splitlines()) == 1 and res.stderr.startswith("dqtool: error:")
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_refused_exits_1_and_lists_the_reason(tmp_path: Path) -> None:
    res = run("fold", str(MODELS / "invalid_dq21_block_scale_shape.onnx"), "-o",
              str(tmp_path / "o.onnx"))
    assert res.exit_code == 1 and "refused W_DequantizeLinear" in res.stdout


def test_bad_options_exit_2(tmp_path: Path) -> None:
    src = str(MODELS / "dq13_int8_per_axis.onnx")
    assert run("fold", src, "--dry-run", "--x-types", "int33").exit_code == 2
    assert run("fold", src, "--dry-run", "--dtype", "float8").exit_code == 2
    assert run("fold", src, "-o", str(tmp_path / "o.onnx"), "--shard-size", "lots").exit_code \
        == 2
    assert run("fold", str(tmp_path / "nope.onnx")).exit_code == 2
    assert list(tmp_path.iterdir()) == []


def test_fold_does_not_import_onnxruntime() -> None:
    code = ("import dqtool.cli.fold_cmd, dqtool.folding, sys; "
            "from dqtool.folding import fold; import dqtool; dqtool.fold; "
            "assert 'onnxruntime' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_op_types_no_dequantize_feeds_warn_but_exit_0(tmp_path: Path) -> None:
    src = big_model(tmp_path)  # both DequantizeLinear nodes feed MatMul
    res = run("fold", str(src), "--op-types", "Bogus,MatMul", "--op-types", "matmul",
              "--dry-run", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["summary"]["folded"] == 2  # stdout stays one document
    (line,) = res.stderr.splitlines()
    assert line.startswith("dqtool: warning: --op-types Bogus,matmul:")
    assert "are: MatMul" in line and "did you mean MatMul?" in line
    res = run("fold", str(src), "--op-types", "Gemm", "--dry-run")
    assert res.exit_code == 0 and "Gemm" in res.stderr and "0 would fold" in res.stdout
    res = run("fold", str(src), "--op-types", "MatMul", "--dry-run")
    assert res.exit_code == 0 and res.stderr == ""


def test_a_dq_at_an_opset_before_it_existed_is_refused_with_that_reason(tmp_path):
    import onnx

    proto = onnx.parser.parse_model("""<ir_version: 4, opset_import: ["" : 9]>
        g (float[4] a) => (float[4] y) <int8[4] q = {1, 2, 3, 4}, float s = {0.5}> {
            w = DequantizeLinear(q, s)
            y = Add(a, w)
        }""")
    src = tmp_path / "op9.onnx"
    onnx.save(proto, src)
    r = CliRunner().invoke(cli, ["fold", str(src), "-o", str(tmp_path / "f.onnx")], env=ENV)
    assert r.exit_code == 1, r.output
    assert "refused" in r.stdout, r.stdout
    assert "ai.onnx DequantizeLinear does not exist at opset 9" in r.stdout, r.stdout
    assert "not constant" not in r.stdout


def test_op_types_of_a_fused_node_select_it_without_a_warning():
    # MatMulNBits answers to its own op type (it becomes DequantizeLinear + MatMul): the
    # warning said no DequantizeLinear fed it.
    src = Path(__file__).resolve().parents[1] / "models" / "ort_matmulnbits_4bit_sym_b32.onnx"
    res = run("fold", str(src), "--op-types", "MatMulNBits", "--dry-run", "--json")
    assert res.exit_code == 0 and res.stderr == ""
    doc = json.loads(res.stdout)
    assert doc["summary"]["folded"] == 2 and len(doc["fused_left"]) == 1  # the Gather
    res = run("fold", str(src), "--op-types", "Matmulnbits", "--dry-run")
    assert res.exit_code == 0 and "did you mean MatMulNBits?" in res.stderr
    res = run("fold", str(src), "--op-types", "MatMulNBits", "--dry-run")
    assert "0 left (0 refused), 1 fused left;" in res.stdout  # the Gather, counted


def test_a_model_object_with_external_data_folds_to_external_data(tmp_path):
    # dqtool.fold(ir.load(m), OUT) wrote OUT inline (its tensors, all replaced, no longer
    # said where they came from), where dqtool.upgrade of the same object wrote OUT.data.
    import onnx_ir as ir

    import dqtool

    src = big_model(tmp_path)
    assert (tmp_path / "big.onnx.data").exists()
    out = tmp_path / "o" / "f.onnx"
    out.parent.mkdir()
    report = dqtool.fold(ir.load(src), out)
    assert report.external_data and sorted(p.name for p in out.parent.iterdir()) == [
        "f.onnx", "f.onnx.data"]
    assert report.files == [str(out.parent / "f.onnx.data"), str(out)]
