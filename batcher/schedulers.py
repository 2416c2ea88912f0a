"""Schedulers: turn a Problem into an ordered list of groups (lists of node indices), each
group holding nodes of one signature class whose dependencies all lie in earlier groups.

- ``depth``: group by (topological generation, class).
- ``agenda``: DyNet's heuristic: a ready unbatchable node first, else the ready class with the
  lowest average depth over the whole graph (ties go to cheaper ops).
- ``level`` (ours): a launch per class and level, in bulk, where those launches can run in
  some order (each node at its first level, else at its last: the lower bound itself). Else
  prefer a ready class whose ready nodes include *every* remaining node of its lowest pending
  level (launching it now cannot cost a later launch: the lower bound is kept); tie-breaks (the
  fewest ready nodes, the most levels still ahead, the agenda rule) are tried in turn while
  another could save launches worth its search, and the shortest schedule is kept. On trees
  and chains this reaches or nears the lower bound where depth and agenda over-split.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Callable

import numpy as np

from autobatch.batcher.int_keys import bucket_starts, distinct_keys, stable_order, unique_keys
from autobatch.batcher.problem import SCHEDULING, UNBATCHABLE, Problem

Schedule = list[list[int]]
Scheduler = Callable[[Problem], Schedule]

# Ops that cost more than a vector op: among equally good choices, run them later, when more
# of their nodes may be ready (DyNet's tie-break).
EXPENSIVE_OPS = frozenset({"MatMul", "Gemm", "Conv", "LSTM", "GRU", "RNN", "Einsum"})


def depth_schedule(problem: Problem) -> Schedule:
    """A launch per (depth, class) and per unbatchable node (keyed ``-1 - i`` in place of a
    class), in the order of those keys, sorted with NumPy over all nodes at once."""
    n = problem.size
    sig, depth = problem.sig, problem.depth
    if n and sig[0] != UNBATCHABLE and sig.min() == sig.max() and depth.min() == depth.max():
        return [list(range(n))]  # one class at one depth (a lockstep round's calls): one launch, cheaply
    nodes = np.arange(n)
    second = np.where(problem.sig != UNBATCHABLE, problem.sig, -1 - nodes)
    order = np.lexsort((nodes, second, problem.depth))
    depth, second = problem.depth[order], second[order]
    starts = np.flatnonzero(np.concatenate(([True], (depth[1:] != depth[:-1]) | (second[1:] != second[:-1])))) \
        if n else np.zeros(0, dtype=np.int64)
    members, bounds = order.tolist(), [*starts.tolist(), n]
    return [members[bounds[g]:bounds[g + 1]] for g in range(len(starts))]


class _Ready:
    """Ready-set bookkeeping shared by the agenda-style schedulers. ``by_level``: also count the
    ready nodes of each class at each level (the level scheduler asks; the agenda does not)."""

    def __init__(self, problem: Problem, by_level: bool = False) -> None:
        self.problem = problem
        # Plain lists: this bookkeeping runs per node, where NumPy scalars cost several times more.
        self.sig: list[int] = problem.sig.tolist()
        self.level: list[int] = problem.level.tolist() if by_level else []
        self.waiting = [len(p) for p in problem.preds]
        self.ready_by_class: dict[int, list[int]] = defaultdict(list)
        # (class, level) -> ready nodes; None when not counted
        self.ready_at_level: dict[tuple[int, int], int] | None = defaultdict(int) if by_level else None
        self.ready_unbatchable: list[int] = []
        self.done = 0
        for i, waiting in enumerate(self.waiting):
            if waiting == 0:
                self._make_ready(i)

    def _make_ready(self, i: int) -> None:
        cls = self.sig[i]
        if cls == UNBATCHABLE:
            self.ready_unbatchable.append(i)
        else:
            self.ready_by_class[cls].append(i)
            if self.ready_at_level is not None:
                self.ready_at_level[cls, self.level[i]] += 1

    def launch(self, group: list[int]) -> None:
        self.done += len(group)
        waiting, succs, make_ready = self.waiting, self.problem.succs, self._make_ready
        for i in group:
            for j in succs[i]:
                waiting[j] -= 1
                if waiting[j] == 0:
                    make_ready(j)

    def take_class(self, cls: int) -> list[int]:
        group = sorted(self.ready_by_class.pop(cls))
        if self.ready_at_level is not None:
            for i in group:
                self.ready_at_level[cls, self.level[i]] -= 1
        return group


def _class_costs(problem: Problem) -> tuple[np.ndarray, np.ndarray]:
    """Average depth and an expense flag per class."""
    n_classes = len(problem.classes)
    batchable = problem.sig != UNBATCHABLE
    totals = np.bincount(problem.sig[batchable], weights=problem.depth[batchable], minlength=n_classes)
    counts = np.bincount(problem.sig[batchable], minlength=n_classes)
    average = totals / np.maximum(counts, 1)
    expensive = np.array([signature[1] in EXPENSIVE_OPS for signature in problem.classes], dtype=bool)
    return average, expensive


def _agenda(problem: Problem, choose: Callable[[_Ready], int], limit: int | None = None,
            by_level: bool = False) -> Schedule | None:
    """The schedule made by launching ready groups as ``choose`` says; None once it would take
    ``limit`` launches or more (a candidate that cannot beat a schedule already found)."""
    ready = _Ready(problem, by_level)
    schedule: Schedule = []
    while ready.done < problem.size:
        if limit is not None and len(schedule) >= limit:
            return None
        if ready.ready_unbatchable:
            group = [ready.ready_unbatchable.pop(0)]
        else:
            group = ready.take_class(choose(ready))
        schedule.append(group)
        ready.launch(group)
    return schedule


def _cheapest_first(problem: Problem) -> Callable[[int], tuple]:
    average, expensive = _class_costs(problem)
    return lambda cls: (average[cls], bool(expensive[cls]), cls)


def agenda_schedule(problem: Problem) -> Schedule:
    if SCHEDULING is not None:
        schedule = _compiled_search(problem, _AGENDA)
    else:
        key = _cheapest_first(problem)
        schedule = _agenda(problem, lambda ready: min(ready.ready_by_class, key=key))
    assert schedule is not None
    return schedule


def level_schedule(problem: Problem) -> Schedule:
    """Ours: every node of a class at one level in one launch, when those launches can run in
    some order (``level_groups``: the lower bound, found in bulk). Else launch a ready class
    whose ready nodes complete its lowest pending level (this never costs a launch against the
    bound). Which class among several, or when none completes, is a tie-break; each of
    ``LEVEL_TIE_BREAKS`` is tried in turn while the launches another could save are worth more
    than its search (``NODES_A_LAUNCH_IS_WORTH``), and the shortest schedule is kept."""
    for levels in (lambda: problem.level, lambda: problem.late_level):  # each node as early as it can be, then as late
        grouped = level_groups(problem, levels())
        if grouped is not None:
            return grouped
    bound = problem.lower_bound()
    best: Schedule | None = None
    for tie_break in LEVEL_TIE_BREAKS:
        schedule = _level_schedule(problem, tie_break, limit=len(best) if best is not None else None)
        if schedule is not None:  # shorter than the best so far (a longer one is abandoned early)
            best = schedule
        if best is not None and (len(best) - bound) * NODES_A_LAUNCH_IS_WORTH <= problem.size:
            break  # another search would cost more than the launches it could save (none at the bound)
    assert best is not None
    return best


def level_groups(problem: Problem, level: np.ndarray) -> Schedule | None:
    """A launch per class and ``level`` (``Problem.level`` or ``late_level``; and one per
    unbatchable node), ordered so that each reads only earlier ones; None when no order can (a
    cycle among them: levels that do not line up, as in a Tree-LSTM traced op by op). Such a
    schedule has as many launches as the lower bound (a class of highest level m has its nodes
    on levels 1..m), and is found with NumPy over all nodes at once, and Python only over
    launches and the dependencies between them."""
    if problem.size == 0:
        return []
    group, counts, between = launches_by_level(problem, level)
    groups = len(counts)
    sources, targets = between // groups, (between % groups).tolist()
    waiting = np.bincount(between % groups, minlength=groups).tolist()
    starts = bucket_starts(sources, groups).tolist()
    nodes = stable_order(group, groups)
    bounds = np.concatenate(([0], np.cumsum(counts)))
    # Among the launches ready, the one whose nodes start shallowest (then by class and level).
    first_depth = np.minimum.reduceat(problem.depth[nodes], bounds[:-1]).tolist()
    ready = [(first_depth[g], g) for g in range(groups) if waiting[g] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        g = heapq.heappop(ready)[1]
        order.append(g)
        for h in targets[starts[g]:starts[g + 1]]:
            waiting[h] -= 1
            if waiting[h] == 0:
                heapq.heappush(ready, (first_depth[h], h))
    if len(order) < groups:
        return None
    members, bounds = nodes.tolist(), bounds.tolist()
    return [members[bounds[g]:bounds[g + 1]] for g in order]


def launches_by_level(problem: Problem, level: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``level_groups``' launches: per node its launch, numbered by class, then level, then the
    unbatchable nodes' (one each, in node order); each launch's number of nodes; and the pairs of
    launches an edge joins, ``source * launches + target``, ascending."""
    sig = problem.sig
    levels, classes = int(level.max()) + 1, len(problem.classes)
    unbatchable = sig == UNBATCHABLE  # keyed past every class's, by their count so far
    key = np.where(unbatchable, classes * levels + np.cumsum(unbatchable) - 1, sig * levels + level)
    _, group, counts = unique_keys(key, classes * levels + int(np.count_nonzero(unbatchable)))
    src, dst = problem.edges
    # No edge joins two nodes of one launch: along an edge, a class's level (first or last) grows.
    return group, counts, distinct_keys(group[src] * len(counts) + group[dst], len(counts) ** 2)


