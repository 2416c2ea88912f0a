"""Rewrite a schedule into a batched IR graph.

For each group: stack each per-instance input (index arrays, never a Python loop per instance
at run time), one batched op from the op's rule, and rows of its outputs addressed lazily. A
group whose inputs are exactly an earlier group's output rows in order reads that output
directly: no gather (DyNet's contiguity trick). Original value names are kept for the
per-instance (unstacked) form of a value, so graph outputs keep their names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from autobatch.batcher.functions import rule_for
from autobatch.batcher.rules import Operand, Refusal, Shape
from autobatch.batcher.signature import is_shared, sum_of_terms
from autobatch.ir import Graph, Node, ValueType, captured_names, is_nondeterministic

# The name of the ops the rewrite adds to move rows between batches (gathers, stacking
# concats, cutting a row out): backends may run these differently from compute ops.
DATA_MOVEMENT = "autobatch:move"


def is_data_movement(node: Node) -> bool:
    return node.name.startswith(DATA_MOVEMENT)

# Stacking reshapes values by a shape *input*, which Reshape takes from opset 5 on.
MIN_STACKING_OPSET = 5
RANDOM = "draws random numbers anew each run"
EMPTY = "values without elements are not stacked"


class GraphEmitter:
    """Adds fresh-named constants and ops to the batched graph."""

    def __init__(self, out: Graph) -> None:
        self.out = out
        self.count = 0
        self.batch_size = 0  # set for each group

    def _fresh(self, kind: str) -> str:
        while True:
            self.count += 1
            name = f"autobatch/{kind}{self.count}"
            if name not in self.out.values:
                return name

    def const(self, array: np.ndarray) -> str:
        name = self._fresh("c")
        self.out.add_initializer(name, np.asarray(array))
        return name

    def op(self, op_type: str, inputs: Sequence[str], attributes: dict[str, Any] | None = None,
           n_outputs: int = 1, name: str = "") -> list[str]:
        outputs = [self._fresh("v") for _ in range(n_outputs)]
        self.out.add_node(op_type, list(inputs), outputs, attributes, name=self.node_name(name))
        return outputs

    def node_name(self, prefix: str) -> str:
        """Node names must be unique in ONNX (onnxruntime refuses repeats)."""
        if not prefix:
            return ""
        self.count += 1
        return f"{prefix}/{self.count}"


class DryEmitter:
    """Stands in for GraphEmitter while deciding, once per signature class, whether a rule
    batches that class. Records nothing."""

    batch_size = 2

    def const(self, array: np.ndarray) -> str:
        return "dry"

    def op(self, op_type: str, inputs: Sequence[str], attributes: dict[str, Any] | None = None,
           n_outputs: int = 1) -> list[str]:
        return ["dry"] * n_outputs


def operands(graph: Graph, node: Node, stacked_names: Sequence[str] | None = None) -> list[Operand | None]:
    """The representative's inputs as operands; ``stacked_names`` gives the batched value of
    each per-instance input (its own name while dry-running)."""
    result: list[Operand | None] = []
    for index, name in enumerate(node.inputs):
        if not name:
            result.append(None)
            continue
        value = graph.values[name]
        shape = tuple(value.type.shape) if value.type is not None and value.type.shape is not None else ()
        if is_shared(graph, name):
            result.append(Operand(name, False, shape, value.const))
        else:
            result.append(Operand(stacked_names[index] if stacked_names else name, True, shape))
    return result


def output_shapes(graph: Graph, node: Node) -> list[Shape]:
    return [tuple(graph.values[o].type.shape) if o else () for o in node.outputs]


def has_rule(graph: Graph, node: Node) -> bool:
    """Whether the op's rule batches this node's signature class (decided on a dry run)."""
    return refusal(graph, node) is None


def refusal(graph: Graph, node: Node) -> str | None:
    """Why this node's signature class runs one member at a time (None: its rule batches it)."""
    if is_nondeterministic(node.op_type, node.domain, graph.functions, node.inputs):
        return RANDOM
    if sum_of_terms(graph, node):
        return None
    if not all(_is_tensor(graph, name) for name in [*node.inputs, *node.outputs] if name):
        return "sequences and optionals are not stacked"  # they are Python lists and None
    ins = operands(graph, node)
    if not any(o is not None and o.stacked for o in ins):
        return None  # identical inputs: one run serves every member
    rule = rule_for(node, graph.functions)
    if rule is None:
        return f"no batching rule for {node.qualified_op}"
    if graph.opset_imports.get("", 1) < MIN_STACKING_OPSET:
        return f"opset {graph.opset_imports.get('', 1)} has no Reshape by a shape input"
    outs = output_shapes(graph, node)
    if any(0 in o.shape for o in ins if o is not None and o.stacked) or any(0 in shape for shape in outs):
        return EMPTY  # a 0 in a Reshape's shape copies a dimension
    result = rule(DryEmitter(), node, ins, outs)
    return result.reason if isinstance(result, Refusal) else None


