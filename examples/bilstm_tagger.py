"""BiLSTM tagger over WikiNER, as dynet-benchmark's ``bilstm-tagger``, written for ONE sentence.

Each word ``w_t`` is embedded (``E[w_t]``), read by a forward and a backward LSTM, and tagged by
an MLP without biases, ``scores_t = tanh([f_t; b_t] @ H) @ O`` (row-vector form of DyNet's
``O * tanh(H * [f; b])``); the loss of a sentence is the sum of its tokens'
``-log_softmax(scores_t)[tag_t]``. Words not in the vocabulary read row 0 (unknown).

Three forms over the same parameters: ``loss_primitive`` (every op one IR node),
``loss_cells`` (one cell per LSTM step and one per token's MLP + loss) and ``loss_sequences``
(the sentence as a matrix: one bidirectional ``ops.lstm``, the MLP and loss over its rows).

    python -m autobatch.examples.bilstm_tagger [--instances 32] [--size 64] [--backends numpy,onnxruntime]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from autobatch import cell, ops
from autobatch.datasets import wikiner_sentences
from autobatch.examples.common import (Params, Vocabulary, add_bilstm, argument_parser, bilstm, bilstm_rows, measure_losses,
                                      run_all)

Sentence = Sequence[tuple[str, str]]


def make_vocabularies(sentences: Sequence[Sentence]) -> tuple[Vocabulary, Vocabulary]:
    """Words and tags of these sentences."""
    return (Vocabulary.build(w for s in sentences for w, _ in s),
            Vocabulary.build(t for s in sentences for _, t in s))


def add_tagger_params(p: Params, words: int, tags: int, size: int, inputs: int | None = None) -> None:
    """Word table, forward/backward LSTMs (``wf``, ``wb``, and ``w_onnx_*`` as one
    bidirectional layer) and the MLP ``H``, ``O``."""
    inputs = inputs or size
    p.add("E", words, inputs, scale=1.0)
    add_bilstm(p, "w", inputs, size)
    p.add("H", 2 * size, size)
    p.add("O", size, tags)


def make_params(words: Vocabulary, tags: Vocabulary, size: int = 256, seed: int = 0) -> Params:
    """Embedding = LSTM hidden = MLP hidden = ``size``; fixed seed."""
    p = Params(seed, words=words, tags=tags, size=size)
    add_tagger_params(p, len(words), len(tags), size)
    return p


# ----------------------------------------------------------------------------- the tagger over word vectors
def token_loss(f: Any, b: Any, tag: Any, p: Params) -> Any:
    """``-log_softmax(tanh([f; b] @ H) @ O)[tag]``."""
    return ops.pick_neg_log_softmax(ops.matmul(ops.tanh(ops.matmul(ops.concat([f, b]), p["H"])), p["O"]), tag)


def tag_losses(vectors: Sequence[Any], tags: Sequence[int], p: Params, cells: bool) -> Any:
    """The summed NLL of a sentence given its word vectors (shared with the char tagger)."""
    states = bilstm(vectors, p, "w", cells)
    if cells:
        def mlp_loss(f: Any, b: Any, tag: Any) -> Any:
            return token_loss(f, b, tag, p)

        loss = p.cell("mlp_loss", lambda: cell(mlp_loss))
        losses = [loss(f, b, t) for (f, b), t in zip(states, tags)]
    else:
        losses = [token_loss(f, b, t, p) for (f, b), t in zip(states, tags)]
    return ops.esum(losses)


def sequence_tag_losses(x: Any, tags: Sequence[int], p: Params) -> Any:
    """The summed NLL of a sentence given its word vectors as the rows of ``x [n, d]``."""
    states, _ = bilstm_rows(x, p, "w")
    return ops.softmax_cross_entropy(ops.matmul(ops.tanh(ops.matmul(states, p["H"])), p["O"]), tags)


def loss_sequences(sentence: Sentence, params: Params) -> Any:
    """Summed token NLL of one sentence, its BiLSTM one op."""
    words, tags = params.config["words"], params.config["tags"]
    x = ops.lookup(params["E"], [words[w] for w, _ in sentence])
    return sequence_tag_losses(x, [tags[t] for _, t in sentence], params)


def _loss(sentence: Sentence, p: Params, cells: bool) -> Any:
    words, tags = p.config["words"], p.config["tags"]
    vectors = [ops.lookup(p["E"], words[w]) for w, _ in sentence]
    return tag_losses(vectors, [tags[t] for _, t in sentence], p, cells)


def loss_primitive(sentence: Sentence, params: Params) -> Any:
    """Summed token NLL of one sentence, traced op by op."""
    return _loss(sentence, params, cells=False)


def loss_cells(sentence: Sentence, params: Params) -> Any:
    """Summed token NLL of one sentence: LSTM steps and the MLP + loss are cells."""
    return _loss(sentence, params, cells=True)


LOSSES = {"primitive": loss_primitive, "cells": loss_cells, "sequences": loss_sequences}


def main(argv: list[str] | None = None) -> None:
    args = argument_parser("bilstm_tagger", __doc__.splitlines()[0], forms=tuple(LOSSES)).parse_args(argv)
    sentences, source = wikiner_sentences(limit=args.instances)
    params = make_params(*make_vocabularies(sentences), size=args.size)
    tokens = sum(len(s) for s in sentences)
    print(f"BiLSTM tagger, size {args.size}: {len(sentences)} sentences from {source}, "
          f"{tokens / len(sentences):.1f} tokens a sentence")
    run_all(lambda form, backend: measure_losses(LOSSES[form], sentences, params, form, backend, args.repeats), args)


if __name__ == "__main__":
    main()
