"""BiLSTM tagger with character-based rare words (dynet-benchmark's ``bilstm-tagger-withchar``),
written for ONE sentence.

The rule for a word's vector (as dynet-benchmark's ``word_rep``): a word seen MORE than
``RARE`` = 5 times in the sentences the vocabulary was built from reads the word table ``E``;
every other word (rare, or never seen) is spelled: its characters, between two padding symbols
``<*>``, are embedded (``C``, 64 wide) and read by a forward and a backward character LSTM of
hidden size ``size // 2``, and the word vector is ``[last forward state; last backward state]``
(``size`` wide, like a table row). The rest is the BiLSTM tagger of ``examples.bilstm_tagger``.

Three forms over the same parameters: ``loss_primitive``, ``loss_cells`` (one cell per word or
character LSTM step, one per token's MLP + loss) and ``loss_sequences`` (one bidirectional
``ops.lstm`` per spelled word and one per sentence; the MLP and loss over the sentence's rows).

    python -m autobatch.examples.char_tagger [--instances 32] [--size 64] [--backends numpy,onnxruntime]
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from autobatch import ops
from autobatch.datasets import wikiner_sentences
from autobatch.examples.bilstm_tagger import Sentence, add_tagger_params, sequence_tag_losses, tag_losses
from autobatch.examples.common import (Params, Vocabulary, add_bilstm, argument_parser, bilstm_rows, lstm, measure_losses,
                                      run_all)

RARE = 5  # a word seen at most this many times is spelled with characters
CHAR_EMBEDDING = 64
PAD = "<*>"


def make_vocabularies(sentences: Sequence[Sentence]) -> tuple[Vocabulary, Vocabulary, Vocabulary]:
    """Frequent words (seen more than ``RARE`` times), characters (with ``<*>``), tags."""
    counts = Counter(w for s in sentences for w, _ in s)
    words = Vocabulary.build(w for w, c in counts.items() if c > RARE)
    words.counts = counts
    chars = Vocabulary.build([PAD, *(ch for w in counts for ch in w)])
    tags = Vocabulary.build(t for s in sentences for _, t in s)
    return words, chars, tags


def is_spelled(word: str, words: Vocabulary) -> bool:
    """The rule: rare and unknown words are spelled with characters."""
    return words.counts[word] <= RARE


def make_params(words: Vocabulary, chars: Vocabulary, tags: Vocabulary, size: int = 256, seed: int = 0) -> Params:
    """Word embedding = LSTM hidden = MLP hidden = ``size`` (even); character embedding 64,
    character LSTMs ``size // 2`` each way; fixed seed."""
    if size % 2:
        raise ValueError(f"size must be even (two character LSTMs of size // 2 make a word vector), got {size}")
    p = Params(seed, words=words, chars=chars, tags=tags, size=size)
    add_tagger_params(p, len(words), len(tags), size)
    p.add("C", len(chars), CHAR_EMBEDDING, scale=1.0)
    add_bilstm(p, "c", CHAR_EMBEDDING, size // 2)
    return p


def word_vector(word: str, p: Params, cells: bool) -> Any:
    words, chars = p.config["words"], p.config["chars"]
    if not is_spelled(word, words):
        return ops.lookup(p["E"], words[word])
    embedded = [ops.lookup(p["C"], chars[ch]) for ch in [PAD, *word, PAD]]
    forward = lstm(embedded, p, "cf", cells)[-1]
    backward = lstm(embedded[::-1], p, "cb", cells)[-1]
    return ops.concat([forward, backward])


def loss_sequences(sentence: Sentence, params: Params) -> Any:
    """Summed token NLL of one sentence; a spelled word's character BiLSTM is one op, and so is
    the sentence's BiLSTM."""
    words, chars, tags = params.config["words"], params.config["chars"], params.config["tags"]
    vectors = []
    for word, _ in sentence:
        if is_spelled(word, words):
            spelled = ops.lookup(params["C"], [chars[ch] for ch in [PAD, *word, PAD]])
            vectors.append(bilstm_rows(spelled, params, "c")[1])  # [last forward; last backward]
        else:
            vectors.append(ops.lookup(params["E"], words[word]))
    return sequence_tag_losses(ops.stack(vectors), [tags[t] for _, t in sentence], params)


def _loss(sentence: Sentence, p: Params, cells: bool) -> Any:
    tags = p.config["tags"]
    vectors = [word_vector(w, p, cells) for w, _ in sentence]
    return tag_losses(vectors, [tags[t] for _, t in sentence], p, cells)


def loss_primitive(sentence: Sentence, params: Params) -> Any:
    """Summed token NLL of one sentence, traced op by op."""
    return _loss(sentence, params, cells=False)


def loss_cells(sentence: Sentence, params: Params) -> Any:
    """Summed token NLL of one sentence: every LSTM step and the MLP + loss are cells."""
    return _loss(sentence, params, cells=True)


LOSSES = {"primitive": loss_primitive, "cells": loss_cells, "sequences": loss_sequences}


def main(argv: list[str] | None = None) -> None:
    parser = argument_parser("char_tagger", __doc__.splitlines()[0], forms=tuple(LOSSES))
    parser.add_argument("--vocabulary-sentences", type=int, default=1696,
                        help="WikiNER sentences the word counts (the rare-word rule) come from")
    args = parser.parse_args(argv)
    corpus, source = wikiner_sentences(limit=max(args.vocabulary_sentences, args.instances))
    sentences = corpus[:args.instances]
    words, chars, tags = make_vocabularies(corpus)
    params = make_params(words, chars, tags, size=args.size)
    tokens = [w for s in sentences for w, _ in s]
    spelled = sum(is_spelled(w, words) for w in tokens)
    print(f"char BiLSTM tagger, size {args.size}: {len(sentences)} sentences from {source}, "
          f"{len(tokens) / len(sentences):.1f} tokens a sentence, {spelled / len(tokens):.0%} of tokens spelled "
          f"(seen <= {RARE} times in {len(corpus)} sentences)")
    run_all(lambda form, backend: measure_losses(LOSSES[form], sentences, params, form, backend, args.repeats), args)


if __name__ == "__main__":
    main()
