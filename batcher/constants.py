"""Constant nodes become shared values, so that instances read one constant and the batching
rules see axes and shapes given by Constant nodes as known data."""

from __future__ import annotations

import numpy as np

from autobatch.ir import Graph, Node

_SCALAR_ATTRIBUTES = {
    "value_float": np.float32, "value_floats": np.float32,
    "value_int": np.int64, "value_ints": np.int64,
    "value_string": object, "value_strings": object,
}


def constant_value(node: Node) -> np.ndarray | None:
    """The value of a Constant node, or None for a form left alone (sparse tensors)."""
    if "value" in node.attributes:
        return np.asarray(node.attr("value"))
    for name, dtype in _SCALAR_ATTRIBUTES.items():
        if name in node.attributes:
            return np.array(node.attr(name), dtype=dtype)
    return None


def constants_to_initializers(graph: Graph) -> int:
    """Replace each ``Constant`` node by an initializer of the same name; returns how many.
    Readers keep reading the same name, now a shared value with no producer."""
    folded = 0
    for node in [n for n in graph.nodes.values() if n.op_type == "Constant" and not n.domain]:
        value = constant_value(node)
        if value is None:
            continue
        graph.remove_nodes([node.id])
        graph.add_initializer(node.outputs[0], value)
        folded += 1
    return folded
