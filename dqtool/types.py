"""ONNX element types by their ONNX names, with the facts dqtool needs about each.

Type names are ONNX's own spellings (``int4``, ``float8e4m3fn``, ``float``, ``bfloat16``),
as they appear in schemas (``tensor(int4)``); NumPy dtypes come from ``ml_dtypes`` for the
narrow types.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np
import onnx_ir as ir


@dataclass(frozen=True)
class ElemType:
    name: str  # ONNX spelling, e.g. "int4", "float"
    ir_type: ir.DataType
    dtype: np.dtype
    bits: int
    is_integer: bool
    signed: bool

    @property
    def min(self) -> int | float:
        if self.is_integer:
            return -(1 << (self.bits - 1)) if self.signed else 0
        return float(ml_dtypes.finfo(self.dtype).min) if self.name != "float8e8m0" else 0.0

    @property
    def max(self) -> int | float:
        if self.is_integer:
            return (1 << (self.bits - 1)) - 1 if self.signed else (1 << self.bits) - 1
        return float(ml_dtypes.finfo(self.dtype).max)

    @property
    def packed(self) -> bool:
        """Stored several elements per byte in a TensorProto."""
        return self.bits < 8

    def __str__(self) -> str:
        return self.name


def _t(name: str, ir_type: ir.DataType, dtype: object, bits: int, integer: bool, signed: bool):
    return ElemType(name, ir_type, np.dtype(dtype), bits, integer, signed)


_D = ir.DataType
TYPES: dict[str, ElemType] = {
    t.name: t
    for t in (
        _t("int2", _D.INT2, ml_dtypes.int2, 2, True, True),
        _t("uint2", _D.UINT2, ml_dtypes.uint2, 2, True, False),
        _t("int4", _D.INT4, ml_dtypes.int4, 4, True, True),
        _t("uint4", _D.UINT4, ml_dtypes.uint4, 4, True, False),
        _t("int8", _D.INT8, np.int8, 8, True, True),
        _t("uint8", _D.UINT8, np.uint8, 8, True, False),
        _t("int16", _D.INT16, np.int16, 16, True, True),
        _t("uint16", _D.UINT16, np.uint16, 16, True, False),
        _t("int32", _D.INT32, np.int32, 32, True, True),
        _t("uint32", _D.UINT32, np.uint32, 32, True, False),
        _t("int64", _D.INT64, np.int64, 64, True, True),
        _t("float4e2m1", _D.FLOAT4E2M1, ml_dtypes.float4_e2m1fn, 4, False, True),
        _t("float6e2m3", _D.FLOAT6E2M3, ml_dtypes.float6_e2m3fn, 6, False, True),
        _t("float6e3m2", _D.FLOAT6E3M2, ml_dtypes.float6_e3m2fn, 6, False, True),
        _t("float8e4m3fn", _D.FLOAT8E4M3FN, ml_dtypes.float8_e4m3fn, 8, False, True),
        _t("float8e4m3fnuz", _D.FLOAT8E4M3FNUZ, ml_dtypes.float8_e4m3fnuz, 8, False, True),
        _t("float8e5m2", _D.FLOAT8E5M2, ml_dtypes.float8_e5m2, 8, False, True),
        _t("float8e5m2fnuz", _D.FLOAT8E5M2FNUZ, ml_dtypes.float8_e5m2fnuz, 8, False, True),
        _t("float8e8m0", _D.FLOAT8E8M0, ml_dtypes.float8_e8m0fnu, 8, False, False),
        _t("float16", _D.FLOAT16, np.float16, 16, False, True),
        _t("bfloat16", _D.BFLOAT16, ml_dtypes.bfloat16, 16, False, True),
        _t("float", _D.FLOAT, np.float32, 32, False, True),
        _t("double", _D.DOUBLE, np.float64, 64, False, True),
        _t("bool", _D.BOOL, np.bool_, 8, True, False),
    )
}

_BY_IR = {t.ir_type: t for t in TYPES.values()}
_BY_DTYPE = {t.dtype: t for t in TYPES.values()}

FLOAT8 = frozenset({"float8e4m3fn", "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz"})
FLOAT_QUANT = FLOAT8 | {"float4e2m1", "float6e2m3", "float6e3m2"}
OUTPUT_FLOATS = frozenset({"float", "float16", "bfloat16"})


def by_name(name: str) -> ElemType:
    try:
        return TYPES[name]
    except KeyError:
        raise KeyError(f"unknown element type {name!r}") from None


def from_ir(dt: ir.DataType | None) -> ElemType | None:
    return None if dt is None else _BY_IR.get(dt)


def from_dtype(dtype: np.dtype | type) -> ElemType:
    try:
        return _BY_DTYPE[np.dtype(dtype)]
    except KeyError:
        raise KeyError(f"no ONNX element type for NumPy dtype {np.dtype(dtype)}") from None


def from_onnx_int(code: int) -> ElemType | None:
    """From a TensorProto.DataType integer (as in ``output_dtype`` attributes)."""
    try:
        return from_ir(ir.DataType(code))
    except ValueError:
        return None


def name_of(dt: ir.DataType | None) -> str | None:
    t = from_ir(dt)
    if t is not None:
        return t.name
    return None if dt is None else dt.name.lower()
