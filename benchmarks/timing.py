"""What the benchmark scripts share: the fastest of several runs after a warm-up."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def timed(run: Callable[[], Any], repeats: int) -> tuple[Any, float]:
    """``run()``'s result (from the warm-up run: sessions made, cells traced, templates planned)
    and the fastest of ``repeats`` timed runs, in seconds."""
    result = run()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return result, best
