"""DQ112 and DQ120–DQ147: the deployment targets' rules (``qnn-htp``, ``openvino``,
``tensorrt``). Each rule's source — the runtime release it was measured on, or the
documentation page and release it comes from — is in the module that checks it and in
docs/targets-qnn.md, docs/targets-openvino.md and docs/targets-tensorrt.md."""

from __future__ import annotations

from dqtool.linting.registry import define

define("DQ112", "target-placement", "info",
       "per operator type, how many QDQ nodes run quantized on the target and which fall back",
       "model: qnn-htp: 12 of 14 Conv run quantized on HTP; 2 fall back: conv3, conv7")

# Qualcomm HTP through onnxruntime's QNN execution provider (onnxruntime-qnn 2.7.0).
define("DQ120", "qnn-activation-type", "error",
       "QNN HTP: an activation quantized to a type the HTP has no fixed-point form for",
       "node 'conv' (Conv): qnn-htp falls back to float: activation x_DQ is float8e4m3fn "
       "(HTP activations are 4-, 8- or 16-bit integers)")
define("DQ121", "qnn-int8-activation-weight", "error",
       "QNN HTP: int8 activations with a weight that is not int8 (no QDQ unit is formed)",
       "node 'conv' (Conv): qnn-htp falls back to float: int8 activations with a uint8 weight")
define("DQ122", "qnn-conv-weight-axis", "error",
       "QNN HTP: a per-channel Conv weight quantized along an axis other than 0",
       "node 'conv' (Conv): qnn-htp falls back to float: weight w_DQ is per-axis on axis 1")
define("DQ123", "qnn-fc-weight", "error",
       "QNN HTP: a MatMul/Gemm weight the HTP FullyConnected cannot take (16-bit, "
       "asymmetric per-channel, unsigned with int16 activations)",
       "node 'fc' (MatMul): qnn-htp falls back to float: per-axis weight w_DQ has zero "
       "point 3 (HTP takes 0, or 128 for uint8)")
define("DQ124", "qnn-blocked-weight", "error",
       "QNN HTP: a blocked weight the HTP block-quantized kernels do not take",
       "node 'fc' (MatMul): qnn-htp falls back to float: weight w_DQ is blocked along K")
define("DQ125", "qnn-not-quantized-unit", "error",
       "QNN HTP: a node with DequantizeLinear inputs whose activation input or output is "
       "not quantized, so it runs as a float operator",
       "node 'fc' (MatMul): qnn-htp falls back to float: output op_out has no QuantizeLinear")
define("DQ126", "qnn-domain", "error",
       "QNN HTP: a DequantizeLinear of a domain onnxruntime has no operator for",
       "node 'fc' (MatMul): qnn-htp falls back to float: w_DQ is an opmx DequantizeLinear")

# OpenVINO 2026.4.1, CPU plugin (low-precision transformations).
define("DQ130", "openvino-activation-type", "error",
       "OpenVINO: an activation that is float or quantized wider than 8 bits (the layer runs "
       "in float)",
       "node 'conv' (Conv): openvino runs it in float: activation x_DQ is uint16 (int8 "
       "layers take u8/i8 activations)")
define("DQ131", "openvino-weight-type", "error",
       "OpenVINO: a weight that is not int8 (the layer runs in float)",
       "node 'conv' (Conv): openvino runs it in float: weight w_DQ is uint8")
define("DQ132", "openvino-weight-zero-point", "error",
       "OpenVINO: a weight with a non-zero zero point (the layer runs in float)",
       "node 'conv' (Conv): openvino runs it in float: weight w_DQ has a non-zero zero point")
define("DQ133", "openvino-weight-granularity", "error",
       "OpenVINO: a blocked weight, or a Conv weight per-axis on other than its output "
       "channels (the layer runs in float, or weight-compressed)",
       "node 'conv' (Conv): openvino runs it in float: weight w_DQ is blocked")
