"""Schedulers: turn a Problem into an ordered list of groups (lists of node indices), each
group holding nodes of one signature class whose dependencies all lie in earlier groups.

- ``depth``: group by (topological generation, class).
- ``agenda``: DyNet's heuristic: a ready unbatchable node first, else the ready class with the
  lowest average depth over the whole graph (ties go to cheaper ops).
- ``level`` (ours): prefer a ready class whose ready nodes include *every* remaining node of
  its lowest pending level (launching it now cannot cost a later launch: the lower bound is
  kept); tie-breaks from the agenda rule and from the levels still ahead, the better of the
  two schedules kept. On trees and chains this reaches the lower bound where depth and agenda
  over-split.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

import numpy as np

from autobatch.batcher.problem import UNBATCHABLE, Problem

Schedule = list[list[int]]
Scheduler = Callable[[Problem], Schedule]

# Ops that cost more than a vector op: among equally good choices, run them later, when more
# of their nodes may be ready (DyNet's tie-break).
EXPENSIVE_OPS = frozenset({"MatMul", "Gemm", "Conv", "LSTM", "GRU", "RNN", "Einsum"})


def depth_schedule(problem: Problem) -> Schedule:
    groups: dict[tuple[int, int], list[int]] = {}
    for i in range(problem.size):
        cls = int(problem.sig[i])
        key = (int(problem.depth[i]), cls if cls != UNBATCHABLE else -1 - i)
        groups.setdefault(key, []).append(i)
    return [groups[key] for key in sorted(groups)]


class _Ready:
    """Ready-set bookkeeping shared by the agenda-style schedulers."""

    def __init__(self, problem: Problem) -> None:
        self.problem = problem
        # Plain lists: this bookkeeping runs per node, where NumPy scalars cost several times more.
        self.sig: list[int] = problem.sig.tolist()
        self.level: list[int] = problem.level.tolist()
        self.waiting = [len(p) for p in problem.preds]
        self.ready_by_class: dict[int, list[int]] = defaultdict(list)
        self.ready_at_level: dict[tuple[int, int], int] = defaultdict(int)  # (class, level) -> ready nodes
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
            self.ready_at_level[cls, self.level[i]] += 1

    def launch(self, group: list[int]) -> None:
        self.done += len(group)
        waiting, succs = self.waiting, self.problem.succs
        for i in group:
            for j in succs[i]:
                waiting[j] -= 1
                if waiting[j] == 0:
                    self._make_ready(j)

    def take_class(self, cls: int) -> list[int]:
        group = sorted(self.ready_by_class.pop(cls))
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


def _agenda(problem: Problem, choose: Callable[[_Ready], int]) -> Schedule:
    ready = _Ready(problem)
    schedule: Schedule = []
    while ready.done < problem.size:
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
    key = _cheapest_first(problem)
    return _agenda(problem, lambda ready: min(ready.ready_by_class, key=key))


def level_schedule(problem: Problem) -> Schedule:
    """Ours: launch a ready class whose ready nodes complete its lowest pending level (this
    never costs a launch against the lower bound); among several, and when none completes,
    two tie-breaks are tried (the agenda's lowest average depth, and the class with the most
    levels still ahead) and the shorter schedule is kept; the second only when the first
    misses the lower bound."""
    first = _level_schedule(problem, _cheapest_first(problem))
    if len(first) == problem.lower_bound():
        return first  # nothing can do better: the second tie-break is not tried
    return min(first, _level_schedule(problem, None), key=len)


def _level_schedule(problem: Problem, tie_break: Callable[[int], tuple] | None) -> Schedule:
    # pending[cls][lvl]: nodes of class cls at level lvl not launched yet.
    pending: dict[int, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for i in np.flatnonzero(problem.sig != UNBATCHABLE):
        pending[int(problem.sig[i])][int(problem.level[i])] += 1
    lowest = {cls: min(levels) for cls, levels in pending.items()}  # kept up to date below
    highest = {cls: max(levels) for cls, levels in pending.items()}
    key = tie_break or (lambda cls: (lowest[cls] - highest[cls], cls))  # most levels ahead first

    def completes_lowest_level(ready: _Ready, cls: int) -> bool:
        return ready.ready_at_level[cls, lowest[cls]] == pending[cls][lowest[cls]]

    def choose(ready: _Ready) -> int:
        complete = [c for c in ready.ready_by_class if completes_lowest_level(ready, c)]
        cls = min(complete or ready.ready_by_class, key=key)
        counts = pending[cls]
        for i in ready.ready_by_class[cls]:
            lvl = ready.level[i]
            counts[lvl] -= 1
            if counts[lvl] == 0:
                del counts[lvl]
        if counts:
            lowest[cls] = min(counts)
        return cls

    return _agenda(problem, choose)


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
