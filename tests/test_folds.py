"""Tree folds (``autobatch.fold_tree``, ``batcher/folds.py``): one record a tree, batched across
trees of any shape level by level, each tree's states equal to its cells run node by node."""

from __future__ import annotations

import numpy as np
import pytest

from autobatch import Batch, Parameter, TraceError, cell, fold_tree, ops
from autobatch.batcher.folds import LEAF, tree_levels

S, D = 4, 3


@pytest.fixture(params=["numpy", "onnxruntime"])
def backend(request):
    return request.param


def cells(seed: int = 0):
    rng = np.random.default_rng(seed)
    W = Parameter(rng.standard_normal((D, 2 * S)).astype(np.float32))
    U = Parameter(rng.standard_normal((2 * S, 2 * S)).astype(np.float32))

    @cell
    def leaf(x):
        h, c = ops.split(ops.tanh(ops.matmul(x, W)), 2)
        return h, c

    @cell
    def node(hl, cl, hr, cr):
        h, c = ops.split(ops.tanh(ops.matmul(ops.concat([hl, hr]), U)), 2)
        return h, c + cl * cr

    return leaf, node


def random_tree(rng: np.random.Generator, leaves: int) -> list[tuple[int, int] | None]:
    """A random binary tree over ``leaves`` leaves, nodes in an order with children first."""
    children: list[tuple[int, int] | None] = [None] * leaves
    roots = list(range(leaves))
    while len(roots) > 1:
        k = int(rng.integers(len(roots) - 1))
        children.append((roots[k], roots[k + 1]))
        roots[k:k + 2] = [len(children) - 1]
    return children


def node_by_node(leaf, node, rows, children):
    states = []
    leaf_inputs = iter(range(rows.shape[0]))
    for pair in children:
        states.append(leaf(ops.index(rows, next(leaf_inputs))) if pair is None else node(*states[pair[0]], *states[pair[1]]))
    return [ops.stack([s[k] for s in states]) for k in range(2)]


def assert_node_by_node(folded, leaf, node, inputs, trees, backend) -> None:
    """Each fold's states equal its tree's cells run node by node, in a batch of their own."""
    with Batch(backend=backend) as batch:
        expected = [node_by_node(leaf, node, batch.constant(x), tree) for x, tree in zip(inputs, trees)]
        batch.run([t for states in expected for t in states])
    for got, want in zip(folded, expected, strict=True):
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g.value, w.value, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("sizes", [[1, 3, 7, 2, 5, 9], [4, 4, 4]])  # trees of many shapes; of one size
def test_folds_equal_their_cells_node_by_node(backend, sizes):
    leaf, node = cells()
    rng = np.random.default_rng(len(sizes))
    trees = [random_tree(rng, n) for n in sizes]
    inputs = [rng.standard_normal((n, D)).astype(np.float32) for n in sizes]
    with Batch(backend=backend) as batch:
        folded = [fold_tree(leaf, node, batch.constant(x), tree) for x, tree in zip(inputs, trees)]
        batch.run([t for states in folded for t in states])
    assert batch.reports[-1].launches == 1  # one fold step for every tree
    assert_node_by_node(folded, leaf, node, inputs, trees, backend)


def test_a_fold_alone_equals_it_batched():
    leaf, node = cells(1)
    rng = np.random.default_rng(2)
    trees = [random_tree(rng, n) for n in (2, 6, 3)]
    inputs = [rng.standard_normal((len([c for c in t if c is None]), D)).astype(np.float32) for t in trees]
    with Batch() as batch:
        together = [fold_tree(leaf, node, batch.constant(x), t)[0] for x, t in zip(inputs, trees)]
        batch.run(together)
    for x, t, got in zip(inputs, trees, together, strict=True):
        with Batch() as batch:
            alone = fold_tree(leaf, node, batch.constant(x), t)[0]
            batch.run([alone])
        np.testing.assert_allclose(got.value, alone.value, rtol=1e-5, atol=1e-6)


