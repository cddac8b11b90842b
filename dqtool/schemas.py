"""The since-versions of ai.onnx operators in the installed onnx.

Walked back from the newest opset one schema at a time (``onnx.defs.get_schema``): listing
every schema with its history instead cost 14 ms of each command's start-up (the first
schema asked for still builds onnx's registry, ~10 ms). Imports nothing of dqtool's, so a
family can read it while it registers, before the codecs exist.
"""

from __future__ import annotations

from functools import cache

import onnx


@cache
def since_versions(op: str) -> tuple[int, ...]:
    """The since-versions of ai.onnx ``op``, oldest first (empty if onnx has none)."""
    found: list[int] = []
    opset = onnx.defs.onnx_opset_version()
    while opset > 0:
        try:
            schema = onnx.defs.get_schema(op, opset, "")
        except onnx.defs.SchemaError:
            break
        found.append(schema.since_version)
        opset = schema.since_version - 1
    return tuple(sorted(found))
