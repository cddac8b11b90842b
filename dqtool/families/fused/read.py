"""Reading MatMulNBits / GatherBlockQuantized nodes into ``FusedSpec`` (the codec).

Reads attributes, types and shapes only (a g_idx is read to tell a trivial one from an
act-order one); never raises for a broken node: what is wrong is in ``problems``. The rules
are those of onnxruntime's schemas and CPU kernels (``docs/fused.md`` lists them).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from dqtool import graph
from dqtool.codecs.base import attr_int
from dqtool.families.fused import ort_facts
from dqtool.families.fused.spec import (
    DOMAIN,
    P_FUSED_ACCURACY,
    P_FUSED_ATTR,
    P_FUSED_G_IDX,
    P_FUSED_INPUTS,
    P_FUSED_RUNTIME,
    P_FUSED_SHAPE,
    P_FUSED_TYPE,
    FusedSpec,
)
from dqtool.spec import Dim, Problem

FLOATS = frozenset({"float", "float16", "bfloat16"})
GBQ_DATA = frozenset({"int4", "uint4", "uint8"})
GBQ_FLOAT_DATA = frozenset({"float8e4m3fn", "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz",
                            "float4e2m1"})
_CODE_TYPE = {2: "uint2", 4: "uint4", 8: "uint8"}


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _shape(v: ir.Value | None) -> tuple[Dim, ...] | None:
    return graph.shape_of(v)


def _known(shape: tuple[Dim, ...] | None) -> bool:
    return shape is not None and all(isinstance(d, int) for d in shape)


def _const(v: ir.Value | None) -> bool:
    return v is not None and graph.constant_tensor(v) is not None


def _power_of_two_16(b: int | None) -> bool:
    return b is not None and b >= 16 and (b & (b - 1)) == 0


def _version(node: ir.Node, opsets: dict[str, int]) -> int:
    v = node.version if node.version is not None else graph.opset_of(opsets, node.domain)
    return 1 if v is None else v


def read(node: ir.Node, opsets: dict[str, int]) -> FusedSpec:
    if node.op_type == "MatMulNBits":
        return read_matmul_nbits(node, _version(node, opsets))
    return read_gather_block_quantized(node, _version(node, opsets))


def is_fused(node: ir.Node) -> bool:
    return graph.domain_name(node.domain) == DOMAIN and node.op_type in (
        "MatMulNBits", "GatherBlockQuantized")


def _g_idx_kind(g_idx: ir.Value | None, k: int | None, block: int | None) -> str:
    if g_idx is None:
        return "none"
    arr = graph.constant_array(g_idx)
    if arr is None or k is None or not block:
        return "unknown"
    arr = arr.reshape(-1)
    if arr.shape == (k,) and np.array_equal(arr.astype(np.int64), np.arange(k) // block):
        return "trivial"
    return "act-order"


def read_matmul_nbits(node: ir.Node, version: int) -> FusedSpec:
    where = "com.microsoft.MatMulNBits"
    a, b, scales, zp, g_idx, bias = (graph.input_value(node, i) for i in range(6))
    problems: list[Problem] = []
    if not 3 <= len(node.inputs) <= 6 or a is None or b is None or scales is None:
        problems.append(Problem(P_FUSED_INPUTS, f"{where} takes A, B, scales and up to 3 "
                                f"optional inputs, got {len(node.inputs)}"))
    k, n = attr_int(node, "K", None), attr_int(node, "N", None)
    bits = attr_int(node, "bits", 4)
    block = attr_int(node, "block_size", None)
    accuracy = attr_int(node, "accuracy_level", 0) or 0
    prepacked = attr_int(node, "weight_prepacked", 0) or 0
    problems += _nbits_attribute_problems(where, k, n, bits, block, prepacked)
    a_type, s_type = graph.elem_type(a), graph.elem_type(scales)
    b_type, zp_type = graph.elem_type(b), graph.elem_type(zp)
    if a_type is not None and a_type not in FLOATS:
        problems.append(Problem(P_FUSED_TYPE, f"{where}: A is {a_type}; it takes float, "
                                "float16 or bfloat16"))
    if b_type is not None and b_type != "uint8":
        problems.append(Problem(P_FUSED_TYPE, f"{where}: B is {b_type}, not uint8"))
    if a_type and s_type and s_type != a_type:
        problems.append(Problem(P_FUSED_TYPE, f"{where}: scales are {s_type}, A is {a_type} "
                                "(they must match)"))
    zp_kind, zp_packed = "none", False
    if zp is not None:
        if zp_type == "uint8":
            zp_kind, zp_packed = "integer", True
        elif zp_type in FLOATS:
            zp_kind = "float"
            if a_type and zp_type != a_type:
                problems.append(Problem(P_FUSED_TYPE, f"{where}: float zero points are "
                                        f"{zp_type}, A is {a_type} (they must match)"))
            if bits == 8:
                problems.append(Problem(P_FUSED_RUNTIME,
                                        f"{where}: {ort_facts.float_zp_8bit_reason()}",
                                        "warning"))
        elif zp_type is not None:
            problems.append(Problem(P_FUSED_TYPE, f"{where}: zero points are {zp_type}; it "
                                    "takes uint8 (packed) or A's float type"))
    geometry_ok = k is not None and n is not None and block and bits in (2, 4, 8) \
        and k > 0 and n > 0
    kb = ceil_div(k, block) if geometry_ok else None
    if geometry_ok:
        problems += _nbits_shape_problems(where, n, kb, block * bits // 8, bits,
                                          (b, scales, zp, bias), zp_packed)
    g_kind = _g_idx_kind(g_idx, k, block)
    if g_kind == "act-order":
        problems.append(Problem(P_FUSED_G_IDX, f"{where}: g_idx maps rows of K to blocks "
                                "out of order (act-order); no blocked DequantizeLinear "
                                "expresses it", "warning"))
    elif g_kind == "unknown":
        problems.append(Problem(P_FUSED_G_IDX, f"{where}: g_idx is computed at run time",
                                "warning"))
    elif g_kind == "trivial" and zp_kind != "float":
        problems.append(Problem(P_FUSED_G_IDX, f"{where}: {ort_facts.g_idx_reason()}",
                                "warning"))
    if accuracy > 0:
        problems.append(Problem(P_FUSED_ACCURACY, f"{where}: accuracy_level={accuracy}: "
                                "onnxruntime may quantize or downcast A, so outputs differ "
                                "from a float MatMul by design", "info"))
    per_axis = kb == 1
    return FusedSpec(
        op="MatMulNBits", domain=DOMAIN, version=version, since_version=1,
        quant_type=_CODE_TYPE.get(bits), scale_type=s_type, float_type=a_type or s_type,
        granularity=None if kb is None else ("per-axis" if per_axis else "blocked"),
        bits=bits, axis=None if kb is None else (1 if per_axis else 0), block_size=block,
        zero_point=zp_kind, zero_point_type=zp_type, zero_point_packed=zp_packed,
        default_zero_point=None if zp is not None or bits not in (2, 4, 8)
        else 1 << (bits - 1),
        packing=f"uint8 (N, k_blocks, blob), {8 // bits if bits in (2, 4, 8) else '?'} "
                "codes per byte low bits first along K",
        x_shape=(k, n) if geometry_ok else None, stored_shape=_shape(b),
        scale_shape=(kb, n) if geometry_ok else _shape(scales),
        x_constant=_const(b), scale_constant=_const(scales), zero_point_constant=_const(zp),
        g_idx=g_kind, has_bias=bias is not None, accuracy_level=accuracy,
        attributes=tuple(sorted((name, attr.value) for name, attr in node.attributes.items()
                                if not attr.is_ref())),
        problems=tuple(problems),
    )


def _nbits_attribute_problems(where: str, k: int | None, n: int | None, bits: int | None,
                              block: int | None, prepacked: int) -> list[Problem]:
    problems = []
    for name, value in (("K", k), ("N", n), ("block_size", block)):
        if value is None:
            problems.append(Problem(P_FUSED_INPUTS, f"{where}: required attribute {name} "
                                    "is missing"))
    for name, value in (("K", k), ("N", n)):
        # Every consumer reads a spec with errors as "leave it"; without this one, K or N
        # of 0 or less passed as valid with no geometry, and upgrade and fold failed on it.
        if value is not None and value <= 0:
            problems.append(Problem(P_FUSED_ATTR, f"{where}: {name}={value}; the weight's "
                                    "dimensions must be positive"))
    if bits not in (2, 4, 8):
        problems.append(Problem(P_FUSED_ATTR, f"{where}: bits={bits}; onnxruntime takes 2, "
                                "4 or 8"))
    if block is not None and not _power_of_two_16(block):
        problems.append(Problem(P_FUSED_ATTR, f"{where}: block_size={block} is not a power "
                                "of 2 ≥ 16"))
    if prepacked:
        problems.append(Problem(P_FUSED_ATTR, f"{where}: weight_prepacked={prepacked}: B is "
                                "in an execution provider's private layout"))
    return problems


def _nbits_shape_problems(where: str, n: int, kb: int, blob: int, bits: int,
                          values: tuple[ir.Value | None, ...], zp_packed: bool
                          ) -> list[Problem]:
    """B, scales, zero points and bias (``values``) against N, k_blocks and the blob."""
    b, scales, zp, bias = values
    problems = []
    b_shape = _shape(b)
    if _known(b_shape) and b_shape != (n, kb, blob):
        problems.append(Problem(P_FUSED_SHAPE, f"{where}: B is {b_shape}, expected "
                                f"(N, k_blocks, blob) = {(n, kb, blob)}"))
    s_shape = _shape(scales)
    if _known(s_shape) and s_shape not in ((n * kb,), (n, kb)):
        problems.append(Problem(P_FUSED_SHAPE, f"{where}: scales are {s_shape}, expected "
                                f"({n * kb},) or {(n, kb)}"))
    z_shape = _shape(zp)
    if zp is not None and _known(z_shape):
        zl = ceil_div(kb * bits, 8) if zp_packed else kb
        if z_shape not in ((n * zl,), (n, zl)):
            problems.append(Problem(P_FUSED_SHAPE, f"{where}: zero points are {z_shape}, "
                                    f"expected ({n * zl},) or {(n, zl)}"))
    if bias is not None and _known(_shape(bias)) and _shape(bias) != (n,):
        problems.append(Problem(P_FUSED_SHAPE, f"{where}: bias is {_shape(bias)}, "
                                f"expected ({n},)"))
    return problems


def gbq_geometry(data_type: str | None, data_shape: tuple[Dim, ...] | None, bits: int,
                 quantize_axis: int) -> tuple[str | None, tuple[Dim, ...] | None, int]:
    """(codes type, logical shape, codes per stored element) of GatherBlockQuantized data."""
    if data_type == "uint8":
        per = 8 // bits if bits in (2, 4, 8) else 1
        shape = None
        if data_shape is not None:
            shape = tuple(d * per if i == len(data_shape) - 1 and isinstance(d, int) else d
                          for i, d in enumerate(data_shape))
        return _CODE_TYPE.get(bits), shape, per
    return data_type, data_shape, 1


def read_gather_block_quantized(node: ir.Node, version: int) -> FusedSpec:
    """Read a GatherBlockQuantized into a ``FusedSpec``, what is wrong in its problems."""
    where = "com.microsoft.GatherBlockQuantized"
    data, indices, scales, zp = (graph.input_value(node, i) for i in range(4))
    problems: list[Problem] = []
    if not 3 <= len(node.inputs) <= 4 or data is None or indices is None or scales is None:
        problems.append(Problem(P_FUSED_INPUTS, f"{where} takes data, indices, scales and "
                                f"an optional zero point, got {len(node.inputs)} inputs"))
    bits = attr_int(node, "bits", 4)
    block = attr_int(node, "block_size", 128)
    d_type, s_type, zp_type = (graph.elem_type(v) for v in (data, scales, zp))
    d_shape = _shape(data)
    rank = len(d_shape) if d_shape is not None else None
    g_axis, q_axis = _gbq_axes(where, node, rank, problems)
    problems += _gbq_type_problems(where, (d_type, s_type, zp_type), zp is not None, bits,
                                   block, rank, (g_axis, q_axis))
    q_type, logical, per = gbq_geometry(d_type, d_shape, bits, q_axis)
    expected_scale = _gbq_expected_scale(logical, rank, q_axis, block)
    if expected_scale is not None:
        problems += _gbq_shape_problems(where, expected_scale, per, q_axis, _shape(scales),
                                        _shape(zp) if zp is not None else None)
    default_zp = None
    if zp is None and d_type == "uint8" and bits in (2, 4, 8):
        default_zp = 1 << (bits - 1)
    return FusedSpec(
        op="GatherBlockQuantized", domain=DOMAIN, version=version, since_version=1,
        quant_type=q_type, scale_type=s_type, float_type=s_type,
        granularity="blocked" if rank else None, bits=4 if d_type in ("int4", "uint4")
        else (bits if d_type == "uint8" else None),
        axis=q_axis if rank else None, block_size=block,
        zero_point="integer" if zp is not None else "none", zero_point_type=zp_type,
        zero_point_packed=zp is not None and d_type == "uint8" and per > 1,
        default_zero_point=default_zp,
        packing=f"uint8, {per} codes per byte low bits first along the last axis"
        if d_type == "uint8" and per > 1 else "none",
        x_shape=logical, stored_shape=d_shape, scale_shape=expected_scale or _shape(scales),
        x_constant=_const(data), scale_constant=_const(scales), zero_point_constant=_const(zp),
        gather_axis=g_axis if rank else None,
        attributes=tuple(sorted((name, attr.value) for name, attr in node.attributes.items()
                                if not attr.is_ref())),
        problems=tuple(problems),
    )


def _gbq_axes(where: str, node: ir.Node, rank: int | None, problems: list[Problem]
              ) -> tuple[int, int]:
    """(gather_axis, quantize_axis), normalized for a known rank; one outside it is added
    to ``problems``."""
    g_axis = attr_int(node, "gather_axis", 0)
    q_axis = attr_int(node, "quantize_axis", 1)
    if rank is not None:
        for name, ax in (("gather_axis", g_axis), ("quantize_axis", q_axis)):
            if not -rank <= ax < rank:
                problems.append(Problem(P_FUSED_ATTR, f"{where}: {name}={ax} is outside "
                                        f"[-{rank}, {rank - 1}]"))
        g_axis, q_axis = g_axis % rank if rank else g_axis, q_axis % rank if rank else q_axis
    return g_axis, q_axis


def _gbq_type_problems(where: str, elem_types: tuple[str | None, str | None, str | None],
                       has_zp: bool, bits: int | None, block: int | None, rank: int | None,
                       axes: tuple[int, int]) -> list[Problem]:
    """Data, scale and zero-point types against each other, bits, block size and axes."""
    d_type, s_type, zp_type = elem_types
    g_axis, q_axis = axes
    problems = []
    float_data = d_type in GBQ_FLOAT_DATA
    if d_type is not None and d_type not in GBQ_DATA and not float_data:
        problems.append(Problem(P_FUSED_TYPE, f"{where}: data is {d_type}; it takes int4, "
                                "uint4, uint8 or a float8/float4 type"))
    if s_type is not None and s_type not in FLOATS:
        problems.append(Problem(P_FUSED_TYPE, f"{where}: scales are {s_type}; they must be "
                                "float, float16 or bfloat16"))
    if d_type == "uint8":
        if bits not in (2, 4, 8):
            problems.append(Problem(P_FUSED_ATTR, f"{where}: bits={bits}; uint8 data takes "
                                    "2, 4 or 8"))
        if rank is not None and (g_axis != 0 or q_axis != rank - 1):
            problems.append(Problem(P_FUSED_ATTR, f"{where}: uint8 data needs gather_axis 0 "
                                    "and quantize_axis the last axis"))
    elif d_type in ("int4", "uint4") and bits != 4:
        problems.append(Problem(P_FUSED_ATTR, f"{where}: bits={bits} with {d_type} data "
                                "(only 4)"))
    if not (_power_of_two_16(block) or (float_data and block == 0)):
        problems.append(Problem(P_FUSED_ATTR, f"{where}: block_size={block} is not a power "
                                "of 2 ≥ 16"))
    if has_zp:
        if float_data:
            problems.append(Problem(P_FUSED_INPUTS, f"{where}: {d_type} data takes no zero "
                                    "point"))
        elif d_type and zp_type and zp_type != d_type:
            problems.append(Problem(P_FUSED_TYPE, f"{where}: zero points are {zp_type}, data "
                                    f"is {d_type} (they must match)"))
    return problems


def _gbq_expected_scale(logical: tuple[Dim, ...] | None, rank: int | None, q_axis: int,
                        block: int | None) -> tuple[Dim, ...] | None:
    """The scales' shape the logical table needs (blocks along ``q_axis``), when known."""
    if _known(logical) and rank and 0 <= q_axis < rank and block:
        return tuple(ceil_div(d, block) if i == q_axis else d for i, d in enumerate(logical))
    return None


def _gbq_shape_problems(where: str, expected_scale: tuple[Dim, ...], per: int, q_axis: int,
                        s_shape: tuple[Dim, ...] | None, z_shape: tuple[Dim, ...] | None
                        ) -> list[Problem]:
    """Scales and zero points (``z_shape`` None without them) against the table's blocks."""
    problems = []
    if _known(s_shape) and s_shape != expected_scale:
        problems.append(Problem(P_FUSED_SHAPE, f"{where}: scales are {s_shape}, expected "
                                f"{expected_scale}"))
    if _known(z_shape):
        want = tuple(ceil_div(d, per) if i == q_axis else d
                     for i, d in enumerate(expected_scale))
        if z_shape != want:
            problems.append(Problem(P_FUSED_SHAPE, f"{where}: zero points are "
                                    f"{z_shape}, expected {want}"))
    return problems
