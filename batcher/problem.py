"""The scheduling problem: nodes with signature classes and dependencies, as flat arrays.

Built once from an IR graph; schedulers and the lower bound read only this, never networkx,
so their per-node work stays in plain Python lists and NumPy.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from autobatch.batcher.int_keys import bucket_starts, stable_order
from autobatch.batcher.signature import Signature, node_signature, shared_values
from autobatch.ir import Graph, Node
from autobatch.ir.compiled import compiled

UNBATCHABLE = -1
SCHEDULING = compiled("autobatch.batcher._scheduling")  # the loops below in C, where built


@dataclass
class Problem:
    """Nodes are numbered 0..n-1 in a deterministic topological order.

    ``sig[i]`` is the signature class of node i (``UNBATCHABLE`` when it has none);
    ``depth[i]`` its topological generation; ``level[i]`` the largest number of nodes of its
    own class on any dependency path ending at it (itself included), worked out when first
    asked for: only the level scheduler and the lower bound read it. ``parts[i]``, when given,
    is the part of the problem node i is in (its instance), where no edge joins two parts.
    """

    node_ids: list[int]
    sig: np.ndarray
    preds: list[list[int]]
    depth: np.ndarray
    classes: list[Signature] = field(default_factory=list)
    alone: Counter[str] = field(default_factory=Counter)  # "op: why" -> nodes that run one at a time
    parts: np.ndarray | None = None
    _level: np.ndarray | None = field(default=None, repr=False)
    _edges: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False)
    _successors: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False)
    _succs: list[list[int]] | None = field(default=None, repr=False)
    _late_level: np.ndarray | None = field(default=None, repr=False)

    @property
    def size(self) -> int:
        return len(self.node_ids)

    @property
    def successors(self) -> tuple[np.ndarray, np.ndarray]:
        """The edges by source (stably: readers ascending) as ``(starts, readers)``: node i's
        readers are ``readers[starts[i]:starts[i + 1]]``."""
        if self._successors is None:
            src, dst = self.edges
            by_source = stable_order(src, self.size)
            self._successors = bucket_starts(src, self.size), dst[by_source]
        return self._successors

    @property
    def succs(self) -> list[list[int]]:
        """Per node, the nodes that read it (only the agenda-style schedulers walk them)."""
        if self._succs is None:
            starts, readers = self.successors
            bounds, targets = starts.tolist(), readers.tolist()
            self._succs = [targets[bounds[i]:bounds[i + 1]] for i in range(self.size)]
        return self._succs

    @property
    def edges(self) -> tuple[np.ndarray, np.ndarray]:
        """Every dependency as arrays ``(source, target)``, targets ascending."""
        if self._edges is None:
            self._edges = _edges(self.preds)
        return self._edges

    @property
    def level(self) -> np.ndarray:
        if self._level is None:
            self._level = _levels(self.edges, self.sig, len(self.classes), self.depth, self.parts)
        return self._level

    @property
    def late_level(self) -> np.ndarray:
        """Per node, the last launch of its class that it could be in without a schedule going
        past the lower bound: its class's highest level, less the most nodes of its class on a
        path starting at it, plus one (``level`` is the first; nodes that no path joins, such as a
        tagger's per-token work after its LSTMs, share their last)."""
        if self._late_level is None and not self.classes:  # every node unbatchable: no class to be late in
            self._late_level = np.zeros(self.size, dtype=np.int64)
        if self._late_level is None:
            starts, readers = self.successors
            batchable = self.sig != UNBATCHABLE
            # Generations backwards: a node's readers are all in later generations than its own.
            sources = np.repeat(np.arange(self.size), np.diff(starts))
            ahead = _levels((readers, sources), self.sig, len(self.classes),
                            self.depth.max(initial=0) - self.depth, self.parts, backwards=True)
            highest = _highest_levels(self.sig, self.level, len(self.classes))
            self._late_level = np.where(batchable, highest[np.where(batchable, self.sig, 0)] - ahead + 1, 0)
        return self._late_level

    def lower_bound(self) -> int:
        """ED-Batch's bound: unbatchable nodes plus, per class, its most nodes on one path."""
        return _lower_bound(self.sig, self.level, len(self.classes))

    def deferred_lower_bound(self) -> int | Callable[[], int]:
        """The bound now where the levels are known, else how to work it out later: a closure
        over what the levels need, for a report to resolve if asked. It holds the edges as
        arrays where they are made (the compiled depths pass), not the per-node lists: a report
        outlives its plan, and a list a node kept alive is one more object for every garbage
        collection to walk (the first after tracing walked 40,000 of them: 8 ms a Tree-LSTM
        minibatch of primitive ops)."""
        if self._level is not None:
            return self.lower_bound()
        sig, classes, depth, parts = self.sig, len(self.classes), self.depth, self.parts
        edges, preds = (self._edges, None) if self._edges is not None else (None, self.preds)
        return lambda: _lower_bound(sig, _levels(edges if edges is not None else _edges(preds), sig, classes, depth,
                                                 parts), classes)


def _lower_bound(sig: np.ndarray, level: np.ndarray, classes: int) -> int:
    return int(np.count_nonzero(sig == UNBATCHABLE)) + int(_highest_levels(sig, level, classes).sum())


def _highest_levels(sig: np.ndarray, level: np.ndarray, classes: int) -> np.ndarray:
    """Per class, its highest level: the most of its nodes on one path."""
    batchable = sig != UNBATCHABLE
    highest = np.zeros(classes, dtype=np.int64)
    np.maximum.at(highest, sig[batchable], level[batchable])
    return highest


def build_problem(graph: Graph, class_check: Callable[[Node], bool] | None = None,
                  refusal: Callable[[Node], str | None] | None = None) -> Problem:
    """``class_check`` is asked once per signature class, on its first node, whether the class
    can batch at all (an op without a rule cannot); a vetoed class is unbatchable. ``refusal``
    instead says why a class cannot (None: it can), and the problem counts the reasons."""
    order = [node.id for node in graph.topological_order()]
    index = {node_id: i for i, node_id in enumerate(order)}
    class_of: dict[Signature, int] = {}
    vetoed: dict[Signature, str] = {}
    alone: Counter[str] = Counter()
    sig = np.full(len(order), UNBATCHABLE, dtype=np.int64)
    shared = shared_values(graph)
    for i, node_id in enumerate(order):
        node = graph.nodes[node_id]
        signature = node_signature(graph, node, shared)
        if signature is None:
            alone[f"{node.qualified_op}: types not static"] += 1
            continue
        if signature not in class_of and signature not in vetoed:
            why = refusal(node) if refusal is not None else None if class_check is None or class_check(node) else \
                "vetoed"
            if why is not None:
                vetoed[signature] = why
        if signature in vetoed:
            alone[f"{node.qualified_op}: {vetoed[signature]}"] += 1
            continue
        sig[i] = class_of.setdefault(signature, len(class_of))
    preds = [  # dependencies from the value index: no networkx needed
        sorted({index[source[0]] for source in map(graph.producer_of, graph.reads(graph.nodes[node_id]))
                if source is not None})
        for node_id in order
    ]
    problem = problem_from(order, sig, preds, list(class_of))
    problem.alone = alone
    return problem


def problem_from(node_ids: list[int], sig: np.ndarray, preds: list[list[int]], classes: list[Signature],
                 parts: np.ndarray | None = None) -> Problem:
    """The problem of nodes given in topological order with their classes and predecessors
    (and ``parts``: see ``Problem``)."""
    if SCHEDULING is None:
        return Problem(node_ids, sig, preds, _depths(preds), classes, parts=parts)
    lengths = np.fromiter(map(len, preds), dtype=np.int64, count=len(preds))
    depth, sources = np.empty(len(preds), dtype=np.int64), np.empty(int(lengths.sum()), dtype=np.int64)
    SCHEDULING.depths(preds, depth, sources)  # the edges too: nearly free here
    return Problem(node_ids, sig, preds, depth, classes, parts=parts,
                   _edges=(sources, np.repeat(np.arange(len(preds)), lengths)))


def _depths(preds: list[list[int]]) -> np.ndarray:
    depth: list[int] = []
    append = depth.append
    for ps in preds:  # nodes are in topological order
        if len(ps) == 1:  # the common case, kept cheap
            append(depth[ps[0]] + 1)
            continue
        deepest = 0
        for p in ps:  # a plain loop: twice as fast as max() over a map here
            above = depth[p]
            if above >= deepest:
                deepest = above + 1
        append(deepest)
    return np.array(depth, dtype=np.int64)


def _edges(preds: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    src = np.fromiter(itertools.chain.from_iterable(preds), dtype=np.int64)
    return src, np.repeat(np.arange(len(preds)), [len(ps) for ps in preds])


def _levels(edges: tuple[np.ndarray, np.ndarray], sig: np.ndarray, n_classes: int, depth: np.ndarray,
            parts: np.ndarray | None = None, backwards: bool = False) -> np.ndarray:
    """Per node, the most nodes of its class on a path ending at it (``edges``: their targets
    ascending; ``depth``: a generation per node, above those of its sources; ``backwards``: the
    edges run from higher node numbers to lower): a DP carrying, per node, the vector of
    per-class path maxima, in C a node at a time, else run one topological generation at a time
    (every predecessor of a generation lies in an earlier one), vectorised over its nodes. With
    ``parts``, only the classes with two nodes in one part need it: a path stays in its part, so
    the others' levels are 1 (a mix of a model's instances has many classes of one node each)."""
    n = len(sig)
    if n_classes == 0 or n == 0:
        return np.zeros(n, dtype=np.int64)
    if not depth.any():  # no dependencies (a lockstep round over known values): every level is 1
        return (sig != UNBATCHABLE).astype(np.int64)
    if parts is not None:
        batchable = sig != UNBATCHABLE
        codes, counts = np.unique(sig[batchable] * (int(parts.max()) + 1) + parts[batchable], return_counts=True)
        repeated = np.unique(codes[counts > 1] // (int(parts.max()) + 1))
        compact = np.full(n_classes, UNBATCHABLE, dtype=np.int64)
        compact[repeated] = np.arange(len(repeated))
        kept = np.where(batchable, compact[np.where(batchable, sig, 0)], UNBATCHABLE)
        level = _levels(edges, kept, len(repeated), depth, backwards=backwards)
        return np.where(batchable & (kept == UNBATCHABLE), 1, level)
    src, dst = edges
    if SCHEDULING is not None:
        level = np.empty(n, dtype=np.int64)
        SCHEDULING.levels(bucket_starts(dst, n), np.ascontiguousarray(src, dtype=np.int64),
                          np.ascontiguousarray(sig, dtype=np.int64), n_classes, backwards, level)
        return level
    best = np.zeros((n, n_classes), dtype=np.int32)
    by_dst_depth = np.argsort(depth[dst], kind="stable")
    src, dst = src[by_dst_depth], dst[by_dst_depth]
    generations = int(depth.max()) + 1
    # Worked out once for all generations (the loop below runs one a generation: hundreds on chains).
    edge_bounds = np.searchsorted(depth[dst], np.arange(generations + 1))
    runs = np.flatnonzero(np.concatenate(([True], dst[1:] != dst[:-1])))  # where a node's edges start
    run_bounds = np.searchsorted(runs, edge_bounds).tolist()
    edge_bounds = edge_bounds.tolist()
    batchable = sig != UNBATCHABLE
    members = np.flatnonzero(batchable)
    members = members[np.argsort(depth[members], kind="stable")]
    member_bounds = np.searchsorted(depth[members], np.arange(generations + 1)).tolist()
    member_sig = sig[members]
    for g in range(generations):
        lo, hi = edge_bounds[g], edge_bounds[g + 1]
        first, last = run_bounds[g], run_bounds[g + 1]
        if last - first == hi - lo:  # one edge a node (or none): its predecessor's row
            best[dst[lo:hi]] = best[src[lo:hi]]
        else:  # each node's row: the maximum over its predecessors' rows
            best[dst[runs[first:last]]] = np.maximum.reduceat(best[src[lo:hi]], runs[first:last] - lo, axis=0)
        m0, m1 = member_bounds[g], member_bounds[g + 1]
        best[members[m0:m1], member_sig[m0:m1]] += 1
    level = np.zeros(n, dtype=np.int64)
    level[batchable] = best[np.flatnonzero(batchable), sig[batchable]]
    return level
