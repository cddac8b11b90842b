"""From a constant DequantizeLinear node to a ``Folding``: which tensors, which kernel calls.

Refusals are returned as reasons (strings), not raised: the pass lists them.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from dqtool import codecs, graph, types
from dqtool.codecs import base
from dqtool.codecs.opmx import logical_shape
from dqtool.errors import KernelError
from dqtool.folding.compute import Folding, Step
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


def _step(kind: str, node: ir.Node, spec: QuantSpec, out: np.dtype | None) -> Step:
    scale = graph.constant_tensor(graph.input_value(node, 1))
    zp_value = graph.input_value(node, 2)
    zp = graph.constant_tensor(zp_value) if zp_value is not None else None
    assert scale is not None  # the spec said constant
    opmx: tuple = ()
    if kind == "opmx":
        a = dict(spec.attributes)
        opmx = (("quant_data_type", a["quant_data_type"]), ("quant_axis", a["quant_axis"]),
                ("group_size", a["group_size"]), ("has_zeropoint", a["has_zeropoint"]),
                ("float_zeropoint", a["float_zeropoint"]))
        if not a["has_zeropoint"]:
            zp = None  # ignored by the op (the codec warns)
    return Step(
        kind=kind,  # type: ignore[arg-type]
        scale=scale, zero_point=zp,
        axis=(base.attr_int(node, "axis", 1) or 0) if kind != "opmx" else 0,
        block_size=base.attr_int(node, "block_size", 0) or 0,
        granularity=spec.granularity, norm_axis=spec.axis, output_dtype=out,
        saturate=spec.saturate if spec.saturate is not None else True, opmx=opmx,
    )


def plan(node: ir.Node, spec: QuantSpec, opsets: dict[str, int],
         store: str | None) -> Folding | str:
    """The folding of a constant, valid DQ; a reason string when it cannot be folded."""
    out_dtype = _np_dtype(spec.float_type)
    if out_dtype is None:
        return f"output type {spec.float_type} is unknown or not a float type"
    store_dtype = out_dtype if store in (None, "keep") else types.by_name(store).dtype
    kind = "opmx" if spec.domain in ("opmx", "pmx") else "dq"
    # The spec's output type is the one in force (output_dtype, else the scale's type);
    # opmx outputs its scale's type, which its kernel infers.
    dq_out = out_dtype if kind == "dq" else None
    steps = [_step(kind, node, spec, dq_out)]
    x = graph.input_value(node, 0)
    source = graph.constant_tensor(x)
    if source is None:
        q_node = x.producer() if x is not None else None
        if q_node is None:
            return "x is not constant"
        q_spec = codecs.read_node(q_node, opsets)
        if q_spec.errors:
            return f"its QuantizeLinear '{q_node.name}': {q_spec.errors[0].message}"
        steps.insert(0, _step("q", q_node, q_spec, _np_dtype(q_spec.quant_type)))
        source = graph.constant_tensor(graph.input_value(q_node, 0))
        assert source is not None
    shape = tuple(int(d) for d in source.shape.numpy())
    if kind == "opmx":
        shape = tuple(logical_shape(shape, str(spec.attribute("quant_data_type"))))  # type: ignore[arg-type]
    folding = Folding(source, tuple(steps), shape, out_dtype, store_dtype)
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
