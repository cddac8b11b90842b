"""Which element types onnxruntime's CPU kernels take for the integer operators whose
schemas allow more than they run: data keyed by release, measured by ``probe`` (one-node
sessions) and compared with the installed release by the tests.

A node's signature is its quantized inputs' element types in slot order, then its
output's ("int32" for MatMulInteger/ConvInteger, "float" for a float output). The
schemas let every operand be int8 or uint8; onnxruntime 1.31 and 1.32 have kernels for
these only (e.g. no QLinearMatMul of an int8 A with a uint8 B: "Could not find an
implementation"). An operator absent from the table takes every type its schema does.
"""

from __future__ import annotations

import functools
import itertools

import numpy as np

from dqtool.families.integer import ops
from dqtool.runtimes.onnxruntime import _runs

S, U = "int8", "uint8"

_QLINEAR = frozenset({(U, U, U), (U, S, U), (S, S, S)})
_MATMUL_INTEGER = frozenset({(a, b, "int32") for a in (S, U) for b in (S, U)})
# Measured with ``probe()`` on onnxruntime 1.31.1 and 1.32.0 (CPU, Linux x86-64).
_MEASURED: dict[tuple[str, str], frozenset[tuple[str, ...]]] = {
    ("ai.onnx", "QLinearConv"): _QLINEAR,
    ("ai.onnx", "QLinearMatMul"): _QLINEAR,
    ("ai.onnx", "MatMulInteger"): _MATMUL_INTEGER,
    ("ai.onnx", "ConvInteger"): _MATMUL_INTEGER,
    ("com.microsoft", "MatMulIntegerToFloat"):
        frozenset({(U, U, "float"), (U, S, "float"), (S, S, "float")}),
    ("com.microsoft", "QGemm"): frozenset({(U, U, U), (U, S, U), (S, S, S), (U, U, "float"),
                                           (U, S, "float"), (S, S, "float")}),
    ("com.microsoft", "DynamicQuantizeMatMul"): frozenset({(S, "float"), (U, "float")}),
}
TYPE_COMBOS: dict[str, dict[tuple[str, str], frozenset[tuple[str, ...]]]] = {
    "1.31": _MEASURED, "1.32": _MEASURED}
TYPED_OPS = frozenset(_MEASURED)  # the operators whose types a release restricts


def takes(key: tuple[str, str], signature: tuple[str, ...], release: str | None
          ) -> bool | None:
    """Whether ``release``'s CPU kernels take a node of operator ``key`` (domain, op) with
    this signature; None where the release or the signature is not known."""
    if release is None or None in signature:
        return None
    table = TYPE_COMBOS.get(release)
    if table is None:
        return None
    combos = table.get(key)
    return True if combos is None else signature in combos


# --- the probe --------------------------------------------------------------------------

_F = np.float32
_MM = {"a": (2, 4), "b": (4, 3)}
_CONV = {"x": (1, 2, 3, 3), "w": (2, 2, 1, 1)}


def _model(key: tuple[str, str], signature: tuple[str, ...]):
    """A one-node model of constants with that signature (inputs, then output type)."""
    from onnx import TensorProto, helper, numpy_helper


    domain, op = key
    opdef = ops.lookup(domain, op)
    assert opdef is not None
    inputs: dict[int, np.ndarray] = {}
    for slot, t in zip(opdef.inputs, signature, strict=False):
        shape = (_CONV if "Conv" in op else _MM)[slot.role]
        dtype = np.dtype(t)
        inputs[slot.value] = np.zeros(shape, dtype)
        if slot.scale is not None:
            inputs[slot.scale] = np.array(0.1, _F)
        if slot.zero_point is not None:
            inputs[slot.zero_point] = np.zeros((), dtype)
    if op == "DynamicQuantizeMatMul":
        inputs[0] = np.zeros(_MM["a"], _F)
    out = signature[-1]
    if opdef.output is not None and out != "float":
        inputs[opdef.output.scale] = np.array(0.1, _F)
        inputs[opdef.output.zero_point] = np.zeros((), np.dtype(out))
    names = [f"i{i}" if i in inputs else "" for i in range(max(inputs) + 1)]
    node = helper.make_node(op, names, ["y"], domain="" if domain == "ai.onnx" else domain)
    elem = {"int32": TensorProto.INT32, "float": TensorProto.FLOAT, S: TensorProto.INT8,
            U: TensorProto.UINT8}[out]
    graph = helper.make_graph([node], "probe", [], [helper.make_tensor_value_info("y", elem,
                                                                                  None)],
                              [numpy_helper.from_array(v, f"i{i}") for i, v in inputs.items()])
    imports = [helper.make_opsetid("", 13)]
    if domain != "ai.onnx":
        imports.append(helper.make_opsetid(domain, 1))
    return helper.make_model(graph, opset_imports=imports, ir_version=8)


def signatures(key: tuple[str, str]) -> list[tuple[str, ...]]:
    """Every signature the schema allows for the operators of the table."""
    if key[1] == "DynamicQuantizeMatMul":
        return [(b, "float") for b in (S, U)]
    pairs = list(itertools.product((S, U), repeat=2))
    if key[1] in ("MatMulInteger", "ConvInteger"):
        return [(a, b, "int32") for a, b in pairs]
    if key[1] == "MatMulIntegerToFloat":
        return [(a, b, "float") for a, b in pairs]
    outs = (S, U, "float") if key[1] == "QGemm" else (S, U)
    return [(a, b, y) for a, b in pairs for y in outs]


@functools.lru_cache(maxsize=1)
def probe() -> dict[tuple[str, str], frozenset[tuple[str, ...]]]:
    """The installed onnxruntime's table, measured (~70 one-node sessions)."""
    return {key: frozenset(s for s in signatures(key) if _runs(_model(key, s)))
            for key in TYPED_OPS}