def _is_tensor(graph: Graph, name: str) -> bool:
    vtype = graph.values[name].type
    return vtype is None or vtype.is_tensor


@dataclass
class RewriteStats:
    gathers: int = 0
    gathers_avoided: int = 0
    merged_duplicates: int = 0


class Rewriter:
    """Builds the batched graph group by group."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        out = Graph(f"{graph.name}_batched", graph.opset_imports)
        out.functions = dict(graph.functions)
        out.meta = dict(graph.meta)
        for name in graph.inputs:
            out.add_input(name, graph.values[name].type)
        for name, array in graph.initializers().items():
            out.add_initializer(name, array, graph.values[name].literal)
        self.out = out
        self.emit = GraphEmitter(out)
        # original value -> (batched value, row) while it exists only as a row of a batch
        self.rows: dict[str, tuple[str, int, int]] = {}
        self._stacks: dict[tuple[str, ...], str] = {}
        self.alias: dict[str, str] = {}  # a merged duplicate's output -> the one computed value
        self.stats = RewriteStats()

    # ------------------------------------------------------------------ values
    def plain(self, name: str) -> str:
        """The per-instance value (under its original name, or that of the duplicate it was
        merged into), cut out of its batch if needed."""
        name = self.alias.get(name, name)
        if name in self.rows:
            batched, row, _ = self.rows.pop(name)
            index = self.emit.const(np.array(row, dtype=np.int64))
            self.out.add_node("Gather", [batched, index], [name], {"axis": 0}, name=self.emit.node_name(DATA_MOVEMENT))
            self.stats.gathers += 1
        return name

    def named(self, name: str) -> None:
        """Make the value exist under exactly this name (graph outputs, subgraph captures)."""
        actual = self.plain(name)
        if actual != name and name not in self.out.values:
            self.out.add_node("Identity", [actual], [name], name=self.emit.node_name(DATA_MOVEMENT))

    def stack(self, names: Sequence[str]) -> str:
        """One value ``[N, ...]`` holding these per-instance values in order."""
        key = tuple(self.alias.get(n, n) for n in names)
        names = key
        if key in self._stacks:
            return self._stacks[key]
        constants = [self.graph.values[n].const for n in names]
        if all(c is not None for c in constants):  # literals: stacked now, not at run time
            result = self._stacks[key] = self.emit.const(np.stack(constants))
            return result
        sources = [self.rows.get(n) for n in names]
        first = sources[0]
        if first is not None and all(s is not None and s[0] == first[0] for s in sources):
            rows = [s[1] for s in sources]
            if rows == list(range(first[2])):
                self.stats.gathers_avoided += 1
                result = first[0]
            else:
                result = self._gather(first[0], rows)
        else:
            result = self._stack_mixed(names, sources)
        self._typed(result, names[0], len(names))
        self._stacks[key] = result
        return result

    def _typed(self, batched: str, member: str, n: int) -> None:
        """Give a batched value its type, ``[n, *member's shape]``: backends need input types
        for ops defined by context-dependent functions (Gelu in onnx.reference)."""
        value, vtype = self.out.values[batched], self.graph.values[member].type
        if value.type is None and value.const is None and vtype is not None and vtype.shape is not None:
            value.type = ValueType.tensor(vtype.elem_type, [n, *vtype.shape])

    def _gather(self, batched: str, rows: list[int]) -> str:
        self.stats.gathers += 1
        index = self.emit.const(np.array(rows, dtype=np.int64))
        return self.emit.op("Gather", [batched, index], {"axis": 0}, name=DATA_MOVEMENT)[0]

    def _stack_mixed(self, names: Sequence[str], sources: list[tuple[str, int, int] | None]) -> str:
        """Rows from several batches and plain values: one gather per batch, one concat, and a
        final gather only when the concatenated order is not already the wanted one."""
        pieces: list[str] = []
        order: list[int] = []  # position in ``names`` of each concatenated row
        by_batch: dict[str, list[int]] = {}
        for position, source in enumerate(sources):
            if source is not None:
                by_batch.setdefault(source[0], []).append(position)
        for batched, positions in by_batch.items():
            rows = [sources[p][1] for p in positions]
            full = rows == list(range(sources[positions[0]][2]))
            pieces.append(batched if full else self._gather(batched, rows))
            order.extend(positions)
        for position, (name, source) in enumerate(zip(names, sources)):
            if source is None:
                shape = self.graph.values[name].type.shape
                row_shape = self.emit.const(np.array([1, *shape], dtype=np.int64))
                pieces.append(self.emit.op("Reshape", [name, row_shape], name=DATA_MOVEMENT)[0])
                order.append(position)
        self.stats.gathers += 1
        joined = self.emit.op("Concat", pieces, {"axis": 0}, name=DATA_MOVEMENT)[0] if len(pieces) > 1 else pieces[0]
        if order != list(range(len(names))):
            joined = self._gather(joined, list(np.argsort(order)))
        return joined

    # ------------------------------------------------------------------ groups
    def run_alone(self, node: Node) -> None:
        for name in sorted(captured_names(node)):
            self.named(name)
        inputs = [self.plain(name) if name else "" for name in node.inputs]
        self.out.add_node(node.op_type, inputs, node.outputs, node.attributes, domain=node.domain,
                          version=node.version, instance=node.instance, name=node.name,
                          output_types=[self.graph.values[o].type if o else None for o in node.outputs])

    def _sum_terms(self, members: list[Node]) -> None:
        """Sums of terms (one per instance, any number of terms each) as one GEMM: a 0/1 matrix
        [instances x terms] times all the terms stacked [terms x size]."""
        out_type = self.graph.values[members[0].outputs[0]].type
        shape = tuple(out_type.shape)
        size = int(np.prod(shape, dtype=np.int64))
        terms = [name for member in members for name in member.inputs]
        owner = np.repeat(np.arange(len(members)), [len(m.inputs) for m in members])
        indicator = np.zeros((len(members), len(terms)), dtype=out_type.dtype)
        indicator[owner, np.arange(len(terms))] = 1
        flat = self.emit.op("Reshape", [self.stack(terms), self.emit.const(np.array([len(terms), size], dtype=np.int64))])[0]
        summed = self.emit.op("MatMul", [self.emit.const(indicator), flat])[0]
        if shape != (size,):
            summed = self.emit.op("Reshape", [summed, self.emit.const(np.array([len(members), *shape], dtype=np.int64))])[0]
        for row, member in enumerate(members):
            self.rows[member.outputs[0]] = (summed, row, len(members))

    def run_group(self, members: list[Node], batchable: bool) -> None:
        if batchable and sum_of_terms(self.graph, members[0]):
            self._sum_terms(members)
            return
        if len(members) == 1 or not batchable:
            for node in members:
                self.run_alone(node)
            return
        first = members[0]
        ins = operands(self.graph, first)
        if not any(o is not None and o.stacked for o in ins):
            self._merge_duplicates(members)
            return
        stacked = [
            self.stack([m.inputs[i] for m in members]) if o is not None and o.stacked else ""
            for i, o in enumerate(ins)
        ]
        self.emit.batch_size = len(members)
        rule = rule_for(first, self.graph.functions)
        assert rule is not None, f"{first} was scheduled as batchable without a rule"
        results = rule(self.emit, first, operands(self.graph, first, stacked), output_shapes(self.graph, first))
        assert not isinstance(results, Refusal), f"rule for {first} changed its mind after its dry run"
        n = len(members)
        for k, output in enumerate(first.outputs):
            if output:
                self._typed(results[k], output, n)
                for row, member in enumerate(members):
                    self.rows[member.outputs[k]] = (results[k], row, n)

    def _merge_duplicates(self, members: list[Node]) -> None:
        """Same op on the same shared inputs: run once, and every member reads that result."""
        first = members[0]
        self.run_alone(first)
        self.stats.merged_duplicates += len(members) - 1
        for member in members[1:]:
            for mine, theirs in zip(member.outputs, first.outputs):
                if mine:
                    self.alias[mine] = theirs

    def finish(self, as_rows: bool = False) -> tuple[Graph, dict[str, tuple[str, int | None]]]:
        """The batched graph, and where each original output lives: ``(name, None)`` for a
        value of its own, or with ``as_rows``, ``(batched name, row)`` for a row of a batch
        (the caller takes a view; no gather per output)."""
        locations: dict[str, tuple[str, int | None]] = {}
        for name in self.graph.outputs:
            row = self.rows.get(self.alias.get(name, name)) if as_rows else None
            if row is not None:
                locations[name] = (row[0], row[1])
                continue
            self.named(name)
            locations[name] = (name, None)
        for value_name in dict.fromkeys(v for v, _ in locations.values()):
            self.out.add_output(value_name)
        self.out.prune_unused_constants()
        return self.out, locations
