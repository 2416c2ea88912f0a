"""A flat plan (``batcher.flat``) lowered to one ONNX graph: what ``autobatch rewrite`` writes.

The executor keeps values in arenas it writes in place; ONNX values are written once. So the
lowering walks the plan's steps as the executor does, but an arena here is a list of *entries*,
one a row: where that row lives, ``(tensor, index)`` (row ``index`` of ``tensor``, or the whole
tensor for ``WHOLE``). A step's operand is made from its rows' entries when it is read: nothing
when they are all of one tensor in order, a Slice or Gather of one tensor, else a Concat of such
pieces. Each template becomes a model-local function, called once a launch: the plan is an IR
graph of these calls (``lowered_graph``), exported through the IR's ONNX export and inlined
there (``onnx.inliner``, ``lower_plan``), so a template's subgraphs keep reading their own names.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import onnx
import onnx.inliner
from onnx import helper, numpy_helper

from autobatch.ir.graph_tidy import constant_nodes_to_initializers, drop_unread
from autobatch.backends.lowered_steps import Entry, StepKinds, pick
from autobatch.batcher.plan import LITERALS, LOOSE, Block, Copied, FlatPlan, Padded, Pieces, Runs, Shaped, Step, Template
from autobatch.ir import Graph, ValueType
from autobatch.ir.gc_pause import without_gc
from autobatch.ir.onnx_io import choose_ir_version, to_onnx

WHOLE = -1  # an entry's index when the tensor is the row itself (a ``once`` result, a literal)
DOMAIN = "autobatch.plan"  # of the template functions, gone once inlined
# A row-wise step whose operands need a copy to be stacked runs a launch a member when its rows
# are bigger than this: onnxruntime's launch of a node costs microseconds, copying a row of 64 KiB
# about as much (light_squeezenet's parallel Relus ran 1.4x slower stacked).
STACK_BYTES = 64 * 1024


class _Op(NamedTuple):
    """A node of the lowered graph while it is made (Slices become Splits, outputs take their
    names) before it goes into the IR graph."""

    op_type: str
    inputs: list[str]
    outputs: list[str]
    attributes: dict[str, Any]
    domain: str = ""


class _Lowering(StepKinds):
    def __init__(self, plan: FlatPlan, inputs: Sequence[onnx.ValueInfoProto], literals: Mapping[str, str],
                 weights: Mapping[str, np.ndarray], opset: int) -> None:
        if opset < 5:
            raise ValueError(f"a plan lowers to ONNX at opset 5 or later, not {opset} (Reshape takes its shape as an input)")
        self.plan = plan
        self.literals = literals  # the plan's name of each literal -> the graph input that gives it
        self.weights = weights
        self.opset = opset
        self.nodes: list[_Op] = []
        self.made_before: dict[tuple, list[str]] = {}
        self.slices: dict[str, dict[str, tuple[int, int]]] = {}  # tensor -> Slice output -> its rows
        self.constants: dict[tuple, str] = {}
        self.initializers: dict[str, np.ndarray] = {}
        self.functions: dict[tuple[str, str], onnx.FunctionProto] = {}
        self.called: dict[int, str] = {}  # id of a template -> its function's name
        self.lengths: dict[str, int] = {}  # rows of each tensor made here with a batch axis
        self.arenas: list[list[Entry | None]] = [[None] * rows for rows in plan.rows]
        self.loose: dict[str, str] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}  # of values made whole rows (``WHOLE``), where known
        self.literal_bytes: dict[str, int] = {}  # the plan's name of each literal -> its size
        by_input = {input_name: name for name, input_name in literals.items()}
        for info in inputs:
            tensor = info.type.tensor_type
            if all(d.HasField("dim_value") for d in tensor.shape.dim):
                self.shapes[info.name] = tuple(d.dim_value for d in tensor.shape.dim)
                if info.name in by_input:
                    self.literal_bytes[by_input[info.name]] = int(np.prod(self.shapes[info.name])) * \
                        helper.tensor_dtype_to_np_dtype(tensor.elem_type).itemsize
        for arena, first, names in plan.literal_runs:
            self.arenas[arena][first:first + len(names)] = [(literals[name], WHOLE) for name in names]

    # ------------------------------------------------------------------ nodes
    def node(self, op_type: str, inputs: Sequence[str], outputs: int = 1, **attributes: Any) -> list[str]:
        """The outputs of a new node; or of the node made before with the same op, inputs and
        attributes (steps often read the same rows: Q, K and V of one input)."""
        key = (op_type, tuple(inputs), outputs, tuple(sorted((k, repr(v)) for k, v in attributes.items())))
        names = self.made_before.get(key)
        if names is None:
            names = self.made_before[key] = [f"plan/{len(self.made_before)}/{k}" for k in range(outputs)]
            domain = attributes.pop("domain", "")
            self.nodes.append(_Op(op_type, list(inputs), names, attributes, domain))
        return names

    def constant(self, array: np.ndarray) -> str:
        array = np.asarray(array)
        key = (array.dtype.str, array.shape, array.tobytes())
        name = self.constants.get(key)
        if name is None:
            name = self.constants[key] = f"plan/c{len(self.initializers)}"
            self.initializers[name] = array
        return name

    def weight(self, name: str) -> str:
        self.initializers.setdefault(name, self.weights[name])
        return name

    def axes(self, op_type: str, tensor: str, axis: int, **attributes: Any) -> str:
        """Unsqueeze or ReduceSum over one axis (an attribute before opset 13, an input from it)."""
        if self.opset < 13:
            return self.node(op_type, [tensor], axes=[axis], **attributes)[0]
        return self.node(op_type, [tensor, self.constant(np.array([axis], np.int64))], **attributes)[0]

    def unsqueezed(self, tensor: str) -> str:
        return self.axes("Unsqueeze", tensor, 0)

    def reshaped(self, tensor: str, shape: Sequence[int]) -> str:
        # A 0 in Reshape's shape copies the input's size there unless ``allowzero`` (opset 14):
        # here a 0 is a size of 0 (rows of no elements), which an explicit shape may say.
        zeros = {"allowzero": 1} if 0 in shape and -1 not in shape and self.opset >= 14 else {}
        return self.node("Reshape", [tensor, self.constant(np.array(shape, np.int64))], **zeros)[0]

    def rows_of(self, tensor: str, indices: list[int]) -> str:
        """Rows ``indices`` of ``tensor``."""
        if tensor in self.lengths and indices == list(range(self.lengths[tensor])):
            return tensor
        first, count = indices[0], len(indices)
        if self.opset >= 10 and indices == list(range(first, first + count)):
            bounds = [self.constant(np.array([v], np.int64)) for v in (first, first + count)]
            sliced = self.node("Slice", [tensor, *bounds])[0]
            self.slices.setdefault(tensor, {})[sliced] = (first, first + count)
            return sliced
        return self.node("Gather", [tensor, self.constant(np.array(indices, np.int64))], axis=0)[0]

    def batched(self, tensor: str, rows: int) -> str:
        self.lengths[tensor] = rows
        return tensor

    # ------------------------------------------------------------------ entries
    def made(self, entries: Sequence[Entry]) -> str:
        """One tensor of these rows, one after the other."""
        pieces: list[str] = []
        k = 0
        while k < len(entries):
            if entries[k] is None:
                raise ValueError("the plan reads a row no step wrote")
            tensor, index = entries[k]
            if index == WHOLE:
                end = k + 1
                shape = self.shapes.get(tensor)
                # (not values of no elements: Reshape reads a 0 in its shape as "keep that axis")
                while (end < len(entries) and entries[end][1] == WHOLE and shape and 0 not in shape
                       and self.shapes.get(entries[end][0]) == shape):
                    end += 1
                if end == k + 1:
                    pieces.append(self.unsqueezed(tensor))
                else:  # values of one shape side by side: one Concat and a Reshape, not an Unsqueeze each
                    joined = self.node("Concat", [tensor for tensor, _ in entries[k:end]], axis=0)[0]
                    pieces.append(self.reshaped(joined, [end - k, *shape]))
                k = end
                continue
            end = k + 1
            while end < len(entries) and entries[end][0] == tensor and entries[end][1] != WHOLE:
                end += 1
            pieces.append(self.rows_of(tensor, [index for _, index in entries[k:end]]))
            k = end
        result = pieces[0] if len(pieces) == 1 else self.node("Concat", pieces, axis=0)[0]
        return self.batched(result, len(entries))

    def row(self, entry: Entry) -> str:
        """One row as a value of its own (no batch axis)."""
        tensor, index = entry
        if index == WHOLE:
            return tensor
        if self.lengths.get(tensor) == 1:  # a reshape, which onnxruntime does without a copy
            return self.axes("Squeeze", tensor, 0)
        return self.node("Gather", [tensor, self.constant(np.array(index, np.int64))], axis=0)[0]

    def loose_value(self, name: str) -> str:
        if name in self.loose:
            return self.loose[name]
        return self.literals[name] if name in self.literals else self.weight(name)

    def read(self, arena: int, rows: Any) -> str:
        """A step's operand, as ``flat_executor._read`` gives it."""
        if type(rows) is Copied:  # a session's outputs are its own arrays
            return self.read(arena, rows.rows)
        if type(rows) is Runs:
            block = self.read(arena, rows.rows)
            values = self.lengths[block] // rows.length
            return self.batched(self.reshaped(block, [values, *rows.shape]), values)
        if type(rows) is Shaped:
            return self.reshaped(self.read(arena, rows.rows), list(rows.shape))
        if type(rows) is Padded:  # in one session a launch a length costs less than padding
            raise ValueError("a padded plan is not lowered: plan it without padding (plan_records(..., padded=False))")
        if type(rows) is Pieces:
            parts = [self.unsqueezed(self.read(a, r)) for a, r in rows]
            return self.batched(parts[0] if len(parts) == 1 else self.node("Concat", parts, axis=0)[0], len(parts))
        if arena == LOOSE:
            return self.loose_value(rows)
        if arena == LITERALS:
            return self.made([(self.literals[name], WHOLE) for name in rows])
        if isinstance(rows, (int, np.integer)):
            return self.row(self.arenas[arena][int(rows)])
        entries = pick(self.arenas[arena], rows)
        if not entries:  # a value of no rows kept in a block
            elem_type, shape = self.plan.kinds[arena]
            return self.batched(self.constant(np.zeros((0, *shape), helper.tensor_dtype_to_np_dtype(elem_type))), 0)
        return self.made(entries)

    def concatenated(self, parts: list[tuple[int, Shaped]], groups: list[tuple[int, int]]) -> str:
        """Every member's rows, group by group (``flat_executor._concatenated``)."""
        pieces = []
        for (arena, rows), (length, count) in zip(parts, groups):
            if type(rows.rows) is Runs and tuple(self.plan.kinds[arena][1]) == rows.shape[1:]:  # a block's rows as it keeps them
                piece = self.made(pick(self.arenas[arena], rows.rows.rows))
            else:
                piece = self.reshaped(self.read(arena, rows.rows), list(rows.shape))
            pieces.append(self.batched(piece, length * count))
        joined = pieces[0] if len(pieces) == 1 else self.node("Concat", pieces, axis=0)[0]
        return self.batched(joined, sum(length * count for length, count in groups))

    # ------------------------------------------------------------------ templates
    def call(self, template: Template, feeds: Mapping[str, str]) -> list[str]:
        name = self.called.get(id(template))
        if name is None:
            name = self.called[id(template)] = f"t{len(self.called)}"
            self.functions[(DOMAIN, name)] = _function(template, name)
            for function in template.graph.functions.values():
                self.functions.setdefault((function.domain, function.name), function)
        graph = template.graph
        return self.node(name, [feeds[input_name] for input_name in graph.inputs], len(graph.outputs), domain=DOMAIN)

    def template_feeds(self, template: Template, step: Step, stacked: list[str]) -> dict[str, str]:
        feeds = {f"w{i}": self.weight(name) for i, name in zip(template.fed, step.weights)}
        feeds.update((f"x{i}", value) for i, value in zip(template.stacked, stacked))
        feeds.update(zip(template.captured, stacked[len(template.stacked):]))
        return feeds

    # ------------------------------------------------------------------ steps
    def step(self, step: Step) -> None:
        template = step.template
        order = self.member_order(step)
        if order is not None and not self.worth_stacking(order):
            self.each_member(step, order)
            return
        if order is not None:
            stacked = [self.made([entries[m] for m in order]) for entries in order.operands]
        elif step.groups:
            stacked = [self.concatenated(parts, step.groups) if isinstance(parts, list) else self.read(*parts)
                       for parts in step.reads]
        else:
            stacked = [self.read(a, rows) for a, rows in step.reads]
        outputs: list[Any]
        if step.fold is not None:
            outputs = self.fold(step, stacked[0])
        elif template is None:
            outputs = [self.reduced(stacked[0], step)]
        elif template.row_shape is not None:
            rows = self.lengths[stacked[0]]
            outputs = [self.batched(self.reshaped(stacked[0], [rows, *template.row_shape]), rows)]
        elif template.sequences:
            outputs = self.sequences(step, stacked[0], stacked[1:])
        else:
            outputs = self.call(template, self.template_feeds(template, step, stacked))
            if template.segment is not None:
                outputs = [self.reduced(self.batched(outputs[0], self.lengths[stacked[0]]), step)]
        for write, value in zip(step.writes, outputs):
            if type(write) is Block:
                self.arenas[write.arena] = self.entries(value, self.plan.rows[write.arena])
            elif write[0] == LOOSE:
                self.loose[write[1]] = value
            elif template is not None and template.once:
                self.arenas[write[0]][write[1]] = (value, WHOLE)
                self.shapes[value] = self.kind(write)[0]
            else:
                entries = self.entries(value, step.size)
                for p, member in enumerate(order if order is not None else range(step.size)):
                    self.arenas[write[0]][write[1] + member] = entries[p]

    def slices_to_splits(self) -> None:
        """Disjoint Slices of one tensor's rows as one Split, where the first of them was: a
        ragged step's result read a member at a time costs one launch, not one a member."""
        position = {node.outputs[0]: k for k, node in enumerate(self.nodes)}
        replaced: dict[int, _Op | None] = {}
        for tensor, slices in self.slices.items():
            ranges = sorted((bounds, name) for name, bounds in slices.items())
            total = self.lengths.get(tensor)
            if len(ranges) < 2 or total is None or any(a[0][1] > b[0][0] for a, b in zip(ranges, ranges[1:])):
                continue
            sizes, outputs, row = [], [], 0
            for (start, end), name in ranges:
                if start > row:
                    sizes.append(start - row)
                    outputs.append(f"{name}/before")
                sizes.append(end - start)
                outputs.append(name)
                row = end
            if row < total:
                sizes.append(total - row)
                outputs.append(f"{tensor}/rest")
            split = _Op("Split", [tensor], outputs, {"axis": 0, "split": sizes}) if self.opset < 13 else \
                _Op("Split", [tensor, self.constant(np.array(sizes, np.int64))], outputs, {"axis": 0})
            places = sorted(position[name] for _, name in ranges)
            replaced[places[0]] = split
            replaced.update((k, None) for k in places[1:])
        nodes = [replaced.get(k, node) for k, node in enumerate(self.nodes)]
        self.nodes = [node for node in nodes if node is not None]

    def worth_stacking(self, order: _Order) -> bool:
        """Whether to stack a row-wise step's operands: free where each is one tensor already,
        else a copy, which pays for the launches it saves only on small rows (``STACK_BYTES``)."""
        copied = 0
        for entries, size in zip(order.operands, order.row_bytes):
            tensor = entries[0][0]
            if all(entry == (tensor, k) for k, entry in enumerate(entries)) and self.lengths.get(tensor) == len(entries):
                continue
            copied += size
        return copied <= STACK_BYTES

    def each_member(self, step: Step, order: _Order) -> None:
        """A row-wise step as one launch of its template a member (``worth_stacking`` said no)."""
        template = step.template
        assert template is not None
        for member in range(step.size):
            stacked = [self.member_row(entries[member]) for entries in order.operands]
            outputs = self.call(template, self.template_feeds(template, step, stacked))
            for write, value in zip(step.writes, outputs):
                self.lengths[value] = 1
                self.arenas[write[0]][write[1] + member] = (value, 0)

    def member_row(self, entry: Entry) -> str:
        """One row as a batch of one."""
        tensor, index = entry
        if index == WHOLE:
            return self.unsqueezed(tensor)
        return self.rows_of(tensor, [index])

    def member_order(self, step: Step) -> _Order | None:
        """For a step whose template maps each member's rows to its own rows (stacked; not
        ragged, once, a reduction or chunked): its members in the order their first operand's
        rows are kept, so that operands are read whole or in few slices, not row by row."""
        template = step.template
        if (template is None or step.groups or step.fold is not None or template.once or template.solo or step.size < 2
                or template.row_shape is not None or template.sequences or template.segment is not None):
            return None
        operands, row_bytes = [], []
        for arena, rows in step.reads:
            if arena == LITERALS and type(rows) is list:
                operands.append([(self.literals[name], WHOLE) for name in rows])
                row_bytes.append(self.literal_bytes[rows[0]])
            elif arena >= 0 and isinstance(rows, (slice, np.ndarray)):
                operands.append(pick(self.arenas[arena], rows))
                elem_type, shape = self.plan.kinds[arena]
                row_bytes.append(int(np.prod(shape)) * helper.tensor_dtype_to_np_dtype(elem_type).itemsize)
            else:
                return None
        first = operands[0]
        rank: dict[str, int] = {}
        for tensor, _ in first:
            rank.setdefault(tensor, len(rank))
        order = _Order(sorted(range(step.size), key=lambda m: (rank[first[m][0]], first[m][1])))
        order.operands, order.row_bytes = operands, row_bytes
        return order

    def entries(self, value: str | list[Entry], rows: int) -> list[Entry]:
        if isinstance(value, list):
            return value
        self.lengths[value] = rows
        return [(value, i) for i in range(rows)]

    def kind(self, write: Any) -> tuple[list[int], np.dtype]:
        """The shape and dtype of one member's value that a write puts in an arena."""
        elem_type, shape = self.plan.kinds[write.arena if type(write) is Block else write[0]]
        return list(shape), helper.tensor_dtype_to_np_dtype(elem_type)


