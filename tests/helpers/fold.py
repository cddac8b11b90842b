"""Fold tests: run a model in onnxruntime (ORT_DISABLE_ALL) on fixed inputs
and compare two models' outputs bit for bit."""

from __future__ import annotations

import hashlib
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx

_NP = {
    onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.FLOAT16: np.float16,
    onnx.TensorProto.BFLOAT16: ml_dtypes.bfloat16, onnx.TensorProto.DOUBLE: np.float64,
    onnx.TensorProto.INT64: np.int64, onnx.TensorProto.INT32: np.int32,
    onnx.TensorProto.INT8: np.int8, onnx.TensorProto.UINT8: np.uint8,
    onnx.TensorProto.BOOL: np.bool_,
}


def sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def feeds(path: str | Path, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs for every graph input that is not an initializer, symbolic dims = 2."""
    m = onnx.load(str(path), load_external_data=False)
    inits = {i.name for i in m.graph.initializer}
    rng = np.random.default_rng(seed)
    out = {}
    for vi in m.graph.input:
        if vi.name in inits:
            continue
        t = vi.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else 2 for d in t.shape.dim]
        dt = _NP[t.elem_type]
        if dt is np.bool_:
            out[vi.name] = np.array(True) if not shape else rng.random(shape) > 0.5
        elif np.issubdtype(np.dtype(dt), np.integer):
            out[vi.name] = np.full(shape, 3, dt)  # loop trip counts and the like
        else:
            out[vi.name] = rng.standard_normal(shape).astype(dt)
    return out


def run_ort(model: str | Path | onnx.ModelProto, inputs: dict[str, np.ndarray]
            ) -> list[np.ndarray]:
    """Every output of ``model`` (a path or a ModelProto) on onnxruntime, CPU, one thread,
    ORT_DISABLE_ALL."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    sess = ort.InferenceSession(source, so, providers=["CPUExecutionProvider"])
    return sess.run(None, inputs)


def ort_runs(path: str | Path) -> bool:
    try:
        run_ort(path, feeds(path))
    except Exception:
        return False
    return True


def assert_bitwise_equal(a: list[np.ndarray], b: list[np.ndarray]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert x.tobytes() == y.tobytes(), f"max diff {np.max(np.abs(x - y))}"
