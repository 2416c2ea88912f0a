"""A signature class's template: its batching rule run over a small graph of template inputs
(``x{i}`` stacked ``[N, *shape]``, ``w{i}`` shared and fed, ``k{i}`` shared and baked in), or
the op itself over one member's values (a *solo* template), or a ragged template made to read
and write rows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from autobatch.batcher.functions import Functions, rule_for
from autobatch.batcher.plan import ARENA_DTYPES, Template
from autobatch.batcher.node_rules import EMPTY, GraphEmitter
from autobatch.batcher.rule_tables import Operand, Refusal
from autobatch.ir import Graph, Node, ValueType


class _SizeWatchingEmitter(GraphEmitter):
    """Notes whether a rule read the batch size (then its template holds for that N only)."""

    def __init__(self, out: Graph, size: int) -> None:
        super().__init__(out)
        self._size = size
        self.read_size = False

    @property  # type: ignore[override]
    def batch_size(self) -> int:
        self.read_size = True
        return self._size

    @batch_size.setter
    def batch_size(self, size: int) -> None:
        self._size = size



def build_template(node: Node, specs: tuple, baked: dict[int, np.ndarray], out_shapes: list[tuple],
                    functions: Functions, opsets: Mapping[str, int], size: int) -> tuple[Template | Refusal, bool]:
    """(the template, or why no rule takes the class; whether the rule read N)."""
    if not any(spec is not None and spec[0] == "x" for spec in specs):
        # Duplicates: the op once, its small constants fed rather than baked (no rule reads
        # them, and a backend that builds a session over constants alone would check them as
        # it never checks values it is fed: Range's one-element bounds).
        specs = tuple(("w", *spec[1:3]) if spec is not None and spec[0] == "k" and spec[1] in ARENA_DTYPES else spec
                      for spec in specs)
    graph = Graph(f"template_{node.op_type}", opsets)
    graph.functions = dict(functions)
    operands = _template_inputs(graph, specs, baked, batched=True)
    stacked = [i for i, o in enumerate(operands) if o is not None and o.stacked]
    if any(0 in operands[i].shape for i in stacked) or any(0 in shape for shape in out_shapes):
        return Refusal(EMPTY), False  # a 0 in a Reshape's shape copies a dimension
    emit = _SizeWatchingEmitter(graph, size)
    results: list[str] | Refusal
    if not stacked:  # duplicates: the op once, on the shared operands
        results = _op_itself(graph, node, operands)
    else:
        rule = rule_for(node, functions)
        results = emit.checked(rule(emit, node, operands, out_shapes)) if rule is not None else \
            Refusal(f"no batching rule for {node.qualified_op}")
        if isinstance(results, Refusal):
            return results, emit.read_size
    _add_outputs(graph, node, results)
    if all(not n.domain for n in graph.nodes.values()):
        graph.functions = {}  # the rule expanded every call: a backend needs no function
    return Template(graph, stacked, _fed(specs), once=not stacked), emit.read_size


def build_solo(node: Node, specs: tuple, baked: dict[int, np.ndarray], functions: Functions,
                opsets: Mapping[str, int], reason: str = "", captured: tuple[tuple[str, ValueType | None], ...] = (),
                out_types: Sequence[ValueType | None] = ()) -> Template:
    """The op itself over one member's values (inputs ``x{i}`` of the per-instance shape, and
    the ``captured`` values its subgraphs read, by their names there); ``reason``: why the
    class runs one member at a time. ``out_types``: the outputs' types, of which the template
    declares the kinds (a sequence, a bfloat16 tensor: what a backend may not take)."""
    graph = Graph(f"solo_{node.op_type}", opsets)
    if node.domain:
        graph.functions = dict(functions)
    operands = _template_inputs(graph, specs, baked, batched=False)
    for inside, vtype in captured:
        graph.add_input(inside, vtype)
    _add_outputs(graph, node, _op_itself(graph, node, operands))
    for name, vtype in zip(graph.outputs, (vtype for k, vtype in enumerate(out_types) if node.outputs[k])):
        graph.values[name].type = _kind_of(vtype)
    stacked = [i for i, o in enumerate(operands) if o is not None and o.stacked]
    return Template(graph, stacked, _fed(specs), once=True, solo=True, reason=reason,
                    captured=tuple(inside for inside, _ in captured))


def _template_inputs(graph: Graph, specs: tuple, baked: dict[int, np.ndarray], batched: bool) -> list[Operand | None]:
    """The operands as template inputs: ``x{i}`` per instance (``[N, *shape]`` when ``batched``),
    ``w{i}`` shared and fed at run time, ``k{i}`` shared and baked in."""
    operands: list[Operand | None] = []
    for i, spec in enumerate(specs):
        if spec is None:
            operands.append(None)
        elif spec[0] == "x":
            graph.add_input(f"x{i}", ValueType.tensor(spec[1], ["N", *spec[2]] if batched else spec[2]))
            operands.append(Operand(f"x{i}", True, spec[2]))
        elif spec[0] == "v":  # a loose value, of its kind
            graph.add_input(f"x{i}", _kind_of(spec[1]))
            operands.append(Operand(f"x{i}", True, spec[1].shape if spec[1] is not None else None))
        elif spec[0] == "w":
            graph.add_input(f"w{i}", ValueType.tensor(spec[1], spec[2]))
            operands.append(Operand(f"w{i}", False, spec[2]))
        else:
            # A copy of its own: the template is kept by these bytes (``spec``), and the weight
            # it came from may change in place later (another weight of these bytes reads it).
            value = np.array(baked[i], copy=True)
            value.flags.writeable = False
            graph.add_initializer(f"k{i}", value)
            operands.append(Operand(f"k{i}", False, spec[2], value))
    return operands


def _kind_of(vtype: ValueType | None) -> ValueType | None:
    """A loose value's type as a template declares it: a tensor's element type, not its shape
    (inferred from other values, it need not hold for every member of a class, and a backend
    that builds a session from it would check it)."""
    if vtype is None or not vtype.is_tensor:
        return vtype
    return ValueType.tensor(vtype.elem_type, None) if vtype.elem_type else None


def _op_itself(graph: Graph, node: Node, operands: list[Operand | None]) -> list[str]:
    results = [f"y{k}" if name else "" for k, name in enumerate(node.outputs)]
    graph.add_node(node.op_type, [o.name if o else "" for o in operands], results, node.attributes,
                   domain=node.domain, version=node.version)
    return results


def _add_outputs(graph: Graph, node: Node, results: list[str]) -> None:
    """The wanted results as graph outputs, each a value of its own (not an input, a constant
    or another output)."""
    for k, name in enumerate(results):
        if node.outputs[k]:
            if name in graph.inputs or name in graph.outputs or graph.values[name].const is not None:
                graph.add_node("Identity", [name], [f"out{k}"])
                name = f"out{k}"
            graph.add_output(name)


def _fed(specs: tuple) -> list[int]:
    return [i for i, spec in enumerate(specs) if spec is not None and spec[0] == "w"]


def as_rows(graph: Graph, axis: int, outs: list[tuple[int, tuple[int, ...]]]) -> Graph:
    """A ragged template over operands whose rows run along a later axis (``[1, R, d]``) as one
    that reads and writes ``[R, *row]``: a Reshape after each stacked input and of each output
    (``outs``: each output's axis and row)."""
    rows = Graph(graph.name, graph.opset_imports)
    rows.functions = graph.functions
    inside: dict[str, str] = {}
    for name in graph.inputs:
        vtype = graph.values[name].type
        if name.startswith("x") and vtype is not None and vtype.shape is not None:
            rows.add_input(name, ValueType.tensor(vtype.elem_type, list(vtype.shape[axis:])))
            rows.add_initializer(f"{name}/shape", np.array([*vtype.shape[:axis], -1, *vtype.shape[axis + 1:]], np.int64))
            inside[name] = rows.add_node("Reshape", [name, f"{name}/shape"], [f"{name}/full"]).outputs[0]
        else:
            rows.add_input(name, vtype)
    for name, array in graph.initializers().items():
        rows.add_initializer(name, array)
    for node in graph.topological_order():
        rows.add_node(node.op_type, [inside.get(name, name) for name in node.inputs], node.outputs, node.attributes,
                      domain=node.domain, version=node.version)
    for name, (_, row) in zip(graph.outputs, outs):
        rows.add_initializer(f"{name}/shape", np.array([-1, *row], np.int64))
        rows.add_node("Reshape", [name, f"{name}/shape"], [f"{name}/rows"])
        rows.add_output(f"{name}/rows")
    return rows
