"""Family "fused": hostile attributes of fused and integer operators, and element types
that have no place in a numeric role.

The hostile campaign of 2026-11 gave com.microsoft MatMulNBits (``K``, ``N``, ``bits``,
``block_size``, ``accuracy_level``) and GatherBlockQuantized (``bits``, ``block_size``,
``quantize_axis``, ``gather_axis``) negative, zero and huge values (2^31, 2^63-1: a size
computed from them overflows, or an allocation trusts them); QLinearConv and ConvInteger
a ``group`` of 0 or one that divides nothing, negative ``pads``, zero ``strides``; a
DequantizeLinear's scale, zero point or input as a string, bool or complex tensor; and
weights of dims [0, 2^63-1, 2^63-1] (no element, so no byte disagrees, but their product
overflows int64). Each must be refused in one line or handled; never a traceback.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from tools.fuzz import commands
from tools.fuzz.case import Case, shuffled
from tools.fuzz.mutate_structure import _base_weight

REPO = Path(__file__).resolve().parents[2]
MODEL = "in/model.onnx"
BIG = 2**63 - 1
INTS = (-1, 0, 1, 3, 2**31, BIG, -(2**63))
LISTS = {  # per list attribute of a 2-D convolution: values no valid model holds
    "pads": ([-1, -1, -1, -1], [2**62] * 4, [1, 1], []),
    "strides": ([0, 0], [-1, -1], [BIG, BIG], [1]),
    "dilations": ([0, 0], [-2, -2], [2**31, 2**31], [1, 1, 1]),
    "kernel_shape": ([0, 0], [-3, -3], [2**40, 2**40]),
}
ATTRIBUTES = {
    "MatMulNBits": ("K", "N", "bits", "block_size", "accuracy_level"),
    "GatherBlockQuantized": ("bits", "block_size", "quantize_axis", "gather_axis"),
    "QLinearConv": ("group",), "ConvInteger": ("group",),
}
SOURCES = {"nbits4": "ort_matmulnbits_4bit_sym_b32",
           "nbits4-asym": "ort_matmulnbits_4bit_asym_b128",
           "nbits2": "ort_matmulnbits_2bit_b32", "nbits8": "ort_matmulnbits_8bit_b32",
           "qop": "ort_qop_per_channel", "dynconv": "ort_dynamic_conv",
           "qdq": "ort_qdq_per_channel"}
BASES = {"MatMulNBits": ("nbits4", "nbits4-asym", "nbits2", "nbits8"),
         "GatherBlockQuantized": ("nbits4", "nbits4-asym"), "QLinearConv": ("qop",),
         "ConvInteger": ("dynconv",), "DequantizeLinear": ("weight", "qdq")}
# Element types with no place where a number is read.
ODD_TYPES = {"string": TensorProto.STRING, "bool": TensorProto.BOOL,
             "complex64": TensorProto.COMPLEX64, "complex128": TensorProto.COMPLEX128}
# (op, input index) of the numeric roles given an odd type: DQ x, scale, zero point;
# MatMulNBits' B and scales; GatherBlockQuantized's data and scales.
ROLES = {"DequantizeLinear": (0, 1, 2), "MatMulNBits": (1, 2), "GatherBlockQuantized": (0, 2)}


@functools.cache
def _base(name: str) -> bytes:
    if name == "weight":
        return _base_weight().SerializeToString()
    return (REPO / "models" / f"{SOURCES[name]}.onnx").read_bytes()


def _first(m: onnx.ModelProto, op: str) -> onnx.NodeProto | None:
    """The first node of ``op``, one whose first input is an initializer if there is one
    (a DequantizeLinear of a weight, not of an activation: it has constants to retype)."""
    inits = {t.name for t in m.graph.initializer}
    nodes = [n for n in m.graph.node if n.op_type == op]
    return next((n for n in nodes if n.input and n.input[0] in inits), None) or \
        (nodes[0] if nodes else None)


def set_attribute(m: onnx.ModelProto, op: str, name: str, value: int | list[int]) -> None:
    node = _first(m, op)
    if node is None:
        return
    kept = [a for a in node.attribute if a.name != name]
    del node.attribute[:]
    node.attribute.extend(kept)
    # make_attribute cannot tell an empty list's type: an empty INTS is written by hand.
    attr = helper.make_attribute(name, value) if value != [] else \
        onnx.AttributeProto(name=name, type=onnx.AttributeProto.INTS)
    node.attribute.append(attr)


def _odd_tensor(name: str, dims: list[int], kind: str) -> onnx.TensorProto:
    n = int(np.prod(dims, dtype=object)) if dims else 1
    if kind == "string":
        return helper.make_tensor(name, TensorProto.STRING, dims, [b"1.5"] * n)
    arr = {"bool": np.ones(n, np.bool_), "complex64": np.full(n, 1 + 2j, np.complex64),
           "complex128": np.full(n, 1 + 2j, np.complex128)}[kind]
    return helper.make_tensor(name, ODD_TYPES[kind], dims, arr.tobytes(), raw=True)


def retype(m: onnx.ModelProto, op: str, index: int, kind: str) -> None:
    """The initializer at input ``index`` of the first ``op`` becomes an ``kind`` tensor of
    the same dims (added if the node had no such input: an absent zero point)."""
    node = _first(m, op)
    if node is None:
        return
    while len(node.input) <= index:
        node.input.append("")
    name = node.input[index] or f"{node.name}_odd{index}"
    node.input[index] = name
    old = next((t for t in m.graph.initializer if t.name == name), None)
    if old is None and node.input[index] != f"{node.name}_odd{index}":
        return  # an activation: nothing constant to retype
    dims = list(old.dims) if old is not None else []
    if old is not None:
        m.graph.initializer.remove(old)
    m.graph.initializer.append(_odd_tensor(name, dims, kind))


def huge_dims(m: onnx.ModelProto, op: str, index: int, dims: list[int]) -> None:
    """The weight at input ``index`` declares ``dims``; no element, so no byte."""
    node = _first(m, op)
    if node is None:
        return
    for t in m.graph.initializer:
        if t.name == node.input[index]:
            t.ClearField("raw_data")
            del t.dims[:]
            t.dims.extend(dims)


def mutations() -> dict[str, tuple[str, Callable[[onnx.ModelProto], None]]]:
    """Every mutation by name: (the op it targets, what it does)."""
    out: dict[str, tuple[str, Callable[[onnx.ModelProto], None]]] = {}
    for op, names in ATTRIBUTES.items():
        for name in names:
            for v in INTS:
                out[f"{op}.{name}={v}"] = (op, functools.partial(set_attribute, op=op,
                                                                 name=name, value=v))
    for op in ("QLinearConv", "ConvInteger"):
        for name, values in LISTS.items():
            for v in values:
                out[f"{op}.{name}={v}"] = (op, functools.partial(set_attribute, op=op,
                                                                 name=name, value=v))
    for op, indices in ROLES.items():
        for index in indices:
            for kind in ODD_TYPES:
                out[f"{op}[{index}]:{kind}"] = (op, functools.partial(retype, op=op,
                                                                      index=index, kind=kind))
    for op, index in (("DequantizeLinear", 0), ("MatMulNBits", 1), ("GatherBlockQuantized", 0)):
        for dims in ([0, BIG, BIG], [BIG, BIG, 0], [0, 2**62]):
            out[f"{op}[{index}]:dims={dims}"] = (op, functools.partial(
                huge_dims, op=op, index=index, dims=dims))
    return out


def make(kind: str, base: str, argv_index: int) -> Case:
    _, mutate = mutations()[kind]
    m = onnx.ModelProto()
    m.ParseFromString(_base(base))
    mutate(m)
    argv = commands.more(MODEL)[argv_index]
    return Case("fused", f"{kind}@{base}", argv, {MODEL: m.SerializeToString()})


def combinations() -> list[tuple[str, str, int]]:
    n = len(commands.more(MODEL))
    return [(kind, base, i) for kind, (op, _) in mutations().items() for base in BASES[op]
            for i in range(n)]


def cases(rng: random.Random) -> Iterator[Case]:
    return shuffled(rng, combinations, make)