# Each maps (ready set, class, lowest pending level per class, highest per class) to a sort key.
TieBreak = Callable[[_Ready, int, dict[int, int], dict[int, int]], tuple]


def _level_schedule(problem: Problem, tie_break: Callable[[Problem], TieBreak],
                    limit: int | None = None) -> Schedule | None:
    if SCHEDULING is not None:
        return _compiled_search(problem, _COMPILED_TIE_BREAKS[tie_break], limit)
    # pending[cls][lvl]: nodes of class cls at level lvl not launched yet.
    pending: dict[int, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    batchable = problem.sig != UNBATCHABLE
    levels = int(problem.level.max(initial=0)) + 1
    codes, counts = np.unique(problem.sig[batchable] * levels + problem.level[batchable], return_counts=True)
    for code, count in zip(codes.tolist(), counts.tolist()):
        pending[code // levels][code % levels] = count
    lowest = {cls: min(levels) for cls, levels in pending.items()}  # kept up to date below
    highest = {cls: max(levels) for cls, levels in pending.items()}
    # Per class, its levels in order and how far the launched ones reach: levels only ever
    # finish, so the lowest pending one is found by moving on (scanning them all each launch
    # made deep chains quadratic).
    in_order = {cls: sorted(levels) for cls, levels in pending.items()}
    passed = dict.fromkeys(pending, 0)
    key = tie_break(problem)

    def completes_lowest_level(ready: _Ready, cls: int) -> bool:
        return ready.ready_at_level[cls, lowest[cls]] == pending[cls][lowest[cls]]  # type: ignore[index]

    def choose(ready: _Ready) -> int:
        complete = [c for c in ready.ready_by_class if completes_lowest_level(ready, c)]
        cls = min(complete or ready.ready_by_class, key=lambda c: key(ready, c, lowest, highest))
        counts = pending[cls]
        for i in ready.ready_by_class[cls]:
            lvl = ready.level[i]
            counts[lvl] -= 1
            if counts[lvl] == 0:
                del counts[lvl]
        levels, k = in_order[cls], passed[cls]
        while k < len(levels) and levels[k] not in counts:
            k += 1
        passed[cls] = k
        if k < len(levels):
            lowest[cls] = levels[k]
        return cls

    return _agenda(problem, choose, limit, by_level=True)


def _agenda_rule(problem: Problem) -> TieBreak:
    """The agenda's choice: the lowest average depth, cheaper ops first."""
    cheapest = _cheapest_first(problem)
    return lambda ready, cls, lowest, highest: cheapest(cls)


def _most_levels_ahead(problem: Problem) -> TieBreak:
    """The class with the most levels still pending (chains: the longest first)."""
    return lambda ready, cls, lowest, highest: (lowest[cls] - highest[cls], cls)


def _fewest_ready(problem: Problem) -> TieBreak:
    """The class with the fewest ready nodes: the smallest group split off, while classes
    with many ready nodes keep gathering more (trees whose per-class levels do not line up)."""
    cheapest = _cheapest_first(problem)
    return lambda ready, cls, lowest, highest: (len(ready.ready_by_class[cls]), cheapest(cls))


def _compiled_search(problem: Problem, mode: int, limit: int | None = None) -> Schedule | None:
    """``_agenda`` with the agenda's choice (``mode`` ``_AGENDA``) or the level scheduler's with
    a tie-break, in C (``_scheduling.search``): the same schedule, about 20x faster."""
    n, sig = problem.size, np.ascontiguousarray(problem.sig, dtype=np.int64)
    average, expensive = _class_costs(problem)
    starts, readers = problem.successors
    waiting = np.bincount(problem.edges[1], minlength=n)
    no_codes = np.zeros(0, dtype=np.int64)
    code, code_start, code_level, code_pending = no_codes, no_codes, no_codes, no_codes
    if mode != _AGENDA:  # (class, level) pairs numbered class by class, levels ascending
        batchable = sig != UNBATCHABLE
        levels = int(problem.level.max(initial=0)) + 1
        pairs, inverse, code_pending = unique_keys(sig[batchable] * levels + problem.level[batchable],
                                                   len(problem.classes) * levels)
        code = np.full(n, -1, dtype=np.int64)
        code[batchable] = inverse
        code_start = bucket_starts(pairs // levels, len(problem.classes))
        code_level = pairs % levels
    return SCHEDULING.search(sig, starts, readers, waiting, average.astype(np.float64), expensive.view(np.uint8),
                             code, code_start, code_level, code_pending, mode, -1 if limit is None else limit)


# In the order tried: on the benchmarks' primitive ops the fewest-ready tie-break came closest to
# the bound on Tree-LSTMs (356 launches of a bound of 332, the agenda rule 428), the most-levels
# one on the char tagger and the parser (907 of 852, 718 of 718; fewest-ready 1,094 and 788).
LEVEL_TIE_BREAKS: tuple[Callable[[Problem], TieBreak], ...] = (_fewest_ready, _most_levels_ahead, _agenda_rule)
_AGENDA = 0  # the modes of ``_scheduling.search``: the agenda's choice, or the level scheduler's with a tie-break
_COMPILED_TIE_BREAKS = {_fewest_ready: 1, _most_levels_ahead: 2, _agenda_rule: 3}
# A launch costs about what a tie-break's search spends on this many nodes: on onnxruntime at size
# 256 the benchmarks' schedules of fewer launches saved 14-100 us a launch, and a search costs
# 0.6-0.9 us a node (python -m benchmarks, the primitive forms' depth and level rows).
NODES_A_LAUNCH_IS_WORTH = 70


SCHEDULERS: dict[str, Scheduler] = {
    "depth": depth_schedule,
    "agenda": agenda_schedule,
    "level": level_schedule,
}


def get_scheduler(name: str) -> Scheduler:
    try:
        return SCHEDULERS[name]
    except KeyError:
        raise ValueError(f"unknown scheduler {name!r}; choose one of {sorted(SCHEDULERS)}") from None
