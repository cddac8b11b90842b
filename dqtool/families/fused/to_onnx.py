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

import numpy as np
import onnx_ir as ir

from dqtool import graph, types
from dqtool.families.fused import arrays, ort_facts, packing, read
from dqtool.families.fused.rows import CodeRows
from dqtool.families.fused.spec import FusedSpec
from dqtool.families.fused.surgery import Builder

_IR_CODE = {"uint2": ir.DataType.UINT2, "uint4": ir.DataType.UINT4, "uint8": ir.DataType.UINT8,
            "int4": ir.DataType.INT4}
_NEEDS = {"uint2": 25, "int2": 25, "uint4": 21, "int4": 21}


class Refusal(Exception):
    """Why a fused node cannot be rewritten exactly (the node is left as it is)."""


def _tensor(v: ir.Value | None) -> ir.TensorProtocol:
    t = graph.constant_tensor(v)
    assert t is not None
    return t


def _array(v: ir.Value) -> np.ndarray:
    return arrays.value_array(v)


def _stored_transpose(made: ir.Value, stored: ir.Value, shape: tuple[int, int]) -> None:
    """Say that ``made`` (a new constant) is ``stored``'s bytes read as ``made``'s type and
    ``shape``, transposed: a rewrite that wants ``made``'s transpose (blocked → per-axis
    rows: B's own rows) takes the stored bytes as they are (``transposed``), where it would
    transpose the transpose back."""
    t, source = graph.constant_tensor(made), graph.constant_tensor(stored)
    if t is not None and source is not None:
        dtype = t.dtype
        t.transposed = lambda: arrays.same_bytes(source, dtype, shape)  # type: ignore[attr-defined]


