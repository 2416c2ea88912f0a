"""Launches per scheduler against the lower bound, and scheduler cost per node.

    python -m benchmarks.batcher_launches [--minibatch 64] [--big-nodes 100000] [--chain-depths 1000 10000 100000]

Tree-LSTM graphs over SST trees and BiLSTM-tagger graphs over WikiNER sentences (from
../shared/data, synthetic with the same statistics when absent): the examples' models traced
with primitive ops, size 256.
"""

from __future__ import annotations

import time

import numpy as np

from autobatch import arguments
from autobatch.batch import Batch
from autobatch.batcher import SCHEDULERS, build_problem
from autobatch.batcher.problem import problem_from
from autobatch.batcher.node_rules import refusal
from benchmarks.models import Workload, bilstm_workload, traced_graph, tree_lstm_workload


def launches_table(name: str, workload: Workload) -> None:
    loss, instances, params, source = workload
    print(f"\n{name}: {len(instances)} instances from {source}")
    print(f"  {'scheduler':<10}{'launches':>10}{'lower bound':>13}{'ratio':>8}{'fallback':>10}{'gathers':>9}{'avoided':>9}")
    for scheduler in SCHEDULERS:
        with Batch(scheduler=scheduler) as batch:
            report = batch.plan([loss(x, params) for x in instances]).report  # planned, not run
            batch.discard()
        print(f"  {scheduler:<10}{report.launches:>10}{report.lower_bound:>13}{report.ratio:>8.2f}"
              f"{report.fallback_nodes:>10}{report.gathers:>9}{report.gathers_avoided:>9}")


def scheduler_cost(target_nodes: int) -> None:
    sample = traced_graph(tree_lstm_workload(16))
    per_tree = len(sample) / 16
    union = traced_graph(tree_lstm_workload(int(target_nodes / per_tree * 1.1)))
    n = len(union)
    start = time.perf_counter()
    problem = build_problem(union, refusal=lambda node: refusal(union, node))
    analyse = time.perf_counter() - start
    print(f"\nscheduler cost on the Tree-LSTM graph of {n} nodes ({per_tree:.0f} a tree):")
    print(f"  analysis (signatures, levels, lower bound input): {analyse / n * 1e6:.1f} us/node")
    for name, scheduler in SCHEDULERS.items():
        start = time.perf_counter()
        schedule = scheduler(problem)
        elapsed = time.perf_counter() - start
        print(f"  {name:<8} {elapsed / n * 1e6:6.2f} us/node  ({len(schedule)} launches, lower bound {problem.lower_bound()})")


def chain_cost(depths: list[int], instances: int = 4, classes: int = 3) -> None:
    """Scheduling deep chains (a Loop unrolled per instance): time per node must stay flat as
    they deepen (the level scheduler was quadratic in depth: 4 x 100,000 took 386 s)."""
    print(f"\nscheduling {instances} chains of one depth, {classes} signature classes in turn:")
    print(f"  {'depth':>8}{'nodes':>9}" + "".join(f"{name + ' us/node':>20}" for name in SCHEDULERS))
    for depth in depths:
        sig = np.tile(np.arange(depth) % classes, instances)
        preds = [[k * depth + i - 1] if i else [] for k in range(instances) for i in range(depth)]
        row = []
        for scheduler in SCHEDULERS.values():
            start = time.perf_counter()
            problem = problem_from(list(range(len(sig))), sig, preds, [("", f"Op{c}") for c in range(classes)])
            schedule = scheduler(problem)
            row.append((time.perf_counter() - start) / len(sig) * 1e6)
            assert len(schedule) == problem.lower_bound() == depth
        print(f"  {depth:>8}{len(sig):>9}" + "".join(f"{cost:>20.2f}" for cost in row))


def main() -> None:
    parser = arguments.parser("python -m benchmarks.batcher_launches", __doc__.split("\n\n")[0])
    parser.add_argument("--minibatch", type=arguments.integer(1), default=64)
    parser.add_argument("--big-nodes", type=arguments.integer(1), default=100_000)
    parser.add_argument("--chain-depths", type=int, nargs="*", default=[1_000, 10_000, 100_000])
    args = parser.parse_args()
    chain_cost(args.chain_depths)
    for name, workload in (("Tree-LSTM (primitive ops)", tree_lstm_workload(args.minibatch)),
                           ("BiLSTM tagger (primitive ops)", bilstm_workload(args.minibatch))):
        launches_table(name, workload)
    scheduler_cost(args.big_nodes)


if __name__ == "__main__":
    main()
