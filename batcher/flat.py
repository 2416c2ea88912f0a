"""The planner: records (traced ops, or an ONNX model's nodes per instance) straight to a plan.

No batched IR graph is built (that cost several Python objects and steps a traced op, most of
a traced batch's time, on the older path this replaced). Each record arrives with a signature key and its predecessors (made while tracing), is scheduled by the
same schedulers, and each signature class is batched by its rule ONCE into a small *template*
graph over a symbolic batch size ``N``, kept across batches. The plan is a list of steps: the
arena rows each stacked operand reads (a view when contiguous, else one gather), the template
to run, and the rows its outputs fill.

Arenas: every per-instance value of one (dtype, shape) lives in one array, a row a value.
Gathering the children of Tree-LSTM nodes made by many earlier steps is then one ``take``,
not a gather per source batch plus a concat.

Classes of a row-wise op that differ only in their length along axis 0 merge into one
*ragged* class (``batcher.ragged``): its template is the op itself over the members' rows
concatenated, and its result is a *block*, an arena of its own with each member's rows after
the last's, which a later ragged step over the same members reads as a view. Recurrent layers
over sequences of different lengths run packed (``batcher.sequences``), tree folds level by
level (``batcher.folds``).

An op no rule batches, or a nondeterministic one, runs once per instance (a *solo* template:
the op itself). So does an op over values no arena holds (*loose* values: sequences,
optionals, types whose shape is known only once computed, float8 and bfloat16 arrays) or with
a subgraph: those values are kept one by one, as they are (``LOOSE``), and a step reads them by
name. Every model takes this path; only a tree fold whose children are not known when traced
raises ``NotFlat``.

The planner's two halves live beside it: ``batcher.classing`` (signing: classes and their
templates) and ``batcher.layout`` (where values live, and the steps that read and write them).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import numpy as np

from autobatch.batcher.classing import Classing
from autobatch.batcher.functions import Functions
from autobatch.batcher.layout import Layout, Locations, row_indices
from autobatch.batcher.plan import BatchReport, Copied, FlatPlan, Kind, RowReduction, Step, Template, TemplateCache
from autobatch.batcher.problem import SCHEDULING
from autobatch.batcher.rounds import RoundPlans
from autobatch.batcher.schedulers import depth_schedule, get_scheduler
from autobatch.ir.records import Record


def plan_records(records: Sequence[Record], wanted: Sequence[str], producers: Sequence[int],
                 weights: Mapping[str, np.ndarray], literals: Mapping[str, np.ndarray], functions: Functions,
                 opsets: Mapping[str, int], scheduler: str, known: dict[Hashable, tuple] | None = None,
                 apart: bool = False, padded: bool = True, *, cache: TemplateCache,
                 literals_fixed: bool = False, rounds: RoundPlans | None = None) -> FlatPlan:
    """The plan computing ``wanted`` (made by the records at ``producers``) from ``records``
    (in trace order; those that lead to no wanted value are left out). ``weights`` are shared
    by every instance; ``literals`` are data of one instance: ``literals_fixed`` where the plan
    runs on these values only (a traced batch's), else the plan must hold for any values of
    their types (a session keeps it for its inputs' types). ``known``: what earlier plans
    learnt of record keys, for a caller whose keys (and weights) stay the same across plans.
    ``apart``: no record reads a value of another instance (``mix_records``' records), which
    makes the schedulers' levels cheap to work out, and (with ``padded``) lets the classes of
    one node of the model over instances of different shapes run padded (``batcher.padding``).
    ``rounds``: where a lockstep round's plan is learnt (``batcher.rounds``), for a caller that
    asks it for the next round's plan (``RoundPlans.again``) before planning."""
    cache.make_room()  # between plans, never during one
    start = time.perf_counter()
    planner = _Planner(cache, weights, literals, functions, opsets, known, literals_fixed)
    traced = records
    records, preds, kept = _live(records, producers)
    schedule = None if apart else planner.round_classes(records, preds)
    a_round = schedule is not None
    if a_round:  # a lockstep round of classes met before: no problem to sign
        analysed = scheduled = time.perf_counter()
        lower_bound: int | Callable[[], int] = len(schedule)
    else:
        problem = planner.sign(records, preds, apart, padded)
        analysed = time.perf_counter()
        # No dependencies (a lockstep round over known values): every scheduler launches each class
        # once, and grouping by class is the cheapest way there.
        schedule = depth_schedule(problem) if not problem.depth.any() else get_scheduler(scheduler)(problem)
        scheduled = time.perf_counter()
        lower_bound = problem.deferred_lower_bound()
    steps: list[Step] = []
    step_groups: list[list[int] | None] = []  # per step, its group where it is the group's one step (``rounds``)
    launches_by_op: Counter[str] = Counter()
    for group in schedule:  # a step a launch; rows picked where they lie make none (``Layout._picked_rows``)
        made = planner.steps(list(map(records.__getitem__, group)), planner.record_class[group[0]])
        steps += made
        step_groups += [group] if len(made) == 1 else [None] * len(made)
        if made:
            launches_by_op[records[group[0]].op_type] += len(made)
    locations = planner.places(wanted)
    if planner.picked:
        _copy_shared_rows(locations, planner.picked)
    done = time.perf_counter()
    gathers = views = 0
    for step in steps:
        for read in step.reads:
            for _, rows in read if isinstance(read, list) else (read,):
                rows = row_indices(rows)
                gathers += isinstance(rows, (np.ndarray, list))  # a list: literals stacked, or pieces
                views += isinstance(rows, slice)
    merged = sum(step.size - 1 for step in steps if step.template is not None and step.template.once
                 and not step.template.solo)
    # counted a class at a time (its records share their op and template), and a group at a
    # time where the rule refused the group's number of members (``Layout.steps``)
    reasons = planner.alone_steps
    solo = [cls for cls, template in enumerate(planner.templates) if getattr(template, "solo", False)]
    if solo:  # (most plans, a lockstep round's among them, have none: no count of members)
        members = np.bincount(planner.record_class, minlength=len(planner.templates)).tolist()
        for cls in solo:
            if members[cls]:
                reasons[f"{planner.first_records[cls].op_type}: {planner.templates[cls].reason}"] += members[cls]
    report = BatchReport(scheduler, len(records), len(steps), lower_bound, sum(reasons.values()),
                         gathers, views, merged,
                         {"analyse": analysed - start, "schedule": scheduled - analysed, "plan": done - scheduled},
                         alone=dict(reasons), launches_by_op=dict(launches_by_op), by_shape=dict(planner.by_shape))
    plan = FlatPlan(planner.arena_kinds, planner.rows, planner.blocks, planner.literal_runs, steps, locations, report)
    if rounds is not None:
        if a_round:
            rounds.learn(records, plan)
        if not planner.read_literals:  # (a plan that read a literal's value holds for that value only)
            if kept is not None:  # members by their place among the records traced
                step_groups = [None if group is None else [kept[j] for j in group] for group in step_groups]
            rounds.learn_round(traced, producers, wanted, plan, step_groups)
    return plan


class _Planner(Classing, Layout):
    def __init__(self, cache: TemplateCache, weights: Mapping[str, np.ndarray], literals: Mapping[str, np.ndarray],
                 functions: Functions, opsets: Mapping[str, int], known: dict[Hashable, tuple] | None = None,
                 literals_fixed: bool = False) -> None:
        self.cache = cache  # templates by key, kept across plans
        self.weights = weights
        self.literals = literals
        self.functions = functions
        self.opsets = opsets
        self.kinds: dict[Kind, int] = {}  # the arena of each kind, shared by the values of that kind
        self.arena_kinds: list[Kind] = []
        self.rows: list[int] = []
        self.blocks: set[int] = set()  # arenas of their own: a ragged step's result (``Block``)
        self.runs: dict[str, int] = {}  # value -> its rows, for a value kept in a block
        self.picked: set[str] = set()  # values that are a row of a block (``Layout._picked_rows``)
        self.read_literals = False  # whether a step's layout read a literal's value (``Layout._picked_rows``)
        self.alone_steps: Counter[str] = Counter()  # "op: why" -> members run alone where a rule refused their number
        self.literals_fixed = literals_fixed  # whether the plan may depend on the literals' values (``plan_records``)
        self.shaped: dict[str, tuple[int, ...]] = {}  # the shape of a value in a block that is not [rows, *row]
        self.loose: set[str] = set()  # values loose steps give as they are (``LOOSE``)
        self.literal_runs: list[tuple[int, int, list[str]]] = []
        # per-instance value -> arena << ROW_BITS | row; a literal gets its row when first asked for
        self.location = Locations(self._place_literal)
        self.classes: list[tuple] = []
        self.class_of: dict[tuple, int] = {}  # a signature -> its class
        self.record_class: list[int] = []  # per record (live ones, in order): its class
        self.templates: list[Template | RowReduction | str | None] = []  # per class; None for sums of terms
        self.first_records: list[Record] = []  # per class: its first record
        self.ragged: list[tuple | None] = []  # per class: its signature without the length of its rows
        self.one_row: list[list[tuple]] = []  # per class: its signatures as one row (``_kind``)
        self.by_shape: Counter[str] = Counter()  # "op: why" -> nodes of a model run in a class per shape
        self._attributes_keys: dict[int, tuple] = {}
        # record key -> what ``_kind`` says of it: given by the caller when its keys stay valid
        # across plans (``InferenceSession``: records kept per input signature), else per plan.
        self.known: dict[Hashable, tuple] = known if known is not None else {}
        # a record's rows, by its key without their length (``classing._length_free_key``)
        self.rows_of_kinds: dict[tuple, tuple] = {}


def _copy_shared_rows(locations: dict[str, tuple[int, Any]], picked: set[str]) -> None:
    """A wanted row picked from a block is read as a copy where another wanted value of that
    block may share its memory: the block's own rows, or the same row picked again. Results
    never share memory (as each instance's alone would not); rows of a block each picked once
    (a parser's 1,733 feature vectors a minibatch) are views of distinct rows, read as they lie."""
    picks: Counter[tuple[int, int]] = Counter()  # (block, row) -> the wanted values picked there
    whole: set[int] = set()  # blocks that hold a wanted value other than a row picked from them
    for name, (arena, rows) in locations.items():
        if name in picked and type(rows) is int:
            picks[arena, rows] += 1
        else:
            whole.add(arena)
    for name in picked.intersection(locations):
        arena, rows = locations[name]
        if arena in whole or picks[arena, rows] > 1:
            locations[name] = (arena, Copied(rows))


def _live(records: Sequence[Record], producers: Sequence[int]
          ) -> tuple[Sequence[Record], list[list[int]], list[int] | None]:
    """The records that lead to a wanted value (usually all), their predecessors renumbered
    among them, and where each was among the records given (None: all of them, in place)."""
    preds = [record.preds for record in records]
    alive = bytearray(len(records))
    count = (SCHEDULING.alive if SCHEDULING is not None else _alive)(preds, producers, alive)
    if count == len(records):
        return records, preds, None
    kept = [i for i, flag in enumerate(alive) if flag]
    index = {old: new for new, old in enumerate(kept)}
    return [records[i] for i in kept], [[index[p] for p in preds[i]] for i in kept], kept


def _alive(preds: Sequence[Sequence[int]], producers: Sequence[int], alive: bytearray) -> int:
    """``_scheduling.alive``'s twin: each node a producer reads, itself included, marked 1; how many."""
    for i in producers:
        alive[i] = 1
    for i in range(len(preds) - 1, -1, -1):  # predecessors come first: one backward pass
        if alive[i]:
            for p in preds[i]:
                alive[p] = 1
    return alive.count(1)
