"""The fold's fast paths give the same bytes as the plain ones.

* packed (4-bit, 2-bit) sources in external data are read row slice by row slice, and
  fall back to one whole unpack when a slice would start inside a byte;
* streaming in chunks keeps their order, and a failed write stops the computing.
"""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import onnx_ir as ir
import pytest

from dqtool import kernel, storage
from dqtool.folding import compute, fold
from dqtool.folding.kernel_call import KernelCall

RNG = np.random.default_rng(7)

# (name, ml_dtypes type, low, high): the packed types the kernel dequantizes.
PACKED = [("int4", ml_dtypes.int4, -8, 8), ("uint4", ml_dtypes.uint4, 0, 16),
          ("int2", ml_dtypes.int2, -2, 2), ("uint2", ml_dtypes.uint2, 0, 4)]


def _model(folder: Path, q: np.ndarray, scale: np.ndarray, attrs: dict) -> Path:
    two_bit = q.dtype in (np.dtype(ml_dtypes.int2), np.dtype(ml_dtypes.uint2))
    opset, ir_version = (25, 13) if two_bit else (21, 11)  # 2-bit types came with opset 25
    qv = ir.Value(name="W_q", const_value=ir.tensor(q))
    sv = ir.Value(name="W_s", const_value=ir.tensor(scale))
    dq = ir.node("DequantizeLinear", [qv, sv], attributes=attrs, name="W_dq")
    dq.outputs[0].name = "W"
    dq.outputs[0].dtype = ir.DataType.FLOAT
    g = ir.Graph([], [dq.outputs[0]], nodes=[dq], initializers=[qv, sv],
                 opset_imports={"": opset})
    path = folder / "m.onnx"
    ir.save(ir.Model(g, ir_version=ir_version), path, external_data="m.onnx.data",
            size_threshold_bytes=0)
    return path


def _folded(path: Path, out: Path) -> np.ndarray:
    fold(path, out, external_data=True)
    return ir.load(out).graph.initializers["W"].const_value.numpy()


@pytest.mark.parametrize(("name", "dt", "lo", "hi"), PACKED)
@pytest.mark.parametrize("shape", [(64, 6), (37, 5), (33, 1), (9, 7)])
@pytest.mark.parametrize("blocked", [False, True])
def test_packed_external_rows_equal_whole(tmp_path: Path, monkeypatch, name, dt, lo, hi,
                                          shape, blocked) -> None:
    x = RNG.integers(lo, hi, shape).astype(dt)
    if blocked:
        scale = RNG.random((-(-shape[0] // 4), shape[1])).astype(np.float32) + 0.01
        attrs = {"axis": 0, "block_size": 4}
    else:
        scale = RNG.random(shape[1]).astype(np.float32) + 0.01
        attrs = {"axis": 1}
    want = kernel.dequantize(x, scale, axis=attrs["axis"],
                             block_size=attrs.get("block_size", 0))
    src = _model(tmp_path, x, scale, attrs)
    monkeypatch.setattr(compute, "CHUNK_ELEMENTS", 13)  # many chunks, some mid-byte
    got = _folded(src, tmp_path / "out.onnx")
    assert got.tobytes() == want.tobytes()


def test_read_rows_slices_packed_and_refuses_mid_byte(tmp_path: Path) -> None:
    x = RNG.integers(-8, 8, (9, 3)).astype(ml_dtypes.int4)
    src = _model(tmp_path, x, np.float32(0.5) * np.ones(3, np.float32), {"axis": 1})
    t = storage.load(src).graph.initializers["W_q"].const_value
    assert isinstance(t, ir.ExternalTensor)
    et = compute.types.from_ir(t.dtype)
    assert et is not None
    got = compute._read_rows(t, et, 2, 6)  # 6 elements in: a byte boundary
    assert got is not None and got.tobytes() == x[2:6].tobytes()
    assert compute._read_rows(t, et, 1, 3) is None  # starts at element 3: mid-byte
    last = compute._read_rows(t, et, 4, 9)  # ends on the padded last byte
    assert last is not None and last.tobytes() == x[4:9].tobytes()


def _folding(rows: int = 40) -> compute.Folding:
    x = RNG.integers(-128, 128, (rows, 8)).astype(np.int8)
    step = KernelCall("dq", ir.tensor(np.float32(0.25)), None, 1, 0, "per-tensor", None,
                        np.dtype(np.float32))
    return compute.Folding(ir.tensor(x), (step,), x.shape, np.dtype(np.float32),
                           np.dtype(np.float32))


def test_chunked_write_keeps_order(monkeypatch) -> None:
    folding = _folding()
    monkeypatch.setattr(compute, "CHUNK_ELEMENTS", 16)
    parts: list[bytes] = []
    folding.write(lambda b: parts.append(bytes(b)))
    assert len(parts) == 20
    assert b"".join(parts) == folding.compute().tobytes()


def test_failed_write_is_raised_and_stops_computing(monkeypatch) -> None:
    folding = _folding()
    monkeypatch.setattr(compute, "CHUNK_ELEMENTS", 16)
    computed = 0
    real = folding.compute

    def counting(r0=None, r1=None):
        nonlocal computed
        computed += 1
        return real(r0, r1)

    monkeypatch.setattr(folding, "compute", counting)

    def sink(b: memoryview) -> None:
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        folding.write(sink)
    assert computed == 1  # stopped at the first failed write, not after all 20 chunks
    assert folding._source_cache is None
