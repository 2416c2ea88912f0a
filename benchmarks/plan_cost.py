"""What ``InferenceSession.run_batch`` costs for a new mix of instance shapes and for a mix seen
before, by the flat path and by the general path, on the serving benchmark's model.

    python -m benchmarks.plan_cost [--instances 16] [--mixes 40]

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


def mix_cost(backend: str, flat: bool, instances: int, mixes: int) -> tuple[float, float]:
    """Mean seconds of ``run_batch`` over ``mixes`` new mixes, then over the same mixes again."""
    rng = np.random.default_rng(0)
    session = InferenceSession(build_model(), backend=backend, flat=flat, alone_when_faster=False)  # the plan's cost

    def instance(n: int) -> dict[str, np.ndarray]:
        return {"x": rng.standard_normal((n, 128)).astype(np.float32)}

    session.run_batch(None, [instance(n) for n in range(1, MAX_LENGTH + 1)])  # every shape typed
    batches = [[instance(int(n)) for n in rng.integers(1, MAX_LENGTH + 1, instances)] for _ in range(mixes)]
    costs = []
    for _ in range(2):  # new mixes, then the same mixes again
        start = time.perf_counter()
        for batch in batches:
            session.run_batch(None, batch)
        costs.append((time.perf_counter() - start) / mixes)
    return costs[0], costs[1]


def main(argv: list[str] | None = None) -> None:
    parser = arguments.parser("python -m benchmarks.plan_cost", __doc__.splitlines()[0])
    parser.add_argument("--instances", type=arguments.integer(1), default=16)
    parser.add_argument("--mixes", type=arguments.integer(1), default=40)
    args = parser.parse_args(argv)
    print(f"{args.instances} instances a batch, lengths 1..{MAX_LENGTH}, {args.mixes} mixes")
    print(f"{'backend':12} {'path':8} {'new mix ms':>11} {'seen mix ms':>12}")
    for backend in ("numpy", "onnxruntime"):
        for flat in (True, False):
            new, seen = mix_cost(backend, flat, args.instances, args.mixes)
            print(f"{backend:12} {'flat' if flat else 'general':8} {new * 1e3:11.2f} {seen * 1e3:12.2f}")


if __name__ == "__main__":
    main()
