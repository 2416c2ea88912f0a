"""The IR's values and nodes (ONNX-style: a node's attributes are ONNX's protos), and what is
read off a node without its graph: attribute values, its subgraphs' free names, its schema."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import onnx
from onnx import AttributeProto, GraphProto, helper

from autobatch.ir.types import ValueType


class Value:
    """A named SSA value: a graph input, a constant (initializer) or a node output.

    Invariant: ``const`` is set exactly for constants; their identity is their name within
    the graph. A constant is a weight or parameter that instances share, unless it is a
    ``literal``: data of one instance (a word index, a value computed in an earlier round).
    """

    __slots__ = ("name", "type", "const", "literal")

    def __init__(self, name: str, type: ValueType | None = None, const: np.ndarray | None = None,
                 literal: bool = False) -> None:
        self.name = name
        self.type = type
        self.const = const
        self.literal = literal

    @property
    def is_shared(self) -> bool:
        return self.const is not None

    def __repr__(self) -> str:
        kind = "shared " if self.is_shared else ""
        return f"Value({kind}{self.name!r}: {self.type!r})"


class Node:
    """One operator application.

    ``version`` is the opset version of the node's domain; ``instance`` is the index of the
    instance the node belongs to (None for a node not tied to one instance). An empty string
    in ``inputs`` is a missing optional input, as in ONNX.
    """

    __slots__ = ("id", "op_type", "domain", "version", "attributes", "inputs", "outputs", "instance", "name")

    def __init__(
        self,
        id: int,
        op_type: str,
        domain: str,
        version: int,
        attributes: dict[str, AttributeProto],
        inputs: list[str],
        outputs: list[str],
        instance: int | None,
        name: str,
    ) -> None:
        self.id = id
        self.op_type = op_type
        self.domain = domain
        self.version = version
        self.attributes = attributes
        self.inputs = inputs
        self.outputs = outputs
        self.instance = instance
        self.name = name

    def attr(self, name: str, default: Any = None) -> Any:
        """Python value of an attribute (strings decoded), or ``default``."""
        proto = self.attributes.get(name)
        if proto is None:
            return default
        return attribute_value(proto)

    def subgraphs(self) -> Iterator[GraphProto]:
        for proto in self.attributes.values():
            if proto.type == AttributeProto.GRAPH:
                yield proto.g
            elif proto.type == AttributeProto.GRAPHS:
                yield from proto.graphs

    @property
    def qualified_op(self) -> str:
        return f"{self.domain}::{self.op_type}" if self.domain else self.op_type

    def __repr__(self) -> str:
        label = f" {self.name!r}" if self.name else ""
        return f"Node#{self.id}{label} {self.qualified_op}-{self.version}"


def attribute_value(proto: AttributeProto) -> Any:
    value = helper.get_attribute_value(proto)
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if proto.type == AttributeProto.STRINGS:
        return [v.decode("utf-8") for v in value]
    if proto.type == AttributeProto.TENSOR:
        return onnx.numpy_helper.to_array(value)
    return value


def make_attributes(attributes: Mapping[str, Any] | None) -> dict[str, AttributeProto]:
    """Attribute protos from Python values (protos are kept as they are)."""
    result: dict[str, AttributeProto] = {}
    for name, value in (attributes or {}).items():
        if isinstance(value, AttributeProto):
            result[name] = value
        else:
            if isinstance(value, np.ndarray):
                value = onnx.numpy_helper.from_array(value)
            result[name] = helper.make_attribute(name, value)
    return result


@functools.lru_cache(maxsize=4096)
def schema_version(op_type: str, opset: int, domain: str) -> int | None:
    """The ``since_version`` of the op's schema at this opset, or None for an unknown op
    (cached: the lookup costs microseconds and graphs repeat the same ops)."""
    try:
        return onnx.defs.get_schema(op_type, opset, domain).since_version
    except onnx.defs.SchemaError:
        return None


def subgraphs_of(node: onnx.NodeProto) -> Iterator[GraphProto]:
    """The graphs an ONNX node's attributes hold (If's branches, a Loop's body), whatever their
    declared type says: import checks read a hostile file's."""
    for attr in node.attribute:
        if attr.HasField("g"):
            yield attr.g
        yield from attr.graphs


def captured_names(node: Node) -> set[str]:
    """Values a node's subgraph attributes read from the enclosing scope."""
    return captured_by(node.attributes.values())


def captured_by(attributes: Iterable[AttributeProto]) -> set[str]:
    """Values these attributes' subgraphs read from the enclosing scope (of an IR node's or an
    ONNX ``NodeProto``'s attributes)."""
    free: set[str] = set()
    for attr in attributes:
        if attr.type == AttributeProto.GRAPH:
            free |= _free_names(attr.g)
        elif attr.type == AttributeProto.GRAPHS:
            for graph in attr.graphs:
                free |= _free_names(graph)
    return free


def _free_names(graph: GraphProto) -> set[str]:
    defined = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    defined |= {t.values.name for t in graph.sparse_initializer}
    used: set[str] = set()
    for node in graph.node:
        used.update(n for n in node.input if n)
        used |= captured_by(node.attribute)
        defined.update(n for n in node.output if n)
    used.update(v.name for v in graph.output)
    return used - defined
