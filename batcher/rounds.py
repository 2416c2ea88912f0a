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
"""

from __future__ import annotations

import itertools
import operator
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from autobatch.batcher.plan import ARENA_DTYPES, LITERALS, BatchReport, FlatPlan, Kind, Step, Template
from autobatch.batcher.signature import attributes_key
from autobatch.ir import Recent
from autobatch.ir.records import Record

_INPUTS, _OUTPUTS, _KEY = map(operator.attrgetter, ("inputs", "outputs", "key"))
_FIRST = operator.itemgetter(0)
KEPT = 8  # rounds' shapes kept (a program's few kinds of call)


@dataclass
class _Shape:
    """What a learnt round's plan is, but for its names and its number of members ``N``."""

    attributes: tuple  # the members' attributes (``attributes_key``): the key holds them by id
    template: Template
    kinds: list[Kind]  # of each arena
    slots: list[int]  # per arena: its rows, in members
    write: tuple[int, int]  # (arena, slot): the output's rows from ``slot * N``


class RoundPlans:
    """The plans of lockstep rounds met so far, by their members' key (one ``Batch``'s)."""

    def __init__(self) -> None:
        self._shapes: Recent = Recent(KEPT)
        self.reused = 0  # rounds planned by ``again``

    def again(self, records: Sequence[Record], wanted: Sequence[str], literals: Mapping[str, np.ndarray],
              scheduler: str) -> FlatPlan | None:
        """The plan of a round shaped as one learnt before, or None (the planner plans it);
        ``scheduler``: the name its report gives (every scheduler makes this plan)."""
        if not records:
            return None
        start = time.perf_counter()
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
            if getattr(literals.get(names[0]), "dtype", None) not in ARENA_DTYPES \
                    or not all(map(literals.__contains__, names)):  # (a record reading another's value too)
                return None
            reads.append((LITERALS, list(names)))
        arena, slot = shape.write
        base = slot * n
        step = Step(template, n, reads, [first.inputs[i] for i in template.fed], [(arena, base)])
        locations = dict(zip(outputs, zip(itertools.repeat(arena), range(base, base + n))))
        report = BatchReport(scheduler, nodes=n, launches=1, bound=1, fallback_nodes=0, gathers=len(reads),
                             gathers_avoided=0, merged_duplicates=0,
                             seconds={"analyse": 0.0, "schedule": 0.0, "plan": time.perf_counter() - start},
                             launches_by_op={first.op_type: 1})
        self.reused += 1
        return FlatPlan(list(shape.kinds), [count * n for count in shape.slots], set(), [], [step], locations, report)

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
        if type(template) is not Template or template.solo or template.once or template.ragged \
                or template.sequences or template.row_shape is not None or template.segment is not None \
                or template.captured or step.groups is not None or step.fold is not None or step.size != n:
            return
        if any(type(read) is not tuple or read[0] != LITERALS or type(read[1]) is not list for read in step.reads):
            return
        key = records[0].key
        (arena, row), = step.writes
        if list(map(_KEY, records)).count(key) != n or row % n or any(rows % n for rows in plan.rows):
            return
        self._shapes[key] = _Shape(attributes_key(records[0].attributes), template, list(plan.kinds),
                                   [rows // n for rows in plan.rows], (arena, row // n))
