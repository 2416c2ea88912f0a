"""The IR: a Graph facade over ``networkx.MultiDiGraph`` holding ONNX-style nodes and values.

Nodes of the networkx graph are integer node ids; an edge ``u -> v`` with key
``(output_index, input_index)`` says that input ``input_index`` of ``v`` reads output
``output_index`` of ``u`` (so ``Add(x, x)`` has two parallel edges). A value captured from
the enclosing scope by a subgraph attribute (If/Loop/Scan bodies) is an edge with input
index ``CAPTURED``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import networkx as nx
import numpy as np
import onnx
from onnx import FunctionProto, GraphProto

from autobatch.ir.errors import ValidationError
from autobatch.ir.gc_pause import without_gc
from autobatch.ir.nodes import Node, Value, captured_names, make_attributes, schema_version
from autobatch.ir.types import ValueType, type_of_array

CAPTURED = -1  # input index of an edge for a value read from inside a subgraph attribute
# Shape inference sees the values of constants up to this size (shapes, axes, indices); larger
# ones (weights) only by their types, which spares copying and parsing them for every new shape.
SHAPE_DATA_LIMIT = 4096


class Graph:
    """A dataflow graph of ONNX nodes over named values, held in networkx.

    Invariants: every value name is unique; every node output is produced by exactly one
    node; the networkx edges mirror node inputs (and captured values) exactly.
    """

    def __init__(self, name: str = "graph", opset_imports: Mapping[str, int] | None = None) -> None:
        self.name = name
        self._nx: nx.MultiDiGraph | None = None  # built on first use, then kept in step
        self.nodes: dict[int, Node] = {}
        self.values: dict[str, Value] = {}
        self.inputs: list[str] = []
        self.outputs: list[str] = []
        self.opset_imports: dict[str, int] = dict(opset_imports or {"": onnx.defs.onnx_opset_version()})
        self.functions: dict[tuple[str, str], FunctionProto] = {}
        # Model-level fields kept for a faithful export (ir_version, producer, doc strings, metadata).
        self.meta: dict[str, Any] = {}
        self._producer: dict[str, tuple[int, int]] = {}
        self._consumers: dict[str, list[tuple[int, int]]] = {}
        self._next_id = 0
        # True while every edge runs from an older node to a newer one: then id order is a
        # topological order and no sort is needed.
        self._ids_in_order = True

    # ----------------------------------------------------------------- building
    def add_input(self, name: str, type: ValueType | None) -> Value:
        value = self._new_value(name, type)
        self.inputs.append(name)
        return value

    def add_initializer(self, name: str, array: np.ndarray, literal: bool = False) -> Value:
        """A constant: a weight or parameter every instance may share, or with ``literal``
        one instance's data."""
        array = np.asarray(array)
        value = self._new_value(name, type_of_array(array), const=array)
        value.literal = literal
        return value

    def add_output(self, name: str) -> None:
        if name not in self.values:
            raise ValidationError(f"graph output {name!r} is not a value of graph {self.name!r}")
        self.outputs.append(name)

    def add_node(
        self,
        op_type: str,
        inputs: Sequence[str],
        outputs: Sequence[str],
        attributes: Mapping[str, Any] | None = None,
        *,
        domain: str = "",
        version: int | None = None,
        instance: int | None = None,
        name: str = "",
        output_types: Sequence[ValueType | None] | None = None,
    ) -> Node:
        if version is None:
            version = self.opset_imports.get(domain, 1)
        node = Node(-1, op_type, domain, version, make_attributes(attributes), list(inputs), list(outputs),
                    instance, name)
        self._insert([node], [output_types if output_types is not None else [None] * len(node.outputs)])
        return node

    @property
    def nx(self) -> nx.MultiDiGraph:
        """The dataflow as a networkx ``MultiDiGraph``. Built in bulk on first use (hot paths
        such as running a batched graph never need it) and kept up to date afterwards."""
        if self._nx is None:
            graph = nx.MultiDiGraph()
            graph.add_nodes_from(self.nodes)
            graph.add_edges_from(self._edges(self.nodes.values()))
            self._nx = graph
        return self._nx

    def _edges(self, nodes: Iterable[Node]) -> Iterator[tuple[int, int, tuple[int, int], dict[str, str]]]:
        """The edges into these nodes: (producer, consumer, (output index, input index), value)."""
        for node in nodes:
            for name, index in self._reads(node):
                source = self._producer.get(name)
                if source is not None:
                    yield source[0], node.id, (source[1], index), {"value": name}

    def _insert(self, nodes: Sequence[Node], output_types: Sequence[Sequence[ValueType | None]]) -> None:
        """Give the nodes ids and add them with their values (and, once networkx has been
        asked for, their edges in one call: a per-edge call costs several times more)."""
        edges: list[tuple[int, int, tuple[int, int], dict[str, str]]] = []
        track = self._nx is not None
        for node, types in zip(nodes, output_types):
            node.id = self._next_id
            self._next_id += 1
            for index, (output, vtype) in enumerate(zip(node.outputs, types)):
                if not output:
                    continue
                self._new_value(output, vtype)
                self._producer[output] = (node.id, index)
                for reader, input_index in self._consumers.get(output, ()):  # read before defined
                    self._ids_in_order = False
                    if track:
                        edges.append((node.id, reader, (index, input_index), {"value": output}))
            self.nodes[node.id] = node
            for name, index in self._reads(node):
                self._consumers.setdefault(name, []).append((node.id, index))
                source = self._producer.get(name)
                if source is not None and source[0] == node.id:
                    self._ids_in_order = False  # a node reading its own output: a cycle
                if track and source is not None:
                    edges.append((source[0], node.id, (source[1], index), {"value": name}))
        if track:
            self._nx.add_nodes_from(node.id for node in nodes)
            self._nx.add_edges_from(edges)

    def remove_nodes(self, node_ids: Iterable[int]) -> None:
        """Remove nodes and the values they produce; consumers of those values must go too."""
        for node_id in list(node_ids):
            node = self.nodes.pop(node_id)
            if self._nx is not None:
                self._nx.remove_node(node_id)
            for name, _ in self._reads(node):
                self._consumers[name] = [c for c in self._consumers.get(name, []) if c[0] != node_id]
            for output in node.outputs:
                if output:
                    del self._producer[output]
                    del self.values[output]

    def prune_unused_constants(self) -> int:
        """Drop shared constants that nothing reads; returns how many."""
        unused = [name for name, value in self.values.items()
                  if value.is_shared and not self._consumers.get(name) and name not in self.outputs]
        for name in unused:
            del self.values[name]
        return len(unused)

    def _new_value(self, name: str, type: ValueType | None, const: np.ndarray | None = None) -> Value:
        if not name:
            raise ValidationError("a value needs a non-empty name")
        if name in self.values:
            raise ValidationError(f"value {name!r} is defined twice in graph {self.name!r}")
        value = Value(name, type, const)
        self.values[name] = value
        return value

    def _reads(self, node: Node) -> list[tuple[str, int]]:
        reads = [(name, index) for index, name in enumerate(node.inputs) if name]
        if node.attributes:  # only subgraph attributes capture values
            reads.extend((name, CAPTURED) for name in sorted(captured_names(node)))
        return reads

    # ----------------------------------------------------------------- queries
    def producer(self, value: str) -> tuple[Node, int] | None:
        """The node producing ``value`` and the output index, or None for inputs and constants."""
        source = self._producer.get(value)
        return None if source is None else (self.nodes[source[0]], source[1])

    def reads(self, node: Node) -> list[str]:
        """The values a node reads: its inputs and what its subgraphs capture."""
        return [name for name, _ in self._reads(node)]

    def producer_of(self, value: str) -> tuple[int, int] | None:
        """(node id, output index) of the value's producer; None for inputs and constants."""
        return self._producer.get(value)

    def consumer_count(self, value: str) -> int:
        return len(self._consumers.get(value, ()))

    def consumers(self, value: str) -> list[tuple[Node, int]]:
        """(node, input index) for every read of ``value``; index ``CAPTURED`` for subgraph reads."""
        return [(self.nodes[n], i) for n, i in self._consumers.get(value, [])]

    def topological_order(self) -> list[Node]:
        """Nodes in a dependency order that is deterministic: ties go to the older node."""
        if self._ids_in_order:
            return list(self.nodes.values())  # insertion order: ids ascend
        try:
            order = nx.lexicographical_topological_sort(self.nx)
            return [self.nodes[n] for n in order]
        except nx.NetworkXUnfeasible:
            raise ValidationError(f"graph {self.name!r} has a cycle: {self._describe_cycle()}") from None

    def initializers(self) -> dict[str, np.ndarray]:
        return {name: v.const for name, v in self.values.items() if v.const is not None}

    def __len__(self) -> int:
        return len(self.nodes)

    # ----------------------------------------------------------------- whole-graph operations
    def subgraph(self, node_ids: Iterable[int], name: str | None = None) -> Graph:
        """A new graph with only these nodes: values they read from outside become inputs
        (or stay shared constants); values read outside them, or graph outputs, become outputs."""
        chosen = sorted(set(node_ids))
        result = self._empty_like(name or f"{self.name}_sub")
        produced = {o for n in chosen for o in self.nodes[n].outputs if o}
        for node_id in chosen:
            for value_name, _ in self._reads(self.nodes[node_id]):
                if value_name in produced or value_name in result.values:
                    continue
                value = self.values.get(value_name)
                if value is None:
                    continue  # from an outer scope: stays captured
                if value.is_shared:
                    result.add_initializer(value_name, value.const, value.literal)
                else:
                    result.add_input(value_name, value.type)
        for node_id in chosen:
            result._copy_node(self.nodes[node_id], self)
        chosen_set = set(chosen)
        for value_name in sorted(produced, key=lambda v: self._producer[v]):
            used_outside = any(n not in chosen_set for n, _ in self._consumers.get(value_name, []))
            if used_outside or value_name in self.outputs:
                result.outputs.append(value_name)
        return result

    @staticmethod
    @without_gc
    def union(graphs: Sequence[Graph], rename: Callable[[int, str], str] | None = None) -> Graph:
        """One graph holding every instance: instance ``k``'s values are renamed
        (``i{k}/name`` by default) and its nodes tagged ``instance=k``. Constants with the same
        name and equal contents in every graph stay one shared value."""
        if not graphs:
            raise ValidationError("union of no graphs")
        rename = rename or (lambda k, name: f"i{k}/{name}")
        first = graphs[0]
        result = first._empty_like(f"union_of_{len(graphs)}")
        for graph in graphs[1:]:
            for domain, version in graph.opset_imports.items():
                if result.opset_imports.setdefault(domain, version) != version:
                    raise ValidationError(
                        f"cannot unite graphs importing {domain or 'ai.onnx'} at opsets "
                        f"{result.opset_imports[domain]} and {version}"
                    )
            result.functions.update(graph.functions)
        shared = _common_constants(graphs)
        for name in sorted(shared):
            result.add_initializer(name, shared[name])
        for k, graph in enumerate(graphs):
            names = {name: (name if name in shared else rename(k, name)) for name in graph.values}
            result._add_renamed(graph, names, k, skip=shared.keys())
        return result

    def renamed(self, names: Mapping[str, str]) -> Graph:
        """A copy whose values named in ``names`` are renamed (the others keep their names)."""
        result = self._empty_like(self.name)
        result._add_renamed(self, names, None)
        return result

    def _add_renamed(self, graph: Graph, names: Mapping[str, str], instance: int | None,
                     skip: Iterable[str] = ()) -> None:
        """Every input, constant (but those in ``skip``), node and output of ``graph``, renamed by
        ``names``; its nodes tagged ``instance`` (None: as they were)."""
        get, skip = names.get, set(skip)
        for name in graph.inputs:
            self.add_input(get(name, name), graph.values[name].type)
        for name, value in graph.values.items():
            if value.is_shared and name not in skip:
                self.add_initializer(get(name, name), value.const, value.literal)
        order = graph.topological_order()
        self._insert([self._renamed(node, names, node.instance if instance is None else instance) for node in order],
                     [[graph.values[o].type if o else None for o in node.outputs] for node in order])
        self.outputs.extend(get(name, name) for name in graph.outputs)

    def _empty_like(self, name: str) -> Graph:
        result = Graph(name, self.opset_imports)
        result.functions = dict(self.functions)
        result.meta = dict(self.meta)
        return result

    def _copy_node(self, node: Node, source: Graph) -> None:
        self._insert([self._renamed(node, {}, node.instance)], [[source.values[o].type if o else None for o in node.outputs]])

    @staticmethod
    def _renamed(node: Node, names: Mapping[str, str], instance: int | None) -> Node:
        """A copy of ``node`` (attribute protos shared: they are never mutated), reading and
        writing renamed values."""
        if names and any(True for _ in node.subgraphs()):
            renamed_captures = {v for v in captured_names(node) if names.get(v, v) != v}
            if renamed_captures:
                raise ValidationError(
                    f"{node} reads {sorted(renamed_captures)} from inside a subgraph; "
                    "such nodes cannot be renamed into a union (inline the subgraph first)"
                )
        get = names.get
        return Node(-1, node.op_type, node.domain, node.version, dict(node.attributes),
                    [get(v, v) for v in node.inputs], [get(v, v) for v in node.outputs], instance, node.name)

    # ----------------------------------------------------------------- checks
    def validate(self, check_types: bool = False) -> None:
        """Raise ValidationError on dangling inputs, undefined outputs, cycles or unknown ops;
        with ``check_types``, also on dtype/shape mismatches (ONNX strict shape inference)."""
        for node in self.nodes.values():
            for name, index in self._reads(node):
                if name not in self.values and index != CAPTURED:
                    raise ValidationError(
                        f"{node} input {index} reads {name!r}, which no node, graph input or initializer defines"
                    )
            self._check_op_known(node)
        for name in self.outputs:
            if name not in self.values:
                raise ValidationError(f"graph output {name!r} is not defined")
        if not self._ids_in_order and not nx.is_directed_acyclic_graph(self.nx):
            raise ValidationError(f"graph {self.name!r} has a cycle: {self._describe_cycle()}")
        if check_types:
            from autobatch.ir.onnx_io import to_onnx

            try:
                onnx.shape_inference.infer_shapes(to_onnx(self, check=False), check_type=True, strict_mode=True)
            except onnx.shape_inference.InferenceError as error:
                raise ValidationError(f"type mismatch in graph {self.name!r}: {error}") from None

    def _check_op_known(self, node: Node) -> None:
        if (node.domain, node.op_type) in self.functions:
            return
        if schema_version(node.op_type, node.version, node.domain) is None:
            raise ValidationError(
                f"{node}: unknown op {node.qualified_op} (domain {node.domain or 'ai.onnx'!r}, opset "
                f"{node.version}); it is neither a standard op nor a function of this model"
            )

    def _describe_cycle(self) -> str:
        edges = nx.find_cycle(self.nx)
        return " -> ".join(repr(self.nodes[u]) for u, *_ in edges) + f" -> {self.nodes[edges[0][0]]!r}"

    def infer_shapes(self) -> None:
        """Fill in dtype and shape of every value that ONNX shape inference can derive."""
        from autobatch.ir.onnx_io import inferred_types, to_onnx

        for name, vtype in inferred_types(to_onnx(self, check=False, data_limit=SHAPE_DATA_LIMIT)).items():
            value = self.values.get(name)
            if value is not None and value.const is None:
                value.type = vtype

    # ----------------------------------------------------------------- display
    def __str__(self) -> str:
        def typed(name: str) -> str:
            value = self.values.get(name)
            return f"%{name}: {value.type!r}" if value is not None and value.type is not None else f"%{name}"

        lines = [f"graph {self.name} (opsets {self.opset_imports}) {{"]
        lines += [f"  input  {typed(n)}" for n in self.inputs]
        for name, value in self.values.items():
            if value.is_shared:
                lines.append(f"  shared {typed(name)}")
        for node in self.topological_order():
            attrs = ", ".join(f"{k}={_short(node.attr(k))}" for k in sorted(node.attributes))
            tag = "" if node.instance is None else f"  # instance {node.instance}"
            lines.append(
                f"  {', '.join(typed(o) for o in node.outputs if o)} = {node.qualified_op}"
                f"{'<' + attrs + '>' if attrs else ''}({', '.join('%' + i if i else '' for i in node.inputs)}){tag}"
            )
        lines += [f"  output {typed(n)}" for n in self.outputs]
        lines.append("}")
        return "\n".join(lines)

    def draw(self, path: str, plan: Any = None) -> None:
        """Draw the graph (and a batch plan of it, an ``ir.draw.PlanView``) to PNG or SVG (needs
        matplotlib) or Graphviz DOT, by the file's suffix."""
        from autobatch.ir.draw import draw_graph

        draw_graph(self, path, plan)


def _short(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"tensor{list(value.shape)}"
    if isinstance(value, GraphProto):
        return f"graph({value.name})"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _common_constants(graphs: Sequence[Graph]) -> dict[str, np.ndarray]:
    """Constants (not literals) with equal contents under the same name in every graph that
    has them: one shared value in the union."""
    common: dict[str, np.ndarray] = {}
    conflicting: set[str] = set()
    for graph in graphs:
        for name, value in graph.values.items():
            if value.const is None or name in conflicting:
                continue
            if value.literal:
                conflicting.add(name)
            elif name not in common:
                common[name] = value.const
            elif not _same_array(common[name], value.const):
                conflicting.add(name)
    return {name: array for name, array in common.items() if name not in conflicting}


def _same_array(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal dtype, shape and contents, bit for bit where the bits are the value (-0.0 is not
    0.0, and a NaN equals a NaN of the same bits)."""
    if a is b:
        return True
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return np.array_equal(a, b) if a.dtype == object else a.tobytes() == b.tobytes()
