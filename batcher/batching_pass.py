"""Batching as a graph pass: ``BatchingPass(scheduler)(graph) -> PassResult(graph, modified)``."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from autobatch.batcher.problem import UNBATCHABLE, build_problem
from autobatch.batcher.rewrite import Rewriter, refusal
from autobatch.batcher.schedulers import get_scheduler
from autobatch.ir import Graph
from autobatch.ir.gc_pause import without_gc


@dataclass
class BatchReport:
    """What one batching run did. ``launches`` counts batched ops plus nodes run alone;
    ``lower_bound`` is ED-Batch's bound for the same graph (``bound``: it, or how to work it
    out when first asked for, which costs a pass over the graph that planning did not need)."""

    scheduler: str
    nodes: int
    launches: int
    bound: int | Callable[[], int]
    fallback_nodes: int
    gathers: int
    gathers_avoided: int
    merged_duplicates: int
    seconds: dict[str, float] = field(default_factory=dict)  # batching: analyse, schedule, plan/rewrite
    execution: dict[str, float] = field(default_factory=dict)  # flat path: gather, kernels, scatter
    alone: dict[str, int] = field(default_factory=dict)  # "op: why" -> nodes run one at a time
    launches_by_op: dict[str, int] = field(default_factory=dict)  # flat path: op type -> its steps

    @property
    def lower_bound(self) -> int:
        if callable(self.bound):
            self.bound = self.bound()
        return self.bound

    @property
    def ratio(self) -> float:
        return self.launches / self.lower_bound if self.lower_bound else 1.0

    def __str__(self) -> str:
        timing = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in {**self.seconds, **self.execution}.items())
        why = ", ".join(f"{n} x {reason}" for reason, n in sorted(self.alone.items(), key=lambda item: -item[1])[:3])
        return (
            f"{self.nodes} nodes -> {self.launches} launches ({self.scheduler}); lower bound "
            f"{self.lower_bound} (ratio {self.ratio:.2f}); {self.fallback_nodes} nodes ran one at a time"
            f"{f' ({why})' if why else ''}; {self.gathers} gathers, {self.gathers_avoided} avoided; "
            f"{self.merged_duplicates} duplicates merged" + (f"; {timing}" if timing else "")
        )


@dataclass
class PassResult:
    """``locations`` maps each output of the input graph to ``(value, row)`` in the batched
    graph: row None for a value of its own, else a row of a batched value (``as_rows``)."""

    graph: Graph
    modified: bool
    report: BatchReport
    locations: dict[str, tuple[str, int | None]] = field(default_factory=dict)


class BatchingPass:
    """Groups same-signature nodes of a graph (usually the union of many instances) and
    rewrites each group into one batched op."""

    def __init__(self, scheduler: str = "level", as_rows: bool = False) -> None:
        """``as_rows``: leave outputs that are rows of a batch where they are (see
        ``PassResult.locations``) instead of cutting each out under its own name."""
        self.scheduler_name = scheduler
        self.scheduler = get_scheduler(scheduler)
        self.as_rows = as_rows

    @without_gc
    def __call__(self, graph: Graph) -> PassResult:
        seconds: dict[str, float] = {}
        start = time.perf_counter()
        if any(graph.values[o].type is None for n in graph.nodes.values() for o in n.outputs if o):
            graph.infer_shapes()
        problem = build_problem(graph, refusal=lambda node: refusal(graph, node))
        seconds["analyse"] = time.perf_counter() - start

        start = time.perf_counter()
        schedule = self.scheduler(problem)
        seconds["schedule"] = time.perf_counter() - start

        start = time.perf_counter()
        rewriter = Rewriter(graph)
        for group in schedule:
            members = [graph.nodes[problem.node_ids[i]] for i in group]
            rewriter.run_group(members, batchable=problem.sig[group[0]] != UNBATCHABLE)
        batched, locations = rewriter.finish(self.as_rows)
        seconds["rewrite"] = time.perf_counter() - start

        stats = rewriter.stats
        report = BatchReport(
            self.scheduler_name, problem.size, len(schedule), problem.deferred_lower_bound(),
            int((problem.sig == UNBATCHABLE).sum()), stats.gathers, stats.gathers_avoided,
            stats.merged_duplicates, seconds, alone=dict(problem.alone),
        )
        return PassResult(batched, len(schedule) < problem.size, report, locations)
