"""An ONNX graph tidied as exporters write one: nodes and initializers that nothing reads
dropped (after inlining, or a rewrite that bypassed nodes), Constant nodes as initializers."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

import onnx

from autobatch.ir.nodes import captured_by


def drop_unread(graph: onnx.GraphProto, among: Collection[str] | None = None) -> None:
    """Nodes none of whose outputs is read (a template's constant its step's members never use;
    with ``among``, only nodes whose first output is one of those), and initializers nothing
    reads that are not graph inputs: onnxruntime would warn of each."""
    read = {output.name for output in graph.output}
    kept = []
    for node in reversed(graph.node):
        if read.isdisjoint(node.output) and (among is None or node.output[:1] and node.output[0] in among):
            continue
        kept.append(node)
        read.update(node.input)
        read |= captured_by(node.attribute)
    keep_only(graph.node, reversed(kept))
    inputs = {value.name for value in graph.input}
    without(graph.initializer, lambda tensor: tensor.name not in read and tensor.name not in inputs)


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
    keep_only(graph.node, kept)


def keep_only(field: Any, kept: Any) -> None:
    """A repeated field of a proto set to ``kept`` (its own items, in their new order)."""
    kept = list(kept)
    del field[:]
    field.extend(kept)


def without(field: Any, drop: Callable[[Any], bool]) -> None:
    """A repeated field of a proto less the items ``drop`` says."""
    keep_only(field, [item for item in field if not drop(item)])
