"""``fold_tree``: a tree's cells as ONE traced op, batched across trees of any shape level by
level (``batcher.folds``).

Written node by node, a Tree-LSTM traces a cell call for every tree node, and planning handles
every call. Folded, each tree is one record: its leaves' inputs as rows, its shape as data (each
node's children), and the two cells. The batch then runs the leaf cell once over every leaf of
every tree, and the node cell once a level (a node's level: one more than its highest child's),
its operands gathered from the states below: what hand-batched Tree-LSTM code does.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from autobatch.ir.records import FOLD_DOMAIN, FOLD_TREE, LEAF
from autobatch.frontends import recorder
from autobatch.frontends.cells import CELL_DOMAIN, Cell
from autobatch.frontends.ops import _tensors
from autobatch.frontends.tensors import PreparedCall, Tensor, TraceError, attributes
from autobatch.ir import ValueType



def fold_tree(leaf: Cell, node: Cell, leaves: Tensor, children: Sequence[tuple[int, int] | None]) -> tuple[Tensor, ...]:
    """The states of every node of one binary tree, bottom up: ``leaf(x)`` for a leaf (``x`` the
    next row of ``leaves [L, d]``), ``node(*left_states, *right_states)`` for an internal node.
    ``children[k]`` is None for a leaf, else the indices of node k's children, both before k
    (or ``children`` is an int array ``[nodes, 2]``, ``LEAF`` = -1 twice for a leaf). Leaves
    given as ids (ints ``[L]``, the leaf cell reading one) are run once an id a batch.
    Returns each state of every node, in node order: ``[len(children), *state_shape]``."""
    (rows,) = _tensors(FOLD_TREE, leaves)
    batch = rows.batch
    if rows.ndim < 1 or not rows.shape[0]:
        raise TraceError(f"{FOLD_TREE}: leaves must be rows [L, ...] with L > 0, got {rows.shape}")
    matrix = _children_matrix(children, rows.shape[0])
    cells = (FOLD_TREE, leaf, node, rows.shape[1:], rows.dtype)
    calls = batch.cell_calls.get(cells)
    if calls is None:  # the first fold of these cells over rows like these in this batch
        calls = batch.cell_calls[cells] = _prepare(leaf, node, rows)
    leaf_call, node_call = calls
    structure = batch.constant(matrix)
    shared = leaf_call.shared + node_call.shared
    shapes = [(len(matrix), *shape) for shape in leaf_call.shapes]
    types = [ValueType.tensor(dtype, shape) for shape, dtype in zip(shapes, leaf_call.dtypes)]
    attrs = attributes(leaf=leaf_call.op_type, node=node_call.op_type, leaf_parameters=len(leaf_call.shared),
                       cells=CELL_DOMAIN)
    return tuple(batch._append(FOLD_TREE, FOLD_DOMAIN, batch._reads([rows, structure]),
                               [rows.name, structure.name, *shared], attrs, shapes, list(leaf_call.dtypes), types,
                               (rows.entry, structure.entry, *shared), (cells, rows.entry, structure.entry), None))


def _prepare(leaf: Cell, node: Cell, rows: Tensor) -> tuple[PreparedCall, PreparedCall]:
    """The two cells traced for a row of ``rows`` and for two nodes' states; their states agree."""
    batch = rows.batch
    row = Tensor(batch, "fold_leaf_input", rows.shape[1:], rows.dtype)
    leaf_call = leaf._prepare(batch, [row], (row.entry,))
    states = [Tensor(batch, f"fold_state{k}", shape, dtype)
              for k, (shape, dtype) in enumerate(zip(leaf_call.shapes, leaf_call.dtypes))]
    node_call = node._prepare(batch, states + states, tuple(s.entry for s in states + states))
    if list(zip(node_call.shapes, node_call.dtypes)) != list(zip(leaf_call.shapes, leaf_call.dtypes)):
        raise TraceError(f"{FOLD_TREE}: the node cell returns {list(zip(node_call.shapes, map(str, node_call.dtypes)))}, "
                         f"the leaf cell {list(zip(leaf_call.shapes, map(str, leaf_call.dtypes)))}: they must agree")
    return leaf_call, node_call


def _children_matrix(children: Sequence[tuple[int, int] | None] | np.ndarray, rows: int) -> np.ndarray:
    """``[nodes, 2]`` int64: a node's children, ``LEAF`` twice for a leaf; checked."""
    try:
        if isinstance(children, np.ndarray):
            if children.dtype.kind not in "iu":
                raise TypeError
            matrix = children.astype(np.int64, copy=False).reshape(len(children), 2)
        else:
            pairs = [(LEAF, LEAF) if pair is None else pair for pair in children]
            matrix = np.array(pairs, dtype=np.int64).reshape(len(pairs), 2)
    except (ValueError, TypeError):
        raise TraceError(f"{FOLD_TREE}: children must be None or two node indices each (or an int array [n, 2], "
                         f"{LEAF} for a leaf), got {list(children)[:8]!r}") from None
    bad, leaves = _fold_children(np.require(matrix, np.int64, "CA"))  # C order, aligned: as the C reads it
    if bad >= 0:
        raise TraceError(f"{FOLD_TREE}: node {bad}'s children must be two indices of earlier nodes, got "
                         f"{tuple(matrix[bad].tolist())}")
    if leaves != rows:
        raise TraceError(f"{FOLD_TREE}: {leaves} leaves in the tree, {rows} rows of leaf inputs")
    return matrix


def fold_children(matrix: np.ndarray) -> tuple[int, int]:
    """A tree's children ``[n, 2]`` (int64, C order) checked: (the first node whose children are
    neither ``LEAF`` twice nor two indices of earlier nodes, -1 where none; the number of leaves
    before it). ``_recorder.fold_children``'s twin."""
    left, right = matrix[:, 0], matrix[:, 1]
    leaf = (left == LEAF) & (right == LEAF)
    ok = leaf | ((np.minimum(left, right) >= 0) & (np.maximum(left, right) < np.arange(len(matrix))))
    bad = -1 if ok.all() else int(np.argmin(ok))
    return bad, int(np.count_nonzero(leaf[:bad] if bad >= 0 else leaf))


# The check runs once a traced tree: in C where built (5.7 us a tree of 39 nodes in NumPy).
_fold_children = recorder.compiled.fold_children if recorder.compiled else fold_children
