"""What runtimes can run and where they deviate from the spec: data keyed by version.

The kernel follows the ONNX specification. A runtime's limits (``onnxruntime.py``: probed
from the installed runtime, or fixed profiles of released versions) and its known
deviations from the spec (``deviations.py``) are data here, never the kernel's definition.
"""
