"""The plan's memory: where each value lives (an arena row, a block's rows, a loose value),
and the steps that read and write there, made from a schedule's groups of one class
(``batcher.flat``'s planner; ``batcher.classing`` gives the classes and their templates)."""

from __future__ import annotations

import itertools
import operator
import weakref
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from autobatch.batcher.folds import Fold, Level, state_types, tree_levels
from autobatch.batcher.padding import Padding, padded_chunks
from autobatch.batcher.plan import (ARENA_DTYPES, ARENA_TYPES, LITERALS, LOOSE, Block, Copied, NotFlat, Padded, Pieces,
                                    RowReduction, Rows, Runs, Shaped, Step, Template, TemplateCache, Unpadded)
from autobatch.batcher.rule_tables import Refusal
from autobatch.ir import Graph, ValueType, attribute_value
from autobatch.ir.records import LEAF, Record
from autobatch.ir.types import type_of_value

# Where the planner keeps a value: ``arena << ROW_BITS | row``, one int (cheap to store, and a
# run of rows is a range of ints).
ROW_BITS = 40
ROW_MASK = (1 << ROW_BITS) - 1
PER_SIZE = "per size"  # the rule read N: templates are kept per (key, N)
_INPUTS, _OUTPUTS = operator.attrgetter("inputs"), operator.attrgetter("outputs")  # of a record: a map over members, no loop of Python