def _default_zero_points(code: int, bits: int, shape: tuple[int, ...],
                         dtype: ir.DataType) -> ir.PackedTensor:
    """``code`` everywhere in a packed 2/4-bit tensor: its packed byte, repeated (the bytes
    ``packing.pack`` gives; the last byte's unused slots stay 0)."""
    count = int(np.prod(shape))
    byte = sum(code << (bits * j) for j in range(8 // bits))
    packed = np.full(-(-count * bits // 8), byte, np.uint8)
    if count * bits % 8:
        packed[-1] &= (1 << (count * bits % 8)) - 1
    return ir.PackedTensor(packed, dtype, shape=shape)


def check(spec: FusedSpec, target: int) -> None:
    """Raise ``Refusal`` when ``spec`` has no exact ai.onnx form at opset ``target``."""
    if spec.errors:
        raise Refusal("invalid: " + "; ".join(p.message for p in spec.errors))
    why = ort_facts.g_idx_refusal(spec.g_idx, spec.zero_point)
    if why is not None:
        raise Refusal(why)
    if spec.attribute("weight_prepacked", 0):
        raise Refusal("B is prepacked for an execution provider")
    if not spec.constant:
        raise Refusal("the quantized weight, scales or zero points are computed at run time")
    need = needed_opset(spec)
    if target < need:
        what = spec.quant_type if need != 19 else f"a {spec.scale_type} scale in"
        raise Refusal(f"{what} DequantizeLinear needs ai.onnx opset {need}+")


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


BITS_KEY = "dqtool.fused.bits"
# The original MatMulNBits' accuracy_level (> 0), on its DequantizeLinear: pack writes it
# back unless told another.
ACCURACY_KEY = "dqtool.fused.accuracy_level"
# On the bias Add made from a MatMulNBits' own bias input: pack takes this one back into
# the node (an Add that was in the original model stays an Add: a bias inside the node
# is summed in its own order, so outputs moved).
BIAS_KEY = "dqtool.fused.bias"
# The original node's name and its constant inputs' names (JSON, by role), on its
# DequantizeLinear: pack gives them back where they are free, so upgrade then pack gives
# back the original model's names too.
NAMES_KEY = "dqtool.fused.names"
# A MatMulNBits whose one block spans K (upgraded to per-axis): its block_size, which a
# per-axis weight does not say, where it is not what pack takes then (the smallest power
# of two >= K and >= 16).
BLOCK_KEY = "dqtool.fused.block_size"
# The bits of each row's last byte of B past K's last code (K·bits not a multiple of 8),
# one byte a row in hex, where any is not 0: onnxruntime's quantizer leaves codes there
# that no value reads, and pack puts them back so that B's bytes are the original's.
TAIL_KEY = "dqtool.fused.tail"
# role -> input index, of each fused op
NAME_ROLES = {"MatMulNBits": {"B": 1, "scales": 2, "zero_points": 3},
              "GatherBlockQuantized": {"data": 0, "scales": 2, "zero_points": 3}}
_NARROW_BITS = {ir.DataType.UINT4: 4, ir.DataType.INT4: 4, ir.DataType.UINT2: 2,
                ir.DataType.INT2: 2}


def _widen(b: Builder, note: bool) -> bool:
    """Give every new DequantizeLinear 8-bit codes in place of 2/4-bit ones (exact);
    ``note``: say so on it (``BITS_KEY``)."""
    from dqtool.convert.widen import widened_tensor

    done = False
    for dq in [n for n in b.nodes if n.op_type == "DequantizeLinear"]:
        for i in (0, 2):
            v = graph.input_value(dq, i)
            if v is None or v.dtype not in _WIDE:
                continue
            wide_t, np_t = _WIDE[v.dtype]
            # (codes in a file: written a band at a time when saved)
            wide = b.existing(widened_tensor(_tensor(v), np_t, wide_t),
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
                old = v.producer()
                if old is not None and any(n is old for n in b.nodes):
                    b.nodes.remove(old)
                else:
                    b.home.initializers.pop(v.name, None)
            # What the codes were, so ``pack`` can give back the original width (it checks
            # that every code still fits before it believes this).
            if note:
                dq.metadata_props[BITS_KEY] = str(_NARROW_BITS[v.dtype])
            done = True
    return done


def shared_weight_key(node: ir.Node, spec: FusedSpec, target: int, unpacked: bool
                      ) -> tuple | None:
    """What two MatMulNBits must share for one dequantized weight to serve both: the same
    B, scales, zero points and g_idx values, attributes and accuracy level (noted on the
    DequantizeLinear); None for a node whose weight is not constant. (In two graphs, the
    branches of an If reading one stored weight, they share its constants: ``_weight_for``.)"""
    ins = [graph.input_value(node, i) for i in range(5)]
    if ins[1] is None or graph.constant_tensor(ins[1]) is None or node.graph is None:
        return None
    if spec.zero_point == "float":  # HQQ's chain ends in one Reshape pack takes whole
        return None
    return (target, unpacked, spec.x_shape, spec.bits, spec.block_size,
            spec.accuracy_level, *(None if v is None else id(v) for v in ins[1:]))


def _weight_for(mm: ir.Node, b: Builder) -> ir.Value | None:
    """The dequantized weight ``mm`` (made for another MatMulNBits with the same weight)
    multiplies by, as the node ``b`` builds for can read it: that value in the same graph;
    in another one (the other branch of an If, both reading one stored weight), a
    DequantizeLinear there of the same constants, when they are stored where both graphs
    see them (with the weight: ``Builder.home``); else None (this node makes its own)."""
    w = mm.inputs[1]
    if mm.graph is b.graph or w is None:
        return w
    dq = w.producer()
    if dq is None or dq.op_type != "DequantizeLinear" or dq.domain not in ("", "ai.onnx") \
            or not all(v is not None and v.is_initializer() and v.graph is b.home
                       for v in dq.inputs):
        return None
    return b.op("DequantizeLinear", list(dq.inputs), "dequantize", dict(dq.attributes),
                w.dtype, w.shape)


def matmul_nbits(node: ir.Node, spec: FusedSpec, b: Builder, unpacked: bool = False,
                 shared: tuple[ir.Node, str] | None = None) -> tuple[ir.Value, str]:
    """The new nodes of a MatMulNBits (in ``b``); returns (result, how). ``unpacked``: x
    holds one code a byte (for a fold, which reads codes and never writes x) instead of
    the packed bytes a saved model stores. ``shared``: (the MatMul made for another
    MatMulNBits with the same weight, that node's name): this one multiplies by the same
    dequantized weight (one weight stored, not two): the MatMul's B as it is now (a
    lowering below opset 21 may have put a Reshape after the DequantizeLinear)."""
    a, bq, scales, zp, _g, bias = (graph.input_value(node, i) for i in range(6))
    w = None if shared is None else _weight_for(shared[0], b)
    if w is not None:
        y = b.op("MatMul", [a, w], "matmul", dtype=a.dtype)
        how = f"MatMul by {shared[1]}'s dequantized weight (the same B, scales and zero points)"
        if w.producer() in b.nodes:  # its own DequantizeLinear, of the constants stored once
            how = (f"DequantizeLinear of {shared[1]}'s constants (the same B, scales and zero "
                   "points, stored once) → MatMul")
        if bias is not None:
            y = b.op("Add", [y, bias], "bias", dtype=a.dtype)
            how += " → Add (bias)"
        return y, how
    k, n = spec.x_shape
    bits, block, kb = spec.bits, spec.block_size, spec.k_blocks
    code_t = _IR_CODE[spec.quant_type]
    s_type = types.by_name(spec.scale_type).ir_type
    per_axis = kb == 1
    rows = k if spec.zero_point != "float" else kb * block

    def x_bytes() -> ir.TensorProtocol:
        raw = packing.nbits_to_onnx(_array(bq), rows, n, bits)
        if bits == 8:
            return ir.Tensor(raw.reshape(rows, n), dtype=code_t)
        return ir.PackedTensor(raw, code_t, shape=(rows, n))

    if unpacked:  # codes a band of rows at a time, as the fold streams them
        x = b.existing(CodeRows(lambda: _array(bq), rows, n, bits, code_t), "x")
    elif n * bits % 8 == 0:  # rows of whole bytes: written a band of K rows at a time
        x = b.streamed("x", code_t, (rows, n), x_bytes, lambda file: packing.write_nbits_as_onnx(
            _array(bq), rows, n, bits, file))
    else:
        x = b.constant("x", code_t, (rows, n), x_bytes)
    s_shape = (n,) if per_axis else (kb, n)

    def scale_kn(as_float32: bool = False):
        def make() -> np.ndarray:
            s = _array(scales).reshape(n, kb).T
            return (s.astype(np.float32) if as_float32 else s).reshape(s_shape)
        return make

    dq_attrs: dict = {"axis": 1} if per_axis else {"axis": 0, "block_size": block}
    how_parts: list[str] = []
    if spec.zero_point != "float":
        def zp_codes() -> ir.TensorProtocol:
            if zp is None and bits < 8:
                return _default_zero_points(spec.default_zero_point, bits, s_shape, code_t)
            if zp is None:
                codes = np.full(s_shape, spec.default_zero_point, np.uint8)
            else:
                from dqtool.families.fused.kernel import matmul_nbits_zero_points

                codes = matmul_nbits_zero_points(_array(zp), n, kb, bits)[0].T.reshape(s_shape)
            codes = np.ascontiguousarray(codes)
            if bits == 8:
                return ir.Tensor(codes, dtype=code_t)
            return ir.PackedTensor(packing.pack(codes.reshape(-1), bits), code_t,
                                   shape=s_shape)

        # written transposed a band at a time, in C where it can
        s = b.streamed("scale", s_type, s_shape, scale_kn(), lambda file: (
            packing.write_transposed(_array(scales).reshape(n, kb), file)))
        if k == kb * block:  # x and the scale are B and the scales transposed, exactly
            _stored_transpose(x, bq, (n, k))
            _stored_transpose(s, scales, (n, kb))
        z = b.constant("zero_point", code_t, s_shape, zp_codes)
        w = b.op("DequantizeLinear", [x, s, z], "dequantize", dq_attrs, s_type, (k, n))
        how_parts.append(f"DequantizeLinear ({spec.quant_type} ({k}, {n}), "
                         + ("per-axis axis 1" if per_axis else f"blocked axis 0, block {block}"
                            + (", ragged last block" if k % block else ""))
                         + (", default zero point made explicit" if zp is None else "") + ")")
    else:
        s32 = b.constant("scale", ir.DataType.FLOAT, s_shape, scale_kn(True))
        dq_attrs = {"axis": 0, "block_size": block} if not per_axis else {"axis": 1}
        w0 = b.op("DequantizeLinear", [x, s32], "dequantize", dq_attrs, ir.DataType.FLOAT,
                  (rows, n))

        def zp_blocks() -> np.ndarray:
            return np.ascontiguousarray(_array(zp).reshape(n, kb).T).reshape(kb, 1, n)

        # The offsets -(zp·s) are computed by the graph, in float32 as onnxruntime does, so
        # the zero points stay stored as they were (and ``pack`` gives them back).
        z_type = types.by_name(spec.zero_point_type).ir_type
        zc = b.constant("zero_point", z_type, (kb, 1, n), zp_blocks)
        if z_type != ir.DataType.FLOAT:
            zc = b.op("Cast", [zc], "zero_point_float", {"to": ir.AttrInt64("to", 1)},
                      ir.DataType.FLOAT, (kb, 1, n))
        s_b = b.op("Reshape", [s32, b.small("scale_shape", np.array([kb, 1, n]))],
                   "scale_blocks", dtype=ir.DataType.FLOAT, shape=(kb, 1, n))
        prod = b.op("Mul", [zc, s_b], "zero_point_times_scale", dtype=ir.DataType.FLOAT,
                    shape=(kb, 1, n))
        off = b.op("Neg", [prod], "offset", dtype=ir.DataType.FLOAT, shape=(kb, 1, n))
        blocks = b.op("Reshape", [w0, b.small("blocks_shape", np.array([kb, block, n]))],
                      "blocks", dtype=ir.DataType.FLOAT, shape=(kb, block, n))
        added = b.op("Add", [blocks, off], "add_offset", dtype=ir.DataType.FLOAT,
                     shape=(kb, block, n))
        w = b.op("Reshape", [added, b.small("rows_shape", np.array([rows, n]))], "rows",
                 dtype=ir.DataType.FLOAT, shape=(rows, n))
        if rows != k:
            w = b.op("Slice", [w, b.small("starts", np.array([0])),
                               b.small("ends", np.array([k])), b.small("axes", np.array([0]))],
                     "slice", dtype=ir.DataType.FLOAT, shape=(k, n))
        if s_type != ir.DataType.FLOAT:
            w = b.op("Cast", [w], "cast", {"to": ir.AttrInt64("to", int(s_type))}, s_type,
                     (k, n))
        how_parts.append(f"DequantizeLinear ({spec.quant_type} ({rows}, {n}), float32 scale) "
                         "→ Add of -(zp·s) per block (float zero points, two roundings "
                         "as onnxruntime)"
                         + (" → Slice of the ragged tail" if rows != k else "")
                         + (f" → Cast to {spec.scale_type}" if s_type != ir.DataType.FLOAT
                            else ""))
    y = b.op("MatMul", [a, w], "matmul", dtype=a.dtype)
    how_parts.append("MatMul")
    if bias is not None:
        y = b.op("Add", [y, bias], "bias", dtype=a.dtype)
        how_parts.append("Add (bias)")
    return y, " → ".join(how_parts)


def gather_block_quantized(node: ir.Node, spec: FusedSpec, b: Builder
                           ) -> tuple[ir.Value, str]:
    data, indices, scales, zp = (graph.input_value(node, i) for i in range(4))
    stored = graph.elem_type(data)
    logical = tuple(int(d) for d in spec.x_shape)
    s_shape = tuple(int(d) for d in spec.scale_shape)
    code_t = _IR_CODE.get(spec.quant_type or "") or types.by_name(spec.quant_type).ir_type
    s_type = types.by_name(spec.scale_type).ir_type
    notes = []
    if stored == "uint8" and spec.bits != 8:
        x = b.existing(arrays.same_bytes(_tensor(data), code_t, logical), "x")
        notes.append(f"uint8-packed codes read as {spec.quant_type} {logical} (same bytes)")
    else:
        x = data
    z: ir.Value | None = zp
    if stored == "uint8":
        bits = spec.bits

        def zp_codes() -> ir.TensorProtocol:
            if zp is None and bits < 8:
                return _default_zero_points(spec.default_zero_point, bits, s_shape, code_t)
            if zp is None:
                codes = np.full(s_shape, spec.default_zero_point, np.uint8)
            else:
                codes = packing.unpack(_array(zp), bits)[..., : s_shape[-1]]
            codes = np.ascontiguousarray(codes)
            if bits == 8:
                return ir.Tensor(codes, dtype=code_t)
            return ir.PackedTensor(packing.pack(codes.reshape(-1), bits), code_t,
                                   shape=s_shape)

        z = b.constant("zero_point", code_t, s_shape, zp_codes)
        if zp is None:
            notes.append(f"default zero point {spec.default_zero_point} made explicit")
    inputs = [x, scales] + ([z] if z is not None else [])
    w = b.op("DequantizeLinear", inputs, "dequantize",
             {"axis": spec.axis, "block_size": spec.block_size}, s_type, logical)
    y = b.op("Gather", [w, indices], "gather", {"axis": spec.gather_axis}, s_type)
    how = (f"DequantizeLinear of the table ({spec.quant_type} {logical}, blocked axis "
           f"{spec.axis}, block {spec.block_size}) → Gather axis {spec.gather_axis}")
    return y, how + ("; " + "; ".join(notes) if notes else "")


def rewrite(node: ir.Node, opsets: dict[str, int], target: int, fresh,
            in_function: bool = False, unpacked: bool = False, shared: dict | None = None
            ) -> tuple[list[ir.Value], str, str, list[ir.Node]]:
    """Rewrite ``node`` in place; returns (values it no longer uses, how, why, new nodes).
    Raises ``Refusal`` (nothing changed) when it has no exact ai.onnx form at ``target``.
    ``unpacked``: see ``matmul_nbits``. ``shared``: the caller's memo of the weights made so
    far in this conversion: a MatMulNBits with the same weight as one before multiplies by
    its dequantized weight (a weight two nodes shared was stored twice)."""
    spec = read.read(node, opsets)
    check(spec, target)
    b = Builder(node, fresh, in_function,
                home=graph.input_value(node, 1 if spec.op == "MatMulNBits" else 0))
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
        _note(node, spec, b, y)
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


def _note(node: ir.Node, spec: FusedSpec, b: Builder, y: ir.Value) -> None:
    dqs = [n for n in b.nodes if n.op_type == "DequantizeLinear"]
    names = _names(node)
    if not dqs:  # a weight shared with a node before: the names go on this node's MatMul
        dqs = [n for n in b.nodes if n.op_type == "MatMul"][:1]
    tail = _tail(node, spec) if spec.op == "MatMulNBits" else None
    for dq in dqs:
        dq.metadata_props[NAMES_KEY] = names
        if spec.op == "MatMulNBits" and spec.accuracy_level > 0:
            dq.metadata_props[ACCURACY_KEY] = str(spec.accuracy_level)
        if spec.op == "MatMulNBits" and spec.k_blocks == 1 and \
                spec.block_size != max(16, 1 << (spec.x_shape[0] - 1).bit_length()):
            dq.metadata_props[BLOCK_KEY] = str(spec.block_size)
        if tail:
            dq.metadata_props[TAIL_KEY] = tail
    if spec.op == "MatMulNBits" and graph.input_value(node, 5) is not None:
        y.producer().metadata_props[BIAS_KEY] = "1"  # the Add made of the bias input


def tail_place(k: int, bits: int, block: int) -> tuple[int, int] | None:
    """(byte of a row of B holding K's last code, bit where the codes past K start), or
    None when K's codes end on a byte."""
    per = 8 // bits
    if k % per == 0:
        return None
    blob = block * bits // 8
    return (k - 1) // block * blob + (k - 1) % block // per, bits * (k % per)


def _tail(node: ir.Node, spec: FusedSpec) -> str | None:
    """``TAIL_KEY``'s note of a MatMulNBits, or None when there is nothing past K or only 0."""
    k, n = spec.x_shape
    place = tail_place(k, spec.bits, spec.block_size)
    bq = graph.input_value(node, 1)
    if place is None or bq is None or graph.constant_tensor(bq) is None:
        return None
    byte, shift = place
    rows = np.asarray(_array(bq), np.uint8).reshape(n, -1)
    tail = rows[:, byte] >> shift
    return tail.astype(np.uint8).tobytes().hex() if tail.any() else None


def _names(node: ir.Node) -> str:
    import json

    names: dict[str, str] = {"node": node.name or ""}
    if node.op_type == "GatherBlockQuantized":  # uint8-packed codes, or int4/uint4
        names["data_type"] = graph.elem_type(graph.input_value(node, 0)) or ""
    for role, i in NAME_ROLES[node.op_type].items():
        v = graph.input_value(node, i)
        if v is not None and v.name and v.is_initializer():
            names[role] = v.name
        elif v is not None and v.name and (holder := graph.constant_node(v)) is not None:
            # inside a function: a Constant node's output, and that node's own name
            names[role] = v.name
            names[f"{role}_node"] = holder.name or ""
    return json.dumps(names, sort_keys=True)


def convert(node: ir.Node, step) -> object:
    """The family's "onnx" adapter: rewrite the node (then its new DequantizeLinear follows
    the usual lowerings: ``--per-axis``, blocked → per-axis rows below opset 21), or keep
    it with the reason."""
    from dqtool import codecs
    from dqtool.convert import blocked, generic, outputs
    from dqtool.convert.context import Step
    from dqtool.convert.registry import Outcome

    if step.ctx.options.keep_contrib:
        return Outcome("kept", "left as com.microsoft", "--keep-contrib")
    try:
        old, how, why, new = rewrite(node, {"com.microsoft": 1}, step.target, step.ctx.fresh,
                                     step.in_function,
                                     shared=step.ctx.memo.setdefault("fused.weights", {}))
    except Refusal as e:
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