define("DQ134", "openvino-ragged-block", "error",
       "OpenVINO: a blocked DequantizeLinear whose block size does not divide the axis "
       "(the model is refused when read)",
       "node 'conv' (Conv): openvino refuses the model: w_DQ block_size 4 does not divide 6")
define("DQ135", "openvino-blocked-fc-refused", "error",
       "OpenVINO: a MatMul/Gemm weight blocked along its output axis in several blocks (the "
       "CPU plugin fails to compile the model)",
       "node 'fc' (MatMul): openvino refuses the model: w_DQ has 4 blocks along N")
define("DQ136", "openvino-conv-uint8-refused", "error",
       "OpenVINO: a Conv with a uint8 weight of zero point 0 (per-tensor or per output "
       "channel) and 8-bit activations of non-zero zero point (the CPU plugin fails to "
       "compile it)",
       "node 'conv' (Conv): openvino refuses the model: uint8 weight, activation zero point 128")
define("DQ137", "openvino-domain", "error",
       "OpenVINO: a DequantizeLinear of a domain OpenVINO's ONNX reader has no operator for",
       "node 'fc' (MatMul): openvino refuses the model: w_DQ is an opmx DequantizeLinear")
define("DQ138", "openvino-unsupported-type", "error",
       "OpenVINO: a quantized type its ONNX reader refuses (int2, uint2, float6, float8 fnuz; "
       "the model is refused when read)",
       "node 'fc' (MatMul): openvino refuses the model: w_DQ is int2")
define("DQ139", "openvino-blocked-quantize", "error",
       "OpenVINO: a constant weight stored as a blocked QuantizeLinear → DequantizeLinear "
       "pair (the ONNX reader fails to convert it)",
       "node 'fc' (MatMul): openvino refuses the model: W2_DequantizeLinear dequantizes a "
       "blocked QuantizeLinear")

# TensorRT, from NVIDIA's operator documentation (no GPU here: not measured).
define("DQ140", "tensorrt-quant-type", "error",
       "TensorRT: a quantized type its Dequantize layer does not take",
       "node 'w_DQ' (ai.onnx DequantizeLinear-21): tensorrt-10 cannot run it: x type uint8 "
       "(TensorRT 10 takes int8, float8e4m3fn, int4)")
define("DQ141", "tensorrt-zero-point", "error",
       "TensorRT: a zero point that is not all zeros (symmetric quantization only)",
       "tensorrt-10 cannot run it: zero point has 6 non-zero values; TensorRT takes zero only")
define("DQ142", "tensorrt-build-constant", "error",
       "TensorRT: a scale or zero point that is not a build-time constant",
       "tensorrt-10 cannot run it: the scale is computed at run time")
define("DQ143", "tensorrt-granularity", "error",
       "TensorRT: a scale shape it does not take (scalar, 1-D per-channel, 2-D blocks for "
       "int4 only)",
       "tensorrt-10 cannot run it: blocked int8 (2-D block scales are for int4 only)")
define("DQ144", "tensorrt-volume", "error",
       "TensorRT: a tensor of more than 2^31-1 elements",
       "tensorrt-10 cannot run it: x has 4294967296 elements (at most 2147483647)")
define("DQ145", "tensorrt-scale-type", "error",
       "TensorRT: a scale or output type its Dequantize layer does not take",
       "tensorrt-8.6 cannot run it: a float16 scale (TensorRT 8.6 takes float32)")
define("DQ146", "tensorrt-domain", "error",
       "TensorRT: a DequantizeLinear outside the ai.onnx domain (its ONNX parser imports "
       "ai.onnx operators)",
       "tensorrt-10 cannot run it: com.microsoft DequantizeLinear; fix: `dqtool upgrade "
       "--opset 21`")
define("DQ147", "tensorrt-float-activation", "error",
       "TensorRT: a weighted layer whose weight is dequantized but whose activation is float "
       "(INT8/FP8 quantize activations and weights together; INT4 is weight-only)",
       "node 'conv' (Conv): tensorrt runs it in float: the activation input is float")
