"""Constant nodes become shared values, so that instances read one constant and the batching
rules see axes and shapes given by Constant nodes as known data; and what an instance's input
types already decide (shapes, and what is computed from them) is folded into constants."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from autobatch.ir import Graph, Node
from autobatch.ir.random_ops import NONDETERMINISTIC

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


# The most elements a folded value may have: a bigger one (a mask over a long text) stays computed
# rather than become a constant of every input signature's graph.
FOLD_LIMIT = 1 << 16
Evaluate = Callable[[Graph, dict[str, Any]], "list[Any] | None"]  # ``backends.evaluate``


def fold_known_values(graph: Graph, evaluate: Evaluate) -> int:
    """Evaluate now, and make constants of, the nodes whose inputs are all known once the
    graph's input types are: constants, and the shape of a value whose shape is static (Shape,
    Size). Exporters compute initial states, position ids, masks and reshape targets from
    shapes (``Shape -> Gather -> Concat -> ConstantOfShape``); folded, they are data the batching
    rules read, not per-instance steps. Returns how many nodes were folded."""
    folded = 0
    for node in graph.topological_order():
        if node.domain or node.op_type in NONDETERMINISTIC or node.op_type == "Dropout" or any(True for _ in node.subgraphs()) \
                or any(name in graph.outputs for name in node.outputs):  # an output stays the instance's own
            continue
        values = _known_outputs(graph, node, evaluate)
        if values is None or any(np.asarray(value).size > FOLD_LIMIT for value in values) and not _of_a_big_weight(graph, node):
            continue
        graph.remove_nodes([node.id])
        for name, value in zip(node.outputs, values):
            if name:
                graph.add_initializer(name, value)
        folded += 1
    return folded


# Ops whose output, of the model's own weights alone, is no bigger than their biggest input: a
# rearranged, retyped or sliced weight (the legacy exporter's Identity of a tied weight, dynamo's
# Transpose of one), one normalized or mapped element by element (DeBERTa's LayerNorm of its
# relative embeddings, then a slice of them), projected or added to (their projections to keys
# and queries). Folded whatever their size: their value is another weight.
REARRANGING = frozenset({"Identity", "Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Cast", "Slice"})
NORMALIZING = frozenset({"LayerNormalization", "Softmax", "LogSoftmax", "Abs", "Neg", "Relu", "Tanh", "Sigmoid",
                         "Exp", "Log", "Sqrt", "Reciprocal", "Erf"})
BROADCASTING = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Where"})


def _no_bigger(graph: Graph, node: Node) -> bool:
    """Whether the node's output is no bigger than its biggest input (told before evaluating it)."""
    if node.op_type in REARRANGING or node.op_type in NORMALIZING:
        return True
    shapes = [np.shape(graph.values[name].const) for name in node.inputs]
    try:
        if node.op_type == "MatMul" and len(shapes) == 2 and min(map(len, shapes)) >= 2:  # (a weight projected)
            out = (*np.broadcast_shapes(shapes[0][:-2], shapes[1][:-2]), shapes[0][-2], shapes[1][-1])
        elif node.op_type in BROADCASTING:
            out = np.broadcast_shapes(*shapes)
        elif node.op_type == "Expand" and len(shapes) == 2 and len(shapes[1]) == 1:  # (to a shape: of the same size)
            out = np.broadcast_shapes(shapes[0], tuple(int(d) for d in graph.values[node.inputs[1]].const))
        elif node.op_type == "Tile" and len(shapes) == 2 and shapes[1] == (len(shapes[0]),):  # (repeated once)
            out = tuple(d * int(r) for d, r in zip(shapes[0], graph.values[node.inputs[1]].const))
        else:
            return False
    except ValueError:  # (shapes that do not broadcast: its own error, at run time)
        return False
    return int(np.prod(out)) <= max(int(np.prod(shape)) for shape in shapes)


def fold_weights_alone(graph: Graph, evaluate: Evaluate, memo: dict[str, Any] | None = None) -> int:
    """Make constants of the nodes that read constants alone and make no bigger a value
    (``_no_bigger``), before anything is folded from shapes: over ``FOLD_LIMIT`` elements, typing
    would leave them computed, and a batch could not read them as weights (a language model's
    tied output projection). ``memo`` keeps each value by name across the graphs typed for one
    model, so that it is computed once and its array shared. Returns how many nodes were folded."""
    folded = 0
    for node in graph.topological_order():
        if node.domain or node.op_type in NONDETERMINISTIC or not node.inputs \
                or any(not name or graph.values[name].const is None for name in node.inputs) \
                or any(name in graph.outputs for name in node.outputs) or not _no_bigger(graph, node):
            continue
        values = [memo.get(name) for name in node.outputs] if memo is not None and all(
            name in memo for name in node.outputs if name) else evaluate(graph.subgraph([node.id]), {})
        if values is None:
            continue
        graph.remove_nodes([node.id])
        for name, value in zip(node.outputs, values):
            if name:
                graph.add_initializer(name, value)
                if memo is not None:
                    memo[name] = value
        folded += 1
    return folded


def _of_a_big_weight(graph: Graph, node: Node) -> bool:
    """Whether a node of constant inputs makes a value no bigger than a constant it reads over
    ``FOLD_LIMIT`` (a weight expanded to a shape folded from an input's: the same for every
    length): folded, as the weight itself is, not left computed."""
    return any(np.size(graph.values[name].const) > FOLD_LIMIT for name in node.inputs if name) and _no_bigger(graph, node)


# The inputs that are shapes, not data: an empty one is a scalar's shape, not a value of nothing
# (HF's exports make the scalar True of a mask as ``ConstantOfShape([])``).
_SHAPE_INPUTS = {"ConstantOfShape": 0, "Reshape": 1, "Expand": 1}


def _known_outputs(graph: Graph, node: Node, evaluate: Evaluate) -> list[Any] | None:
    if node.op_type in ("Shape", "Size"):
        vtype = graph.values[node.inputs[0]].type
        if vtype is None or not vtype.is_static:
            return None
        shape = np.array(vtype.shape, dtype=np.int64)
        if node.op_type == "Size":
            return [np.array(shape.prod(), dtype=np.int64)]
        return [shape[node.attr("start", 0):node.attr("end", None)]]
    if not node.inputs or any(name and graph.values[name].const is None for name in node.inputs):
        return None
    if any(name and graph.values[name].const.size == 0 and _SHAPE_INPUTS.get(node.op_type) != k  # type: ignore[union-attr]
           for k, name in enumerate(node.inputs)):
        return None  # backends differ on a reduction of nothing (onnxruntime's mean 0, the standard's NaN): left to its own
    return evaluate(graph.subgraph([node.id]), {})
