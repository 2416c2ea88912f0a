"""The seed paper's models at test size (size 16, six instances of real data when
../shared/data is there, else the synthetic stand-ins), built once per test session."""

from __future__ import annotations

import functools
from typing import Any

from autobatch.datasets import sst_trees, wikiner_sentences
from autobatch.examples import bilstm_tagger, char_tagger, tree_lstm


def _tree_lstm() -> tuple[Any, list, Any]:
    trees, _ = sst_trees("dev", limit=6)
    return tree_lstm, trees, tree_lstm.make_params(tree_lstm.make_vocabulary(trees), size=16)


def _bilstm_tagger() -> tuple[Any, list, Any]:
    sentences, _ = wikiner_sentences(limit=6)
    return bilstm_tagger, sentences, bilstm_tagger.make_params(*bilstm_tagger.make_vocabularies(sentences), size=16)


def _char_tagger() -> tuple[Any, list, Any]:
    corpus, _ = wikiner_sentences(limit=400)  # word counts for the rare-word rule
    words, chars, tags = char_tagger.make_vocabularies(corpus)
    sentences = [s for s in corpus if len(s) <= 20][:6]
    return char_tagger, sentences, char_tagger.make_params(words, chars, tags, size=16)


MODELS = {"tree_lstm": _tree_lstm, "bilstm_tagger": _bilstm_tagger, "char_tagger": _char_tagger}


@functools.cache
def model(name: str) -> tuple[Any, list, Any]:
    """(example module, instances, parameters) of a model in ``MODELS``."""
    return MODELS[name]()
