"""Arc-hybrid transition parser (unlabelled, greedy), written for ONE sentence as an ``async``
program that awaits its scores at every step; ``run_programs`` runs a minibatch of them in
lockstep, so every step's MLPs (and the BiLSTMs before the first step) run batched across
sentences even though each sentence picks its own next transition on the host.

Positions: 0 is ROOT, 1..n the words. The BiLSTM reads ``<root> w1 .. wn``; the feature vector of
a configuration is ``[v(s2); v(s1); v(s0); v(b0)]`` (top three stack items, first buffer item),
``v(i) = [forward_i; backward_i]``, and a learned padding vector ``PAD`` where an item is missing.
``scores = tanh(features @ W1 + b1) @ W2 + b2`` for SHIFT / LEFT-ARC / RIGHT-ARC; the parser takes
the best legal one:

* SHIFT: move b0 onto the stack (buffer not empty);
* LEFT-ARC: pop s0, its head is b0 (buffer not empty, s0 is not ROOT);
* RIGHT-ARC: pop s0, its head is s1 (two items on the stack).

It stops when the buffer is empty and only ROOT is left: 2n transitions, every word has a head.
The weights are random (nothing is trained here): the parses are arbitrary but deterministic.

    python -m autobatch.examples.parser [--instances 32] [--size 64] [--backends numpy,onnxruntime]
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from autobatch import Batch, cell, ops, run_programs
from autobatch.datasets import wikiner_sentences
from autobatch.frontends.tensors import current_batch
from autobatch.examples.common import Measurement, Params, Vocabulary, add_bilstm, argument_parser, bilstm, bilstm_rows, run_all

SHIFT, LEFT_ARC, RIGHT_ARC = 0, 1, 2
TRANSITIONS = ("SHIFT", "LEFT-ARC", "RIGHT-ARC")
ROOT = "<root>"

Sentence = Sequence[str]


@dataclass
class Parse:
    """``transitions``: names in order; ``heads[i]`` is the head of word ``i + 1`` (0 = ROOT)."""

    transitions: list[str] = field(default_factory=list)
    heads: list[int] = field(default_factory=list)

    @property
    def arcs(self) -> list[tuple[int, int]]:
        """``(head, dependent)`` pairs."""
        return [(h, d) for d, h in enumerate(self.heads, 1)]


def make_vocabulary(sentences: Sequence[Sentence]) -> Vocabulary:
    return Vocabulary.build([ROOT, *(w for s in sentences for w in s)])


def make_params(words: Vocabulary, size: int = 256, seed: int = 0) -> Params:
    """Embedding = LSTM hidden = MLP hidden = ``size``; fixed seed."""
    p = Params(seed, words=words, size=size)
    p.add("E", len(words), size, scale=1.0)
    add_bilstm(p, "w", size, size)
    p.add("PAD", 2 * size, scale=1.0)
    p.add("W1", 8 * size, size)
    p.add("b1", size, scale=0.1)
    p.add("W2", size, len(TRANSITIONS))
    p.add("b2", len(TRANSITIONS), scale=0.1)
    return p


def legal(stack: list[int], buffer: list[int]) -> list[int]:
    moves = []
    if buffer:
        moves.append(SHIFT)
        if stack and stack[-1] != 0:
            moves.append(LEFT_ARC)
    if len(stack) >= 2:
        moves.append(RIGHT_ARC)
    return moves


def mlp(s2: Any, s1: Any, s0: Any, b0: Any, p: Params) -> Any:
    """Transition scores from the four feature vectors."""
    hidden = ops.tanh(ops.affine(ops.concat([s2, s1, s0, b0]), p["W1"], p["b1"]))
    return ops.affine(hidden, p["W2"], p["b2"])


def features(sentence: Sentence, p: Params, form: str) -> list[Any]:
    """``v(i)`` for ROOT and every word: ``[forward_i; backward_i]``."""
    words: Vocabulary = p.config["words"]
    if form == "sequences":  # the BiLSTM one op over the sentence's rows, read back row by row
        states, _ = bilstm_rows(ops.lookup(p["E"], [words[w] for w in [ROOT, *sentence]]), p, "w")
        return [ops.index(states, i) for i in range(len(sentence) + 1)]
    embedded = [ops.lookup(p["E"], words[w]) for w in [ROOT, *sentence]]
    return [ops.concat([f, b]) for f, b in bilstm(embedded, p, "w", form == "cells")]


async def _parse(sentence: Sentence, p: Params, form: str) -> Parse:
    vectors = features(sentence, p, form)
    if form != "primitive":
        def mlp_cell(s2: Any, s1: Any, s0: Any, b0: Any) -> Any:
            return mlp(s2, s1, s0, b0, p)

        scorer = p.cell("mlp", lambda: cell(mlp_cell))
    else:
        def scorer(*features: Any) -> Any:
            return mlp(*features, p)

    # The padding vector as a value of this sentence: a Concat (or cell) that reads a shared
    # Parameter beside per-instance values has no batching rule yet and would run once per
    # sentence, so PAD is copied into the instance once (PAD + 0, batched with the others).
    pad = p["PAD"] + ops.zeros(p["PAD"].shape)

    def feature(items: list[int], k: int) -> Any:
        return vectors[items[k]] if k < len(items) else pad

    stack, buffer = [0], list(range(1, len(sentence) + 1))
    heads = [-1] * len(sentence)
    result = Parse()
    while buffer or len(stack) > 1:
        top = stack[::-1]
        scores = await scorer(feature(top, 2), feature(top, 1), feature(top, 0), feature(buffer, 0))
        move = max(legal(stack, buffer), key=lambda m: scores[m])  # first legal one on ties
        if move == SHIFT:
            stack.append(buffer.pop(0))
        elif move == LEFT_ARC:
            heads[stack.pop() - 1] = buffer[0]
        else:
            dependent = stack.pop()
            heads[dependent - 1] = stack[-1]
        result.transitions.append(TRANSITIONS[move])
    result.heads = heads
    return result


async def parse_primitive(sentence: Sentence, params: Params) -> Parse:
    """Parse one sentence (a list of words), every op one IR node."""
    return await _parse(sentence, params, "primitive")


async def parse_cells(sentence: Sentence, params: Params) -> Parse:
    """Parse one sentence; LSTM steps and the scoring MLP are cells."""
    return await _parse(sentence, params, "cells")


async def parse_sequences(sentence: Sentence, params: Params) -> Parse:
    """Parse one sentence; the BiLSTM is one op, the scoring MLP a cell."""
    return await _parse(sentence, params, "sequences")


PARSERS = {"primitive": parse_primitive, "cells": parse_cells, "sequences": parse_sequences}


def parse_all(sentences: Sequence[Sentence], params: Params, form: str = "cells", backend: str = "numpy") -> list[Any]:
    """Parse a minibatch in lockstep (``run_programs``)."""
    fn = PARSERS[form]
    return run_programs(lambda s: fn(s, params), sentences, backend=backend)


# ----------------------------------------------------------------------------- timing
class _Timed:
    """Finds the Batch ``run_programs`` made (``current_batch()`` from inside a program) and
    times its ``run_pending``; everything else is tracing and host-side decisions."""

    def __init__(self) -> None:
        self.batch: Batch | None = None
        self.run_s = 0.0

    def wrap(self, program: Any) -> Any:
        async def timed(sentence: Sentence) -> Parse:
            if self.batch is None:
                self.batch = batch = current_batch()
                run_pending = batch.run_pending

                def timed_run() -> None:
                    start = time.perf_counter()
                    run_pending()
                    self.run_s += time.perf_counter() - start

                batch.run_pending = timed_run  # type: ignore[method-assign]
            return await program(sentence)

        return timed


def measure_parses(sentences: Sequence[Sentence], params: Params, form: str, backend: str,
                   repeats: int = 1) -> Measurement:
    best: Measurement | None = None
    for round_ in range(repeats + 1):
        timer = _Timed()
        start = time.perf_counter()
        results = run_programs(timer.wrap(lambda s: PARSERS[form](s, params)), sentences, backend=backend)
        total = time.perf_counter() - start
        failures = [r for r in results if not isinstance(r, Parse)]
        if failures:
            raise SystemExit(str(failures[0]))
        reports = timer.batch.reports if timer.batch else []
        calls = sum(r.nodes for r in reports) + (timer.batch.reused_calls if timer.batch else 0)
        m = Measurement(form, backend, len(sentences), calls, total - timer.run_s, timer.run_s,
                        sum(r.launches for r in reports), sum(r.lower_bound for r in reports),
                        f"{len(reports)} lockstep rounds; first: {reports[0]}" if reports else "no rounds")
        if round_ and (best is None or total < best.trace_s + best.run_s):
            best = m
    assert best is not None
    return best


def main(argv: list[str] | None = None) -> None:
    args = argument_parser("parser", __doc__.splitlines()[0], forms=tuple(PARSERS)).parse_args(argv)
    tagged, source = wikiner_sentences(limit=args.instances)
    sentences = [[w for w, _ in s] for s in tagged]
    params = make_params(make_vocabulary(sentences), size=args.size)
    words = sum(len(s) for s in sentences)
    print(f"arc-hybrid parser, size {args.size}: {len(sentences)} sentences from {source}, "
          f"{words / len(sentences):.1f} words a sentence, {2 * words} transitions in all "
          "(tracing time includes the host-side transition choices)")
    run_all(lambda form, backend: measure_parses(sentences, params, form, backend, args.repeats), args)


if __name__ == "__main__":
    main()
