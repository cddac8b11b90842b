"""The integer-operator family: which operators it holds and where each keeps its
quantization parameters (input positions), as data every part of the family reads.

Two kinds carry quantized tensors through integer kernels:

* ``qlinear``: quantized inputs and a quantized output, each with its scale and zero point
  (QLinearConv, QLinearMatMul, the com.microsoft QLinear* ops, QGemm);
* ``integer``: integer inputs with zero points only, an int32 output; the scales live in
  the float graph around them (MatMulInteger, ConvInteger);
* ``dynamic``: a float input quantized at run time (DynamicQuantizeLinear and the
  com.microsoft ops that do it inside: DynamicQuantizeMatMul, DynamicQuantizeLSTM) or an
  integer product scaled back to float (MatMulIntegerToFloat).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["qlinear", "integer", "dynamic"]
MS = "com.microsoft"
ONNX = "ai.onnx"


@dataclass(frozen=True)
class Slot:
    """One quantized tensor of an operator: the input positions of its value, scale and
    zero point (None: the operator has no such input; for the output, ``value`` is None)."""

    role: str  # "x", "w", "a", "b", "y", ...
    value: int | None
    scale: int | None
    zero_point: int | None
    weight: bool = False  # the operand a quantizer stores as an initializer
    optional: bool = False  # may be left out (with its scale and zero point)


@dataclass(frozen=True)
class OpDef:
    domain: str  # as reports spell it
    op: str
    since_version: int
    kind: Kind
    inputs: tuple[Slot, ...]
    output: Slot | None  # None: the output is int32 or float, not quantized
    bias: int | None = None  # input position of an int32 (or float) bias
    float_op: str | None = None  # the float operator of its QDQ form
    float_domain: str = ""  # that operator's domain ("" for ai.onnx)
    # Attributes of the integer op that its float op does not take.
    drop_attributes: tuple[str, ...] = ()
    # Why the operator has no faithful QDQ form (None: it has one).
    no_qdq: str | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.domain, self.op)


def _unary(op: str, float_op: str, *, zp_optional: bool = True, drop=()) -> OpDef:
    return OpDef(MS, op, 1, "qlinear", (Slot("x", 0, 1, 2),), Slot("y", None, 3, 4),
                 float_op=float_op, drop_attributes=tuple(drop))


def _binary(op: str, float_op: str) -> OpDef:
    return OpDef(MS, op, 1, "qlinear", (Slot("a", 0, 1, 2), Slot("b", 3, 4, 5)),
                 Slot("c", None, 6, 7), float_op=float_op)


OPS: tuple[OpDef, ...] = (
    OpDef(ONNX, "QLinearConv", 10, "qlinear",
          (Slot("x", 0, 1, 2), Slot("w", 3, 4, 5, weight=True)), Slot("y", None, 6, 7),
          bias=8, float_op="Conv"),
    OpDef(ONNX, "QLinearMatMul", 10, "qlinear",
          (Slot("a", 0, 1, 2), Slot("b", 3, 4, 5, weight=True)), Slot("y", None, 6, 7),
          float_op="MatMul"),
    OpDef(ONNX, "MatMulInteger", 10, "integer",
          (Slot("a", 0, None, 2), Slot("b", 1, None, 3, weight=True)), None,
          float_op="MatMul"),
    OpDef(ONNX, "ConvInteger", 10, "integer",
          (Slot("x", 0, None, 2), Slot("w", 1, None, 3, weight=True)), None,
          float_op="Conv"),
    OpDef(ONNX, "DynamicQuantizeLinear", 11, "dynamic", (), None,
          # It is already the QDQ form's own way to quantize an activation at run time.
          float_op="DynamicQuantizeLinear"),
    OpDef(MS, "QLinearConv", 1, "qlinear",
          (Slot("x", 0, 1, 2), Slot("w", 3, 4, 5, weight=True)), Slot("y", None, 6, 7),
          bias=8, float_op="Conv", drop_attributes=("channels_last",)),
    OpDef(MS, "QGemm", 1, "qlinear",
          (Slot("a", 0, 1, 2), Slot("b", 3, 4, 5, weight=True)), Slot("y", None, 7, 8),
          bias=6, float_op="Gemm"),
    _binary("QLinearAdd", "Add"),
    _binary("QLinearMul", "Mul"),
    _unary("QLinearSigmoid", "Sigmoid"),
    _unary("QLinearLeakyRelu", "LeakyRelu"),
    _unary("QLinearAveragePool", "AveragePool", drop=("channels_last",)),
    _unary("QLinearGlobalAveragePool", "GlobalAveragePool", drop=("channels_last",)),
    _unary("QLinearSoftmax", "Softmax", drop=("opset",)),
    _unary("QLinearReduceMean", "ReduceMean"),
    # Variadic: (Y_scale, Y_zero_point, then one (value, scale, zero point) per input);
    # its slots are made per node by ``slots_of``.
    OpDef(MS, "QLinearConcat", 1, "qlinear", (), Slot("y", None, 0, 1), float_op="Concat"),
    OpDef(MS, "QLinearWhere", 1, "qlinear", (Slot("x", 1, 2, 3), Slot("y", 4, 5, 6)),
          Slot("z", None, 7, 8), float_op="Where"),
    OpDef(MS, "MatMulIntegerToFloat", 1, "dynamic",
          (Slot("a", 0, 2, 4), Slot("b", 1, 3, 5, weight=True)), None, bias=6,
          float_op="MatMul"),
    OpDef(MS, "DynamicQuantizeMatMul", 1, "dynamic",
          (Slot("b", 1, 2, 3, weight=True),), None, bias=4, float_op="MatMul"),
    OpDef(MS, "DynamicQuantizeLSTM", 1, "dynamic",
          (Slot("W", 1, 8, 9, weight=True), Slot("R", 2, 10, 11, weight=True)), None,
          no_qdq="its gates quantize the input and the hidden state at every time step "
          "inside the loop; ai.onnx LSTM takes float weights only, so no QDQ graph "
          "reproduces it"),
    OpDef(MS, "MulInteger", 1, "integer",
          (Slot("a", 0, None, 1), Slot("b", 2, None, 3)), None,
          no_qdq="its int32 product has no scale in the graph to dequantize it with"),
    # Fused blocks whose float twin is a com.microsoft operator: DequantizeLinear on each
    # quantized input → that operator (float output, no QuantizeLinear).
    OpDef(MS, "QAttention", 1, "dynamic",
          (Slot("input", 0, 3, 6), Slot("weight", 1, 4, 7, weight=True)), None,
          float_op="Attention", float_domain=MS),
    OpDef(MS, "QEmbedLayerNormalization", 1, "qlinear",
          (Slot("word_embedding", 2, 8, 13, weight=True),
           Slot("position_embedding", 3, 9, 14, weight=True),
           Slot("segment_embedding", 4, 10, 15, weight=True, optional=True),
           Slot("gamma", 5, 11, 16, weight=True), Slot("beta", 6, 12, 17, weight=True)), None,
          float_op="EmbedLayerNormalization", float_domain=MS),
)

BY_KEY: dict[tuple[str, str], OpDef] = {d.key: d for d in OPS}

_POOL = {"auto_pad": "STRING", "kernel_shape": "INTS", "pads": "INTS", "strides": "INTS",
         "channels_last": "INT"}
# The attribute types of the com.microsoft operators, as onnxruntime's schemas give them
# (onnxruntime/core/graph/contrib_ops/quantization_defs.cc; tests compare them with the
# installed onnxruntime's): validation refuses any other type when a model is loaded, so
# the kernels and rewrites read only these (``Family.attribute_types``).
ATTRIBUTE_TYPES: dict[str, dict[str, str]] = {
    "QLinearConv": {**_POOL, "dilations": "INTS", "group": "INT"},
    "QGemm": {"alpha": "FLOAT", "transA": "INT", "transB": "INT"},
    "QLinearLeakyRelu": {"alpha": "FLOAT"},
    "QLinearAveragePool": {**_POOL, "ceil_mode": "INT", "count_include_pad": "INT"},
    "QLinearGlobalAveragePool": {"channels_last": "INT"},
    "QLinearSoftmax": {"axis": "INT", "opset": "INT"},
    "QLinearReduceMean": {"axes": "INTS", "keepdims": "INT"},
    "QLinearConcat": {"axis": "INT"},
    "DynamicQuantizeLSTM": {"activation_alpha": "FLOATS", "activation_beta": "FLOATS",
                            "activations": "STRINGS", "clip": "FLOAT", "direction": "STRING",
                            "hidden_size": "INT", "input_forget": "INT"},
    "QAttention": {"do_rotary": "INT", "mask_filter_value": "FLOAT", "num_heads": "INT",
                   "past_present_share_buffer": "INT", "scale": "FLOAT",
                   "unidirectional": "INT"},
    "QEmbedLayerNormalization": {"epsilon": "FLOAT"},
}


def lookup(domain: str, op: str) -> OpDef | None:
    return BY_KEY.get((domain, op))


def slots_of(opdef: OpDef, n_inputs: int) -> tuple[Slot, ...]:
    """The quantized inputs of one node (QLinearConcat's depend on its input count)."""
    if opdef.op != "QLinearConcat":
        return opdef.inputs
    return tuple(Slot(f"x{i}", 2 + 3 * i, 3 + 3 * i, 4 + 3 * i)
                 for i in range((n_inputs - 2) // 3))