class Layout:
    """The steps of a plan and where their values live (a part of ``flat._Planner``)."""

    # ------------------------------------------------------------------ steps
    def steps(self, members: list[Record], cls: int) -> list[Step]:
        """The launches of a class's members scheduled together: one, or one a member where the
        rule refuses their number."""
        template = self.templates[cls]
        op_type = members[0].op_type if not members[0].domain else None
        if op_type == "Gather" and self._picked_rows(members):
            return []
        if op_type == "Concat":
            stacked = self._stacked_rows(members)
            if stacked is not None:
                return [stacked]
            if not isinstance(template, Padding) and stacked_row(members[0]) is not None:
                # a class of stacks of any number of rows, whose template is its first member's:
                # each number of rows with its own
                by_count: dict[int, list[Record]] = {}
                for member in members:  # one pass, not one over every member a number of rows
                    by_count.setdefault(len(member.inputs), []).append(member)
                groups = [by_count[count] for count in sorted(by_count)]
                return [step for group in groups for step in self._steps_of(group, self._own_template(group[0]))]
        return self._steps_of(members, template)

    def _steps_of(self, members: list[Record], template: Template | Fold | Padding | RowReduction | str | None
                  ) -> list[Step]:
        """``steps`` by the members' template (None: a sum of terms)."""
        if isinstance(template, Fold):
            return [self._fold_step(members)]
        if isinstance(template, Padding):
            return [step for chunk in padded_chunks(members) for step in self._padded_steps(chunk, template)]
        if isinstance(template, RowReduction) or isinstance(template, Template) and template.ragged:
            own = self._vector_template(members, template)
            return [self._ragged_step(members, template) if own is None else self._step(members, own)]
        if isinstance(template, str):  # PER_SIZE
            template = self._template(members[0], len(members))
            if isinstance(template, Refusal):
                solo = self._template(members[0], None, solo=template.reason)
                self._alone(members[0], template.reason, len(members))
                return [self._step([member], solo) for member in members]  # type: ignore[arg-type]
        return [self._step(members, template)]

    def _alone(self, record: Record, reason: str, members: int) -> None:
        """Members of a group run one at a time where a rule refused their number, counted by
        op and reason (``report.alone``)."""
        self.alone_steps[f"{record.op_type}: {reason}"] += members

    def _vector_template(self, members: list[Record], template: Template | RowReduction) -> Template | None:
        """The template of the members' own signature where a row-wise class's group holds
        vectors of one length (a primitive LSTM's gates ``[4h]`` and state ``[h]``, merged as
        rows of scalars, each group one of them): stacked ``[N, d]`` as any value, rather than
        ``N * d`` rows of a block that every later step would read scalar by scalar. None:
        the ragged step."""
        first = members[0]
        if not isinstance(template, Template) or template.sequences or template.segment is not None \
                or template.row_shape is not None or template.length_axis or any(template.out_axes) \
                or any(isinstance(e, ValueType) and len(e.shape) != 1 for e in (*first.entries, *first.types)) \
                or any(member.entries != first.entries for member in members):
            return None
        own = self._own_template(first)
        if isinstance(own, str):  # PER_SIZE
            own = self._template(first, len(members))
        return own if isinstance(own, Template) and not own.solo else None

    def _picked_rows(self, members: list[Record]) -> bool:
        """Gathers of one row, by a known index (a constant, or a traced batch's data), of values
        kept as rows of a block (the parser's ``ops.index(states, i)``): each member's output is
        that row where it lies, no step. A step would copy every member's whole value to pick
        one row of it."""
        first = members[0]
        axis = first.attributes.get("axis")
        if axis is not None and attribute_value(axis) != 0 or not first.outputs[0]:
            return False
        picks = []
        for member in members:
            data, index = member.inputs
            length = self.runs.get(data)
            # A literal's value only where the plan runs on it alone: a kept plan serves other values.
            position = self.literals.get(index) if self.literals_fixed else None
            self.read_literals |= position is not None  # (picked or not, the plan now holds for this value)
            if position is None:
                position = self.weights.get(index)  # a model's constant index (an initializer)
            if length is None or data in self.shaped or position is None or position.ndim \
                    or position.dtype.kind not in "iu":
                return False
            row = int(position)  # (a Python int compares ~10x faster than a 0-d array: a row a member)
            if not -length <= row < length:
                return False
            picks.append((member.outputs[0], self.location[data] + row % length))
        self.location.update(picks)
        self.picked.update(name for name, _ in picks)  # rows of a block, not of their type's arena
        return True

    def _stacked_rows(self, members: list[Record]) -> Step | None:
        """A Concat along axis 0 of rows ``[1, *row]`` (``ops.stack``'s): every member's rows read
        at once, in order, and kept as a block, whatever their number; no launch (a Concat
        launch a number of rows, each reading its rows position by position, copied the same
        rows). None where it is not so."""
        first = members[0]
        row = stacked_row(first)
        if row is None:
            return None
        names = [name for member in members for name in member.inputs]
        # (Every member's rows alike: a class padded across shapes holds members of others.)
        if not self.loose.isdisjoint(names) or any(m.entries.count(row) != len(m.entries) for m in members):
            return None
        template = reshape_template(self.cache, row.elem_type, 0, tuple(row.shape), (0, tuple(row.shape[1:])),
                                    self.opsets)
        arena, rows = self._rows(names)
        if type(row_indices(rows)) is slice:  # read as a view: copied, so that the block is no alias of its inputs
            rows = Copied(rows)
        block = self._block(first, 0, [member.outputs[0] for member in members], [len(m.inputs) for m in members])
        return Step(template, len(members), [(arena, rows)], [], [block])

    def _step(self, members: list[Record], template: Template | None) -> Step:
        first = members[0]
        outputs = list(zip(*map(_OUTPUTS, members)))  # per output, its name in each member
        if template is None:  # a sum of terms
            terms = [name for member in members for name in member.inputs]
            offsets = np.cumsum([0] + [len(m.inputs) for m in members[:-1]], dtype=np.intp)
            return Step(None, len(members), [self._rows(terms)], [], [self._write(first, 0, outputs[0], False)],
                        offsets)
        if template.solo:  # one member: its own value (all of its rows where it is kept in a block)
            reads = [self.where(first.inputs[i]) for i in template.stacked]
            reads += [self.where(outside) for _, outside, _ in first.captured]
            writes = [self._write(first, k, names, True) if stackable(first.types[k]) else self._loose(names[0])
                      for k, names in enumerate(outputs) if names[0]]
            return Step(template, 1, reads, [first.inputs[i] for i in template.fed], writes)
        inputs = list(zip(*map(_INPUTS, members)))  # per input, its name in each member
        reads = [self._rows(inputs[i]) for i in template.stacked]
        writes = [self._write(first, k, names, template.once) for k, names in enumerate(outputs) if names[0]]
        return Step(template, len(members), reads, [first.inputs[i] for i in template.fed], writes)

    def _padded_steps(self, chunk: list[Record], padded: Padding) -> list[Step]:
        """A chunk's launch: its last (longest) member's template over every member's operands
        padded to that member's shapes (``batcher.padding``); a plain step where their shapes
        agree, one a member where the rule refuses their number."""
        top = chunk[-1]
        template = self._template(top, None)
        if template == PER_SIZE:
            template = self._template(top, len(chunk))
        if isinstance(template, Refusal):
            self._alone(top, template.reason, len(chunk))
            return [self._step([member], self._template(member, None, solo=template.reason)) for member in chunk]  # type: ignore[arg-type]
        assert isinstance(template, Template)
        if all(member.key == top.key for member in chunk):
            return [self._step(chunk, template)]
        fills = dict(padded.fills)
        reads = [(LITERALS, Padded(Pieces(self.where(member.inputs[i]) for member in chunk), tuple(top.entries[i].shape),
                                   fills.get(i), tuple(tuple(member.entries[i].shape) for member in chunk)))
                 for i in template.stacked]
        writes = [Unpadded([self._write(member, k, [member.outputs[k]], False) for member in chunk],
                           tuple(tuple(member.types[k].shape) for member in chunk))
                  for k, name in enumerate(top.outputs) if name]
        return [Step(template, len(chunk), reads, [top.inputs[i] for i in template.fed], writes)]

    def _loose(self, name: str) -> tuple[int, str]:
        self.loose.add(name)
        return LOOSE, name

    def _ragged_step(self, members: list[Record], template: Template | RowReduction) -> Step:
        """Members ordered by length (stable: the order of an earlier ragged step over the same
        instances, whose blocks are then read as views)."""
        data = next(i for i, entry in enumerate(members[0].entries) if isinstance(entry, ValueType))
        axis, out_axes = (template.length_axis, template.out_axes) if isinstance(template, Template) else (0, ())
        members, lengths, groups, bounds = _by_length(members, data, axis)
        inputs = list(zip(*map(_INPUTS, members)))
        sequences = isinstance(template, Template) and template.sequences
        stacked = [data] if isinstance(template, RowReduction) else template.stacked
        # A recurrent layer's own initial states: one row a member, in the step's order.
        reads = [self._rows(inputs[i]) if sequences and i != data else
                 self._ragged_read(inputs[i], bounds, members[0].entries[i], axis) for i in stacked]
        outputs = list(zip(*map(_OUTPUTS, members)))
        # A reduction of each member's rows (a ReduceSum or ReduceMean itself, or a loss a row
        # reduced): one output, of one shape, K rows of one arena.
        segment = template if isinstance(template, RowReduction) else template.segment
        if segment is not None:
            offsets = np.cumsum([0] + lengths[:-1], dtype=np.intp)
            run = template if isinstance(template, Template) else None
            fed = [members[0].inputs[i] for i in run.fed] if run is not None else []
            return Step(run, len(members), reads, fed, [self._write(members[0], 0, outputs[0], False)], offsets,
                        groups, segment)
        # Every output a block, but a recurrent layer's final states: one row a member.
        writes = [self._block(members[0], k, names, lengths, out_axes[k] if out_axes else 0) if k == 0 or not sequences
                  else self._write(members[0], k, names, False) for k, names in enumerate(outputs) if names[0]]
        return Step(template, len(members), reads, [members[0].inputs[i] for i in template.fed], writes,
                    groups=groups)

    def _fold_step(self, members: list[Record]) -> Step:
        """Every member's tree at once (``batcher.folds``): ordered by their numbers of leaves,
        their leaf inputs read as one run of rows, their states written as blocks."""
        members, _, groups, bounds = _by_length(members, 0, 0)
        leaves = self._ragged_read([member.inputs[0] for member in members], bounds, members[0].entries[0], 0)
        matrices = [self.literals.get(member.inputs[1]) for member in members]
        if any(matrix is None for matrix in matrices):
            raise NotFlat("a tree fold's children must be known when traced")
        leaf_rows, levels = tree_levels(matrices)  # type: ignore[arg-type]
        leaf_cell, node_cell = self._fold_cells(members[0])
        states = len(members[0].outputs)
        inputs = [self.literals.get(member.inputs[0]) for member in members]
        if all(value is not None and value.ndim == 1 and value.dtype.kind in "iu" for value in inputs):
            # Leaves read known ids (words): the leaf cell runs once an id, its states repeated.
            _, first, repeat = np.unique(np.concatenate(inputs), return_index=True, return_inverse=True)  # type: ignore[arg-type]
            leaf = self._fold_level(leaf_cell, len(first), [(LEAF, first)], leaf_rows)
            leaf.repeat = repeat
        else:
            leaf = self._fold_level(leaf_cell, len(leaf_rows), [(LEAF, slice(None))], leaf_rows)
        launches = [leaf]
        for nodes, left, right in levels:
            operands = [(k, left) for k in range(states)] + [(k, right) for k in range(states)]
            launches.append(self._fold_level(node_cell, len(nodes), operands, nodes))
        sizes = [len(matrix) for matrix in matrices]  # type: ignore[arg-type]
        outputs = list(zip(*map(_OUTPUTS, members)))
        writes = [self._block(members[0], k, names, sizes) for k, names in enumerate(outputs)]
        return Step(None, len(members), [leaves], [], writes, groups=groups, fold=launches)

    def _fold_cells(self, first: Record) -> tuple[Record, Record]:
        """A fold's leaf and node cell calls as records, for their templates."""
        leaf, node, leaf_parameters, domain = (attribute_value(first.attributes[name])
                                               for name in ("leaf", "node", "leaf_parameters", "cells"))
        shared = list(first.inputs[2:])
        states = state_types(first)
        row = ValueType.tensor(first.entries[0].dtype, first.entries[0].shape[1:])
        names = [f"s{k}" for k in range(len(states))]
        calls = []
        for function, operands, parameters in ((leaf, [row], shared[:leaf_parameters]),
                                               (node, states + states, shared[leaf_parameters:])):
            inputs = [f"x{i}" for i in range(len(operands))] + parameters
            calls.append(Record(as_text(function), as_text(domain), inputs, names, {}, states, (*operands, *parameters),
                                     None, []))
        return calls[0], calls[1]

    def _fold_level(self, call: Record, size: int, operands: list, nodes: np.ndarray) -> Level:
        """One launch of a fold: ``call``'s cell batched for ``size`` members."""
        template = self._template(call, None)
        if template == PER_SIZE:
            template = self._template(call, size)
        if not isinstance(template, Template):
            raise NotFlat(f"no batching rule takes cell {call.op_type} (a tree fold batches its cells)")
        return Level(template, [call.inputs[i] for i in template.fed], [operands[i] for i in template.stacked], nodes)

    def _ragged_read(self, names: Sequence[str], bounds: list[int], vtype: ValueType, axis: int
                     ) -> tuple[int, Rows] | list[tuple[int, Rows]]:
        """Every member's rows (along ``axis`` of values of the type ``vtype`` has but for its
        length), one after the other: those of one block that keeps them as such rows, else group
        by group."""
        row = (-1, *vtype.shape[axis + 1:])
        block = self._one_block(names)
        if block is not None and self.arena_kinds[block[0]][1] == row[1:]:
            arena, starts = block
            return arena, _rows_of_runs(starts, np.array([self.runs[name] for name in names], dtype=np.int64))
        return [(arena, Shaped(rows, row)) for arena, rows in (self._rows(names[lo:hi]) for lo, hi in zip(bounds, bounds[1:]))]

    def _one_block(self, names: Sequence[str]) -> tuple[int, np.ndarray] | None:
        """(the block, where each value's rows start) when every value is in one block; else None."""
        if not all(map(self.runs.__contains__, names)):
            return None
        places = [self.location[name] for name in names]
        arena = places[0] >> ROW_BITS
        if any(place >> ROW_BITS != arena for place in places):
            return None
        return arena, np.array(places, dtype=np.int64) & ROW_MASK

    def _rows(self, names: Sequence[str]) -> tuple[int, Rows]:
        """The arena holding these values (one: they have one type) and their rows in it; for
        literals only, ``LITERALS`` and their names: stacked straight from their values."""
        if stacked_literals(names, self.literals):
            return LITERALS, list(names)
        if self.runs and not self.runs.keys().isdisjoint(names):  # C loops: this runs for every read of a plan
            return self._rows_in_blocks(names)
        places = list(map(self.location.__getitem__, names))
        first = places[0]
        if self.picked and not self.picked.isdisjoint(names) and any(p >> ROW_BITS != first >> ROW_BITS for p in places):
            return LITERALS, Pieces(self.where(name) for name in names)  # rows picked from blocks beside others
        arena, row = _place(first)
        if places == list(range(first, first + len(places))):
            return arena, slice(row, row + len(places))
        return arena, np.array(places, dtype=np.int64) & ROW_MASK

    def _rows_in_blocks(self, names: Sequence[str]) -> tuple[int, Rows]:
        """Values of one shape ``[length, ...]``, some or all kept in blocks: ``Runs`` of one
        block, else ``Pieces``."""
        block = self._one_block(names)
        if block is not None:
            arena, starts = block
            length = self.runs[names[0]]
            shape = self.shaped.get(names[0]) or (length, *self.arena_kinds[arena][1])
            return arena, Runs(_rows_of_runs(starts, np.full(len(names), length)), length, shape)
        return LITERALS, Pieces(self.where(name) for name in names)

    def places(self, names: Sequence[str]) -> dict[str, tuple[int, int | slice | str]]:
        """``where`` of each value, in bulk where each is one row of an arena (a lockstep round's
        results: a round plans its few records, and this was a fifth of its planning)."""
        location, weights = self.location, self.weights
        if self.loose.isdisjoint(names) and self.runs.keys().isdisjoint(names) \
                and all(map(location.__contains__, names)) and not any(map(weights.__contains__, names)):
            return {name: (place >> ROW_BITS, place & ROW_MASK) for name, place in zip(names, map(location.__getitem__, names))}
        return {name: self.where(name) for name in names}

    def where(self, name: str) -> tuple[int, int | slice | str]:
        """(arena, row) of a value, or (arena, its rows) for one kept in a block, or (``LOOSE``,
        its name) for a loose value (a weight read by a subgraph, too)."""
        if name in self.loose or name in self.weights or name not in self.location and name in self.literals \
                and not stackable(type_of_value(self.literals[name])):
            return LOOSE, name
        arena, row = _place(self.location[name])
        length = self.runs.get(name)
        if length is None:
            return arena, row
        shape = self.shaped.get(name)
        return (arena, slice(row, row + length)) if shape is None else (arena, Shaped(slice(row, row + length), shape))

    def _block(self, first: Record, k: int, names: Sequence[str], lengths: list[int], axis: int = 0) -> Block:
        """An arena of its own for output ``k`` of a ragged step: each member's rows (as many as
        its length, along ``axis``) after the previous member's."""
        vtype = first.types[k]
        arena = len(self.rows)
        row = tuple(vtype.shape[axis + 1:])
        if axis:
            self.shaped.update((name, (*vtype.shape[:axis], length, *row)) for name, length in zip(names, lengths))
        self.arena_kinds.append((vtype.elem_type, row))
        self.rows.append(sum(lengths))
        self.blocks.add(arena)
        starts = itertools.accumulate(lengths, initial=arena << ROW_BITS)
        self.location.update(zip(names, starts))
        self.runs.update(zip(names, lengths))
        return Block(arena)

    def _write(self, first: Record, k: int, names: Sequence[str], once: bool) -> tuple[int, int]:
        """Rows for output ``k`` (``names``: its name in each member; one row for all when
        ``once``): (arena, first row)."""
        vtype = first.types[k]
        arena = self.arena((vtype.elem_type, vtype.shape))
        start = self.rows[arena]
        self.rows[arena] += 1 if once else len(names)
        base = arena << ROW_BITS | start
        self.location.update(zip(names, itertools.repeat(base) if once else range(base, base + len(names))))
        return arena, start




