"""The names ``upgrade`` noted from the original fused nodes, given back to what pack made."""

from __future__ import annotations

import onnx_ir as ir

from dqtool import graph
from dqtool.families.fused.upgrade_notes import NAME_ROLES
from dqtool.names import Names
from dqtool.storage import raw_bytes


def restore_names(model: ir.Model, named: list[tuple[ir.Node, dict, set[str]]]) -> None:
    """The names upgrade noted from the original fused node (``NAMES_KEY``) back on the
    packed node and on the constants made for it, each where nothing in the model has it
    now (after the pass, so that the values it replaced are gone)."""
    notes = [n for n in named if n[0].graph is not None]
    if not notes:
        return
    taken = Names(model)
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
            or raw_bytes(a).tobytes() != raw_bytes(b).tobytes():
        return
    node.replace_input_with(i, stored)
    home.initializers.pop(made.name, None)
