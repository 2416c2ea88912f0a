"""A Gather of one constant index (PyTorch's ``select``, ``x[i]``) moved before the Transpose,
Squeeze and Unsqueeze that feed it, onto the value they rearrange.

PyTorch's multi-head attention splits its packed projection as
``proj.unflatten(-1, (3, E)).unsqueeze(0).transpose(0, -2).squeeze(-2)[i]`` (``[L, 1, 3, E]`` ->
``[3, L, 1, E]`` -> ``[L, 1, E]``): its Transpose puts an axis of 3 before the length, so the value
it makes has no contiguous rows, and batched along the length (``batcher.instance_axis``) it is
padded and moved chunk by chunk, the whole projection three times. Selected first,
``[L, 1, 3, E]`` -> ``[L, 1, E]`` keeps its rows, and the moves redone after it move only axes of 1.
The result is the same array: a Gather of one index, a Transpose and a Squeeze or Unsqueeze only
move elements.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from autobatch.ir.graph_tidy import drop_unread, keep_only

MOVES = frozenset({"Transpose", "Squeeze", "Unsqueeze"})
DEFAULT_DOMAINS = ("", "ai.onnx")


def select_first(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with each Gather of one constant index of its main graph moved before the moves
    that make its data, as far as they go (a copy; ``model`` itself where there is none)."""
    index = _Index(model.graph)
    if not any(index.move_under(node) for node in model.graph.node):
        return model
    try:
        model = onnx.shape_inference.infer_shapes(model)  # (a copy) the ranks of the values the moves read
    except (onnx.shape_inference.InferenceError, RuntimeError):
        model = onnx.ModelProto.FromString(model.SerializeToString())  # the ranks the moves say, or none
    graph, index = model.graph, _Index(model.graph)
    bypassed: set[str] = set()  # the outputs of the moves a Gather passed
    nodes = []
    budget = 4 * len(graph.node) + 1024  # moves redone at most: Gathers after one long chain would redo it each
    for node in list(graph.node):
        after = []
        while budget > 0 and (move := index.move_under(node)) is not None and \
                (passed := index.passed(node, move)) is not None:
            budget -= 1
            node, redone = passed
            bypassed.add(move.output[0])
            after.append(redone)
        nodes += [node, *reversed(after)]
    keep_only(graph.node, nodes)
    drop_unread(graph, bypassed)  # (the moves no Gather reads any more, and their axes)
    return model


class _Index:
    """What the rewrite reads of a graph: each value's producer, its constants, declared ranks."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self.graph = graph
        self.producers = {name: node for node in graph.node for name in node.output}
        self.constants: dict[str, Any] = {tensor.name: tensor for tensor in graph.initializer}
        self.constants.update((node.output[0], node.attribute[0].t) for node in graph.node
                              if node.op_type == "Constant" and [a.name for a in node.attribute] == ["value"])
        self.ranks = {value.name: len(value.type.tensor_type.shape.dim)
                      for value in [*graph.input, *graph.value_info, *graph.output]
                      if value.type.tensor_type.HasField("shape")}
        self.inputs = {value.name for value in graph.input}
        self.names = set(self.producers) | set(self.constants) | self.inputs

    def move_under(self, gather: onnx.NodeProto) -> onnx.NodeProto | None:
        """The move making ``gather``'s data, where ``gather`` is a Gather of one constant index."""
        if gather.op_type != "Gather" or gather.domain not in DEFAULT_DOMAINS or len(gather.input) != 2:
            return None
        index = self.constant(gather.input[1])
        if index is None or index.ndim != 0:
            return None
        move = self.producers.get(gather.input[0])
        return move if move is not None and move.op_type in MOVES and move.domain in DEFAULT_DOMAINS else None

    def passed(self, gather: onnx.NodeProto, move: onnx.NodeProto) -> tuple[onnx.NodeProto, onnx.NodeProto] | None:
        """``gather`` as a Gather of ``move``'s input, and ``move`` redone on its result, giving
        ``gather``'s output; None where the axes are not known or the Gather takes an axis the
        Unsqueeze made."""
        rank = self.rank(gather.input[0])
        if rank is None:
            return None
        axis = _attribute(gather, "axis", 0) % rank
        axes = None if move.op_type == "Transpose" else self.axes(move)
        attributes: dict[str, Any] = {}
        if move.op_type == "Transpose":
            perm = list(_attribute(move, "perm", None) or reversed(range(rank)))
            source = perm[axis]
            attributes = {"perm": [p - (p > source) for k, p in enumerate(perm) if k != axis]}
        elif axes is None:
            return None
        elif move.op_type == "Squeeze":  # its axes are of its input, of rank ``rank + len(axes)``
            axes = [a % (rank + len(axes)) for a in axes]
            source = [k for k in range(rank + len(axes)) if k not in axes][axis]
            axes = [a - (a > source) for a in axes]
        else:  # Unsqueeze: its axes are of its output, of rank ``rank``
            axes = [a % rank for a in axes]
            if axis in axes:
                return None
            source = axis - sum(a < axis for a in axes)
            axes = [a - (a > axis) for a in axes]
        selected = self.name(f"{gather.output[0]}/selected")
        first = helper.make_node("Gather", [move.input[0], gather.input[1]], [selected], axis=source,
                                 name=self.name(f"{gather.name or 'Gather'}/first"))
        inputs = [selected]
        if axes is not None and len(move.input) > 1:  # (opset 13 on: axes as an input)
            inputs.append(self.name(f"{move.output[0]}/axes"))
            self.graph.initializer.append(numpy_helper.from_array(np.array(axes, np.int64), inputs[-1]))
        elif axes is not None:
            attributes = {"axes": axes}
        redone = helper.make_node(move.op_type, inputs, list(gather.output),
                                  name=self.name(f"{move.name or move.op_type}/after"), **attributes)
        self.producers[selected] = first
        self.producers[gather.output[0]] = redone
        return first, redone

    def rank(self, name: str) -> int | None:
        """The rank of value ``name``: worked out through the moves that make it, else declared
        (a loop, not recursion: a hostile model may chain any number of moves)."""
        added = 0  # what the Squeezes and Unsqueezes walked through add to the rank found
        while (move := self.producers.get(name)) is not None:
            if move.op_type == "Transpose" and _attribute(move, "perm", None):
                return len(_attribute(move, "perm", None)) + added
            axes = self.axes(move) if move.op_type in ("Squeeze", "Unsqueeze") else None
            if axes is None:
                break
            added += -len(axes) if move.op_type == "Squeeze" else len(axes)
            name = move.input[0]
        return None if name not in self.ranks else self.ranks[name] + added

    def axes(self, move: onnx.NodeProto) -> list[int] | None:
        """A Squeeze's or Unsqueeze's axes, from its input (opset 13 on) or its attribute."""
        if len(move.input) > 1 and move.input[1]:
            value = self.constant(move.input[1])
            return None if value is None else [int(a) for a in value.ravel()]
        axes = _attribute(move, "axes", None)
        return None if axes is None else list(axes)

    def constant(self, name: str) -> np.ndarray | None:
        tensor = self.constants.get(name)
        return None if tensor is None else numpy_helper.to_array(tensor)

    def name(self, stem: str) -> str:
        name, k = stem, 0
        while name in self.names:
            k += 1
            name = f"{stem}{k}"
        self.names.add(name)
        return name


def _attribute(node: onnx.NodeProto, name: str, default: Any) -> Any:
    for attribute in node.attribute:
        if attribute.name == name:
            return helper.get_attribute_value(attribute)
    return default
