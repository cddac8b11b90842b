"""What an onnxruntime version can run, as data: fixed profiles for the versions a user
deploys, and a probe that measures the installed one with one-node sessions.

A profile says which ai.onnx opset a DequantizeLinear still runs at, which quantized and
scale types its CPU DequantizeLinear takes, which scale types its com.microsoft
DequantizeLinear takes, which custom domains have a DequantizeLinear at all, and which A
types its com.microsoft MatMulNBits takes. The lint
target ``onnxruntime`` is the probed installed runtime; ``onnxruntime-1.31``/``-1.32`` are the
fixed profiles below, each measured by this module's probe on that release (a test probes
the installed runtime and compares it with the fixed profile of its release).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import metadata

import numpy as np
import onnx
from onnx import helper, numpy_helper

from dqtool import types


@dataclass(frozen=True)
class OrtProfile:
    release: str  # "1.31" for a fixed profile, the full version ("1.32.0") when probed
    source: str  # how the facts were obtained
    max_opset: int  # highest ai.onnx opset at which a DequantizeLinear model runs
    max_ir_version: int
    quant_types: frozenset[str]  # ai.onnx DequantizeLinear x types (float scale)
    scale_types: frozenset[str]  # ai.onnx DequantizeLinear scale types (int8 x)
    microsoft_scale_types: frozenset[str]  # com.microsoft DequantizeLinear scale types
    domains: frozenset[str]  # custom domains with a DequantizeLinear ("com.microsoft")
    # A types of the com.microsoft MatMulNBits its CPU provider has a kernel for
    matmulnbits_a_types: frozenset[str] = frozenset()

    @property
    def name(self) -> str:
        return f"onnxruntime {self.release} CPU"

    def to_json(self) -> dict[str, object]:
        return {"release": self.release, "source": self.source,
                "max_opset": self.max_opset, "max_ir_version": self.max_ir_version,
                "quant_types": sorted(self.quant_types),
                "scale_types": sorted(self.scale_types),
                "microsoft_scale_types": sorted(self.microsoft_scale_types),
                "domains": sorted(self.domains),
                "matmulnbits_a_types": sorted(self.matmulnbits_a_types)}


_FLOAT_HALF = frozenset({"float", "float16"})
_INTS = frozenset({"int2", "int4", "int8", "int16", "int32",
                   "uint2", "uint4", "uint8", "uint16"})
_F8 = frozenset({"float8e4m3fn", "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz"})

# Measured with ``probe()`` on onnxruntime 1.31.1 and 1.32.0 (CPU, Linux x86_64).
FIXED: dict[str, OrtProfile] = {
    "1.31": OrtProfile("1.31", "measured on onnxruntime 1.31.1", 26, 13, _INTS | _F8,
                       _FLOAT_HALF, _FLOAT_HALF, frozenset({"com.microsoft"}), _FLOAT_HALF),
    "1.32": OrtProfile("1.32", "measured on onnxruntime 1.32.0", 27, 14, _INTS | _F8,
                       _FLOAT_HALF, _FLOAT_HALF, frozenset({"com.microsoft"}), _FLOAT_HALF),
}


def installed_version() -> str | None:
    """The installed onnxruntime's version, read from its metadata (no import)."""
    try:
        return metadata.version("onnxruntime")
    except metadata.PackageNotFoundError:
        return None


def release_of(version: str) -> str:
    """"1.32.0" -> "1.32"."""
    return ".".join(version.split(".")[:2])


def target_release(target: str) -> str | None:
    """The release a lint target names: ``onnxruntime-1.32`` -> "1.32"; ``onnxruntime`` ->
    the installed one's (None when none is installed, or for another target)."""
    if target == "onnxruntime":
        version = installed_version()
        return None if version is None else release_of(version)
    if target.startswith("onnxruntime-"):
        return target[len("onnxruntime-"):]
    return None


# --- the probe ------------------------------------------------------------------------

def _runs(model: onnx.ModelProto) -> bool:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 4
    try:
        sess = ort.InferenceSession(model.SerializeToString(), so,
                                    providers=["CPUExecutionProvider"])
        sess.run(None, {})
    except Exception:  # onnxruntime raises its own types; any failure means "cannot"
        return False
    return True


def _dq_model(opset: int, x_type: str = "int8", scale_type: str = "float",
              domain: str = "", ir_version: int | None = None) -> onnx.ModelProto:
    """A one-node DequantizeLinear of constants at ``opset``; y is float (output_dtype where
    the scale type cannot be an output type)."""
    x = np.zeros(4, types.TYPES[x_type].dtype)
    s = np.ones((), types.TYPES[scale_type].dtype)
    attrs = {}
    out = scale_type
    if scale_type == "float8e8m0":
        attrs["output_dtype"] = onnx.TensorProto.FLOAT
        out = "float"
    node = helper.make_node("DequantizeLinear", ["x", "s"], ["y"], domain=domain, **attrs)
    graph = helper.make_graph(
        [node], "probe", [],
        [helper.make_tensor_value_info("y", types.TYPES[out].ir_type.value, [4])],
        [numpy_helper.from_array(x, "x"), numpy_helper.from_array(s, "s")])
    imports = [helper.make_opsetid("", opset)]
    if domain:
        imports.append(helper.make_opsetid(domain, 1))
    if ir_version is None:
        ir_version = helper.find_min_ir_version_for(imports, ignore_unknown=True)
    return helper.make_model(graph, opset_imports=imports, ir_version=ir_version)