def lowered_graph(plan: FlatPlan, inputs: Sequence[onnx.ValueInfoProto], literals: Mapping[str, str],
                  outputs: Sequence[tuple[onnx.ValueInfoProto, tuple[int, Any]]], weights: Mapping[str, np.ndarray],
                  opset_imports: Mapping[str, int], name: str = "batched") -> Graph:
    """The IR graph computing what ``plan`` computes: its ``inputs`` give the literals
    (``literals``: the plan's name of each -> the input's), the ``weights`` it reads are its
    initializers, each output is the value at its plan location, and each launch of a
    template is a call of the template's model-local function (domain ``DOMAIN``)."""
    lowering = _Lowering(plan, inputs, literals, weights, opset_imports.get("", 1))
    for step in plan.steps:
        lowering.step(step)
    values = [lowering.loose_value(row) if arena == LOOSE else lowering.read(arena, row) for _, (arena, row) in outputs]
    lowering.slices_to_splits()
    named: dict[str, str] = {}
    for (info, _), value in zip(outputs, values):
        if value.startswith("plan/") and value not in named and value not in lowering.initializers:
            # made by a node here: it takes the output's name (a constant, such as an empty
            # sequence's empty output, keeps its own, and an Identity gives the output)
            named[value] = info.name
        else:
            lowering.nodes.append(_Op("Identity", [named.get(value, value)], [info.name], {}))
    graph = Graph(name, {**opset_imports, DOMAIN: 1})
    for info in inputs:
        graph.add_input(info.name, ValueType(info.type))
    for key, array in lowering.initializers.items():
        graph.add_initializer(key, array)
    for node in lowering.nodes:
        graph.add_node(node.op_type, [named.get(n, n) for n in node.inputs], [named.get(n, n) for n in node.outputs],
                       node.attributes, domain=node.domain)
    for info, _ in outputs:
        graph.values[info.name].type = ValueType(info.type)
        graph.add_output(info.name)
    graph.functions.update(lowering.functions)
    return graph


