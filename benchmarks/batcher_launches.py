"""Launches per scheduler against the lower bound, and scheduler cost per node.

    python -m benchmarks.batcher_launches [--minibatch 64] [--big-nodes 100000]

Tree-LSTM graphs over SST trees and BiLSTM-tagger graphs over WikiNER sentences (from
../shared/data, synthetic with the same statistics when absent), built with primitive ops.
"""

from __future__ import annotations

import argparse
import time

from autobatch.batcher import SCHEDULERS, BatchingPass, build_problem
from autobatch.batcher.rewrite import has_rule
from autobatch.datasets import sst_trees, wikiner_sentences
from autobatch.ir import Graph
from autobatch.zoo import bilstm_params, bilstm_tagger_graph, tree_lstm_graph, tree_lstm_params

SIZE = 256


def tree_graphs(count: int) -> tuple[list[Graph], str]:
    trees, source = sst_trees(limit=count)
    vocabulary = {w: i for i, w in enumerate(sorted({leaf.word for t in trees for leaf in t.leaves()}))}
    params = tree_lstm_params(len(vocabulary), SIZE)
    return [tree_lstm_graph(t, vocabulary, params) for t in trees], source


def sentence_graphs(count: int) -> tuple[list[Graph], str]:
    sentences, source = wikiner_sentences(limit=count)
    words = {w: i for i, w in enumerate(sorted({w for s in sentences for w, _ in s}))}
    tags = {t: i for i, t in enumerate(sorted({t for s in sentences for _, t in s}))}
    params = bilstm_params(len(words), len(tags), SIZE)
    return [bilstm_tagger_graph([words[w] for w, _ in s], [tags[t] for _, t in s], params) for s in sentences], source


def launches_table(name: str, graphs: list[Graph], source: str) -> None:
    union = Graph.union(graphs)
    print(f"\n{name}: {len(graphs)} instances from {source}, {len(union)} nodes")
    print(f"  {'scheduler':<10}{'launches':>10}{'lower bound':>13}{'ratio':>8}{'fallback':>10}{'gathers':>9}{'avoided':>9}")
    for scheduler in SCHEDULERS:
        report = BatchingPass(scheduler)(union).report
        print(f"  {scheduler:<10}{report.launches:>10}{report.lower_bound:>13}{report.ratio:>8.2f}"
              f"{report.fallback_nodes:>10}{report.gathers:>9}{report.gathers_avoided:>9}")


def scheduler_cost(target_nodes: int) -> None:
    sample, _ = tree_graphs(64)
    per_tree = sum(len(g) for g in sample) / len(sample)
    graphs, _ = tree_graphs(int(target_nodes / per_tree * 1.1))
    union = Graph.union(graphs)
    n = len(union)
    start = time.perf_counter()
    problem = build_problem(union, lambda node: has_rule(union, node))
    analyse = time.perf_counter() - start
    print(f"\nscheduler cost on a Tree-LSTM union of {len(graphs)} trees, {n} nodes ({per_tree:.0f} a tree):")
    print(f"  analysis (signatures, levels, lower bound input): {analyse / n * 1e6:.1f} us/node")
    for name, scheduler in SCHEDULERS.items():
        start = time.perf_counter()
        schedule = scheduler(problem)
        elapsed = time.perf_counter() - start
        print(f"  {name:<8} {elapsed / n * 1e6:6.2f} us/node  ({len(schedule)} launches, lower bound {problem.lower_bound()})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minibatch", type=int, default=64)
    parser.add_argument("--big-nodes", type=int, default=100_000)
    args = parser.parse_args()
    launches_table("Tree-LSTM", *tree_graphs(args.minibatch))
    launches_table("BiLSTM tagger", *sentence_graphs(args.minibatch))
    scheduler_cost(args.big_nodes)


if __name__ == "__main__":
    main()
