"""Tree folds (``frontends.folds.fold_tree``) in a flat plan: the folds of every tree make one
step. Its leaf cell runs once over every leaf of every tree; its node cell once a level, a
node's level being one more than its highest child's, its operands gathered from the states of
the levels below. All trees' states live in one block a state (each tree's rows after the last
tree's), so a gather is one ``take``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from autobatch.ir import ValueType
from autobatch.ir.records import FOLD_DOMAIN, FOLD_TREE, LEAF


def fold_signature(record: Any, attributes: tuple) -> tuple | None:
    """The signature of a fold record without its tree's size (every fold of the same cells
    over the same kind of rows is one class), or None for any other record."""
    if record.domain != FOLD_DOMAIN or record.op_type != FOLD_TREE:
        return None
    rows, structure, *shared = record.entries
    entries = (("rows", rows.elem_type, rows.shape[1:]), ("rows", structure.elem_type, structure.shape[1:]), *shared)
    return ("fold", attributes, entries, tuple(map(bool, record.outputs)))


@dataclass(frozen=True)
class Fold:
    """The template of a class of folds: the step is worked out from its members (``flat``)."""


@dataclass
class Level:
    """One launch of a fold: ``template`` over the stacked ``operands`` (per operand: the index
    of the state it reads, ``LEAF`` for the leaf inputs, and its rows), writing every state's
    ``nodes`` rows (row ``repeat[j]`` of its result for ``nodes[j]``, when set)."""

    template: Any  # flat.Template
    weights: list[str]  # per fed input of the template: the weight's name
    operands: list[tuple[int, np.ndarray | slice]]
    nodes: np.ndarray
    repeat: np.ndarray | None = None  # the launch's row for each node (its members are distinct leaves)


def tree_levels(matrices: list[np.ndarray]) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray, np.ndarray]]]:
    """For trees (children matrices, one after the other): the rows of their leaves (in the order
    their inputs are), and per level from 1 up, its nodes' rows and their left and right
    children's rows."""
    offsets = np.cumsum([0] + [len(m) for m in matrices[:-1]])
    children = np.concatenate([np.where(m == LEAF, LEAF, m + offset) for m, offset in zip(matrices, offsets)])
    internal = np.flatnonzero(children[:, 0] != LEAF)
    level = np.zeros(len(children), dtype=np.int64)
    left, right = children[internal, 0], children[internal, 1]
    while True:  # as many rounds as the deepest tree is high
        higher = 1 + np.maximum(level[left], level[right])
        if np.array_equal(higher, level[internal]):
            break
        level[internal] = higher
    order = internal[np.argsort(level[internal], kind="stable")]
    bounds = np.searchsorted(level[order], np.arange(1, int(level.max(initial=0)) + 2))
    levels = [(nodes, children[nodes, 0], children[nodes, 1])
              for nodes in (order[lo:hi] for lo, hi in zip(bounds, bounds[1:]))]
    return np.flatnonzero(children[:, 0] == LEAF), levels


def state_types(record: Any) -> list[ValueType]:
    """The type of one node's state, per output of a fold record."""
    return [ValueType.tensor(vtype.dtype, vtype.shape[1:]) for vtype in record.types]
