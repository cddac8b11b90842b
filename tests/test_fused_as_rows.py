"""MatMulNBits lowered to per-axis rows (``upgrade --per-axis``, and below opset 21): the
rows of a weight blocked along K are B's own rows, so they are B's stored bytes (widened
to 8 bits below 21), never B transposed to ai.onnx's (K, N) and transposed back. Until
2026-11-27 (`b9a228a`) they were: `upgrade --per-axis` of the 1.9 GB bench model took 31-54 s
against ~1 s, `downgrade --opset 19` 12.7 s and 285 MB against 3 s and 46 MB."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from helpers.fused import gbq_model, nbits_inputs, nbits_model

import dqtool
from dqtool import transposes
from dqtool.checking import check
from dqtool.families.fused import packing


def _external(model: onnx.ModelProto, path) -> None:
    onnx.save_model(model, path, save_as_external_data=True, location=path.name + ".data",
                    size_threshold=0)


def _initializers(path) -> dict[str, onnx.TensorProto]:
    return {t.name: t for t in onnx.load(str(path)).graph.initializer}


def _no_transpose(monkeypatch) -> None:
    for name in ("transpose_codes", "transpose_codes_numpy"):
        monkeypatch.setattr(transposes, name, lambda *a, **k: pytest.fail("transposed"))
    monkeypatch.setattr(packing, "nbits_to_onnx", lambda *a, **k: pytest.fail("transposed"))


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("external", [True, False])
def test_per_axis_rows_of_a_matmul_nbits_are_its_b(tmp_path, monkeypatch, bits, external):
    k, n, block = 128, 24, 32
    inputs = nbits_inputs(np.random.default_rng(bits), k, n, bits, block)
    src = tmp_path / "m.onnx"
    model = nbits_model(k, n, bits, block, inputs, opset=25 if bits == 2 else 21)
    _external(model, src) if external else onnx.save(model, src)
    out = tmp_path / "out.onnx"
    _no_transpose(monkeypatch)
    report = dqtool.upgrade(str(src), 25 if bits == 2 else 21, str(out), per_axis=True)
    monkeypatch.undo()
    assert any(f"per-axis rows ({n * k // block}, {block})" in c.how for c in report.changes)
    got = _initializers(out)
    (x,) = [t for name, t in got.items() if name.endswith("x_rows")]
    (s,) = [t for name, t in got.items() if name.endswith("scale_rows")]
    assert list(x.dims) == [n * k // block, block] and x.raw_data == inputs["B"].tobytes()
    assert list(s.dims) == [n * k // block] and s.raw_data == inputs["scales"].tobytes()
    assert check(str(out), against=str(src)).passed


def test_per_axis_rows_of_a_ragged_k_are_laid_out_as_before(tmp_path):
    # K not a whole number of blocks: B's last block is padded with zeros, the rows with the
    # zero point; laid out from the codes (no shortcut), still exact.
    k, n, block = 100, 16, 32
    inputs = nbits_inputs(np.random.default_rng(7), k, n, 4, block)
    src = tmp_path / "m.onnx"
    onnx.save(nbits_model(k, n, 4, block, inputs), src)
    out = tmp_path / "out.onnx"
    report = dqtool.upgrade(str(src), 21, str(out), per_axis=True)
    assert any("ragged last block padded by 28" in c.how for c in report.changes)
    assert check(str(out), against=str(src)).passed


@pytest.mark.parametrize("external", [True, False])
def test_below_21_the_rows_are_b_widened(tmp_path, monkeypatch, external):
    k, n, block = 128, 24, 32
    inputs = nbits_inputs(np.random.default_rng(3), k, n, 4, block)
    src = tmp_path / "m.onnx"
    model = nbits_model(k, n, 4, block, inputs)
    _external(model, src) if external else onnx.save(model, src)
    out = tmp_path / "out.onnx"
    _no_transpose(monkeypatch)
    dqtool.downgrade(str(src), 19, str(out))
    monkeypatch.undo()
    got = _initializers(out)
    (x,) = [t for t in got.values() if t.data_type == onnx.TensorProto.UINT8
            and list(t.dims) == [n * k // block, block]]
    codes = packing.unpack(inputs["B"].reshape(n, -1), 4)
    assert x.raw_data == codes.tobytes()
    assert check(str(out), against=str(src)).passed


def test_below_21_a_gather_block_quantized_table_is_widened_from_its_file(tmp_path,
                                                                          monkeypatch):
    """The table's int4 codes become int8 a band at a time from the data file (they were
    unpacked whole, twice, in memory)."""
    from dqtool.storage import tensor_reads

    rng = np.random.default_rng(2)
    table = rng.integers(-8, 8, (64, 32), dtype=np.int8)
    scales = (rng.random((64, 2)) + 0.01).astype(np.float32)
    src = tmp_path / "m.onnx"
    _external(gbq_model(table.astype(ml_dtypes.int4), scales, None, block=16), src)
    written = []
    real = tensor_reads.WidenedCodes.tofile
    monkeypatch.setattr(tensor_reads.WidenedCodes, "tofile",
                        lambda self, f: written.append(self.count) or real(self, f))
    out = tmp_path / "out.onnx"
    dqtool.downgrade(str(src), 19, str(out))
    assert written == [64 * 32]
    got = _initializers(out)
    (x,) = [t for t in got.values() if t.data_type == onnx.TensorProto.INT8]
    assert x.raw_data == table.tobytes()
    assert check(str(out), against=str(src)).passed


def test_these_conversions_do_not_write_the_transposed_weights_early():
    """The data file's writers start before the conversion only where the new weights are
    kept as made (upgrade to 21+ without --per-axis); else the input's copy is kept."""
    import onnx_ir as ir

    from dqtool.convert import _rewrites_most, default_registry
    from dqtool.convert.context import Options

    model = ir.serde.deserialize_model(nbits_model(64, 8, 4, 32, nbits_inputs(
        np.random.default_rng(0), 64, 8, 4, 32)))
    reg = default_registry()
    assert _rewrites_most(model, Options(), 21, reg)
    assert not _rewrites_most(model, Options(per_axis=True), 21, reg)
    assert not _rewrites_most(model, Options(), 20, reg)
    assert not _rewrites_most(model, Options(keep_contrib=True), 21, reg)


def test_pack_of_per_axis_rows_says_how_to_get_a_packable_form(tmp_path):
    inputs = nbits_inputs(np.random.default_rng(9), 64, 8, 4, 32)
    src = tmp_path / "m.onnx"
    onnx.save(nbits_model(64, 8, 4, 32, inputs), src)
    dqtool.upgrade(str(src), 21, str(tmp_path / "u.onnx"), per_axis=True)
    report = dqtool.pack(str(tmp_path / "u.onnx"), str(tmp_path / "p.onnx"))
    assert not report.packed
    assert any("`dqtool upgrade --opset 21` of the original, without --per-axis" in s.why
               for s in report.skipped)
