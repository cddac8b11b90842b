"""A generated family of QDQ models for the deployment targets (qnn-htp, openvino,
tensorrt): one quantized operator (Conv, MatMul, Gemm or Add) between QuantizeLinear /
DequantizeLinear pairs, varied along the axes those runtimes' rules turn on — activation
and weight types, granularity and axis, zero points, block size, opset and domain.

The operator is always named ``op``; lint's verdict for it is compared with the runtimes'."""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, replace

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

NP = {"uint8": np.uint8, "int8": np.int8, "uint16": np.uint16, "int16": np.int16,
      "int4": ml_dtypes.int4, "uint4": ml_dtypes.uint4, "int32": np.int32,
      "float8e4m3fn": ml_dtypes.float8_e4m3fn}
# A non-zero zero point per type: the middle of the unsigned ranges (what an asymmetric
# quantizer writes for a symmetric tensor), a small offset for the signed ones.
_NONZERO = {"uint8": 128, "int8": 3, "uint16": 32768, "int16": 5, "uint4": 8, "int4": 1}
_IR = {13: 7, 19: 9, 21: 10, 23: 11}


@dataclass(frozen=True)
class Variant:
    op: str = "Conv"  # Conv, MatMul, Gemm, Add
    act: str = "uint8"
    weight: str = "int8"
    granularity: str = "per-axis"  # per-tensor, per-axis, blocked
    axis: int | None = None  # None: the output-channel axis (Conv 0, MatMul 1, Gemm 0)
    weight_zp: str = "zero"  # zero, nonzero, none
    act_zp: str = "zero"  # zero, nonzero
    block: int = 4
    opset: int = 21
    domain: str = ""
    quantize_input: bool = True  # False: X reaches the operator in float
    quantize_output: bool = True  # False: the operator's output is the model's, in float

    @property
    def label(self) -> str:
        return ",".join(f"{k}={v}" for k, v in asdict(self).items())


_SHAPES = {  # x, weight, y
    "Conv": ([1, 8, 6, 6], (6, 8, 3, 3), [1, 6, 4, 4]),
    "MatMul": ([2, 32], (32, 8), [2, 8]),
    "Gemm": ([2, 32], (8, 32), [2, 8]),  # transB=1: weight (N, K)
    "Add": ([1, 4, 6, 6], None, [1, 4, 6, 6]),
}
_OUT_AXIS = {"Conv": 0, "MatMul": 1, "Gemm": 0}


def _zp(kind: str, qtype: str) -> int | None:
    return None if kind == "none" else 0 if kind == "zero" else _NONZERO[qtype]


class _Builder:
    def __init__(self, v: Variant):
        self.v, self.nodes, self.inits = v, [], []

    def init(self, name: str, arr) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(arr), name))
        return name

    def node(self, op: str, ins: list[str], out: str, name: str, **attrs) -> str:
        domain = self.v.domain if op in ("QuantizeLinear", "DequantizeLinear") else ""
        self.nodes.append(helper.make_node(op, ins, [out], name=name, domain=domain, **attrs))
        return out

    def activation(self, src: str, tag: str, scale: float) -> str:
        v = self.v
        s = self.init(f"{tag}_s", np.float32(scale))
        z = self.init(f"{tag}_zp", np.array(_zp(v.act_zp, v.act) or 0, NP[v.act]))
        q = self.node("QuantizeLinear", [src, s, z], f"{tag}_q", f"{tag}_Q")
        return self.node("DequantizeLinear", [q, s, z], f"{tag}_f", f"{tag}_DQ")

    def weight(self, shape: tuple[int, ...]) -> str:
        v = self.v
        rng = np.random.default_rng(0)
        lo = 0 if v.weight.startswith("u") else -7
        w = rng.integers(lo, lo + 15, size=shape).astype(NP[v.weight])
        axis = _OUT_AXIS[v.op] if v.axis is None else v.axis
        attrs: dict[str, int] = {}
        if v.granularity == "per-tensor":
            sshape: tuple[int, ...] = ()
        elif v.granularity == "per-axis":
            sshape, attrs = (shape[axis],), {"axis": axis}
        else:
            sshape = tuple(-(-d // v.block) if i == axis else d for i, d in enumerate(shape))
            attrs = {"axis": axis, "block_size": v.block}
        ins = [self.init("w_q", w), self.init("w_s", np.full(sshape, 0.01, np.float32))]
        zp = _zp(v.weight_zp, v.weight)
        if zp is not None:
            ins.append(self.init("w_zp", np.full(sshape, zp, NP[v.weight])))
        return self.node("DequantizeLinear", ins, "w_f", "w_DQ", **attrs)


def model(v: Variant) -> onnx.ModelProto:
    b = _Builder(v)
    x_shape, w_shape, y_shape = _SHAPES[v.op]
    x = b.activation("X", "x", 0.05) if v.quantize_input else "X"
    second = b.activation("X2", "x2", 0.05) if v.op == "Add" else b.weight(w_shape)
    ins = [x, second]
    if v.op in ("Conv", "Gemm"):  # an int32 bias, per output channel
        n = w_shape[0]
        per_axis = v.granularity != "per-tensor"
        bs = b.init("b_s", np.full((n,) if per_axis else (), 0.0005, np.float32))
        bias = [b.init("b_q", np.arange(n, dtype=np.int32)), bs]
        ins.append(b.node("DequantizeLinear", bias, "b_f", "b_DQ",
                          **({"axis": 0} if per_axis else {})))
    attrs = {"transB": 1} if v.op == "Gemm" else {}
    y = b.node(v.op, ins, "op_out", "op", **attrs)
    if v.quantize_output:
        b.activation(y, "y", 0.1)
    inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, x_shape)]
    if v.op == "Add":
        inputs.append(helper.make_tensor_value_info("X2", TensorProto.FLOAT, x_shape))
    b.nodes[-1].output[0] = "Y"
    g = helper.make_graph(b.nodes, "g", inputs,
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, y_shape)],
                          b.inits)
    opsets = [helper.make_opsetid("", v.opset)]
    if v.domain:
        opsets.append(helper.make_opsetid(v.domain, 1))
    return helper.make_model(g, opset_imports=opsets, ir_version=_IR.get(v.opset, 10))


