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

Two forms over the same parameters: ``loss_primitive`` (about 20 IR nodes per tree node) and
``loss_cells`` (one cell call per tree node).

    python -m autobatch.examples.tree_lstm [--instances 32] [--size 64] [--backends numpy,onnxruntime]
"""

from __future__ import annotations

from typing import Any

from autobatch import cell, ops
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
def leaf(word: Any, label: Any, p: Params) -> tuple[Any, Any, Any]:
    """``(h, c, nll)`` of a leaf; ``word`` and ``label`` are ints (or int64 scalar tensors in a cell)."""
    x = ops.lookup(p["E"], word)
    i, o, u = ops.split(ops.affine(x, p["W_iou"], p["b_iou"]), 3)
    c = ops.sigmoid(i) * ops.tanh(u)
    return _output(o, c, label, p)


def node(hl: Any, cl: Any, hr: Any, cr: Any, label: Any, p: Params) -> tuple[Any, Any, Any]:
    """``(h, c, nll)`` of an internal node from its children's states."""
    i, o, u = ops.split(ops.affine(ops.concat([hl, hr]), p["U_iou"], p["b_iou"]), 3)
    fl = ops.sigmoid(ops.affine(hl, p["Uf1"], p["b_f"]))
    fr = ops.sigmoid(ops.affine(hr, p["Uf2"], p["b_f"]))
    c = ops.sigmoid(i) * ops.tanh(u) + fl * cl + fr * cr
    return _output(o, c, label, p)


def _output(o: Any, c: Any, label: Any, p: Params) -> tuple[Any, Any, Any]:
    h = ops.sigmoid(o) * ops.tanh(c)
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


LOSSES = {"primitive": loss_primitive, "cells": loss_cells}


def main(argv: list[str] | None = None) -> None:
    parser = argument_parser(__doc__.splitlines()[0], forms=tuple(LOSSES))
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
