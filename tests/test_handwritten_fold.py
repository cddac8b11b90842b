"""``dqtool.handwritten.fold_values``: the float weight of each constant hand-written
dequantization, the bytes onnxruntime (ORT_DISABLE_ALL) and the reference evaluator give
the original."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto as TP
from test_handwritten_models import S12, X8, H, cast_mul, feeds, model, run_ort, run_ref, same_bits
from test_handwritten_recognize import blocked, nibbles
from test_handwritten_rewrite import S16, U8

from dqtool.handwritten import fold_values

OUTPUT_CASES = {
    "per-axis": lambda: cast_mul(X8, S12.reshape(1, 12), swap=True),
    "uint8 zero point": lambda: cast_mul(U8, S12.reshape(1, 12),
                                         zp=np.arange(12, dtype=np.float32) + 120),
    "integer Sub that wraps": lambda: cast_mul(X8, np.float32(0.3), zp=np.int8(100),
                                               zp_where="before"),
    "blocked": blocked,
    "int4 unpacked": nibbles,
    "float16": lambda: cast_mul(U8, S16.reshape(1, 12), ft="float16", zp=np.float16(131),
                                opset=23),
}


@pytest.mark.parametrize("name", sorted(OUTPUT_CASES))
def test_weight_is_what_both_runtimes_compute(name: str) -> None:
    m = OUTPUT_CASES[name]()
    [f] = fold_values(ir.from_proto(m))
    assert f.foldable and f.reason is None
    w = f.weight()
    assert w.shape == f.shape
    assert same_bits([w], run_ort(m, {})) and same_bits([w], run_ref(m, {}))


def test_float16_folds_to_float32_and_a_cast() -> None:
    """The folded form of a float16 pattern feeding a MatMul: its float32 constant and a
    Cast to float16 give the original's bits on both runtimes (a float16 constant would
    not on onnxruntime: test_handwritten_rewrite measures why)."""
    m = cast_mul(X8, S16.reshape(1, 12), ft="float16", consumer="MatMul", opset=23)
    [f] = fold_values(ir.from_proto(m))
    assert (f.dtype, f.cast_to) == ("float", "float16")
    const = f.compute()
    assert const.dtype == np.float32
    folded = model([H("Cast", ["w32"], ["w"], to=TP.FLOAT16), H("MatMul", ["A", "w"], ["y"])],
                   {"w32": const}, "y", TP.FLOAT16, inputs=list(m.graph.input), opset=23)
    inputs = feeds(m)
    assert same_bits(run_ort(folded, inputs), run_ort(m, inputs))
    assert same_bits(run_ref(folded, inputs), run_ref(m, inputs))


def test_float32_weight_feeding_a_matmul() -> None:
    m = cast_mul(U8, S12.reshape(1, 12), zp=np.float32(128), consumer="MatMul")
    [f] = fold_values(ir.from_proto(m))
    folded = model([H("MatMul", ["A", "w"], ["y"])], {"w": f.weight()}, "y", TP.FLOAT,
                   inputs=list(m.graph.input))
    inputs = feeds(m)
    # onnxruntime prepacks a constant MatMul B and sums in another order (docs/commands/
    # fold.md): compare the weight through an Identity, as fold's prepack guard does
    guarded = onnx.helper.make_graph(
        [H("Identity", ["w0"], ["w"]), H("MatMul", ["A", "w"], ["y"])], "g",
        list(m.graph.input), list(folded.graph.output),
        [onnx.numpy_helper.from_array(f.weight(), "w0")])
    guarded_model = onnx.helper.make_model(guarded, opset_imports=list(m.opset_import),
                                           ir_version=m.ir_version)
    assert same_bits(run_ort(guarded_model, inputs), run_ort(m, inputs))
    assert same_bits(run_ref(folded, inputs), run_ref(m, inputs))


def test_no_constant_where_no_exact_form() -> None:
    m = cast_mul(X8, np.float32(0.5), zp=np.float32(0.5))
    [f] = fold_values(ir.from_proto(m))
    assert not f.foldable and f.compute is None and "not an integer" in (f.reason or "")
    with pytest.raises(AssertionError):
        f.weight()
