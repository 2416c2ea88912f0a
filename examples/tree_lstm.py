"""Binary Tree-LSTM over SST trees, as dynet-benchmark's ``treenn``, written for ONE tree.

Leaf (a preterminal with its word ``x = E[word]``)::

    [i; o; u] = x @ W_iou + b_iou          c = sigmoid(i) * tanh(u)
Internal node (children ``(hl, cl)``, ``(hr, cr)``), two forget gates::

    [i; o; u] = [hl; hr] @ U_iou + b_iou
    fl = sigmoid(hl @ Uf1 + b_f)           fr = sigmoid(hr @ Uf2 + b_f)
    c = sigmoid(i) * tanh(u) + fl * cl + fr * cr
Every node: ``h = sigmoid(o) * tanh(c)`` and a 5-way NLL ``-log_softmax(h @ W_out)[label]``;
the loss of a tree is the sum of its nodes' NLLs. The gate matrices of dynet-benchmark (one per
gate) are stored side by side (``W_iou``), which is the same model.

Three forms over the same parameters: ``loss_primitive`` (about 20 IR nodes per tree node),
``loss_cells`` (one cell call per tree node) and ``loss_fold`` (the tree's states as one
``autobatch.fold_tree`` over its shape, the losses over its nodes' rows).

    python -m autobatch.examples.tree_lstm [--instances 32] [--size 64] [--backends numpy,onnxruntime]
"""

from __future__ import annotations

from typing import Any

import numpy as np

from autobatch import cell, fold_tree, ops
from autobatch.ir.records import LEAF
from autobatch.datasets import Tree, sst_trees
from autobatch.frontends.cells import Cell
from autobatch.examples.common import Params, Vocabulary, argument_parser, measure_losses, run_all

CLASSES = 5


def make_vocabulary(trees: list[Tree]) -> Vocabulary:
    return Vocabulary.build(leaf.word for tree in trees for leaf in tree.leaves())


def make_params(vocabulary: Vocabulary, size: int = 256, seed: int = 0) -> Params:
    """Embedding size = hidden size = ``size``; fixed seed."""
    p = Params(seed, vocabulary=vocabulary, size=size)
    p.add("E", len(vocabulary), size, scale=1.0)
    p.add("W_iou", size, 3 * size)
    p.add("b_iou", 3 * size, scale=0.1)
    p.add("U_iou", 2 * size, 3 * size)
    p.add("Uf1", size, size)
    p.add("Uf2", size, size)
    p.add("b_f", size, scale=0.1)
    p.add("W_out", size, CLASSES)
    return p


# ----------------------------------------------------------------------------- one tree node, primitive ops
def leaf_state(x: Any, p: Params) -> tuple[Any, Any]:
    """``(h, c)`` of a leaf whose word vector is ``x``."""
    i, o, u = ops.split(ops.affine(x, p["W_iou"], p["b_iou"]), 3)
    c = ops.sigmoid(i) * ops.tanh(u)
    return ops.sigmoid(o) * ops.tanh(c), c


def node_state(hl: Any, cl: Any, hr: Any, cr: Any, p: Params) -> tuple[Any, Any]:
    """``(h, c)`` of an internal node from its children's states."""
    i, o, u = ops.split(ops.affine(ops.concat([hl, hr]), p["U_iou"], p["b_iou"]), 3)
    fl = ops.sigmoid(ops.affine(hl, p["Uf1"], p["b_f"]))
    fr = ops.sigmoid(ops.affine(hr, p["Uf2"], p["b_f"]))
    c = ops.sigmoid(i) * ops.tanh(u) + fl * cl + fr * cr
    return ops.sigmoid(o) * ops.tanh(c), c


def leaf(word: Any, label: Any, p: Params) -> tuple[Any, Any, Any]:
    """``(h, c, nll)`` of a leaf; ``word`` and ``label`` are ints (or int64 scalar tensors in a cell)."""
    h, c = leaf_state(ops.lookup(p["E"], word), p)
    return h, c, ops.pick_neg_log_softmax(ops.matmul(h, p["W_out"]), label)


