"""Lockstep rounds that repeat, planned by substitution (issue 19: "a plan whose structure repeats
(... a lockstep round like the last) is reused rather than rebuilt").

A parser's round is the same call (its scoring cell) once a program, over values the earlier
rounds computed; only the names of those values and how many programs are left change. The
planner's plan for such a round is one step: each stacked operand's values stacked from the
literals (``LITERALS``), the template run once, its output in rows ``slot * N ..`` of an
arena. ``RoundPlans`` keeps that shape of plan, learnt from a plan the planner made
(``learn``), and makes a later round's plan from it for any number of programs (``again``):
about 20 us on this host where the planner took 75 (``benchmarks/README.md``). It refuses, and
the planner plans, wherever the new round is not that shape: a record that reads another's
value, a key or attributes not the learnt ones, other than one output a record, an operand not
a literal of an arena's dtype, outputs not all wanted in trace order. Its caller keeps it only
while the names in the keys denote the same weights, unchanged (``Batch``: a traced block's,
its weights frozen).

Any other round (a decoder's: an LSTM step and an output cell reading its ``h``, a program) is
made from the plan of a round of the same records: the same keys, the same values read within
the round (each record's by the record and output that makes it), as many records, the same
values wanted. Then the planner would sign, schedule and lay it out as it did that one; only the
literals its steps stack are other values, re-bound by their records' places (checked when
learnt). Not kept: plans that read literals' values (rows picked by a literal index, tree
folds), place literals in arenas, keep values loose, run a member alone, or stack literals in
a ragged step (its members in the order of their lengths).
"""

from __future__ import annotations

import dataclasses
import itertools
import operator
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from autobatch.batcher.layout import stacked_literals
from autobatch.batcher.plan import LITERALS, BatchReport, FlatPlan, Kind, Step, Template
from autobatch.batcher.signature import attributes_key
from autobatch.ir import Recent
from autobatch.ir.records import Record

_INPUTS, _OUTPUTS, _KEY = map(operator.attrgetter, ("inputs", "outputs", "key"))
_FIRST = operator.itemgetter(0)
KEPT = 8  # rounds' shapes kept (a program's few kinds of call), and kinds of rounds of the same records
ALIKE = 4  # rounds of as many records, the first of one key, kept: a program's round may alternate


@dataclass
class _Shape:
    """What a learnt round's plan is, but for its names and its number of members ``N``."""

    attributes: tuple  # the members' attributes (``attributes_key``): the key holds them by id
    template: Template
    kinds: list[Kind]  # of each arena
    slots: list[int]  # per arena: its rows, in members
    write: tuple[int, int]  # (arena, slot): the output's rows from ``slot * N``
    report: BatchReport  # the learnt round's (one launch of one class; its ``nodes`` are N)


@dataclass
class _Round:
    """A learnt round's plan, but for the literals its steps stack."""

    keys: list  # of its records, in order
    links: list[tuple[int, int, int, int]]  # each value read within the round: (record, operand, maker, output)
    attributes: list[tuple[dict, tuple]]  # its records' attributes objects, and what each said
    slots: list[tuple[int, int]]  # per wanted value: (record, output)
    places: list[tuple[int, Any]]  # per wanted value: where the plan puts it
    plan: FlatPlan
    # per step, the reads re-bound: (read, the (record, operand) each of its names is)
    stacked: list[list[tuple[int, list[tuple[int, int]]]]]


