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


def print_against(seconds: dict[str, float], baseline: str, show: Callable[[float], str]) -> None:
    """A line a system: its time as ``show`` puts it, and how many times faster than ``baseline``'s."""
    for name, value in seconds.items():
        print(f"  {name:50} {show(value)}   {seconds[baseline] / value:5.2f}x onnxruntime alone")


def onnxruntime_alone(model: Any, threads: int) -> Any:
    """onnxruntime's own CPU session of ``model`` (an ``onnx.ModelProto``), on ``threads`` threads."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
