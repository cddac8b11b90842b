"""Per-type facts and lookup tables for the kernel.

Every quantized type of 8 bits or fewer is stored by NumPy/ml_dtypes in one byte, so a
256-entry table indexed by the raw byte maps a code to its value. Bytes that are not valid
codes for a narrow type (e.g. 0x10 for uint4) never occur in a valid array; their entries are
whatever ml_dtypes makes of them and are never read.
"""

from __future__ import annotations

from functools import cache

import ml_dtypes
import numpy as np

# x / zero-point types DequantizeLinear accepts (union over all versions and dialects).
# The float sets below repeat dqtool.types.FLOAT8 / FLOAT_QUANT / OUTPUT_FLOATS on purpose:
# dqtool.types imports onnx_ir (and with it sympy), which would make ``import dqtool.kernel``
# ~0.35 s slower for nothing; tests/test_kernel_tables.py keeps the two in step.
INT_TYPES: frozenset[np.dtype] = frozenset(
    np.dtype(t)
    for t in (
        ml_dtypes.int2, ml_dtypes.uint2, ml_dtypes.int4, ml_dtypes.uint4,
        np.int8, np.uint8, np.int16, np.uint16, np.int32,
    )
)
FLOAT_QUANT_TYPES: frozenset[np.dtype] = frozenset(
    np.dtype(t)
    for t in (
        ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e4m3fnuz, ml_dtypes.float8_e5m2,
        ml_dtypes.float8_e5m2fnuz, ml_dtypes.float4_e2m1fn, ml_dtypes.float6_e2m3fn,
        ml_dtypes.float6_e3m2fn,
    )
)
QUANT_TYPES = INT_TYPES | FLOAT_QUANT_TYPES
FLOAT8_TYPES: frozenset[np.dtype] = frozenset(
    np.dtype(t)
    for t in (
        ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e4m3fnuz, ml_dtypes.float8_e5m2,
        ml_dtypes.float8_e5m2fnuz,
    )
)
E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)
BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)
SCALE_TYPES: frozenset[np.dtype] = frozenset({F32, F16, BF16, E8M0})
OUTPUT_TYPES: frozenset[np.dtype] = frozenset({F32, F16, BF16})


def is_byte_type(dtype: np.dtype) -> bool:
    """Stored one element per byte: eligible for 256-entry tables."""
    return dtype.itemsize == 1


def int_range(dtype: np.dtype) -> tuple[int, int]:
    info = ml_dtypes.iinfo(dtype)
    return int(info.min), int(info.max)


@cache
def code_values(dtype: np.dtype) -> np.ndarray:
    """float32 value of every byte code of a one-byte type (exact: all such values fit)."""
    with np.errstate(invalid="ignore", over="ignore"):
        table = np.arange(256, dtype=np.uint8).view(dtype).astype(np.float32)
    table.setflags(write=False)
    return table


NIBBLE_PAIR_MASK = 0x0F0F


@cache
def nibble_pair_values(dtype: np.dtype) -> np.ndarray:
    """Two 4-bit codes at once: ``table[u16 & 0x0F0F]`` is the pair of their float32 values.

    Indexed by a uint16 view of two adjacent bytes (little-endian: the first code is the low
    byte), masked to the low nibbles, so one gather writes two outputs (a uint64 holding two
    float32, first in the low half). 0x0F0F + 1 entries, 30 KiB: L1-resident.
    """
    bits = code_values(dtype)[:16].view(np.uint32).astype(np.uint64)
    index = np.arange(NIBBLE_PAIR_MASK + 1)
    table = bits[index & 0xF] | (bits[(index >> 8) & 0xF] << np.uint64(32))
    table.setflags(write=False)
    return table


def unsigned_view(a: np.ndarray) -> np.ndarray:
    """The raw codes of a contiguous array as unsigned integers of the same width."""
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])