def test_levels_of_trees_one_after_the_other():
    # tree A: leaves 0, 1 -> 2; tree B: leaves 3, 4, 5, (3, 4) -> 6, (6, 5) -> 7
    a = np.array([[LEAF, LEAF], [LEAF, LEAF], [0, 1]])
    b = np.array([[LEAF, LEAF], [LEAF, LEAF], [LEAF, LEAF], [0, 1], [3, 2]])
    leaves, levels = tree_levels([a, b])
    assert leaves.tolist() == [0, 1, 3, 4, 5]
    assert [(n.tolist(), l.tolist(), r.tolist()) for n, l, r in levels] == [([2, 6], [0, 3], [1, 4]), ([7], [6], [5])]


@pytest.mark.parametrize("children,words", [
    ([None, None, (0, 2)], "children must be two indices of earlier nodes"),
    ([None, None, (0,)], "children must be None or two node indices"),
    ([None, None, (0, 1), None], "3 leaves in the tree, 2 rows"),
    ([None, None, ("a", 1)], "children must be None or two node indices"),
    ([None, None, (LEAF, 0)], r"node 2's children must be two indices of earlier nodes, got \(-1, 0\)"),
    ([None, None, (1, LEAF)], r"node 2's children must be two indices of earlier nodes, got \(1, -1\)"),
    ([None, (0, 0), (-2, 1)], r"node 2's children must be two indices of earlier nodes, got \(-2, 1\)"),
])
def test_bad_trees_are_refused_by_name(children, words):
    leaf, node = cells()
    with Batch() as batch:
        with pytest.raises(TraceError, match=words):
            fold_tree(leaf, node, batch.constant(np.zeros((2, D), np.float32)), children)


@pytest.mark.parametrize("layout", ["unaligned", "strided", "big-endian", "int32"])
def test_children_arrays_of_any_layout_are_taken(layout):
    """Children as an int array need not be what the C check reads (aligned, C-ordered, native
    int64): the fold copies them into that first, and its states equal those of the list."""
    leaf, node = cells()
    pairs = np.array([[LEAF, LEAF], [LEAF, LEAF], [0, 1]], dtype=np.int64)
    children = {"unaligned": lambda: np.frombuffer(b"\0" + pairs.tobytes(), np.int64, offset=1).reshape(3, 2),
                "strided": lambda: np.repeat(pairs, 2, axis=1)[:, ::2],
                "big-endian": lambda: pairs.astype(">i8"),
                "int32": lambda: pairs.astype(np.int32)}[layout]()
    leaves = np.random.default_rng(2).standard_normal((2, D)).astype(np.float32)
    with Batch() as batch:
        got = fold_tree(leaf, node, batch.constant(leaves), children)
        want = fold_tree(leaf, node, batch.constant(leaves), [None, None, (0, 1)])
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_cells_whose_states_disagree_are_refused():
    leaf, _ = cells()

    @cell
    def node(hl, cl, hr, cr):
        return ops.concat([hl, hr]), cl

    with Batch() as batch:
        with pytest.raises(TraceError, match="they must agree"):
            fold_tree(leaf, node, batch.constant(np.zeros((2, D), np.float32)), [None, None, (0, 1)])


def test_leaves_given_as_ids_run_once_an_id(backend):
    """A leaf cell reading a word id (its lookup inside): each distinct id runs once a batch,
    and every leaf gets its id's states. Children may be an int array, LEAF for a leaf."""
    rng = np.random.default_rng(4)
    table = Parameter(rng.standard_normal((6, D)).astype(np.float32))
    _, node = cells(3)
    W = Parameter(rng.standard_normal((D, 2 * S)).astype(np.float32))

    @cell
    def word(i):
        h, c = ops.split(ops.tanh(ops.matmul(ops.lookup(table, i), W)), 2)
        return h, c

    trees = [random_tree(rng, n) for n in (5, 3, 8, 1)]
    words = [rng.integers(0, 6, len([c for c in t if c is None])) for t in trees]  # ids repeat
    shapes = [np.array([(LEAF, LEAF) if c is None else c for c in t], dtype=np.int64) for t in trees]
    with Batch(backend=backend) as batch:
        folded = [fold_tree(word, node, ids, shape) for ids, shape in zip(words, shapes)]
        batch.run([t for states in folded for t in states])
    fold_step = next(step for step in batch.last_plan.steps if step.fold)
    assert len(fold_step.fold[0].nodes) == sum(map(len, words))  # every leaf written
    assert fold_step.fold[0].repeat is not None and fold_step.fold[0].repeat.max() < len(np.unique(np.concatenate(words)))
    assert_node_by_node(folded, word, node, words, trees, backend)
