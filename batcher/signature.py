"""Node signatures: two nodes may run as one batched op iff their signatures are equal.

A signature is a complete, hashable tuple: (domain, op_type, opset version, every attribute,
and per input either ("data", dtype, shape) for a per-instance value or ("shared", name) for a
shared one). Groups compare these tuples, never hashes alone (DyNet's bugs came from fields
left out of a hashed signature).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from onnx import AttributeProto, helper

from autobatch.ir import Graph, Node

Signature = tuple


def is_shared(graph: Graph, value_name: str) -> bool:
    """A value every member of a group may read as-is: a constant read by several nodes (a
    weight, an axes list), or a value computed outside any instance. A constant marked
    ``literal``, or read by one node only, is that instance's data (a word index, a label, a
    value from an earlier round), so that nodes differing only in such data still batch (the
    literals are stacked once, at rewrite time)."""
    value = graph.values[value_name]
    if value.is_shared:
        return not value.literal and graph.consumer_count(value_name) > 1
    source = graph.producer(value_name)
    if source is None:
        return False  # a graph input belongs to one instance
    return source[0].instance is None


def sum_of_terms(graph: Graph, node: Node) -> bool:
    """A Sum of several per-instance float terms of one static type (a loss summed over the
    nodes of a tree): such Sums batch together whatever their number of terms."""
    if node.op_type != "Sum" or node.domain or len(node.inputs) < 2:
        return False
    out_type = graph.values[node.outputs[0]].type
    if out_type is None or not out_type.is_static or out_type.dtype is None or out_type.dtype.kind != "f":
        return False
    return all(name and not is_shared(graph, name) and graph.values[name].type == out_type for name in node.inputs)


def shared_values(graph: Graph) -> set[str]:
    """Every value ``is_shared`` says yes to, found in one pass (for signing many nodes)."""
    shared = {name for name, value in graph.values.items()
              if value.is_shared and not value.literal and graph.consumer_count(name) > 1}
    shared.update(o for node in graph.nodes.values() if node.instance is None for o in node.outputs if o)
    return shared


def node_signature(graph: Graph, node: Node, shared: set[str] | None = None) -> Signature | None:
    """The node's signature, or None when it cannot be batched (types unknown or not static).
    ``shared``: the graph's ``shared_values``, when many nodes are signed."""
    if node.op_type == "Sum" and sum_of_terms(graph, node):
        out_type = graph.values[node.outputs[0]].type
        return ("", "Sum", node.version, (), (("terms", out_type.elem_type, out_type.shape),), (True,))
    inputs: list[tuple] = []
    for name in node.inputs:
        if not name:
            inputs.append(("missing",))
        elif name in shared if shared is not None else is_shared(graph, name):
            inputs.append(("shared", name))
        else:
            vtype = graph.values[name].type
            if vtype is None or not vtype.is_tensor or not vtype.is_static:
                return None
            inputs.append(("data", vtype.elem_type, vtype.shape))
    for name in node.outputs:
        vtype = graph.values[name].type if name else None
        if name and (vtype is None or not vtype.is_tensor or not vtype.is_static):
            return None
    attributes = attributes_key(node.attributes)
    # Which optional outputs are wanted, not just how many: a batch produces the representative's.
    outputs = tuple(bool(name) for name in node.outputs)
    return (node.domain, node.op_type, node.version, attributes, tuple(inputs), outputs)


def attributes_key(attributes: Mapping[str, AttributeProto]) -> tuple:
    """Every attribute, as a hashable and comparable tuple."""
    return tuple(sorted((name, _hashable(proto)) for name, proto in attributes.items()))


def _hashable(proto: AttributeProto) -> Any:
    kind = proto.type
    # Floats compare by their float32 bits: -0.0 and 0.0 differ (Celu divides by alpha), and a
    # NaN equals itself.
    if kind == AttributeProto.FLOAT:
        return ("f", np.float32(proto.f).tobytes())
    if kind == AttributeProto.INT:
        return ("i", proto.i)
    if kind == AttributeProto.STRING:
        return ("s", proto.s)
    if kind == AttributeProto.FLOATS:
        return ("fs", np.asarray(proto.floats, dtype=np.float32).tobytes())
    if kind == AttributeProto.INTS:
        return ("is", tuple(proto.ints))
    if kind == AttributeProto.STRINGS:
        return ("ss", tuple(proto.strings))
    # Tensors, graphs, type protos and their lists: compare their exact serialized bytes.
    return (AttributeProto.AttributeType.Name(kind), proto.SerializeToString(deterministic=True))


def describe(signature: Signature | None) -> str:
    if signature is None:
        return "unbatchable"
    domain, op_type, version, attributes, inputs, _ = signature
    parts = []
    for entry in inputs:
        if entry[0] in ("data", "terms"):
            parts.append(f"{helper.tensor_dtype_to_np_dtype(entry[1])}{list(entry[2])}")
        elif entry[0] == "shared":
            parts.append(f"shared:{entry[1]}")
        else:
            parts.append("-")
    op = f"{domain}::{op_type}" if domain else op_type
    return f"{op}-{version}({', '.join(parts)})" + (f" {len(attributes)} attrs" if attributes else "")
