"""One registry of every (de)quantization encoding, keyed by (domain, op, since-version).

``read_node`` resolves the version in force to the encoding that governs it (the newest
since-version not above it) and reads the node into a ``QuantSpec``.
"""

from __future__ import annotations

import bisect

import onnx_ir as ir

from dqtool import families, graph
from dqtool.codecs.base import Codec
from dqtool.spec import P_NO_IMPORT, P_VERSION, Problem, QuantSpec

QUANT_OPS = frozenset({"DequantizeLinear", "QuantizeLinear"})

# Every registered family's codecs (dqtool.families).
REGISTRY: dict[tuple[str, str, int], Codec] = {
    (c.domain, c.op, c.since_version): c for c in families.codecs()
}
DOMAINS = frozenset(domain for domain, _, _ in REGISTRY)
_KNOWN_OPS = frozenset((domain, op) for domain, op, _ in REGISTRY)
# (domain, op) -> its since-versions, oldest first: lookup runs once per node and step.
_SINCE = {key: sorted(v for d, o, v in REGISTRY if (d, o) == key) for key in _KNOWN_OPS}


def lookup(domain: str, op: str, version: int) -> Codec | None:
    """The codec governing ``op`` of ``domain`` at ``version``, or None if none does."""
    domain = graph.domain_name(domain)
    since = _SINCE.get((domain, op), [])
    i = bisect.bisect_right(since, version)
    return REGISTRY[(domain, op, since[i - 1])] if i else None


def is_quant_node(node: ir.Node) -> bool:
    return (graph.domain_name(node.domain), node.op_type) in _KNOWN_OPS


def read_node(node: ir.Node, opsets: dict[str, int]) -> QuantSpec:
    """The meaning of a (de)quantization node; what is wrong with it is in ``problems``."""
    domain = graph.domain_name(node.domain)
    version = node.version if node.version is not None else graph.opset_of(opsets, node.domain)
    if version is None:
        version = 1
        missing = Problem(P_NO_IMPORT, f"domain {domain} is used without an opset import")
    else:
        missing = None
    codec = lookup(domain, node.op_type, version)
    if codec is None:
        return QuantSpec(
            op=node.op_type, domain=domain, version=version, since_version=0, quant_type=None,
            scale_type=None, float_type=None, granularity=None,
            problems=(Problem(P_VERSION, f"{domain} {node.op_type} does not exist at opset "
                              f"{version}"),),
        )
    spec = codec.read(node, version)
    return spec.with_problems(missing) if missing else spec
