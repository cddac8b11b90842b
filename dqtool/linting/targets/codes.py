"""DQ1xx: what a target (``--target``) cannot run. Only checked when a target is given."""

from __future__ import annotations

from dqtool.linting.registry import define

define("DQ100", "target-opset", "error",
       "the model's ai.onnx opset is above what the target runs",
       "model: the model's ai.onnx opset 28 is above the target's 26 (onnxruntime 1.31 CPU); "
       "fix: `dqtool downgrade --opset 26` would lower it")
define("DQ101", "target-quant-type", "error",
       "the target cannot dequantize this quantized type",
       "node 'W' (ai.onnx DequantizeLinear-21): directml-fl1.0 cannot run it: x type int8 "
       "(DirectML FL1.0 takes uint8); fix: none exact; `dqtool fold` (constant)")
define("DQ102", "target-scale-type", "error",
       "the target cannot take this scale or output type (or output ≠ scale type)",
       "onnxruntime cannot run it: a bfloat16 scale (no CPU kernel); fix: `dqtool downgrade "
       "--opset 18`")
define("DQ103", "target-granularity", "error",
       "the target cannot run this granularity (blocked, per-axis, axis placement)",
       "onnx-opset-13 cannot run it: blocked needs DequantizeLinear 21+; fix: `dqtool "
       "downgrade --opset 13`")
define("DQ104", "target-rank", "error",
       "the target cannot take a tensor of this dimension count",
       "directml-fl2.1 cannot run it: x has 2 dimensions (DirectML FL2.1 takes exactly 4)")
define("DQ105", "target-zero-point", "error",
       "the target needs a zero point the node lacks, or forbids one it has",
       "directml-fl6.0 cannot run it: no zero point (DirectML requires one below FL6.2)")
define("DQ106", "target-domain", "error",
       "the target has no operator for this node's domain",
       "onnxruntime cannot run it: no opmx domain; fix: `dqtool upgrade --opset 21`")
define("DQ107", "target-exact-division", "error",
       "the target needs blocks/groups that divide the dimension exactly (no ragged block)",
       "onednn-graph cannot run it: block_size 32 does not divide 100 on axis 0")
define("DQ108", "target-constant-parameters", "error",
       "the target takes scales/zero points as attributes or constants, and these are not",
       "onednn-graph cannot run it: Dequantize takes scales as an attribute, the scale is "
       "computed at run time")
