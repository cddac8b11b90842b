"""MatMulNBits / GatherBlockQuantized → ai.onnx DequantizeLinear, exactly.

Cases rewritten:
- MatMulNBits with integer zero points (packed uint8, or none: ``2^(bits-1)`` made
  explicit) → ``DequantizeLinear(x (K, N) uint2/uint4/uint8, scale (k_blocks, N), zp)``
  blocked along axis 0 with the same block size (per-axis on axis 1 when one block spans K;
  a ragged last block stays ragged) → ``MatMul`` (→ ``Add`` of the bias). x is B's codes
  transposed by one pass over the packed bytes (no Transpose node is left).
- MatMulNBits with float zero points (HQQ): onnxruntime computes ``q·s + (-(zp·s))`` in
  float32, two roundings, which no zero point of DequantizeLinear expresses; so
  ``DequantizeLinear(x, float32 scale)`` (exactly ``q·s``) → ``Reshape`` into blocks →
  ``Add`` of the float32 offsets ``-(zp·s)`` → ``Reshape`` (→ ``Slice`` of a ragged tail)
  (→ ``Cast`` to A's type) → ``MatMul``. Bit-identical to the weight onnxruntime uses.
- a g_idx that maps every row to its own block (``k // block_size``) is dropped when the
  zero points are float (onnxruntime computes other nodes with a g_idx by its own path:
  ``ort_facts``).
- GatherBlockQuantized → ``DequantizeLinear`` of the table (blocked along quantize_axis,
  int4/uint4 tables and scales reused as they are stored; uint8-packed codes become
  uint2/uint4 tensors over the same bytes) → ``Gather``. This order, because ai.onnx Gather
  takes no 4-bit type.
Refused (the node stays, the report says why): an act-order or computed g_idx, any
g_idx with integer or no zero points, a B prepacked for an execution provider, a weight
not constant, a target opset too old for the codes (uint4 21, uint2 25; uint8 is laid
out per-axis below 21).
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx_ir as ir

from dqtool import codecs, graph
from dqtool.convert import blocked, generic, outputs
from dqtool.convert.context import Step
from dqtool.convert.registry import Outcome
from dqtool.convert.widen import widened_tensor
from dqtool.families.fused import ort_facts, read
from dqtool.families.fused.gather_to_onnx import gather_block_quantized
from dqtool.families.fused.matmul_to_onnx import matmul_nbits, shared_weight_key
from dqtool.families.fused.spec import FusedSpec
from dqtool.families.fused.surgery import FusedBuilder
from dqtool.families.fused.upgrade_notes import BITS_KEY, note_original

if TYPE_CHECKING:
    from dqtool.storage import EarlyWriter

_NEEDS = {"uint2": 25, "int2": 25, "uint4": 21, "int4": 21}


class NoExactForm(Exception):
    """Why a fused node cannot be rewritten exactly (the node is left as it is)."""


def check(spec: FusedSpec, target: int) -> None:
    """Raise ``NoExactForm`` when ``spec`` has no exact ai.onnx form at opset ``target``."""
    if spec.errors:
        raise NoExactForm("invalid: " + "; ".join(p.message for p in spec.errors))
    why = ort_facts.g_idx_refusal(spec.g_idx, spec.zero_point)
    if why is not None:
        raise NoExactForm(why)
    if spec.attribute("weight_prepacked", 0):
        raise NoExactForm("B is prepacked for an execution provider")
    if not spec.constant:
        raise NoExactForm("the quantized weight, scales or zero points are computed at run time")
    need = needed_opset(spec)
    if target < need:
        what = spec.quant_type if need != 19 else f"a {spec.scale_type} scale in"
        raise NoExactForm(f"{what} DequantizeLinear needs ai.onnx opset {need}+")


def native_opset(spec: FusedSpec) -> int:
    """The opset whose DequantizeLinear takes the codes as they are (uint4 21, uint2 25)."""
    return _NEEDS.get(spec.quant_type or "", 13 if spec.quant_type == "uint8" else 21)


def needed_opset(spec: FusedSpec) -> int:
    """The lowest opset ``upgrade`` rewrites the node at: below ``native_opset`` 2/4-bit
    codes are widened to 8 bits and a blocked weight laid out as per-axis rows (the usual
    lowerings, exact); below 19, float16/bfloat16 scales are read as float32 and the
    weight cast back (exact: the product fits float32, then one rounding, as the
    original's); float8 tables 21."""
    need = 13 if spec.quant_type in ("uint2", "int2", "uint4", "int4", "uint8") else 21
    return need


_WIDE = {ir.DataType.UINT4: (ir.DataType.UINT8, np.uint8),
         ir.DataType.UINT2: (ir.DataType.UINT8, np.uint8),
         ir.DataType.INT4: (ir.DataType.INT8, np.int8),
         ir.DataType.INT2: (ir.DataType.INT8, np.int8)}

_NARROW_BITS = {ir.DataType.UINT4: 4, ir.DataType.INT4: 4, ir.DataType.UINT2: 2,
                ir.DataType.INT2: 2}


def _widen(b: FusedBuilder, note: bool) -> bool:
    """Give every new DequantizeLinear 8-bit codes in place of 2/4-bit ones (exact);
    ``note``: say so on it (``BITS_KEY``)."""
    done = False
    for dq in [n for n in b.nodes if n.op_type == "DequantizeLinear"]:
        for i in (0, 2):
            v = graph.input_value(dq, i)
            if v is None or v.dtype not in _WIDE:
                continue
            wide_t, np_t = _WIDE[v.dtype]
            codes = graph.constant_tensor(v)
            assert codes is not None  # (the reading of the node found it constant)
            # (codes in a file: written a band at a time when saved)
            wide = b.existing(widened_tensor(codes, np_t, wide_t),
                              f"{'x' if i == 0 else 'zero_point'}_8bit")
            made = wide.producer()
            if made is not None:  # in a function, a Constant node: before its reader
                b.nodes.remove(made)
                b.nodes.insert(b.nodes.index(dq), made)
            dq.replace_input_with(i, wide)
            if v.name in b.created and not v.uses():
                # the narrow codes go: an initializer, or in a function the Constant node
                # holding them (left, it kept its 2/4-bit type in a model lowered below
                # the opset that has it: onnxruntime refused the model)
                b.drop_constant(v)
            # What the codes were, so ``pack`` can give back the original width (it checks
            # that every code still fits before it believes this).
            if note:
                dq.metadata_props[BITS_KEY] = str(_NARROW_BITS[v.dtype])
            done = True
    return done


def rewrite(node: ir.Node, opsets: dict[str, int], target: int, fresh,
            in_function: bool = False, unpacked: bool = False, shared: dict | None = None,
            early: EarlyWriter | None = None
            ) -> tuple[list[ir.Value], str, str, list[ir.Node]]:
    """Rewrite ``node`` in place; returns (values it no longer uses, how, why, new nodes).
    Raises ``NoExactForm`` (nothing changed) when it has no exact ai.onnx form at ``target``.
    ``unpacked``: see ``matmul_nbits``. ``shared``: the caller's memo of the weights made so
    far in this conversion: a MatMulNBits with the same weight as one before multiplies by
    its dequantized weight (a weight two nodes shared was stored twice). ``early``: the
    save's writer of the data file, when it writes while the model is converted."""
    spec = read.read(node, opsets)
    check(spec, target)
    b = FusedBuilder(node, fresh, in_function,
                home=graph.input_value(node, 1 if spec.op == "MatMulNBits" else 0), early=early)
    old_inputs = [v for v in node.inputs if v is not None]
    if spec.op == "MatMulNBits":
        key = None if shared is None else shared_weight_key(node, spec, target, unpacked)
        y, how = matmul_nbits(node, spec, b, unpacked,
                              None if key is None else shared.get(key))
        if key is not None and key not in shared:
            mm = next((n for n in b.nodes if n.op_type == "MatMul"), None)
            if mm is not None:
                shared[key] = (mm, node.name or f"<unnamed {node.op_type}>")
    else:
        y, how = gather_block_quantized(node, spec, b)
    # What pack needs to give the original back (width, accuracy level, bias, names), as
    # node metadata: only where the model is IR version 10 anyway (opset 21 on; metadata
    # needs 10, and a model lowered for an older runtime keeps its lower IR version), and
    # never in a fold (whose nodes pack does not read).
    notes = target >= 21 and not unpacked
    if notes:
        note_original(node, spec, b, y)
    if target < native_opset(spec) and _widen(b, notes):
        how += (f"; {spec.quant_type} codes widened to 8 bits (DequantizeLinear-"
                f"{native_opset(spec)} is the first to take {spec.quant_type})")
    b.finish(y)
    why = "exact: the dequantized weight is bit-identical to the one onnxruntime multiplies"
    if spec.op == "GatherBlockQuantized":
        why = ("exact: every gathered value is bit-identical (an out-of-range index, zeros "
               "in GatherBlockQuantized, is an error in Gather)")
    if spec.accuracy_level > 0:
        why += (f"; accuracy_level={spec.accuracy_level}: onnxruntime may quantize A in the "
                "original, so its outputs differ from the float MatMul by design")
    if spec.g_idx == "trivial":
        how += "; g_idx (every row in its own block) dropped"
    return old_inputs, how, why, b.nodes


# The weights each conversion has made so far (``rewrite``'s ``shared``), by its Context:
# freed with the conversion.
_MADE: weakref.WeakKeyDictionary[Any, dict] = weakref.WeakKeyDictionary()


def convert(node: ir.Node, step) -> object:
    """The family's "onnx" adapter: rewrite the node (then its new DequantizeLinear follows
    the usual lowerings: ``--per-axis``, blocked → per-axis rows below opset 21), or keep
    it with the reason."""
    try:
        old, how, why, new = rewrite(node, {"com.microsoft": 1}, step.target, step.ctx.fresh,
                                     step.in_function,
                                     shared=_MADE.setdefault(step.ctx, {}),
                                     early=step.ctx.early)
    except NoExactForm as e:
        return Outcome("kept", "left as com.microsoft", str(e))
    step.ctx.replaced.extend(old)
    out = Outcome("changed", f"com.microsoft {node.op_type} → {how}", why)
    dst = generic.since_at("DequantizeLinear", step.target)
    if not (step.ctx.options.per_axis or dst < 21):
        return out  # no lowering applies (nor a reading of the new nodes to find one)
    for dq in (n for n in new if n.op_type == "DequantizeLinear"):
        spec = codecs.read_node(dq, {"": max(dst, 21)})  # as built: a DequantizeLinear-21
        sub = Step(dq, step.where, step.in_function, dst, dst, step.ctx)
        if spec.granularity == "blocked":
            reason = "--per-axis" if step.ctx.options.per_axis else \
                f"DequantizeLinear-{dst} has no blocked form"
            res = blocked.to_per_axis(sub, spec, reason)
            if res.status == "refused":
                return res
            out = Outcome.merge([out, res])
        if spec.scale_type not in (None, "float") and dst < 19:
            res = outputs.float32_detour(sub, codecs.read_node(dq, {"": max(dst, 21)}),
                                         f"DequantizeLinear-{dst} takes float scales only")
            if res.status == "refused":
                return res
            out = Outcome.merge([out, res])
    return out