class Locations(dict):
    """Planner locations by value name; a missing one is a literal's, placed by ``place``
    (a planner's method, held weakly: a cycle through it would keep the planner and every
    record it read alive until the collector's next pass, about 13,000 objects a BERT mix)."""

    def __init__(self, place: Callable[[str], int]) -> None:
        super().__init__()
        self.place = weakref.WeakMethod(place)

    def __missing__(self, name: str) -> int:
        location = self[name] = self.place()(name)
        return location


def stacked_row(record: Record) -> ValueType | None:
    """The row ``[1, *row]`` of a Concat along axis 0 whose every operand is one such row
    (``ops.stack``'s), else None: such Concats are one signature class whatever their number of
    rows (``Classing._kind``), run as one step (``Layout._stacked_rows``)."""
    axis = record.attributes.get("axis")
    if record.op_type != "Concat" or record.domain or axis is None or len(record.outputs) != 1 \
            or not record.outputs[0] or record.types[0] is None or not record.entries:
        return None
    row = record.entries[0]
    if not isinstance(row, ValueType) or not stackable(row) or row.shape[:1] != (1,) \
            or record.entries.count(row) != len(record.entries) or attribute_value(axis) not in (0, -len(row.shape)):
        return None
    return row


def _place(location: int) -> tuple[int, int]:
    """(arena, row) of a planner location."""
    return location >> ROW_BITS, location & ROW_MASK


