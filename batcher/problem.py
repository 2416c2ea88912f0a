"""The scheduling problem: nodes with signature classes and dependencies, as flat arrays.

Built once from an IR graph; schedulers and the lower bound read only this, never networkx,
so their per-node work stays in plain Python lists and NumPy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from autobatch.batcher.signature import Signature, node_signature, shared_values
from autobatch.ir import Graph, Node

UNBATCHABLE = -1


@dataclass
class Problem:
    """Nodes are numbered 0..n-1 in a deterministic topological order.

    ``sig[i]`` is the signature class of node i (``UNBATCHABLE`` when it has none);
    ``depth[i]`` its topological generation; ``level[i]`` the largest number of nodes of its
    own class on any dependency path ending at it (itself included).
    """

    node_ids: list[int]
    sig: np.ndarray
    preds: list[list[int]]
    succs: list[list[int]]
    depth: np.ndarray
    level: np.ndarray
    classes: list[Signature] = field(default_factory=list)

    @property
    def size(self) -> int:
        return len(self.node_ids)

    def lower_bound(self) -> int:
        """ED-Batch's bound: unbatchable nodes plus, per class, its most nodes on one path."""
        unbatchable = int(np.count_nonzero(self.sig == UNBATCHABLE))
        batchable = self.sig != UNBATCHABLE
        if not batchable.any():
            return unbatchable
        per_class = np.zeros(len(self.classes), dtype=np.int64)
        np.maximum.at(per_class, self.sig[batchable], self.level[batchable])
        return unbatchable + int(per_class.sum())


def build_problem(graph: Graph, class_check: Callable[[Node], bool] | None = None) -> Problem:
    """``class_check`` is asked once per signature class, on its first node, whether the class
    can batch at all (an op without a rule cannot); a vetoed class is unbatchable."""
    order = [node.id for node in graph.topological_order()]
    index = {node_id: i for i, node_id in enumerate(order)}
    class_of: dict[Signature, int] = {}
    vetoed: set[Signature] = set()
    sig = np.full(len(order), UNBATCHABLE, dtype=np.int64)
    shared = shared_values(graph)
    for i, node_id in enumerate(order):
        node = graph.nodes[node_id]
        signature = node_signature(graph, node, shared)
        if signature is None or signature in vetoed:
            continue
        if signature not in class_of and class_check is not None and not class_check(node):
            vetoed.add(signature)
            continue
        sig[i] = class_of.setdefault(signature, len(class_of))
    preds: list[list[int]] = [[] for _ in order]
    succs: list[list[int]] = [[] for _ in order]
    for v, node_id in enumerate(order):  # dependencies from the value index: no networkx needed
        for u in sorted({index[source[0]] for source in map(graph.producer_of, graph.reads(graph.nodes[node_id]))
                         if source is not None}):
            preds[v].append(u)
            succs[u].append(v)
    depth = _depths(preds)
    level = _levels(preds, sig, len(class_of))
    return Problem(order, sig, preds, succs, depth, level, list(class_of))


def _depths(preds: list[list[int]]) -> np.ndarray:
    depth = np.zeros(len(preds), dtype=np.int64)
    for i, ps in enumerate(preds):  # nodes are in topological order
        if ps:
            depth[i] = max(depth[p] for p in ps) + 1
    return depth


def _levels(preds: list[list[int]], sig: np.ndarray, n_classes: int) -> np.ndarray:
    """Per node, the most nodes of its class on a path ending at it: a DP over the topological
    order carrying, per node, the vector of per-class path maxima (vectorised over classes)."""
    n = len(preds)
    level = np.zeros(n, dtype=np.int64)
    if n_classes == 0:
        return level
    best = np.zeros((n, n_classes), dtype=np.int32)
    for i, ps in enumerate(preds):
        if ps:
            row = best[ps].max(axis=0) if len(ps) > 1 else best[ps[0]].copy()
        else:
            row = np.zeros(n_classes, dtype=np.int32)
        if sig[i] != UNBATCHABLE:
            row[sig[i]] += 1
            level[i] = row[sig[i]]
        best[i] = row
    return level
