"""An instance's graph typed for its input signature (``typed_instance``: shapes inferred, what
the input types decide folded into constants), constants shared by identity across the graphs
typed for a model's signatures, what a session keeps of its model's instances
(``ModelInstances``), and the plan of instances given as their records."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import onnx

from autobatch.backends import FeedError, evaluate
from autobatch.backends.control_flow import CONTROL_FLOW
from autobatch.backends.ort_runtime import might_abort_onnxruntime
from autobatch.batcher.constants import constants_to_initializers, fold_known_values, fold_weights_alone
from autobatch.batcher.flat import plan_records
from autobatch.batcher.instances import InstanceRecords, alike, instance_records, mix_records
from autobatch.batcher.plan import FlatPlan, TemplateCache
from autobatch.feed_keys import input_signature, values_key
from autobatch.frontends.onnx_control_flow import unroll_instance
from autobatch.ir import Graph, Recent, ValueType
from autobatch.ir.recent import Budgeted
from autobatch.ir.types import type_of_value
from autobatch.ir.limits import WorkLimit, check_deadline

# What a session keeps, most recently used first: a long-running server meets ever new input
# shapes, and unbounded caches would only grow.
SHAPES_KEPT = 1024  # typed graphs and their records, per input signature
FOLD_WORK = 500_000  # nodes inferred again, all rounds of folding together, that typing may spend
UNROLLED_NODES_KEPT = 500_000  # nodes of the control-flow instances last unrolled (``check`` unrolls what
# ``run_batch`` then runs): a cap on nodes, not instances, as one instance may unroll into 100,000


class SharedConstants(dict):
    """Each constant of the graphs typed for input signatures, by name: one equal to the first
    of its name becomes that same array, so that a batch's mix of signatures finds the constants
    every instance shares by identity (``instances.mix_records``) rather than by comparing them all,
    each batch. (Its first array is kept, as the graphs that share it are.)"""

    def share(self, graph: Graph) -> Graph:
        for name, value in graph.values.items():
            array = value.const
            if array is None or value.literal:
                continue
            first = self.setdefault(name, array)
            if alike(first, array):
                value.const = first
        return graph


class ModelInstances:
    """A model's instances as a session plans and runs them, kept per input signature: the model
    typed for it, its records, whether onnxruntime could abort on it. With control flow, each
    instance is unrolled by its values instead (within ``max_unrolled_nodes``, else a FeedError)."""

    def __init__(self, graph: Graph, max_unrolled_nodes: int) -> None:
        self.graph = graph
        self.max_unrolled_nodes = max_unrolled_nodes
        self.control_flow = any(n.op_type in CONTROL_FLOW and not n.domain for n in graph.nodes.values())
        self.typed: Recent = Recent(SHAPES_KEPT)  # input signature -> the model typed for it
        self.records: Recent = Recent(SHAPES_KEPT)  # input signature -> InstanceRecords
        self._aborts: Recent = Recent(SHAPES_KEPT)  # input signature -> ``might_abort``
        # the values of a control-flow instance -> its graph
        self._unrolled = Budgeted(1 << 30, UNROLLED_NODES_KEPT, len)
        self._constants = SharedConstants()
        self.weights_alone: dict[str, Any] = {}  # what the model computes of its weights alone, by name (``typed_instance``)

    def graph_of(self, feeds: Mapping[str, Any]) -> Graph:
        """The model with its inputs' concrete types and every value's shape inferred; a model
        with control flow unrolled for these values."""
        if self.control_flow:
            key = values_key(feeds)
            graph = self._unrolled.get(key)
            if graph is None:
                try:
                    graph = unroll_instance(self.graph, feeds, evaluate, self.max_unrolled_nodes)
                except WorkLimit as error:
                    raise FeedError(str(error)) from None
                constants_to_initializers(graph)
                self._unrolled[key] = graph
            return graph
        key = input_signature(feeds)
        graph = self.typed.get(key)
        if graph is None:
            graph = typed_instance(self.graph, {name: type_of_value(value) for name, value in feeds.items()},
                                   self.weights_alone)
            self.typed[key] = graph = self._constants.share(graph)
        return graph

    def records_of(self, feeds: Mapping[str, Any]) -> InstanceRecords:
        """The typed graph of an instance as records (with control flow, made for each instance)."""
        if self.control_flow:
            return instance_records(self.graph_of(feeds))
        signature = input_signature(feeds)
        records = self.records.get(signature)
        if records is None:
            records = self.records[signature] = instance_records(self.graph_of(feeds))
        return records

    def might_abort(self, feeds: Mapping[str, Any], unrolled: Graph | None) -> bool:
        """Whether onnxruntime could abort on a recurrent layer of this instance
        (``might_abort_onnxruntime``): over its ``unrolled`` graph, or once per input signature
        (typing the graph and walking its nodes for every instance run alone made the exported
        LSTM tagger 2x slower)."""
        if unrolled is not None:
            return _aborts_onnxruntime(unrolled)
        key = input_signature(feeds)
        aborts = self._aborts.get(key)
        if aborts is None:
            aborts = self._aborts[key] = _aborts_onnxruntime(self.graph_of(feeds))
        return aborts


def _aborts_onnxruntime(graph: Graph) -> bool:
    return any(might_abort_onnxruntime(graph, node) for node in graph.nodes.values())


def typed_instance(graph: Graph, input_types: Mapping[str, ValueType], weights: dict[str, Any] | None = None) -> Graph:
    """A copy of ``graph`` (Constant nodes made initializers, and what it computes of its weights alone:
    ``weights`` keeps those values for the next copy) with these input types and every other
    value's shape inferred from them: declared shapes are hints, which would size slots."""
    graph = Graph.union([graph], rename=lambda _k, name: name)
    constants_to_initializers(graph)
    fold_weights_alone(graph, evaluate, weights)
    for value in graph.values.values():
        if value.const is None and value.type is not None:
            value.type = ValueType(_without_shapes(value.type.proto))
    for name, vtype in input_types.items():
        graph.values[name].type = vtype
    graph.infer_shapes()
    # What folding makes known (a reshape's target) may make more shapes known: before opset 14
    # onnx infers a Reshape's shape only from a constant target, so a deep export's chain of
    # Shape -> ... -> Reshape is known a layer a round (a 48-layer GPT-2: about 50 rounds). Each
    # round infers the whole graph again: the rounds are bounded by the graph's size, so that
    # a chain of thousands of such layers costs seconds, its rest left to plan per mix.
    for _ in range(max(8, FOLD_WORK // max(1, len(graph.nodes)))):
        check_deadline()
        if not fold_known_values(graph, evaluate):
            break
        graph.infer_shapes()
    return graph


def _without_shapes(proto: onnx.TypeProto) -> onnx.TypeProto:
    """The type with its tensors' shapes left out (element types kept)."""
    bare = onnx.TypeProto()
    bare.CopyFrom(proto)
    for tensor in _tensor_types(bare):
        tensor.ClearField("shape")
    return bare


def _tensor_types(proto: onnx.TypeProto) -> list:
    kind = proto.WhichOneof("value")
    if kind == "tensor_type":
        return [proto.tensor_type]
    inner = {"sequence_type": "elem_type", "optional_type": "elem_type", "map_type": "value_type"}.get(kind)
    return _tensor_types(getattr(getattr(proto, kind), inner)) if inner else []


def plan_name(k: int, name: str, producer: Mapping[str, int], weights: Mapping[str, Any]) -> str:
    """What a batch's records call output ``name`` of instance k: ``i{k}/name``, but for a
    constant every instance shares."""
    own = f"i{k}/{name}"
    return name if own not in producer and own not in weights and name in weights else own


def plan_instances(pieces: Sequence[InstanceRecords], outputs: Sequence[Sequence[str]], literals: Mapping[str, Any],
                   functions: Mapping, opsets: Mapping[str, int], scheduler: str, *,
                   known: dict[Hashable, tuple] | None = None, apart: bool = True, padded: bool = True,
                   cache: TemplateCache) -> tuple[FlatPlan, dict[str, Any], list[str]]:
    """The plan computing output ``outputs[k]`` of each instance k (given as its records), the
    constants it reads, and what it calls each wanted value, instance by instance."""
    records, producer, weights = mix_records(pieces)
    wanted = [plan_name(k, name, producer, weights) for k, names in enumerate(outputs) for name in names]
    plan = plan_records(records, wanted, [producer[name] for name in wanted if name in producer], weights, literals,
                        functions, opsets, scheduler, known, apart=apart, padded=padded, cache=cache)
    return plan, weights, wanted