def _by_length(members: list[Record], data: int, axis: int) -> tuple[list[Record], list[int], list[tuple[int, int]],
                                                                           list[int]]:
    """Members ordered by the length of operand ``data`` along ``axis`` (stably), their
    lengths, the groups of one length (length, count) and where each group starts and ends."""
    members = sorted(members, key=lambda member: member.entries[data].shape[axis])
    lengths = [member.entries[data].shape[axis] for member in members]
    groups = [(length, len(list(same))) for length, same in itertools.groupby(lengths)]
    bounds = list(itertools.accumulate([count for _, count in groups], initial=0))
    return members, lengths, groups, bounds


def row_indices(rows: Rows) -> Rows:
    """The rows a read takes from its arena, without the ``Runs``, ``Shaped`` and ``Copied`` around them."""
    while isinstance(rows, (Runs, Shaped, Copied)):
        rows = rows.rows
    return rows


def node_of(record: Record) -> str:
    """The name of a record's first output in its instance's graph (``mix_records`` prefixes it)."""
    name = record.outputs[0] if record.outputs else ""
    prefix = f"i{record.instance}/"
    return name[len(prefix):] if name.startswith(prefix) else name


def as_text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _rows_of_runs(starts: np.ndarray, lengths: np.ndarray) -> slice | np.ndarray:
    """The rows of runs (``lengths[j]`` rows from ``starts[j]``) one after the other: a slice
    when each run follows the last."""
    ends = starts + lengths
    if np.array_equal(starts[1:], ends[:-1]):
        return slice(int(starts[0]), int(ends[-1]))
    return np.repeat(starts - np.cumsum(lengths) + lengths, lengths) + np.arange(int(lengths.sum()))