def node(hl: Any, cl: Any, hr: Any, cr: Any, label: Any, p: Params) -> tuple[Any, Any, Any]:
    """``(h, c, nll)`` of an internal node from its children's states."""
    h, c = node_state(hl, cl, hr, cr, p)
    return h, c, ops.pick_neg_log_softmax(ops.matmul(h, p["W_out"]), label)


def _cells(p: Params) -> tuple[Cell, Cell]:
    """The same node functions as cells (made once per parameter set)."""
    def leaf_cell(word: Any, label: Any) -> tuple[Any, Any, Any]:
        return leaf(word, label, p)

    def node_cell(hl: Any, cl: Any, hr: Any, cr: Any, label: Any) -> tuple[Any, Any, Any]:
        return node(hl, cl, hr, cr, label, p)

    return p.cell("leaf", lambda: cell(leaf_cell)), p.cell("node", lambda: cell(node_cell))


# ----------------------------------------------------------------------------- one tree
def _loss(tree: Tree, p: Params, cells: bool) -> Any:
    vocabulary: Vocabulary = p.config["vocabulary"]
    leaf_fn, node_fn = _cells(p) if cells else (lambda w, y: leaf(w, y, p), lambda *a: node(*a, p))
    state: dict[int, tuple[Any, Any]] = {}
    losses = []
    for n in tree.nodes():  # children before parents
        if n.is_leaf:
            h, c, nll = leaf_fn(vocabulary[n.word], n.label)
        else:
            (hl, cl), (hr, cr) = state.pop(id(n.left)), state.pop(id(n.right))
            h, c, nll = node_fn(hl, cl, hr, cr, n.label)
        state[id(n)] = (h, c)
        losses.append(nll)
    return ops.esum(losses)


def loss_primitive(tree: Tree, params: Params) -> Any:
    """Summed node NLL of one tree, traced op by op."""
    return _loss(tree, params, cells=False)


def loss_cells(tree: Tree, params: Params) -> Any:
    """Summed node NLL of one tree, one cell call per tree node."""
    return _loss(tree, params, cells=True)


def loss_fold(tree: Tree, params: Params) -> Any:
    """Summed node NLL of one tree: its states as one fold over its shape, the NLLs over rows."""
    vocabulary: Vocabulary = params.config["vocabulary"]
    index: dict[int, int] = {}
    words, children, labels = [], [], []  # children: two entries a node, LEAF twice for a leaf
    for k, n in enumerate(tree.nodes()):  # children before parents
        index[id(n)] = k
        if n.is_leaf:
            words.append(vocabulary[n.word])
            children += (LEAF, LEAF)
        else:
            children += (index[id(n.left)], index[id(n.right)])
        labels.append(n.label)
    # The leaf cell reads a word id (its lookup inside): a word's leaf state is computed once a batch.
    leaf_cell = params.cell("word_state", lambda: cell(lambda word: leaf_state(ops.lookup(params["E"], word), params)))
    node_cell = params.cell("node_state", lambda: cell(lambda hl, cl, hr, cr: node_state(hl, cl, hr, cr, params)))
    shape = np.array(children, dtype=np.int64).reshape(-1, 2)
    h, _ = fold_tree(leaf_cell, node_cell, np.array(words, dtype=np.int64), shape)
    return ops.softmax_cross_entropy(ops.matmul(h, params["W_out"]), labels)


LOSSES = {"primitive": loss_primitive, "cells": loss_cells, "fold": loss_fold}


def main(argv: list[str] | None = None) -> None:
    parser = argument_parser("tree_lstm", __doc__.splitlines()[0], forms=tuple(LOSSES))
    parser.add_argument("--split", default="dev", help="SST split in ../shared/data/sst (train falls back to synthetic "
                                                       "when absent)")
    args = parser.parse_args(argv)
    trees, source = sst_trees(args.split, limit=args.instances)
    params = make_params(make_vocabulary(trees), size=args.size)
    nodes = sum(len(t.nodes()) for t in trees)
    print(f"Tree-LSTM, size {args.size}: {len(trees)} trees from {source}, {nodes / len(trees):.1f} nodes a tree")
    run_all(lambda form, backend: measure_losses(LOSSES[form], trees, params, form, backend, args.repeats), args)


if __name__ == "__main__":
    main()
