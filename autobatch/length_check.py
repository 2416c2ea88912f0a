"""A length new to a session checked against its node-level plan (``batcher.instance_axis``)
without typing the whole model for it (``ModelInstances.records_of``: shape inference and
folding in rounds, 15-17 ms a length for the exported BERT, which a server meeting ever new
lengths paid batch after batch).

The probe's typed graph says which of the model's nodes depend on shapes only (folding made
them constants). For a new length those nodes are evaluated once, on the NumPy interpreter, with
each shape they read taken from the plan's patterns; the rest of the model is shape-inferred once
(ONNX's inference, what typing runs) with those values as its constants. The length fits where
every per-instance value has its pattern's shape there, every constant the plan shares has the
probe's value and every constant given per mix its pattern: then typing would have found the
same (the nodes, their signatures and shapes follow from those), and this costs 1-3 ms. Where
anything differs or cannot be told, the caller types the model as before, which decides.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from autobatch.backends.interpreter import Interpreter
from autobatch.batcher.constants import FOLD_LIMIT, constants_to_initializers
from autobatch.batcher.axis_steps import aligned, fits_pattern, pattern_at
from autobatch.batcher.instance_axis import InstanceAxisPlan
from autobatch.batcher.instances import alike
from autobatch.ir import Graph, to_onnx
from autobatch.ir.graph import SHAPE_DATA_LIMIT
from autobatch.ir.graph_tidy import without

log = logging.getLogger("autobatch")


def _weights_alone_as_typed(model: Graph, typed: Graph) -> None:
    """The nodes of ``model`` that read the model's constants alone (no input reaches them: a
    tied weight's Transpose, a LayerNorm of relative embeddings) made the constants typing
    folded them to: the same at every length, not evaluated again for each."""
    reached = set(model.inputs)
    for node in model.topological_order():
        if any(name in reached for name in node.inputs if name):
            reached.update(node.outputs)
            continue
        values = [typed.values[name].const if name in typed.values else None for name in node.outputs if name]
        if values and all(value is not None for value in values):
            model.remove_nodes([node.id])
            for name, value in zip([name for name in node.outputs if name], values):
                model.add_initializer(name, value)


class LengthCheck:
    """``constants(length, dtypes)``: what the plan feeds per mix to an instance of ``length``
    whose inputs have these ``dtypes`` (the constants folded there), or None where the model
    must be typed for it to tell."""

    def __init__(self, graph: Graph, typed: Graph, plan: InstanceAxisPlan) -> None:
        self.plan = plan
        model = Graph.union([graph], rename=lambda _k, name: name)
        constants_to_initializers(model)
        _weights_alone_as_typed(model, typed)
        known = {name for name, value in model.values.items() if value.const is not None}
        folded = {name for name, value in typed.values.items() if value.const is not None} - known
        # Every node typing folded (those of values it then dropped, unread, too): its inputs, the
        # values its Shape nodes read
        shapes = model.subgraph(node.id for node in model.nodes.values()
                                if all(typed.producer_of(name) is None for name in node.outputs if name))
        if any(name not in plan.patterns for name in shapes.inputs):
            raise ValueError("a node folded at the probe reads a value of no pattern")
        if any(node.inputs and all(not name or typed.values[name].const is not None for name in node.inputs)
               for node in typed.nodes.values()):  # (left computed: too big, FOLD_LIMIT; smaller, typing would fold it)
            raise ValueError("a node of constant inputs was left unfolded at the probe")
        self.dtypes = {name: typed.values[name].type.dtype for name in plan.inputs}  # type: ignore[union-attr]
        self.reads = {name: typed.values[name].type.dtype for name in shapes.inputs}  # type: ignore[union-attr]
        self.given = set(shapes.outputs)  # the folded values the rest of the model reads
        shapes.outputs += sorted(folded - self.given)  # (each checked against FOLD_LIMIT, as typing does)
        self.interpreter = Interpreter(shapes)
        skeleton = to_onnx(typed, check=False, data_limit=SHAPE_DATA_LIMIT)
        without(skeleton.graph.input, lambda value: value.name in self.given)
        without(skeleton.graph.initializer, lambda tensor: tensor.name in self.given)
        del skeleton.graph.value_info[:]
        for info in skeleton.graph.output:  # (typed at the probe's length)
            info.type.tensor_type.ClearField("shape")
        self.skeleton = skeleton  # the typed model less those values, and less its own shapes
        # The constants that must be the probe's (what ``InstanceAxisPlan.refusal`` compares).
        self.shared = {e for record, step in zip(plan.records, plan.steps) if step.reads_constants
                       for e in record.entries if type(e) is str and e in self.given and e not in step.fed}

    def constants(self, length: int, dtypes: dict[str, np.dtype]) -> dict[str, np.ndarray] | None:
        if length < 2 or any(dtypes.get(name) != dtype for name, dtype in self.dtypes.items()):
            return None  # (one row may sign otherwise: ``one_row_signatures``)
        try:
            values = self._folded(length)
            if values is None or not self._shapes_fit(length, values) or any(
                    not fits_pattern(aligned(values[name], pattern).shape, pattern, length)
                    for name, layouts in self.plan.fed.items() for pattern in layouts.values()) or any(
                    not alike(values[name], self.plan.weights[name]) for name in self.shared):
                return None
        except Exception as error:  # noqa: BLE001 - the model is typed for this length instead
            log.debug("length %d is typed: its check failed (%s: %s)", length, type(error).__name__, error)
            return None
        return {name: values[name] for name in self.plan.fed}

    def _folded(self, length: int) -> dict[str, np.ndarray] | None:
        feeds = {name: np.broadcast_to(np.zeros((), dtype), pattern_at(self.plan.patterns[name], length))
                 for name, dtype in self.reads.items()}
        values = {name: np.asarray(value) for name, value in zip(self.interpreter.graph.outputs, self.interpreter.run(feeds))}
        if any(value.size > FOLD_LIMIT or value.size == 0 for value in values.values()):  # typing may leave it computed
            return None  # (too big, or empty: a node reading an empty value is not folded)
        return {name: value for name, value in values.items() if name in self.given}

    def _shapes_fit(self, length: int, values: dict[str, Any]) -> bool:
        model = onnx.ModelProto()
        model.CopyFrom(self.skeleton)
        for info in model.graph.input:
            if info.name in self.plan.inputs:
                for dim, size in zip(info.type.tensor_type.shape.dim, pattern_at(self.plan.patterns[info.name], length)):
                    dim.Clear()
                    dim.dim_value = size
        for name, value in values.items():  # as typing gives them to shape inference
            if value.size > SHAPE_DATA_LIMIT:
                model.graph.input.append(helper.make_tensor_value_info(
                    name, helper.np_dtype_to_tensor_dtype(value.dtype), list(value.shape)))
            else:
                model.graph.initializer.append(numpy_helper.from_array(value, name))
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True).graph
        shapes = {info.name: tuple(d.dim_value if d.HasField("dim_value") else None for d in info.type.tensor_type.shape.dim)
                  for info in (*inferred.input, *inferred.value_info, *inferred.output)}
        return all(shapes.get(name) == pattern_at(pattern, length) for name, pattern in self.plan.patterns.items())