def valid(v: Variant) -> bool:
    """Whether the variant is a model ai.onnx (or com.microsoft) can express."""
    needs_21 = v.act in ("int16", "uint16", "int4", "uint4") or \
        v.weight in ("int16", "uint16", "int4", "uint4") or v.granularity == "blocked"
    if v.act == "float8e4m3fn" and v.act_zp != "zero":
        return False
    if v.domain == "com.microsoft":
        return v.granularity != "blocked" and v.opset < 21
    if needs_21 and v.opset < 21:
        return False
    if v.op == "Add":
        return v == replace(v, weight="int8", granularity="per-tensor", axis=None,
                            weight_zp="zero", block=4)
    if v.granularity == "blocked":
        axis = _OUT_AXIS[v.op] if v.axis is None else v.axis
        return v.block <= _SHAPES[v.op][1][axis] and v.opset >= 21
    return not (v.granularity == "per-tensor" and v.axis is not None)


def family(size: str = "small") -> list[Variant]:
    """The variants the oracle tests compare over. ``small``: every value of every axis
    against a few baselines, plus the pairs the rules turn on; ``large``: the full
    product of the main axes (DQTOOL_SLOW=1)."""
    if size == "large":
        grid = itertools.product(
            ["Conv", "MatMul", "Gemm"], ["uint8", "int8", "uint16", "int16"],
            ["int8", "uint8", "int16", "uint16", "int4", "uint4"],
            [("per-tensor", None), ("per-axis", None), ("per-axis", "other"),
             ("blocked", None), ("blocked", "other")],
            ["zero", "nonzero", "none"], ["zero", "nonzero"])
        out = []
        for op, act, w, (g, ax), wzp, azp in grid:
            axis = None if ax is None else {"Conv": 1, "MatMul": 0, "Gemm": 1}[op]
            block = 8 if g == "blocked" else 4
            out.append(Variant(op, act, w, g, axis, wzp, azp, block))
        out += [Variant("Add", act, act_zp=z) for act in ("uint8", "int8", "uint16", "int16")
                for z in ("zero", "nonzero")]
        return [v for v in out if valid(v)]
    out = []
    for op in ("Conv", "MatMul", "Gemm"):
        base = Variant(op)
        other = {"Conv": 1, "MatMul": 0, "Gemm": 1}[op]
        out += [replace(base, act=a) for a in ("uint8", "int8", "uint16", "int16")]
        out += [replace(base, weight=w) for w in ("uint8", "int16", "uint16", "int4", "uint4")]
        out += [replace(base, act="uint16", weight=w) for w in ("uint8", "int16", "int4")]
        out += [replace(base, act="int16", weight=w) for w in ("uint8", "uint4")]
        out += [replace(base, act="int8", weight=w) for w in ("uint8", "int4")]
        out += [replace(base, granularity="per-tensor"),
                replace(base, axis=other),
                replace(base, weight="uint8", weight_zp="nonzero"),
                replace(base, weight="uint8", granularity="per-tensor", weight_zp="nonzero"),
                replace(base, weight_zp="nonzero"), replace(base, weight_zp="none"),
                replace(base, act_zp="nonzero"),
                replace(base, weight="uint8", act_zp="nonzero"),
                replace(base, granularity="per-tensor", weight_zp="nonzero"),
                replace(base, act="int16", weight="int16", granularity="per-tensor"),
                replace(base, granularity="blocked", block=8),
                replace(base, granularity="blocked", block=2),
                replace(base, granularity="blocked", weight="int4", block=8),
                replace(base, granularity="blocked", weight="int4", block=4),
                replace(base, granularity="blocked", weight="int16", block=8),
                replace(base, granularity="blocked", axis=other, block=8),
                replace(base, act="int16", granularity="blocked", weight="int4", axis=other,
                        block=16),
                replace(base, opset=13), replace(base, opset=19),
                replace(base, opset=19, domain="com.microsoft")]
        out += [replace(base, quantize_input=False), replace(base, quantize_output=False),
                replace(base, act="int8", act_zp="nonzero"),
                replace(base, act="float8e4m3fn")]
    out += [Variant("Add", act, act_zp=z) for act in ("uint8", "int8", "uint16", "int16")
            for z in ("zero", "nonzero")]
    seen: dict[Variant, None] = {}
    for v in out:
        if valid(v):
            seen.setdefault(v)
    return list(seen)
