"""Lockstep programs (``run_programs``) with each round made from the plan of an earlier round
like it (``batcher.rounds``), beside every round planned anew (``Batch(reuse_rounds=False)``):
the parser of ``examples.parser`` (sequences form: one scoring call a program a round) and a
greedy LSTM decoder (an LSTM step and an output cell reading its state, a program a round).

    python -m benchmarks.lockstep_rounds [--programs 64] [--size 256] [--repeats 5]

Each way's minibatch is timed (fastest of ``--repeats`` after a warm-up, onnxruntime), with its
planning a round (the reports' seconds) and how many rounds were made from a plan; both ways'
results must agree.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from autobatch import Batch, Parameter, ProgramFailure, cell, ops, run_programs
from autobatch import arguments
from autobatch.datasets import wikiner_sentences
from autobatch.examples import parser
from autobatch.examples.common import lstm_step

VOCABULARY = 50


def decoder(size: int) -> Callable[[tuple[int, int]], Any]:
    """An async greedy decoder: ``(first token, length)`` -> its tokens (random frozen weights)."""
    rng = np.random.default_rng(0)

    def weight(*shape: int, scale: float) -> Parameter:
        return Parameter(rng.standard_normal(shape).astype(np.float32) * scale).freeze()

    E, W, U, b, O = weight(VOCABULARY, size, scale=0.1), weight(size, 4 * size, scale=0.05), \
        weight(size, 4 * size, scale=0.05), weight(4 * size, scale=0.1), weight(size, VOCABULARY, scale=0.1)
    step = cell(lambda x, h, c: lstm_step(x, h, c, W, U, b))
    out = cell(lambda h: ops.matmul(h, O))

    async def decode(job: tuple[int, int]) -> list[int]:
        token, length = job
        h = c = ops.zeros((size,))
        tokens = []
        for _ in range(length):
            h, c = step(ops.lookup(E, token), h, c)
            token = int(np.argmax(await out(h)))
            tokens.append(token)
        return tokens

    return decode


def measure(program: Callable[[Any], Any], inputs: Sequence[Any], reuse: bool, repeats: int
            ) -> tuple[list[Any], float, float, int, int]:
    """(results, fastest seconds, planning seconds a round, rounds made from a plan, rounds)."""
    best: tuple[list[Any], float, float, int, int] | None = None
    for _ in range(repeats + 1):  # the first warms up
        batch = Batch("onnxruntime", reuse_rounds=reuse)
        start = time.perf_counter()
        results = run_programs(program, inputs, batch=batch)
        seconds = time.perf_counter() - start
        failed = [result for result in results if isinstance(result, ProgramFailure)]
        if failed:
            raise SystemExit(str(failed[0]))
        rounds = len(batch.reports)
        planning = sum(sum(report.seconds.values()) for report in batch.reports) / rounds
        if best is None or seconds < best[1]:
            best = (results, seconds, planning, batch.reused_rounds, rounds)
    assert best is not None
    return best


def main(argv: list[str] | None = None) -> None:
    args = arguments.parser("python -m benchmarks.lockstep_rounds", __doc__.splitlines()[0])
    args.add_argument("--programs", type=arguments.integer(1), default=64)
    args.add_argument("--size", type=arguments.integer(2), default=256)
    args.add_argument("--repeats", type=arguments.integer(1), default=5)
    options = args.parse_args(argv)
    sentences = [[word for word, _ in s] for s in wikiner_sentences(limit=options.programs)[0]]
    params = parser.make_params(parser.make_vocabulary(sentences), size=options.size).freeze()
    tasks = {
        "parser (sequences)": (lambda s: parser.parse_sequences(s, params), sentences),
        "greedy decoder": (decoder(options.size), [(k % VOCABULARY, 20 + k % 17) for k in range(options.programs)]),
    }
    print(f"{options.programs} programs, size {options.size}, onnxruntime, fastest of {options.repeats}")
    print(f"{'task':20} {'rounds':24} {'ms':>8} {'planning us a round':>20} {'made from a plan':>17}")
    for name, (program, inputs) in tasks.items():
        timings = {}
        for reuse, way in ((False, "every one planned"), (True, "made from a plan")):
            results, seconds, planning, reused, rounds = measure(program, inputs, reuse, options.repeats)
            timings[reuse] = (results, seconds)
            print(f"{name:20} {way:24} {seconds * 1e3:8.1f} {planning * 1e6:20.0f} {f'{reused} of {rounds}':>17}")
        print(f"{'':20} made from a plan: {timings[False][1] / timings[True][1]:.2f}x; results agree: "
              f"{'yes' if timings[False][0] == timings[True][0] else 'NO'}")


if __name__ == "__main__":
    main()
