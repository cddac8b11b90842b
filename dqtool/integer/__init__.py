"""``qdq`` and ``qoperator``: the applications of the integer operators (QLinear*,
MatMulInteger / ConvInteger, dynamic quantization). ``api.qdq`` rewrites them into QDQ and
``api.qoperator`` fuses QDQ patterns back into them, faithful rather than exact, each with
its check in quantization steps (``numerics``). What the operators mean and their exact
kernels belong to their operator family, ``dqtool.families.integer``, which this builds on."""
