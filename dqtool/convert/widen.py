"""Exact type rewrites of a DequantizeLinear's constant x (and zero point).

- int2/uint2 → int4/uint4 or int8/uint8, int4/uint4 → int8/uint8: same values, wider type;
- int16/uint16 → int32 with the zero point folded in: ``x - zp`` is at most 17 bits, exact
  in int32, and the kernel turns it to float32 exactly (so does onnxruntime);
- float4e2m1 and float6 → float8e4m3fn: every value is representable (3 mantissa bits,
  wider exponent range), and their zero point must be zero, so it is dropped.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx_ir as ir

from dqtool import graph, types
from dqtool.codecs import onnx_std
from dqtool.convert import generic, params
from dqtool.convert.context import Step
from dqtool.convert.registry import Outcome
from dqtool.spec import QuantSpec
from dqtool.storage import int_array, widened

SUB_BYTE_INT = {"int2": ("int4", "int8"), "uint2": ("uint4", "uint8"), "int4": ("int8",),
                "uint4": ("uint8",)}
SMALL_FLOAT = frozenset({"float4e2m1", "float6e2m3", "float6e3m2"})


def _need_constant(step: Step, spec: QuantSpec, what: str) -> str | None:
    x = graph.input_value(step.node, 0)
    if graph.constant_tensor(x) is None:
        return (f"x is {spec.quant_type} computed at run time, and {what}; only a constant x "
                "can be rewritten offline")
    zp = graph.input_value(step.node, 2)
    if zp is not None and graph.constant_tensor(zp) is None:
        return f"the zero point is computed at run time, and {what}"
    return None


def widen_int(step: Step, spec: QuantSpec, allowed: frozenset[str]) -> Outcome:
    """Sub-byte integer x → the narrowest wider integer type ``allowed`` holds."""
    wider = next((t for t in SUB_BYTE_INT[spec.quant_type] if t in allowed), None)
    if wider is None:
        return Outcome.refused(f"no integer type at opset {step.target} holds "
                               f"{spec.quant_type}")
    why = _need_constant(step, spec, f"{spec.quant_type} does not exist at DequantizeLinear-"
                         f"{step.dst}")
    if why:
        return Outcome.refused(why)
    _retype(step, 0, wider)
    if graph.input_value(step.node, 2) is not None:
        _retype(step, 2, wider)
    return Outcome("changed", f"x {spec.quant_type} → {wider} (same values)",
                   f"{spec.quant_type} needs DequantizeLinear-{_since(spec.quant_type)}")


def _retype(step: Step, index: int, to: str) -> None:
    old = graph.input_value(step.node, index)
    t = types.by_name(to)
    stored = graph.constant_tensor(old)
    assert stored is not None, f"{old.name} is not constant"
    step.set_input(index, step.holding(f"{old.name}_{to}",
                                       widened_tensor(stored, t.dtype, t.ir_type)))


def widened_tensor(codes: ir.TensorProtocol, dtype: np.dtype, ir_type: ir.DataType
                   ) -> ir.TensorProtocol:
    """``codes`` (2/4-bit integers) widened to ``dtype``: from its file a band at a time
    (``WidenedCodes``), else computed when needed. Where ``codes`` is another
    constant transposed (``transposed``: MatMulNBits' B as ai.onnx's (K, N)), so is the
    result: a layout that wants that transpose widens the other constant's codes."""
    wide = widened(codes, dtype)
    if wide is None:
        wide = ir.LazyTensor(lambda: ir.Tensor(int_array(codes, dtype), dtype=ir_type),
                             dtype=ir_type, shape=ir.Shape(tuple(int(d) for d in codes.shape)),
                             name=codes.name)
    source = getattr(codes, "transposed", None)
    if source is not None and len(codes.shape) == 2:
        wide.transposed = lambda: widened_tensor(source(), dtype, ir_type)  # type: ignore[attr-defined]
    return wide


def fold_int16(step: Step, spec: QuantSpec) -> Outcome:
    why = _need_constant(step, spec, f"{spec.quant_type} needs DequantizeLinear-21")
    if why:
        return Outcome.refused(why)
    x = graph.input_value(step.node, 0)
    zp = graph.input_value(step.node, 2)
    shape = params.const_shape(x)

    def compute() -> np.ndarray:
        xs = graph.constant_array(x).astype(np.int32)
        if zp is None:
            return xs
        return xs - params.broadcastable(graph.constant_array(zp).astype(np.int32), spec, shape)

    step.set_input(0, step.constant(f"{x.name}_int32", ir.DataType.INT32, shape, compute))
    if zp is not None:
        step.set_input(2, None)
    how = f"x {spec.quant_type} → int32" + (" with the zero point folded in" if zp is not None
                                            else "")
    return Outcome("changed", how, f"{spec.quant_type} needs DequantizeLinear-21")


def small_float_to_f8(step: Step, spec: QuantSpec) -> Outcome:
    why = _need_constant(step, spec, f"{spec.quant_type} needs DequantizeLinear-"
                         f"{_since(spec.quant_type)}")
    if why:
        return Outcome.refused(why)
    zp = graph.input_value(step.node, 2)
    if zp is not None and np.any(graph.constant_array(zp).astype(np.float32) != 0):
        return Outcome.refused(f"{spec.quant_type} zero point is not zero")
    x = graph.input_value(step.node, 0)
    shape = params.const_shape(x)
    step.set_input(0, step.constant(
        f"{x.name}_f8e4m3fn", ir.DataType.FLOAT8E4M3FN, shape,
        lambda: graph.constant_array(x).astype(np.float32).astype(ml_dtypes.float8_e4m3fn)))
    if zp is not None:
        step.set_input(2, None)
    return Outcome("changed", f"x {spec.quant_type} → float8e4m3fn (every value exact)",
                   f"{spec.quant_type} needs DequantizeLinear-{_since(spec.quant_type)}")


def _since(type_name: str) -> int:
    for v in generic.since_versions("DequantizeLinear"):
        if type_name in onnx_std.schema_facts("DequantizeLinear", v).quant_types:
            return v
    return 0
