"""Shared test helpers: tiny models written inline."""

from __future__ import annotations

import onnx_ir as ir
import pytest


def model(text: str) -> ir.Model:
    return ir.from_onnx_text(text)


@pytest.fixture
def tmp_model(tmp_path):
    """Save an inline model to a file and return its path."""

    def make(text: str, name: str = "m.onnx"):
        path = tmp_path / name
        ir.save(ir.from_onnx_text(text), path)
        return path

    return make
