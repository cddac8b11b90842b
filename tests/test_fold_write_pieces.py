"""A streamed fold hands each computed chunk to the file in pieces of
``write_pieces.WRITE_PIECE``: the file holds the same bytes whatever the piece size."""

from __future__ import annotations

from pathlib import Path

import onnx_ir as ir
from test_fold_cli import big_model, run


def test_pieces_smaller_than_a_chunk_write_the_same_bytes(tmp_path: Path, monkeypatch
                                                          ) -> None:
    from dqtool.folding import compute
    from dqtool.storage import write_pieces

    monkeypatch.setattr(compute, "CHUNK_ELEMENTS", 300)
    src = big_model(tmp_path, rows=50)
    assert run("fold", str(src), "-o", str(tmp_path / "whole.onnx")).exit_code == 0
    monkeypatch.setattr(write_pieces, "WRITE_PIECE", 13)  # not a divisor of a chunk's bytes
    assert run("fold", str(src), "-o", str(tmp_path / "pieces.onnx")).exit_code == 0
    a = ir.load(tmp_path / "whole.onnx").graph.initializers
    b = ir.load(tmp_path / "pieces.onnx").graph.initializers
    for name in ("W", "V"):
        want = a[name].const_value.numpy()
        assert want.size == 50 * 32
        assert b[name].const_value.numpy().tobytes() == want.tobytes()
