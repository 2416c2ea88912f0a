"""The four tasks of ``python -m benchmarks``: instances and parameters, built the same way (fixed
seeds, same data) in every process, so that the DyNet subprocesses and the PyTorch models see
exactly the instances and weights our runs see. Imports neither DyNet nor PyTorch.

FLOP estimates (``flops``) count the matrix products only, 2 FLOPs a multiply-add, ``S`` the size:

* Tree-LSTM: a leaf ``x @ W_iou`` (S x 3S) = 6 S^2; an internal node ``[hl; hr] @ U_iou`` (2S x 3S)
  plus ``hl @ Uf1`` and ``hr @ Uf2`` (S x S each) = 16 S^2; every node ``h @ W_out`` = 10 S.
* BiLSTM tagger, per token: two LSTM directions ``x @ W + h @ U`` (S x 4S each) = 2 * 16 S^2 =
  32 S^2; the MLP ``[f; b] @ H`` (2S x S) + ``@ O`` (S x tags) = 4 S^2 + 2 S tags.
* Char tagger: the tagger's per-token cost, plus for each spelled word of L characters, L + 2
  steps (two ``<*>``) of two character LSTMs of hidden h = S/2 over 64-wide inputs:
  (L + 2) * 2 * 2 * (64 * 4h + h * 4h).
* Parser, sentence of n words: the BiLSTM over n + 1 tokens (ROOT) = 32 S^2 a token; 2n
  transitions, each an MLP ``feat @ W1`` (8S x S) + ``@ W2`` (S x 3) = 16 S^2 + 6 S.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from autobatch.datasets import sst_trees, wikiner_sentences
from autobatch.examples import bilstm_tagger, char_tagger, parser, tree_lstm
from autobatch.examples.common import Params

TASKS = ("treelstm", "bilstm", "chartagger", "parser")
TITLES = {"treelstm": "Tree-LSTM (SST)", "bilstm": "BiLSTM tagger (WikiNER)",
          "chartagger": "BiLSTM tagger with chars (WikiNER)", "parser": "Arc-hybrid parser (WikiNER)"}
CHAR_VOCABULARY_SENTENCES = 1696  # as examples/char_tagger.py: the rare-word counts come from these


@dataclass
class Task:
    name: str
    instances: Sequence[Any]
    params: Params
    source: str
    size: int

    @property
    def title(self) -> str:
        return TITLES[self.name]

    @property
    def is_parser(self) -> bool:
        return self.name == "parser"

    def functions(self) -> dict[str, Callable[..., Any]]:
        """form -> loss function (or async parse function for the parser)."""
        return {"treelstm": tree_lstm.LOSSES, "bilstm": bilstm_tagger.LOSSES, "chartagger": char_tagger.LOSSES,
                "parser": parser.PARSERS}[self.name]

    def flops(self) -> float:
        """Estimated FLOPs of a forward pass over every instance (see the module docstring)."""
        S = self.size
        total = 0.0
        if self.name == "treelstm":
            for tree in self.instances:
                for n in tree.nodes():
                    total += (6 if n.is_leaf else 16) * S * S + 10 * S
        elif self.name in ("bilstm", "chartagger"):
            tags = len(self.params.config["tags"])
            for sentence in self.instances:
                total += len(sentence) * (32 * S * S + 4 * S * S + 2 * S * tags)
                if self.name == "chartagger":
                    h = S // 2
                    for word, _ in sentence:
                        if char_tagger.is_spelled(word, self.params.config["words"]):
                            total += (len(word) + 2) * 2 * 2 * (64 * 4 * h + h * 4 * h)
        else:
            for sentence in self.instances:
                n = len(sentence)
                total += (n + 1) * 32 * S * S + 2 * n * (16 * S * S + 6 * S)
        return total


def build(name: str, count: int, size: int) -> Task:
    """``count`` instances of task ``name`` at ``size`` (embedding = hidden size), its
    parameters frozen: this is inference (``Parameter.freeze``)."""
    task = _unfrozen(name, count, size)
    task.params.freeze()
    return task


def _unfrozen(name: str, count: int, size: int) -> Task:
    if name == "treelstm":
        trees, source = sst_trees(limit=count)
        return Task(name, trees, tree_lstm.make_params(tree_lstm.make_vocabulary(trees), size=size), source, size)
    if name == "bilstm":
        sentences, source = wikiner_sentences(limit=count)
        params = bilstm_tagger.make_params(*bilstm_tagger.make_vocabularies(sentences), size=size)
        return Task(name, sentences, params, source, size)
    if name == "chartagger":
        corpus, source = wikiner_sentences(limit=max(CHAR_VOCABULARY_SENTENCES, count))
        params = char_tagger.make_params(*char_tagger.make_vocabularies(corpus), size=size)
        return Task(name, corpus[:count], params, source, size)
    if name == "parser":
        tagged, source = wikiner_sentences(limit=count)
        sentences = [[w for w, _ in s] for s in tagged]
        return Task(name, sentences, parser.make_params(parser.make_vocabulary(sentences), size=size), source, size)
    raise ValueError(f"unknown task {name!r}; choose from {TASKS}")


def arrays(params: Params) -> dict[str, Any]:
    """The parameters as NumPy arrays by name (row-vector convention: ``x @ W + b``)."""
    return {name: p.array for name, p in params.items()}
