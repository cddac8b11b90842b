"""One registry of every (de)quantization encoding, keyed by (domain, op, since-version).

``read_node`` resolves the version in force to the encoding that governs it (the newest
since-version not above it) and reads the node into a ``QuantSpec``.
"""

from __future__ import annotations

import bisect

import onnx_ir as ir

from dqtool import graph, registry
from dqtool.spec import P_NO_IMPORT, P_VERSION, Codec, Problem, QuantSpec

QUANT_OPS = frozenset({"DequantizeLinear", "QuantizeLinear"})



class _Tables:
    """Every registered family's codecs (dqtool.families), indexed; rebuilt when a family
    is registered later (a plugin)."""

    def __init__(self) -> None:
        self.generation = registry.generation()
        self.registry: dict[tuple[str, str, int], Codec] = {
            (c.domain, c.op, c.since_version): c for c in registry.codecs()}
        self.domains = frozenset(domain for domain, _, _ in self.registry)
        self.known_ops = frozenset((domain, op) for domain, op, _ in self.registry)
        # (domain, op) -> its since-versions, oldest first: lookup runs per node and step.
        self.since = {key: sorted(v for d, o, v in self.registry if (d, o) == key)
                      for key in self.known_ops}


_tables = _Tables()


def _current() -> _Tables:
    global _tables
    if _tables.generation != registry.generation():
        _tables = _Tables()
    return _tables


def __getattr__(name: str) -> object:
    # REGISTRY: (domain, op, since-version) -> codec; DOMAINS: the domains codecs read.
    if name == "REGISTRY":
        return _current().registry
    if name == "DOMAINS":
        return _current().domains
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def lookup(domain: str, op: str, version: int) -> Codec | None:
    """The codec governing ``op`` of ``domain`` at ``version``, or None if none does."""
    tables = _current()
    domain = graph.domain_name(domain)
    since = tables.since.get((domain, op), [])
    i = bisect.bisect_right(since, version)
    return tables.registry[(domain, op, since[i - 1])] if i else None


def is_quant_node(node: ir.Node) -> bool:
    return (graph.domain_name(node.domain), node.op_type) in _current().known_ops


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
