"""What ``InferenceSession.run_batch`` costs for a new mix of instance shapes and for a mix seen
before, beside each instance run alone (``session.run``), on the serving benchmark's model.

    python -m benchmarks.plan_cost [--instances 16] [--mixes 40]

A session keeps the plans of its ``WHOLE_PLANS_KEPT`` most recent mixes as one onnxruntime
session each: past that many mixes, onnxruntime's "seen" column makes sessions again.

Every instance shape is typed once before timing (shape inference of a new shape is a cost of
its own), so a "new mix" pays planning and execution only.
"""

from __future__ import annotations

import time

import numpy as np

from autobatch import arguments
from autobatch import InferenceSession
from benchmarks.serving_load import build_model

MAX_LENGTH = 32


def mix_cost(backend: str, instances: int, mixes: int) -> tuple[float, float, float, float]:
    """Mean seconds of ``run_batch`` over ``mixes`` new mixes, then over the same mixes a second
    time (on onnxruntime each makes its plan's one session: ``backends.whole_plan``) and a third,
    and of running each batch's instances alone."""
    rng = np.random.default_rng(0)
    session = InferenceSession(build_model(), backend=backend, alone_when_faster=False)  # the plan's cost

    def instance(n: int) -> dict[str, np.ndarray]:
        return {"x": rng.standard_normal((n, 128)).astype(np.float32)}

    session.run_batch(None, [instance(n) for n in range(1, MAX_LENGTH + 1)])  # every shape typed
    batches = [[instance(int(n)) for n in rng.integers(1, MAX_LENGTH + 1, instances)] for _ in range(mixes)]
    costs = []
    for _ in range(3):  # new mixes, then the same mixes again, twice
        start = time.perf_counter()
        for batch in batches:
            session.run_batch(None, batch)
        costs.append((time.perf_counter() - start) / mixes)
    start = time.perf_counter()
    for batch in batches:
        for feeds in batch:
            session.run(None, feeds)
    return costs[0], costs[1], costs[2], (time.perf_counter() - start) / mixes


def main(argv: list[str] | None = None) -> None:
    parser = arguments.parser("python -m benchmarks.plan_cost", __doc__.splitlines()[0])
    parser.add_argument("--instances", type=arguments.integer(1), default=16)
    parser.add_argument("--mixes", type=arguments.integer(1), default=40)
    args = parser.parse_args(argv)
    print(f"{args.instances} instances a batch, lengths 1..{MAX_LENGTH}, {args.mixes} mixes")
    print(f"{'backend':12} {'new mix ms':>11} {'2nd use ms':>11} {'seen mix ms':>12} {'alone ms':>9} {'alone/new':>10} "
          f"{'alone/seen':>11}")
    for backend in ("numpy", "onnxruntime"):
        new, second, seen, alone = mix_cost(backend, args.instances, args.mixes)
        print(f"{backend:12} {new * 1e3:11.2f} {second * 1e3:11.2f} {seen * 1e3:12.2f} {alone * 1e3:9.2f} "
              f"{alone / new:9.2f}x {alone / seen:10.2f}x")


if __name__ == "__main__":
    main()
