"""An ONNX graph made by inlining, tidied as exporters write one: nodes and initializers that
nothing reads dropped, Constant nodes as initializers."""

from __future__ import annotations

import onnx


def drop_unread(graph: onnx.GraphProto) -> None:
    """Nodes none of whose outputs is read (a template's constant its step's members never use),
    and initializers nothing reads: onnxruntime would warn of each."""
    read = {output.name for output in graph.output}
    kept = []
    for node in reversed(graph.node):
        if read.isdisjoint(node.output):
            continue
        kept.append(node)
        read.update(_names_read(node))
    del graph.node[:]
    graph.node.extend(reversed(kept))
    initializers = [tensor for tensor in graph.initializer if tensor.name in read]
    del graph.initializer[:]
    graph.initializer.extend(initializers)


def _names_read(node: onnx.NodeProto) -> set[str]:
    """Its inputs and every name its subgraphs read (some from the enclosing graph)."""
    names = set(node.input)
    for attribute in node.attribute:
        for subgraph in [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else attribute.graphs:
            for inner in subgraph.node:
                names |= _names_read(inner)
    return names


def constant_nodes_to_initializers(graph: onnx.GraphProto) -> None:
    """The templates' constants (Constant nodes once inlined) as initializers, as exporters write them."""
    kept = []
    for node in graph.node:
        if node.op_type == "Constant" and not node.domain and [a.name for a in node.attribute] == ["value"]:
            tensor = onnx.TensorProto()
            tensor.CopyFrom(node.attribute[0].t)
            tensor.name = node.output[0]
            graph.initializer.append(tensor)
        else:
            kept.append(node)
    del graph.node[:]
    graph.node.extend(kept)