def stacked_literals(names: Sequence[str], literals: Mapping[str, np.ndarray]) -> bool:
    """Whether these values are all literals, of a dtype arenas hold: a read stacks them straight
    from their values (``LITERALS``)."""
    return names[0] in literals and literals[names[0]].dtype in ARENA_DTYPES and all(map(literals.__contains__, names))


def stackable(vtype: ValueType | None) -> bool:
    """Whether values of this type live in an arena: tensors of a static shape and an element
    type NumPy holds (the others are loose)."""
    return vtype is not None and vtype.is_static and vtype.elem_type in ARENA_TYPES


def reshape_template(cache: TemplateCache, elem_type: int, axis: int, row: tuple[int, ...],
                      out: tuple[int, tuple[int, ...]], opsets: Mapping[str, int]) -> Template:
    """A row reshape (``batcher.ragged``): each of ``R`` rows of ``row`` becomes a row of
    ``out``'s; run as a reshape of the rows (a view) on every backend."""
    key = ("reshape", elem_type, axis, row, out, opsets.get("", 1))
    template = cache.templates.get(key)
    if template is None:
        graph = Graph("reshape_rows", {"": opsets.get("", 1)})
        graph.add_input("x0", ValueType.tensor(elem_type, ["R", *row]))
        graph.add_initializer("k1", np.array([-1, *out[1]], np.int64))
        graph.add_node("Reshape", ["x0", "k1"], ["y0"])
        graph.add_output("y0")
        template = cache.templates[key] = Template(graph, [0], [], once=False, ragged=True, row_shape=out[1],
                                                   length_axis=axis, out_axes=(out[0],))
    return template  # type: ignore[return-value]