def _matmulnbits_model(a_type: str) -> onnx.ModelProto:
    """A one-node com.microsoft MatMulNBits of constants (K 16, N 2, 4-bit, one block), its
    A and scales of ``a_type``."""
    t = types.TYPES[a_type]
    node = helper.make_node("MatMulNBits", ["a", "b", "s"], ["y"], domain="com.microsoft",
                            K=16, N=2, bits=4, block_size=16)
    graph = helper.make_graph(
        [node], "probe", [], [helper.make_tensor_value_info("y", t.ir_type.value, [1, 2])],
        [numpy_helper.from_array(np.zeros((1, 16), t.dtype), "a"),
         numpy_helper.from_array(np.zeros((2, 1, 8), np.uint8), "b"),
         numpy_helper.from_array(np.ones((2, 1), t.dtype), "s")])
    return helper.make_model(graph, ir_version=10, opset_imports=[
        helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])


def _dq_since(opset: int) -> int:
    return onnx.defs.get_schema("DequantizeLinear", opset).since_version


def _schema_types(opset: int, name: str) -> frozenset[str]:
    schema = onnx.defs.get_schema("DequantizeLinear", opset)
    allowed = next(c.allowed_type_strs for c in schema.type_constraints
                   if c.type_param_str == name)
    return frozenset(t[len("tensor("):-1] for t in allowed) & set(types.TYPES)


def _max_opset() -> int:
    top = onnx.defs.onnx_opset_version()
    for opset in range(top, 9, -1):
        if _runs(_dq_model(opset)):
            return opset
    return 0


def _max_ir_version(opset: int) -> int:
    for ir_version in range(onnx.IR_VERSION, 3, -1):
        if _runs(_dq_model(min(opset, 13), ir_version=ir_version)):
            return ir_version
    return 0


@functools.lru_cache(maxsize=1)
def probe() -> OrtProfile:
    """Measure the installed onnxruntime (about a hundred one-node sessions, once per
    process)."""
    import onnxruntime as ort

    top = _max_opset()
    opset = top or onnx.defs.onnx_opset_version()
    quant = frozenset(t for t in _schema_types(opset, "T1")
                      if _runs(_dq_model(opset, x_type=t)))
    scale_param = "T2" if _dq_since(opset) >= 21 else "T1"
    scales = frozenset(t for t in _schema_types(opset, scale_param) - _INTS
                       if _runs(_dq_model(opset, scale_type=t)))
    ms = frozenset(t for t in ("float", "float16", "bfloat16")
                   if _runs(_dq_model(13, scale_type=t, domain="com.microsoft")))
    domains = frozenset(d for d, ok in (("com.microsoft", bool(ms)),
                                        ("opmx", _runs(_dq_model(13, domain="opmx"))))
                        if ok)
    mnb = frozenset(t for t in ("float", "float16", "bfloat16")
                    if _runs(_matmulnbits_model(t)))
    return OrtProfile(ort.__version__, f"probed from the installed onnxruntime "
                      f"{ort.__version__}", top, _max_ir_version(opset), quant, scales, ms,
                      domains, mnb)


def profile_for(release: str | None) -> OrtProfile:
    """``None``: the installed runtime, probed; else the fixed profile of a release."""
    if release is None:
        return probe()
    return FIXED[release]


def why_cannot_run(model: onnx.ModelProto, profile: OrtProfile | None = None) -> str | None:
    """What the runtime lacks that this model needs (its opset, its IR version), from the
    profile; None when the profile does not explain a failure."""
    p = profile or probe()
    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
                default=None)
    if opset is not None and p.max_opset and opset > p.max_opset and _has_qdq(model):
        return (f"{p.name} runs DequantizeLinear up to ai.onnx opset {p.max_opset} "
                f"({p.source}); the model is opset {opset}")
    if p.max_ir_version and model.ir_version > p.max_ir_version:
        return (f"{p.name} loads IR versions up to {p.max_ir_version} ({p.source}); the "
                f"model is IR {model.ir_version}")
    return None


def _has_qdq(model: onnx.ModelProto) -> bool:
    """An ai.onnx Q/DQ in the main graph or a function (the ops the profile measured)."""
    nodes = [*model.graph.node, *(n for f in model.functions for n in f.node)]
    return any(n.domain in ("", "ai.onnx") and n.op_type in ("DequantizeLinear",
                                                            "QuantizeLinear") for n in nodes)
