"""An instance's graph typed for its input signature (``typed_instance``: shapes inferred, what
the input types decide folded into constants), constants shared by identity across the graphs
typed for a model's signatures, and the plan of instances given as their records."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import onnx

from autobatch.backends import evaluate
from autobatch.batcher.constants import constants_to_initializers, fold_known_values
from autobatch.batcher.flat import plan_records
from autobatch.batcher.instances import InstanceRecords, alike, mix_records
from autobatch.batcher.plan import FlatPlan, TemplateCache
from autobatch.ir import Graph, ValueType

FOLD_ROUNDS = 8  # rounds of folding what the input types decide, then inferring shapes again


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


def typed_instance(graph: Graph, input_types: Mapping[str, ValueType]) -> Graph:
    """A copy of ``graph`` (Constant nodes made initializers) with these input types and every
    other value's shape inferred from them: declared shapes are hints, which would size slots."""
    graph = Graph.union([graph], rename=lambda _k, name: name)
    constants_to_initializers(graph)
    for value in graph.values.values():
        if value.const is None and value.type is not None:
            value.type = ValueType(_without_shapes(value.type.proto))
    for name, vtype in input_types.items():
        graph.values[name].type = vtype
    graph.infer_shapes()
    for _ in range(FOLD_ROUNDS):  # what folding makes known (a reshape's target) may make more shapes known
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