@without_gc  # bulk graph work: the collector's passes over a session's heap cost more than the lowering
def lower_plan(plan: FlatPlan, inputs: Sequence[onnx.ValueInfoProto], literals: Mapping[str, str],
               outputs: Sequence[tuple[onnx.ValueInfoProto, tuple[int, Any]]], weights: Mapping[str, np.ndarray],
               opset_imports: Mapping[str, int], name: str = "batched") -> onnx.ModelProto:
    """One ONNX model computing what ``plan`` computes (``lowered_graph``, exported through the
    IR's export), every step inlined: the model holds only ONNX ops (and the source model's own
    functions, inlined too)."""
    model = to_onnx(lowered_graph(plan, inputs, literals, outputs, weights, opset_imports, name), check=False)
    model = onnx.inliner.inline_local_functions(model)
    drop_unread(model.graph)
    constant_nodes_to_initializers(model.graph)
    opsets = [opset for opset in model.opset_import if opset.domain != DOMAIN]
    del model.opset_import[:]
    model.opset_import.extend(opsets)
    model.ir_version = choose_ir_version(model, None)
    return model


class _Order(list):
    """A step's members in the order it runs them, with each operand's entries in the step's order."""

    operands: list[list[Entry]]
    row_bytes: list[int]  # of a member's row of each operand


def _function(template: Template, name: str) -> onnx.FunctionProto:
    graph = template.graph
    nodes = [helper.make_node("Constant", [], [const], value=numpy_helper.from_array(array))
             for const, array in graph.initializers().items()]
    for node in graph.topological_order():
        proto = helper.make_node(node.op_type, node.inputs, node.outputs, domain=node.domain or None)
        proto.attribute.extend(node.attributes.values())
        nodes.append(proto)
    opsets = [helper.make_opsetid(domain, version) for domain, version in sorted(graph.opset_imports.items())]
    return helper.make_function(DOMAIN, name, list(graph.inputs), list(graph.outputs), nodes, opsets)
