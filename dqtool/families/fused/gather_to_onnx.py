"""GatherBlockQuantized → ai.onnx DequantizeLinear of the table → Gather, exactly (the cases
are listed in ``to_onnx``'s docstring)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from dqtool import graph, types
from dqtool.families.fused import packing
from dqtool.families.fused.onnx_codes import IR_CODE, default_zero_points
from dqtool.families.fused.spec import FusedSpec
from dqtool.families.fused.surgery import FusedBuilder
from dqtool.storage import same_bytes


def gather_block_quantized(node: ir.Node, spec: FusedSpec, b: FusedBuilder
                           ) -> tuple[ir.Value, str]:
    """The new nodes of a GatherBlockQuantized (in ``b``); returns (result, how)."""
    data, indices, scales, zp = (graph.input_value(node, i) for i in range(4))
    stored = graph.elem_type(data)
    logical = tuple(int(d) for d in spec.x_shape)
    s_shape = tuple(int(d) for d in spec.scale_shape)
    code_t = IR_CODE.get(spec.quant_type or "") or types.by_name(spec.quant_type).ir_type
    s_type = types.by_name(spec.scale_type).ir_type
    notes = []
    if stored == "uint8" and spec.bits != 8:
        table = graph.constant_tensor(data)
        assert table is not None  # (the reading of the node found it constant)
        x = b.existing(same_bytes(table, code_t, logical), "x")
        notes.append(f"uint8-packed codes read as {spec.quant_type} {logical} (same bytes)")
    else:
        x = data
    z: ir.Value | None = zp
    if stored == "uint8":
        bits = spec.bits

        def zp_codes() -> ir.TensorProtocol:
            if zp is None and bits < 8:
                return default_zero_points(spec.default_zero_point, bits, s_shape, code_t)
            if zp is None:
                codes = np.full(s_shape, spec.default_zero_point, np.uint8)
            else:
                codes = packing.unpack(graph.constant_array(zp), bits)[..., : s_shape[-1]]
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
