"""``dqtool pack``: ai.onnx DequantizeLinear → MatMul / Gather back into onnxruntime's fused
MatMulNBits / GatherBlockQuantized, with bit-identical weights.

Cases rewritten (``FusedPackPass``):
- ``DequantizeLinear(x const (K, N), scale, zp)`` blocked along axis 0 (block a power of 2
  ≥ 16) or per-axis on axis 1 (or per-tensor), 2/4/8-bit, whose only use is MatMul's B
  → MatMulNBits; the ``Add`` of a constant ``(N,)`` bias that is the MatMul's only use
  becomes its bias input when ``upgrade`` made it from a MatMulNBits' bias (``BIAS_KEY``),
  or any such Add with ``fuse_bias``. Signed codes move to unsigned ones with the zero point
  (``q - zp`` is unchanged); a ragged last block is padded with code 0 and unused
  zero-point slots with ``2^(bits-1)``, as onnxruntime's quantizer writes them; zero
  points that are all ``2^(bits-1)`` are left out (``zero_points="auto"``), as that
  quantizer does for symmetric weights.
- the float-zero-point chain ``upgrade`` writes for HQQ weights (DequantizeLinear with a
  float32 scale → Reshape → Add(-(zp·s), from the stored zero points) → Reshape (→ Slice)
  (→ Cast) → MatMul)
  → MatMulNBits with float zero points (2 or 4 bits: onnxruntime refuses 8-bit codes with
  float zero points, so an 8-bit chain is left).
- ``DequantizeLinear(table const, blocked along one axis) → Gather`` on another axis
  → GatherBlockQuantized (int4/uint4 tables reused as stored; uint8 → bits 8; uint2 →
  uint8-packed bits 2).
Left alone, with the reason in the report: anything else (a computed weight, a
DequantizeLinear with several uses, blocks along N, scale type differing from A's, ...).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from dqtool import codecs, graph, types
from dqtool.cleanup import ModelNames, ScopedNames
from dqtool.codecs.base import output_dtype_attr
from dqtool.families.fused import arrays, packing
from dqtool.families.fused.surgery import Builder
from dqtool.spec import QuantSpec
from dqtool.storage import tensor_reads

_BITS = {"uint2": 2, "int2": 2, "uint4": 4, "int4": 4, "uint8": 8, "int8": 8}


@dataclass
class Packed:
    node: str
    graph: str
    op: str  # the fused op written
    how: str


@dataclass
class Skipped:
    node: str
    graph: str
    why: str


@dataclass
class PackReport:
    packed: list[Packed] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    model: ir.Model | None = None
    written: list[str] = field(default_factory=list)


class NoMatch(Exception):
    pass


def _t(v: ir.Value | None) -> ir.TensorProtocol:
    t = graph.constant_tensor(v)
    if t is None:
        raise NoMatch("not a constant")
    return t


def _array(v: ir.Value) -> np.ndarray:
    return arrays.value_array(v)


def _only_use(v: ir.Value) -> tuple[ir.Node, int] | None:
    uses = list(v.uses())
    if len(uses) != 1 or v.is_graph_output():
        return None
    return uses[0].node, uses[0].idx


def _pow2_16(b: int) -> bool:
    return b >= 16 and (b & (b - 1)) == 0


def _next_pow2_16(n: int) -> int:
    b = 16
    while b < n:
        b *= 2
    return b


def _unsigned_codes(arr: np.ndarray, bits: int, signed: bool) -> np.ndarray:
    a = arr.astype(np.int16)
    return (a + (1 << (bits - 1)) if signed else a).astype(np.uint8)


# With --per-axis, or below opset 21, upgrade lays a blocked weight out as per-axis rows,
# reshaped and transposed back: pack does not take that form.
_LAYOUT_HINT = {op: "; a weight laid out as per-axis rows (`--per-axis`, or below opset 21) "
                    "packs after `dqtool upgrade --opset 21` of the original, without "
                    "--per-axis" for op in ("Reshape", "Transpose")}


class FusedPackPass:
    """Rewrites the patterns in the module docstring; ``report`` lists what it did."""

    def __init__(self, accuracy_level: int | None = None, zero_points: str = "auto",
                 gather: bool = True, fuse_bias: bool = False) -> None:
        if zero_points not in ("auto", "packed"):
            raise ValueError(f"zero_points must be auto or packed, got {zero_points!r}")
        self.accuracy_level = accuracy_level
        self.zero_points = zero_points
        self.gather = gather
        self.fuse_bias = fuse_bias
        self.report = PackReport()

    def __call__(self, model: ir.Model) -> PackReport:
        fresh = ModelNames(model)
        self.fresh = fresh
        self._named: list[tuple[ir.Node, dict, set[str]]] = []
        # id(DequantizeLinear) → the B, scales (, zero points) packed for its first MatMul,
        # which the others that share the weight take as they are
        self._made: dict[int, list[ir.Value]] = {}
        replaced: list[ir.Value] = []
        for site in list(graph.walk(model)):
            node = site.node
            if node.graph is None or node.op_type != "DequantizeLinear" or \
                    graph.domain_name(node.domain) != "ai.onnx":
                continue
            spec = codecs.read_node(node, site.opsets)
            weight = spec.constant and not spec.errors  # a weight left is said, with why
            for consumer, idx in self._consumers(node, site, weight, spec):
                self._pack_one(node, spec, site, consumer, idx, weight, replaced)
        _drop_unused(replaced)
        _restore_names(model, self._named)
        if self.report.packed:
            model.opset_imports.setdefault("com.microsoft", 1)
            for fn in model.functions.values():
                if any(n.domain == "com.microsoft" for n in fn):
                    fn.opset_imports.setdefault("com.microsoft", 1)
        return self.report

    def _consumers(self, dq: ir.Node, site: graph.Site, weight: bool, spec: QuantSpec
                   ) -> list[tuple[ir.Node, int]]:
        """What pack rewrites of ``dq``: its one use, or several MatMuls that take it as B
        (a weight they share stays one: ``_made``); else nothing (said, for a weight)."""
        out = dq.outputs[0]
        use = _only_use(out)
        if use is not None:
            return [use]
        uses = list(out.uses())
        if uses and not out.is_graph_output() and all(
                u.node.op_type == "MatMul" and u.idx == 1 for u in uses):
            # One packed weight for all of them or none (a part packed stored it twice),
            # and only within the DequantizeLinear's graph: the constants made for the
            # first are values of its scope (an If branch's MatMul read them from another).
            why = next((f"its MatMul '{u.node.name}' is in another graph" for u in uses
                        if u.node.graph is not dq.graph), None)
            if why is None and not spec.errors:
                for u in uses:
                    try:
                        _check_a(graph.input_value(u.node, 0), spec, dq)
                    except NoMatch as e:
                        why = f"its MatMul '{u.node.name}' cannot take it: {e}"
                        break
            if why is None:
                return [(u.node, u.idx) for u in uses]
            if weight:
                self._skip(dq, site, f"{len(uses)} MatMuls share it and {why}: pack packs a "
                           "shared weight for all of them or none")
            return []
        if weight:
            self._skip(dq, site, f"its output has {len(uses)} uses (or is a graph output): "
                       "pack takes a weight feeding one Gather, or MatMuls only (as B)")
        return []

    def _pack_one(self, node: ir.Node, spec: QuantSpec, site: graph.Site, consumer: ir.Node,
                  idx: int, weight: bool, replaced: list[ir.Value]) -> None:
        """Rewrite ``node`` → ``consumer`` (input ``idx``), or say why not (a weight)."""
        try:
            self.in_function = site.function is not None
            if consumer.op_type == "MatMul" and idx == 1:
                how, old = self._matmul(node, spec, consumer)
                op = "MatMulNBits"
            elif consumer.op_type == "Reshape" and idx == 0:
                how, old = self._float_zp_chain(node, spec, consumer)
                op = "MatMulNBits"
            elif consumer.op_type == "Gather" and idx == 0 and self.gather:
                how, old = self._gather(node, spec, consumer)
                op = "GatherBlockQuantized"
            else:
                raise NoMatch("--no-gather" if consumer.op_type == "Gather" and weight
                              else "")
        except NoMatch as e:
            if str(e):
                self._skip(node, site, str(e))
            elif weight:  # not a pattern pack knows: said, with what it feeds
                self._skip(node, site, f"it feeds {consumer.op_type} (input {idx}): "
                           "pack takes DequantizeLinear → MatMul (as its B), the float "
                           "zero-point chain upgrade writes, or → Gather (as its table)"
                           + _LAYOUT_HINT.get(consumer.op_type, ""))
            return
        replaced.extend(old)
        self.report.packed.append(Packed(node.name or "<unnamed>", site.graph, op, how))

    def _noted(self, dq: ir.Node) -> dict:
        """What upgrade noted of the original fused node on this DequantizeLinear."""
        import json

        from dqtool.families.fused.to_onnx import NAMES_KEY

        text = dq.metadata_props.get(NAMES_KEY)
        try:
            noted = json.loads(text) if text else {}
        except ValueError:
            return {}
        return noted if isinstance(noted, dict) else {}

    def _note_names(self, node: ir.Node, dq: ir.Node, b: Builder,
                    mm: ir.Node | None = None) -> None:
        # a MatMul of a weight shared with a node before holds its own node's notes
        noted = (self._noted(mm) if mm is not None else {}) or self._noted(dq)
        if noted:
            self._named.append((node, noted, set(b.created)))

    def _skip(self, node: ir.Node, site: graph.Site, why: str) -> None:
        self.report.skipped.append(Skipped(node.name or "<unnamed>", site.graph, why))

    # --- DequantizeLinear → MatMul ---------------------------------------------------

    def _weight_facts(self, spec: QuantSpec, x_shape) -> tuple[int, int, int, int]:
        """(K, N, bits, block) of a (K, N) weight DequantizeLinear, or NoMatch."""
        if spec.errors or not spec.constant or spec.x_from_quantize:
            raise NoMatch("not a valid DequantizeLinear of constants")
        if spec.quant_type not in _BITS:
            raise NoMatch(f"{spec.quant_type} codes: MatMulNBits takes 2, 4 or 8 bits")
        if x_shape is None or len(x_shape) != 2:
            raise NoMatch("the weight is not 2-D")
        k, n = x_shape
        if not k or not n:  # (a weight of no elements: nothing for MatMulNBits to hold)
            raise NoMatch(f"the weight is empty ({k}, {n})")
        if spec.granularity == "blocked":
            if spec.axis != 0:
                raise NoMatch("blocks run along N (axis 1); MatMulNBits blocks run along K")
            if not _pow2_16(spec.block_size):
                raise NoMatch(f"block size {spec.block_size} is not a power of 2 ≥ 16")
            block = spec.block_size
        elif spec.granularity == "per-axis" and spec.axis != 1:
            raise NoMatch("per-axis along K (axis 0) is not blocks of K")
        else:
            block = _next_pow2_16(k)  # one block spans K
        return k, n, _BITS[spec.quant_type], block

    def _scales_zps(self, dq: ir.Node, spec: QuantSpec, k: int, n: int, bits: int, block: int):
        """(scales (kb, N) as the DequantizeLinear holds them, unsigned zero-point codes
        (N, kb), the same codes (kb, N) as the DequantizeLinear holds them) as lazy
        makers."""
        kb = -(-k // block)
        scale, zp = graph.input_value(dq, 1), graph.input_value(dq, 2)
        signed = types.by_name(spec.quant_type).signed

        def kn(v: ir.Value) -> np.ndarray:
            a = _array(v)
            if spec.granularity == "blocked":
                return a.reshape(kb, n)
            return np.broadcast_to(a.reshape(1, -1) if a.size > 1 else a.reshape(1, 1), (kb, n))

        def scales_kn() -> np.ndarray:
            return kn(scale)

        def zp_codes() -> np.ndarray:  # (kb, N), as the DequantizeLinear holds them
            if zp is None:
                return np.full((kb, n), (1 << (bits - 1)) if signed else 0, np.uint8)
            return _unsigned_codes(kn(zp), bits, signed)

        def zps() -> np.ndarray:
            return np.ascontiguousarray(zp_codes().T)

        return scales_kn, zps, zp_codes, kb, signed

    def _matmul(self, dq: ir.Node, spec: QuantSpec, mm: ir.Node) -> tuple[str, list]:
        x = graph.input_value(dq, 0)
        k, n, bits, block = self._weight_facts(spec, graph.shape_of(x))
        if spec.granularity == "per-axis":  # one block spans K: the original's, if noted
            block = _noted_block(dq, k) or block
        a = graph.input_value(mm, 0)
        _check_a(a, spec, dq)
        narrowed = self._narrower(dq, spec, bits)
        bits = narrowed or bits
        kn_scales, zps, zp_codes, kb, signed = self._scales_zps(dq, spec, k, n, bits, block)
        zp_present = graph.input_value(dq, 2) is not None
        omit_zp = self.zero_points == "auto" and self._all_default(zp_codes, bits)
        bias, add = self._bias(mm, n, spec.scale_type)
        b = Builder(mm if add is None else add, self.fresh, self.in_function,
                    home=graph.input_value(dq, 0))
        b.base = mm.name or dq.name or "matmul"

        # On the stored bytes where it can: adding 2^(bits-1) to every signed code (mod
        # 2^bits) flips its top bit. A ragged last block is padded with code 0, as
        # onnxruntime's quantizer does.
        on_bytes = bits in (4, 8) and n % 2 == 0 and k % 2 == 0 and not narrowed
        flip = (0x88 if bits == 4 else 0x80) if signed else 0

        def b_bytes() -> np.ndarray:
            if on_bytes:
                raw = arrays.raw_bytes(_t(x))
                return packing.onnx_to_nbits(raw if bits == 4 else raw.reshape(k, n), k, n,
                                             bits, block, flip=flip)
            return packing.onnx_to_nbits(_unsigned_codes(_array(x), bits, signed), k, n, bits,
                                         block)

        tail = _noted_tail(dq, k, n, bits, block)
        if tail is not None:  # (K's codes end inside a byte: never the streamed path)
            byte, shift, values = tail
            untailed = b_bytes

            def b_bytes() -> np.ndarray:
                rows = np.array(untailed(), np.uint8).reshape(n, -1)
                rows[:, byte] |= values << shift
                return rows.reshape(n, kb, block * bits // 8)

        s_type = types.by_name(spec.scale_type).ir_type
        made = self._made.get(id(dq))  # B, scales, zero points packed for another MatMul
        if made is not None:
            inputs: list[ir.Value | None] = [a, *made]
        else:
            if on_bytes:  # saved to a data file: written a band of N rows at a time
                bq = b.streamed("B", ir.DataType.UINT8, (n, kb, block * bits // 8), b_bytes,
                                lambda file: packing.write_onnx_as_nbits(
                                    arrays.raw_bytes(_t(x)), k, n, bits, block, file,
                                    flip=flip))
            else:
                bq = b.constant("B", ir.DataType.UINT8, (n, kb, block * bits // 8), b_bytes)
            # written transposed a band at a time, in C where it can (NumPy's transpose
            # of (k_blocks, N) float16 runs at ~0.8 GB/s: ~70 ms of the bench model's pack)
            s = b.streamed("scales", s_type, (n, kb), lambda: np.ascontiguousarray(
                kn_scales().T), lambda file: (
                packing.write_transposed(kn_scales(), file)))
            inputs = [a, bq, s]
            if not omit_zp:
                zl = -(-kb * bits // 8)
                # Unused slots of the last byte hold 2^(bits-1), as onnxruntime's quantizer
                # writes them.
                inputs.append(b.constant("zero_points", ir.DataType.UINT8, (n, zl),
                                         lambda: packing.pack(zps(), bits, 1 << (bits - 1))))
            self._made[id(dq)] = inputs[1:]
        if bias is not None:
            inputs += [None] * (5 - len(inputs)) + [bias]
        y = self._mnb(b, inputs, k, n, bits, block, dq)
        old = [v for v in dq.inputs if v is not None]
        b.nodes.append(y.producer())
        b.finish(y)
        self._note_names(y.producer(), dq, b, mm)
        _remove_unused([mm, dq])
        how = (f"{spec.quant_type} ({k}, {n}) {spec.granularity} → MatMulNBits bits={bits} "
               f"block_size={block}" + (" + bias" if bias is not None else "")
               + ("" if omit_zp else ", packed zero points")
               + ("" if zp_present or omit_zp else " (zero point 0 made explicit)"))
        return how, old

    def _narrower(self, dq: ir.Node, spec: QuantSpec, bits: int) -> int | None:
        """The width ``upgrade`` widened these 8-bit codes from (its note on the node),
        when every code and zero point still fits in it; else None (8 bits stay)."""
        from dqtool.families.fused.to_onnx import BITS_KEY

        hint = dq.metadata_props.get(BITS_KEY)
        if bits != 8 or spec.quant_type != "uint8" or hint not in ("2", "4"):
            return None
        narrow = int(hint)
        for i in (0, 2):
            v = graph.input_value(dq, i)
            if v is not None and int(_array(v).max(initial=0)) >= 1 << narrow:
                return None
        return narrow

    def _all_default(self, zp_codes, bits: int) -> bool:
        # on the codes as stored: the transpose the packed form needs costs more than
        # the test (0.1 ms a weight of the bench model), and is made only if they are kept
        return bool(np.all(zp_codes() == (1 << (bits - 1))))

    def _bias(self, mm: ir.Node, n: int, s_type: str | None):
        """(bias, Add) when the MatMul's one use is an Add of a constant bias that goes
        into the node: the one upgrade made from a MatMulNBits' bias input, or, with
        ``fuse_bias``, any. Else (None, None): the Add stays (inside the node the bias is
        summed in onnxruntime's own order, which moved float16 outputs by an ulp)."""
        from dqtool.families.fused.to_onnx import BIAS_KEY

        use = _only_use(mm.outputs[0])
        if use is None or use[0].op_type != "Add":
            return None, None
        add = use[0]
        if not self.fuse_bias and add.metadata_props.get(BIAS_KEY) != "1":
            return None, None
        other = add.inputs[1 - use[1]]
        if other is None or graph.constant_tensor(other) is None or \
                graph.shape_of(other) != (n,) or graph.elem_type(other) != s_type:
            return None, None
        return other, add

    def _mnb(self, b: Builder, inputs, k, n, bits, block, dq: ir.Node) -> ir.Value:
        from dqtool.families.fused.to_onnx import ACCURACY_KEY

        attrs = {"K": k, "N": n, "bits": bits, "block_size": block}
        # Unless told, the level upgrade noted from the original MatMulNBits (dropping it
        # changed onnxruntime's outputs, and check took that for its own rounding).
        noted = dq.metadata_props.get(ACCURACY_KEY, "0")
        level = self.accuracy_level if self.accuracy_level is not None else \
            int(noted) if noted in ("1", "2", "3", "4") else 0
        if level:
            attrs["accuracy_level"] = level
        node = ir.node("MatMulNBits", inputs, attrs, domain="com.microsoft",
                       name=b.node_name(f"{b.base}/nbits"))
        out = node.outputs[0]
        out.name = self.fresh(f"{b.base}/nbits")
        return out

    # --- the float-zero-point chain upgrade writes -------------------------------------

    def _float_zp_chain(self, dq: ir.Node, spec: QuantSpec, reshape: ir.Node
                        ) -> tuple[str, list]:
        def one(v: ir.Value, op: str, idx: int = 0) -> ir.Node:
            use = _only_use(v)
            if use is None or use[0].op_type != op or use[1] != idx:
                raise NoMatch("")
            return use[0]

        x = graph.input_value(dq, 0)
        rows_n = graph.shape_of(x)
        if spec.zero_point != "none" or spec.scale_type != "float" or rows_n is None:
            raise NoMatch("")
        add = next((u.node for u in reshape.outputs[0].uses() if u.node.op_type == "Add"),
                   None)
        if add is None or len(reshape.outputs[0].uses()) != 1:
            raise NoMatch("")
        off = add.inputs[1] if add.inputs[0] is reshape.outputs[0] else add.inputs[0]
        neg = off.producer()
        mul = neg.inputs[0].producer() if neg is not None and neg.op_type == "Neg" else None
        if mul is None or mul.op_type != "Mul":
            raise NoMatch("")
        zc = mul.inputs[0]
        if zc.producer() is not None and zc.producer().op_type == "Cast":
            zc = zc.producer().inputs[0]
        if graph.constant_tensor(zc) is None:
            raise NoMatch("")
        last = one(add.outputs[0], "Reshape")
        rows, n = rows_n
        k = rows
        tail = last
        nxt = _only_use(tail.outputs[0])
        if nxt is not None and nxt[0].op_type == "Slice":
            ends = graph.constant_array(graph.input_value(nxt[0], 2))
            k = int(ends.reshape(-1)[0]) if ends is not None else k
            tail = nxt[0]
            nxt = _only_use(tail.outputs[0])
        out_type = "float"
        if nxt is not None and nxt[0].op_type == "Cast":
            tail = nxt[0]
            out_type = graph.elem_type(tail.outputs[0])
            nxt = _only_use(tail.outputs[0])
        if nxt is None or nxt[0].op_type != "MatMul" or nxt[1] != 1:
            raise NoMatch("")
        mm = nxt[0]
        _, _, bits, block = self._weight_facts(spec, (rows, n))
        # 2-bit codes upgrade widened to 8 (int2 / uint2 are opset 25's) go back to 2 bits
        bits = self._narrower(dq, spec, bits) or bits
        if bits == 8:
            raise NoMatch("8-bit codes with float zero points: onnxruntime's CPU kernel "
                          "rejects such a MatMulNBits (FU007)")
        kb = rows // block if spec.granularity == "blocked" else 1
        if spec.granularity != "blocked":
            block = rows
            if not _pow2_16(block):
                raise NoMatch("")
        a = graph.input_value(mm, 0)
        if graph.elem_type(a) not in (None, out_type) or graph.elem_type(zc) != out_type:
            raise NoMatch("")
        bias, badd = self._bias(mm, n, out_type)
        b = Builder(mm if badd is None else badd, self.fresh, self.in_function,
                    home=graph.input_value(dq, 0))
        b.base = mm.name or dq.name or "matmul"
        s_type = types.by_name(out_type)
        scale = graph.input_value(dq, 1)
        signed = types.by_name(spec.quant_type).signed

        def b_bytes() -> np.ndarray:
            codes = _unsigned_codes(_array(x), bits, signed)
            return packing.onnx_to_nbits(codes, rows, n, bits, block)

        bq = b.constant("B", ir.DataType.UINT8, (n, kb, block * bits // 8), b_bytes)
        # Flat (N·k_blocks), as onnxruntime's HQQ quantizer (the writer of float zero
        # points) stores scales and zero points.
        s = b.constant("scales", s_type.ir_type, (n * kb,),
                       lambda: np.ascontiguousarray(_array(scale).reshape(kb, n).T)
                       .astype(s_type.dtype).reshape(-1))
        z = b.constant("zero_points", s_type.ir_type, (n * kb,),
                       lambda: np.ascontiguousarray(_array(zc).reshape(kb, n).T).reshape(-1))
        inputs: list[ir.Value | None] = [a, bq, s, z]
        if bias is not None:
            inputs += [None, bias]
        y = self._mnb(b, inputs, k, n, bits, block, dq)
        b.nodes.append(y.producer())
        b.finish(y)
        self._note_names(y.producer(), dq, b)
        chain = [mm, tail, last, add, neg, mul, reshape, dq, mul.inputs[0].producer(),
                 mul.inputs[1].producer(), *(u.node for u in last.outputs[0].uses())]
        old = _remove_unused([n for n in chain if n is not None])
        how = (f"float-zero-point chain ({spec.quant_type} ({k}, {n})) → MatMulNBits "
               f"bits={bits} block_size={block}, float zero points")
        return how, old

    # --- DequantizeLinear → Gather -----------------------------------------------------

    def _gather(self, dq: ir.Node, spec: QuantSpec, gather: ir.Node) -> tuple[str, list]:
        if spec.errors or not spec.constant or spec.x_from_quantize:
            raise NoMatch("not a valid DequantizeLinear of constants")
        x, scale, zp = (graph.input_value(dq, i) for i in range(3))
        shape = graph.shape_of(x)
        if shape is None or not all(isinstance(d, int) for d in shape):
            raise NoMatch("the table has no static shape")
        rank = len(shape)
        ga_attr = gather.attributes.get("axis")
        ga = (ga_attr.as_int() if ga_attr is not None else 0) % rank
        q = spec.quant_type
        if spec.granularity == "blocked":
            qa, block = spec.axis, spec.block_size
            if not _pow2_16(block):
                raise NoMatch(f"block size {block} is not a power of 2 ≥ 16")
        elif spec.granularity == "per-axis" and rank == 2:
            qa = 1 - spec.axis
            block = _next_pow2_16(shape[qa])
        else:
            raise NoMatch(f"{spec.granularity} table: GatherBlockQuantized needs blocks")
        b = Builder(gather, self.fresh, self.in_function, home=graph.input_value(dq, 0))
        b.base = gather.name or dq.name or "gather"
        s_shape = tuple(-(-d // block) if i == qa else d for i, d in enumerate(shape))
        s_type = types.by_name(spec.scale_type).ir_type
        reshaped = spec.granularity != "blocked"
        s_val = scale if not reshaped else b.constant(
            "scales", s_type, s_shape, lambda: _array(scale).reshape(s_shape))
        if q == "uint4" and self._noted(dq).get("data_type") == "uint8" and ga == 0 \
                and qa == rank - 1 and shape[-1] % 2 == 0 and not reshaped:
            # a table upgrade read from uint8-packed codes (its note): the same bytes as
            # uint8 again, zero points packed by row, left out if upgrade made them up
            bits, data = 4, b.existing(arrays.same_bytes(
                _t(x), ir.DataType.UINT8, (*shape[:-1], shape[-1] // 2)), "data")
            z = None
            if zp is not None:
                zcodes = _array(zp).astype(np.uint8).reshape(s_shape)
                if "zero_points" in self._noted(dq) or not np.all(zcodes == 8):
                    z = b.constant("zero_points", ir.DataType.UINT8,
                                   (*s_shape[:-1], -(-s_shape[-1] // 2)),
                                   lambda: packing.pack(zcodes, 4))
        elif q in ("int4", "uint4"):
            bits, data = 4, x
            z = zp
            if zp is not None and reshaped:
                z = b.constant("zero_points", types.by_name(q).ir_type, s_shape,
                               lambda: _array(zp).reshape(s_shape))
        elif q in ("uint8", "uint2"):
            if ga != 0 or qa != rank - 1:
                raise NoMatch(f"{q} tables need gather axis 0 and blocks along the last axis")
            bits = _BITS[q]
            # Codes upgrade widened to 8 bits go back to their width (as for MatMulNBits),
            # where rows still fill whole bytes at it.
            narrow = self._narrower(dq, spec, bits)
            if narrow is not None and shape[-1] % (8 // narrow) == 0:
                bits = narrow
            per = 8 // bits
            if bits == 8:
                data = x
            else:
                if shape[-1] % per:
                    raise NoMatch(f"rows of {shape[-1]} {q} codes do not fill whole bytes")
                packed_shape = (*shape[:-1], shape[-1] // per)
                data = b.constant("data", ir.DataType.UINT8, packed_shape, lambda: packing.pack(
                    _array(x).astype(np.uint8), bits))
            zl = (*s_shape[:-1], -(-s_shape[-1] // per))

            def zp_bytes() -> np.ndarray:
                codes = np.zeros(s_shape, np.uint8) if zp is None else \
                    _array(zp).astype(np.uint8).reshape(s_shape)
                return packing.pack(codes, bits)

            z = b.constant("zero_points", ir.DataType.UINT8, zl, zp_bytes)
        else:
            raise NoMatch(f"{q} tables: GatherBlockQuantized takes int4, uint4, uint8, uint2")
        inputs = [data, gather.inputs[1], s_val] + ([z] if z is not None else [])
        attrs = {"gather_axis": ga, "quantize_axis": qa, "block_size": block}
        if bits != 4:  # 4 is the default; onnxruntime's quantizer leaves it out
            attrs["bits"] = bits
        node = ir.node("GatherBlockQuantized", inputs, attrs, domain="com.microsoft",
                       name=b.node_name(f"{b.base}/gbq"))
        out = node.outputs[0]
        out.name = self.fresh(f"{b.base}/gbq")
        old = [v for v in dq.inputs if v is not None]
        b.nodes.append(node)
        b.finish(out)
        self._note_names(node, dq, b)
        _remove_unused([dq])
        how = (f"{q} table {shape} blocked axis {qa} → GatherBlockQuantized bits={bits} "
               f"block_size={block} gather_axis={ga}")
        return how, old


def _restore_names(model: ir.Model, named: list[tuple[ir.Node, dict, set[str]]]) -> None:
    """The names upgrade noted from the original fused node (``NAMES_KEY``) back on the
    packed node and on the constants made for it, each where nothing in the model has it
    now (after the pass, so that the values it replaced are gone)."""
    from dqtool.families.fused.to_onnx import NAME_ROLES

    notes = [n for n in named if n[0].graph is not None]
    if not notes:
        return
    taken = ScopedNames(model)
    function_of = {id(site.node): site.function for site in graph.walk(model)}
    node_names: dict[int, set[str]] = {}
    for node, names, created in notes:
        in_graph = node_names.get(id(node.graph))
        if in_graph is None:  # once a graph (setdefault would walk it for every node)
            in_graph = node_names[id(node.graph)] = {n.name for n in node.graph if n.name}
        want = names.get("node")
        if not isinstance(want, str):
            want = None
        if want == "":  # the original had no name
            node.name = None
        elif want and want != node.name and want not in in_graph:
            in_graph.add(want)
            node.name = want
        for role, i in NAME_ROLES[node.op_type].items():
            v, want = graph.input_value(node, i), names.get(role)
            if not isinstance(want, str) or v is None:
                continue
            # inside a function a constant is a Constant node's output: that node's name too
            holder = None if v.is_initializer() else graph.constant_node(v)
            # a constant made here, or one upgrade made that pack took as stored (a table,
            # a scale), when this node alone reads it
            ours = v.name in created or all(u.node is node for u in v.uses())
            want_node = names.get(f"{role}_node")
            if holder is not None and ours and isinstance(want_node, str) and want_node \
                    and holder.name != want_node and want_node not in in_graph:
                in_graph.discard(holder.name)
                in_graph.add(want_node)
                holder.name = want_node
            if not want or v.name == want or (not v.is_initializer() and holder is None) \
                    or not ours:
                continue
            if not taken.claim(want, function_of.get(id(node))):
                # The name is still the original's: the stored weight upgrade left for
                # another reader (a tied embedding's Gather reads the lm_head's B). The same
                # bytes are that weight again: read from it, not stored twice.
                _share_stored(node, i, v, want)
                continue
            v.name = want
            if v.const_value is not None:
                v.const_value.name = want


def _share_stored(node: ir.Node, i: int, made: ir.Value, name: str) -> None:
    """``node`` reads initializer ``name`` in place of ``made`` (an initializer pack made,
    read by it alone), when that one holds the same bytes of the same type and shape."""
    home = made.graph
    stored = home.initializers.get(name) if home is not None and made.is_initializer() \
        else None
    if stored is None or stored is made or stored.const_value is None \
            or made.const_value is None or any(u.node is not node for u in made.uses()):
        return
    a, b = stored.const_value, made.const_value
    if a.dtype != b.dtype or tuple(a.shape) != tuple(b.shape) \
            or tensor_reads.raw_bytes(a).tobytes() != tensor_reads.raw_bytes(b).tobytes():
        return
    node.replace_input_with(i, stored)
    home.initializers.pop(made.name, None)


def _check_a(a: ir.Value | None, spec: QuantSpec, dq: ir.Node) -> None:
    """NoMatch when a MatMul's A cannot be a MatMulNBits' A for this weight."""
    # MatMulNBits takes A, scales and Y of one type. MatMul's A and B share a type, so an
    # undeclared A has the dequantized weight's: the scale's, or ``output_dtype``'s.
    out = output_dtype_attr(dq)
    if out not in (None, spec.scale_type):
        raise NoMatch(f"the DequantizeLinear makes {out} from {spec.scale_type} scales "
                      "(output_dtype): MatMulNBits takes A, scales and Y of one type")
    if graph.elem_type(a) not in (None, spec.scale_type):
        raise NoMatch(f"A is {graph.elem_type(a)} and the scale {spec.scale_type}: "
                      "MatMulNBits needs them equal")
    a_shape = graph.shape_of(a)
    if a_shape is not None and len(a_shape) < 2:
        raise NoMatch("A is 1-D")


def _noted_block(dq: ir.Node, k: int) -> int | None:
    """The block size ``upgrade`` noted of a MatMulNBits whose one block spans K, if it
    still does (a power of two >= 16 and >= K); else None."""
    from dqtool.families.fused.to_onnx import BLOCK_KEY

    try:
        block = int(dq.metadata_props.get(BLOCK_KEY, ""), 10)
    except ValueError:  # no note, or not a number ("²" passed isdigit() and int() raised)
        return None
    return block if _pow2_16(block) and block >= k else None


def _noted_tail(dq: ir.Node, k: int, n: int, bits: int, block: int
                ) -> tuple[int, int, np.ndarray] | None:
    """(byte, bit, values) of the bits past K's last code that ``upgrade`` noted, to put
    back in each row of B; None without a note, or one that does not fit this weight."""
    from dqtool.families.fused.to_onnx import TAIL_KEY, tail_place

    place = tail_place(k, bits, block)
    note = dq.metadata_props.get(TAIL_KEY)
    if place is None or not note:
        return None
    try:
        values = np.frombuffer(bytes.fromhex(note), np.uint8)
    except ValueError:
        return None
    if values.size != n or int(values.max(initial=0)) >= 1 << (8 - place[1]):
        return None
    return place[0], place[1], values


def _remove_unused(nodes: list[ir.Node]) -> list[ir.Value]:
    """Remove those of ``nodes`` whose outputs nobody uses (repeatedly, so a chain goes
    consumer first); returns the inputs they had."""
    inputs: list[ir.Value] = []
    changed = True
    while changed:
        changed = False
        for node in nodes:
            if node.graph is not None and all(not o.uses() and not o.is_graph_output()
                                              for o in node.outputs):
                inputs.extend(v for v in node.inputs if v is not None)
                node.graph.remove(node, safe=True)
                changed = True
    return inputs


def _drop_unused(values: list[ir.Value]) -> None:
    seen: set[int] = set()
    for v in values:
        if id(v) in seen or v.uses() or v.is_graph_output() or v.is_graph_input():
            continue
        seen.add(id(v))
        if v.is_initializer() and v.graph is not None:
            v.graph.initializers.pop(v.name, None)
            continue
        producer = v.producer()
        if producer is not None and producer.op_type == "Constant" and \
                producer.graph is not None:
            producer.graph.remove(producer, safe=True)
