"""Which initializers a model file declares in ``value_info``.

onnx_ir writes a value_info entry for every initializer it saves; a conversion must not
add entries that were not there ("nothing else changes"). The file is scanned at the
protobuf wire level (memory-mapped, tensor payloads skipped, not parsed), so this costs
next to nothing even for a model with gigabytes of inline weights.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator

import onnx_ir as ir

from dqtool import wire

# Field numbers (onnx.proto): ModelProto.graph 7, FunctionProto.value_info 12;
# GraphProto.node 1, .value_info 13; NodeProto.attribute 5; AttributeProto.g 6, .graphs 11;
# ValueInfoProto.name 1.



def _fields(buf, start: int, end: int) -> Iterator[tuple[int, int, int]]:
    """(field number, start, end) of each length-delimited field in buf[start:end]."""
    for number, wire_type, _, body, end_ in wire.fields(buf, start, end):
        if wire_type == wire.LEN:
            yield number, body, end_


def _name(buf, start: int, end: int) -> str | None:
    for field, s, e in _fields(buf, start, end):
        if field == 1:
            return bytes(buf[s:e]).decode("utf-8", "replace")
    return None


def _graph(buf, start: int, end: int, names: set[str]) -> None:
    for field, s, e in _fields(buf, start, end):
        if field == 13:
            name = _name(buf, s, e)
            if name:
                names.add(name)
        elif field == 1:  # node: look for subgraphs in its attributes
            for f2, s2, e2 in _fields(buf, s, e):
                if f2 != 5:
                    continue
                for f3, s3, e3 in _fields(buf, s2, e2):
                    if f3 in (6, 11):
                        _graph(buf, s3, e3, names)


def declared(path: str | os.PathLike) -> set[str] | None:
    """Names with a value_info entry in any graph of the model file; None if unreadable."""
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            names: set[str] = set()
            for field, s, e in _fields(mm, 0, len(mm)):
                if field == 7:
                    _graph(mm, s, e, names)
            return names
    except (OSError, ValueError, IndexError):
        return None


def drop_added(model: ir.Model, declared_names: set[str]) -> None:
    """Clear the declared type of initializers that had no value_info in the source, so
    saving does not invent value_info for them (their tensors still say type and shape)."""
    for g in model.graphs():
        for value in g.initializers.values():
            if value.name in declared_names or value.is_graph_input() or \
                    value.is_graph_output():
                continue
            if value.metadata_props or value.doc_string:
                continue
            value.type = None
            value.shape = None