class RoundPlans:
    """The plans of lockstep rounds met so far, by their members' key (one ``Batch``'s)."""

    def __init__(self) -> None:
        self.reused = 0  # rounds planned by ``again``
        self.forget()

    def forget(self) -> None:
        """Drop every plan learnt (their keys name weights by names that may come to denote
        others: ``Batch`` forgets when a block begins and ends); ``reused`` goes on counting."""
        self._shapes: Recent = Recent(KEPT)
        self._rounds: Recent = Recent(KEPT)
        self._met: Recent = Recent(KEPT * ALIKE)  # (records, first key) of rounds planned: a second is learnt

    def again(self, records: Sequence[Record], wanted: Sequence[str], literals: Mapping[str, np.ndarray],
              scheduler: str) -> FlatPlan | None:
        """The plan of a round shaped as one learnt before, or None (the planner plans it);
        ``scheduler``: the name its report gives (the planner's for that round)."""
        if not records:
            return None
        start = time.perf_counter()
        made = self._again_call(records, wanted, literals, scheduler, start)
        return made if made is not None else self._again_round(records, wanted, literals, scheduler, start)

    def _again_call(self, records: Sequence[Record], wanted: Sequence[str], literals: Mapping[str, np.ndarray],
                    scheduler: str, start: float) -> FlatPlan | None:
        """``again`` for a round of one call a program (``learn``), whatever their number."""
        first = records[0]
        key = first.key
        shape: _Shape | None = self._shapes.get(key)
        n = len(records)
        if shape is None or len(wanted) != n or list(map(_KEY, records)).count(key) != n \
                or list(map(len, map(_OUTPUTS, records))).count(1) != n \
                or attributes_key(first.attributes) != shape.attributes:
            return None
        outputs = list(map(_FIRST, map(_OUTPUTS, records)))
        if outputs != list(wanted):  # (so each record's output is wanted: none is dropped)
            return None
        inputs = list(zip(*map(_INPUTS, records)))
        template = shape.template
        reads: list[Any] = []
        for i in template.stacked:
            names = inputs[i]
            if not stacked_literals(names, literals):  # (a record reading another's value too)
                return None
            reads.append((LITERALS, list(names)))
        arena, slot = shape.write
        base = slot * n
        step = Step(template, n, reads, [first.inputs[i] for i in template.fed], [(arena, base)])
        locations = dict(zip(outputs, zip(itertools.repeat(arena), range(base, base + n))))
        self.reused += 1
        return FlatPlan(list(shape.kinds), [count * n for count in shape.slots], set(), [], [step], locations,
                        _report(shape.report, scheduler, start, nodes=n))

    def learn(self, records: Sequence[Record], plan: FlatPlan) -> None:
        """Keep the shape of a round's plan where ``again`` can make it for a later round: one
        step of a batching template over every record (one key, one output), each stacked
        operand read from the literals. Only a plan of ``Classing.round_classes``' classes:
        their templates batch any number of members (none made per size, padded or ragged)."""
        n = len(records)
        if not n or len(plan.steps) != 1 or plan.blocks or plan.literal_runs or len(records[0].outputs) != 1 \
                or len(plan.steps[0].writes) != 1:
            return
        step = plan.steps[0]
        template = step.template
        if type(template) is not Template or not template.stacks_members \
                or step.groups is not None or step.fold is not None or step.size != n:
            return
        if any(type(read) is not tuple or read[0] != LITERALS or type(read[1]) is not list for read in step.reads):
            return
        key = records[0].key
        (arena, row), = step.writes
        if list(map(_KEY, records)).count(key) != n or row % n or any(rows % n for rows in plan.rows):
            return
        self._shapes[key] = _Shape(attributes_key(records[0].attributes), template, list(plan.kinds),
                                   [rows // n for rows in plan.rows], (arena, row // n), plan.report)

    def _again_round(self, records: Sequence[Record], wanted: Sequence[str], literals: Mapping[str, np.ndarray],
                     scheduler: str, start: float) -> FlatPlan | None:
        """``again`` for a round of the same records as one learnt (``learn_round``)."""
        candidates: list[_Round] = self._rounds.get((len(records), records[0].key), [])
        keys = links = None
        for learnt in candidates:
            if len(wanted) != len(learnt.slots):
                continue
            if keys is None:
                keys, links = list(map(_KEY, records)), _links(records)
            if keys == learnt.keys and links == learnt.links \
                    and all(attributes_key(attributes) == said for attributes, said in learnt.attributes) \
                    and [records[j].outputs[o] for j, o in learnt.slots] == list(wanted):
                break
        else:
            return None
        plan = learnt.plan
        steps = []
        for step, rebound in zip(plan.steps, learnt.stacked):
            if not rebound:
                steps.append(step)
                continue
            reads = list(step.reads)
            for k, reads_of in rebound:
                names = [records[j].inputs[i] for j, i in reads_of]
                if not stacked_literals(names, literals):
                    return None
                reads[k] = (LITERALS, names)
            steps.append(dataclasses.replace(step, reads=reads))
        self.reused += 1
        return FlatPlan(list(plan.kinds), list(plan.rows), set(plan.blocks), [], steps,
                        dict(zip(wanted, learnt.places)), _report(plan.report, scheduler, start))

    def learn_round(self, records: Sequence[Record], producers: Sequence[int], wanted: Sequence[str],
                    plan: FlatPlan, members: list[list[int] | None]) -> None:
        """Keep a round's plan for ``again`` to make a round of the same records from (any
        round the planner planned); ``members``: per step, the records it ran (their places
        among ``records``, the records traced), in the order its operands stack them (None:
        not one step of a group). Learnt from the second round of as many records, the first
        of one key, planned: a round met once (a program's first, thousands of records) costs
        this no pass over its records."""
        where = (len(records), records[0].key) if records else None
        if where is None or self._met.get(where) is None:
            if where is not None:
                self._met[where] = True
            return
        if plan.literal_runs or len(members) != len(plan.steps) \
                or any(arena < 0 for arena, _ in plan.locations.values()):
            return
        stacked: list[list[tuple[int, list[tuple[int, int]]]]] = []
        for step, group in zip(plan.steps, members):
            template = step.template
            if template is not None and template.solo or step.fold is not None \
                    or any(type(write) is tuple and write[0] < 0 for write in step.writes):
                return
            rebound = []
            for k, read in enumerate(step.reads):
                parts = read if type(read) is list else [read]
                if all(arena >= 0 for arena, _ in parts):
                    continue
                if type(read) is list or type(read[1]) is not list or group is None or template is None \
                        or step.groups is not None:
                    return  # (names elsewhere: pieces, a loose value; a ragged step's members by length)
                # the members' operand at the template's input, or every operand of each (a stack's rows)
                for reads_of in ([(j, template.stacked[k]) for j in group],
                                 [(j, i) for j in group for i in range(len(records[j].inputs))]):
                    if [records[j].inputs[i] for j, i in reads_of] == read[1]:
                        rebound.append((k, reads_of))
                        break
                else:
                    return
            stacked.append(rebound)
        slots = [(j, records[j].outputs.index(name)) for j, name in zip(producers, wanted)]
        held = {id(record.attributes): record.attributes for record in records}
        # the bound worked out now: the report's way to it holds the round's whole problem
        report = dataclasses.replace(plan.report, bound=plan.report.lower_bound, execution={})
        learnt = _Round(list(map(_KEY, records)), _links(records),
                        [(attributes, attributes_key(attributes)) for attributes in held.values()], slots,
                        [plan.locations[name] for name in wanted], dataclasses.replace(plan, report=report), stacked)
        self._rounds[where] = [learnt, *self._rounds.get(where, [])][:ALIKE]  # the latest first: rounds alternate


def _links(records: Sequence[Record]) -> list[tuple[int, int, int, int]]:
    """Each value a record reads that a record of the round makes: (reader, its operand, maker,
    the maker's output), in order. (Predecessors alone do not tell which output is read.)"""
    made = {name: (maker, output) for maker in sorted({p for record in records for p in record.preds})
            for output, name in enumerate(records[maker].outputs) if name}
    return [(reader, operand, *made[name]) for reader, record in enumerate(records) if record.preds
            for operand, name in enumerate(record.inputs) if name in made]


def _report(was: BatchReport, scheduler: str, start: float, **changes: Any) -> BatchReport:
    """A made round's report: the learnt round's counts (its own dicts), its planning timed."""
    return dataclasses.replace(was, scheduler=scheduler, execution={}, alone=dict(was.alone),
                               launches_by_op=dict(was.launches_by_op), by_shape=dict(was.by_shape),
                               seconds={"analyse": 0.0, "schedule": 0.0, "plan": time.perf_counter() - start},
                               **changes)
