"""dqtool's NumPy kernel: DequantizeLinear/QuantizeLinear of every dialect, exact and fast."""

from __future__ import annotations

from .dequantize import dequantize

__all__ = ["dequantize"]
