"""From a constant DequantizeLinear node to a ``Folding``: which tensors, which kernel calls.

Refusals are returned as reasons (strings), not raised: the pass lists them.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir

from dqtool import codecs, graph, registry, types
from dqtool.errors import KernelError
from dqtool.folding.compute import Folding
from dqtool.folding.kernel_call import KernelCall
from dqtool.spec import QuantSpec

# Validation computes at most this many elements at fold time (the rest waits for the save).
VALIDATE_ELEMENTS = 1 << 16


def not_constant_reason(node: ir.Node, spec: QuantSpec, function: ir.Function | None) -> str:
    """Why a DQ is not constant, naming the first input that is not."""
    names = ("x", "scale", "zero point")
    for i, label in enumerate(names):
        v = graph.input_value(node, i)
        if v is None or graph.constant_tensor(v) is not None:
            continue
        if i == 0 and spec.x_from_quantize:
            continue
        if function is not None and any(v is i for i in function.inputs):
            return f"{label} '{v.name}' is an input of function {function.name} (constant " \
                "only at a call site; inline the function to fold it)"
        if v.is_graph_input():
            kind = "an initializer that is also a graph input (overridable at run time)" \
                if v.const_value is not None else "a graph input"
            return f"{label} '{v.name}' is {kind}"
        producer = v.producer()
        if producer is not None:
            return f"{label} '{v.name}' is computed by {producer.op_type} '{producer.name}'"
        return f"{label} '{v.name}' is not constant"
    return "not constant"


def _np_dtype(name: str | None) -> np.dtype | None:
    return types.TYPES[name].dtype if name in types.TYPES else None


def _bound(support: registry.FoldSupport, call: KernelCall) -> KernelCall:
    return dataclasses.replace(call, kernel=support.kernels[call.kind])


def plan(node: ir.Node, spec: QuantSpec, opsets: dict[str, int],
         store: str | None) -> Folding | str:
    """The folding of a constant, valid DQ; a reason string when it cannot be folded."""
    out_dtype = _np_dtype(spec.float_type)
    if out_dtype is None:
        return f"output type {spec.float_type} is unknown or not a float type"
    store_dtype = out_dtype if store in (None, "keep") else types.by_name(store).dtype
    support = registry.fold_support(spec.domain, node.op_type)
    if support is None or support.call is None:
        return f"no registered family folds {spec.domain}:{node.op_type}"
    # The spec's output type is the one in force (output_dtype, else the scale's type).
    calls = [_bound(support, support.call(node, spec, out_dtype))]
    x = graph.input_value(node, support.weight_input)
    source = graph.constant_tensor(x)
    if source is None:
        q_node = x.producer() if x is not None else None
        if q_node is None:
            return "x is not constant"
        q_spec = codecs.read_node(q_node, opsets)
        if q_spec.errors:
            return f"its QuantizeLinear '{q_node.name}': {q_spec.errors[0].message}"
        q_support = registry.fold_support(q_spec.domain, q_node.op_type)
        if q_support is None or q_support.call is None:
            return f"no registered family folds {q_spec.domain}:{q_node.op_type}"
        calls.insert(0, _bound(q_support, q_support.call(q_node, q_spec,
                                                         _np_dtype(q_spec.quant_type))))
        source = graph.constant_tensor(graph.input_value(q_node, 0))
        assert source is not None
    shape = tuple(int(d) for d in source.shape.numpy())
    if support.shape is not None:
        shape = support.shape(shape, spec)
    folding = Folding(source, tuple(calls), shape, out_dtype, store_dtype)
    return _validate(folding)


def _validate(folding: Folding) -> Folding | str:
    """Run the kernel on the first rows: the operator's rules fail here, not mid-save."""
    try:
        r0, r1 = next(folding.chunks(VALIDATE_ELEMENTS))
        n = int(np.prod(folding.shape, dtype=np.int64))
        if r0 is not None or n <= 1 << 22:
            got = folding.compute(r0, r1)
            want = folding.shape if r0 is None else (r1 - r0, *folding.shape[1:])
            if tuple(got.shape) != tuple(want):
                return f"kernel produced shape {got.shape}, expected {want}"
    except KernelError as e:
        return str(e)
    except AttributeError as e:  # the kernel may still lack an entry point (quantize, opmx)
        return f"kernel cannot compute this node yet ({e})"
    finally:
        folding.release()
    return folding
