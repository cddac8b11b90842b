"""onnx's own DequantizeLinear backend cases (generated from the installed onnx), bit for bit."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from helpers import assert_bits_equal
from onnx import helper, numpy_helper

from dqtool import reference_evaluator
from dqtool.kernel import dequantize


def _cases() -> list:
    from onnx.backend.test.case import node

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return node.collect_testcases("DequantizeLinear")


CASES = _cases()


def _arr(a: object) -> np.ndarray:
    return numpy_helper.to_array(a) if isinstance(a, onnx.TensorProto) else np.asarray(a)


def test_there_are_fourteen_or_more() -> None:
    names = {c.name for c in CASES}
    assert len(CASES) >= 14
    assert {"test_dequantizelinear", "test_dequantizelinear_float4e2m1"} <= names


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_backend_case(case) -> None:
    node = case.model.graph.node[0]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    out_dtype = attrs.get("output_dtype")
    for inputs, outputs in case.data_sets:
        args = [_arr(a) for a in inputs]
        want = _arr(outputs[0])
        got = dequantize(
            *args,
            axis=attrs.get("axis", 1),
            block_size=attrs.get("block_size", 0),
            output_dtype=helper.tensor_dtype_to_np_dtype(out_dtype) if out_dtype else None,
        )
        assert_bits_equal(got, want, case.name)
        feeds = {n: a for n, a in zip(node.input, args, strict=False) if n}
        ev = reference_evaluator(case.model)
        assert_bits_equal(ev.run(None, feeds)[0], want, case.name + " (evaluator)")
