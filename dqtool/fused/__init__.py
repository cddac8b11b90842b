"""``pack``: the application of onnxruntime's fused weight-only operators, the way back from
``upgrade``. It rewrites DequantizeLinear → MatMul / Gather into com.microsoft MatMulNBits /
GatherBlockQuantized with bit-identical weights (``pack_api.pack``; the pass is
``pack_pass``). What the operators mean, their kernel and their exact rewrite into ai.onnx
belong to their operator family, ``dqtool.families.fused``, which this builds on."""
