"""``run_graphs``: instances given as IR graphs of their own, which may differ in structure (a
per-instance program each), batched by one plan and run once.

``InferenceSession.run_batch`` is this for instances of one model, with what it planned kept
across batches; here nothing is kept.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from autobatch.backends.baked_weights import WeightSnapshots
from autobatch.backends.control_flow import CONTROL_FLOW
from autobatch.backends.interpreter import FeedError, check_feeds
from autobatch.batcher import BatchReport, get_scheduler
from autobatch.batcher.instances import instance_records
from autobatch.batcher.plan import TemplateCache
from autobatch.executors import flat_executor
from autobatch.ir import Graph
from autobatch.ir.types import type_of_value
from autobatch.typed_instances import plan_instances, typed_instance


def run_graphs(graphs: Sequence[Graph], feeds_list: Sequence[Mapping[str, Any]], backend: str = "numpy",
               scheduler: str = "level", threads: int = 0) -> tuple[list[list[np.ndarray]], BatchReport]:
    """Output j of instance k at ``[k][j]``, instance k being ``graphs[k]`` run on
    ``feeds_list[k]``, all batched by one plan; and the plan's report. The graphs are of one
    opset and hold no If, Loop or Scan (a session unrolls those per instance)."""
    if len(graphs) != len(feeds_list):
        raise ValueError(f"{len(graphs)} graphs and {len(feeds_list)} feeds: one feeds a graph")
    get_scheduler(scheduler)
    if len({tuple(sorted(g.opset_imports.items())) for g in graphs}) > 1:
        raise ValueError("the graphs import different opsets; batch graphs of one opset")
    for k, graph in enumerate(graphs):
        if any(node.op_type in CONTROL_FLOW and not node.domain for node in graph.nodes.values()):
            raise ValueError(f"graph {k} has control flow: run it through an InferenceSession, which unrolls it")
    checked = []
    for k, (graph, feeds) in enumerate(zip(graphs, feeds_list)):
        try:
            checked.append(check_feeds(graph, feeds))
        except FeedError as error:
            raise FeedError(f"instance {k}: {error}") from None
    typed = [typed_instance(g, {name: type_of_value(v) for name, v in f.items()}) for g, f in zip(graphs, checked)]
    union_feeds = {f"i{k}/{name}": value for k, feeds in enumerate(checked) for name, value in feeds.items()}
    functions = {key: f for graph in graphs for key, f in graph.functions.items()}
    plan, weights, wanted = plan_instances([instance_records(graph) for graph in typed],
                                           [graph.outputs for graph in graphs], union_feeds, functions,
                                           graphs[0].opset_imports if graphs else {}, scheduler, cache=TemplateCache())
    values = flat_executor(backend, threads, snapshots=WeightSnapshots()).run(plan, weights, union_feeds)
    found = iter([values[plan.locations[name]] for name in wanted])
    return [[next(found) for _ in graph.outputs] for graph in graphs], plan.report
