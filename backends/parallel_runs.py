"""Instances run alone, several at once: the way a batch runs alone on onnxruntime's CPU.

One instance of a small model (an exported tagger, a small BERT over a short text) is too little
work to keep several intra-op threads busy: each op wakes them for microseconds of work. Run
one instance per thread instead, each on a session of one intra-op thread, and every core does
a whole instance's work. Measured on this repository's 2-core CPU, 64 texts of each exported
model (benchmarks/README.md), median of 15 rounds: 1.1x-1.4x onnxruntime's own default of one
instance at a time on both cores. Each instance still runs the model alone, on the same kernels,
so its results are those of ``InferenceSession.run`` (one intra-op thread partitions a GEMM's
rows, not its sums, differently).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from autobatch.backends.ort_backend import OrtBackendRep
from autobatch.backends.ort_runtime import run_session
from autobatch.ir import Graph
from autobatch.ir.limits import deadline, remaining


class ParallelRuns:
    """``run`` instances on ``callers`` threads at once (the calling thread is one of them),
    each instance on a one-thread session of ``graph``. The session is a second copy of the
    model (and its weights), made on first use; the threads wait in a pool between batches."""

    def __init__(self, graph: Graph, providers: Sequence[str], callers: int) -> None:
        if callers < 2:
            raise ValueError(f"running instances at once needs 2 callers or more, not {callers}")
        self.graph, self.providers, self.callers = graph, providers, callers
        self._session: Any = None
        self._pool = ThreadPoolExecutor(callers - 1, thread_name_prefix="autobatch-alone")

    def run(self, names: list[str], feeds_list: Sequence[Mapping[str, Any]]) -> list[list[Any]]:
        """Each instance's ``names`` outputs, in order. Every caller takes the next instance not
        taken (long and short ones balance out); the caller's deadline holds on every thread.
        Where instances fail, the others stop taking new ones and the first failed instance's
        error is raised once every thread is done."""
        if self._session is None:
            self._session = OrtBackendRep(self.graph, self.providers, threads=1).session
        results: list[Any] = [None] * len(feeds_list)
        errors: dict[int, BaseException] = {}
        taken = iter(range(len(feeds_list)))
        stopped: list[bool] = []  # the caller left (an error, an interrupt): take no more
        lock = threading.Lock()
        seconds = remaining()
        at = None if seconds is None else time.monotonic() + seconds

        def work() -> None:
            with deadline(None if at is None else at - time.monotonic()):
                while not errors and not stopped:
                    with lock:
                        k = next(taken, None)
                    if k is None:
                        return
                    try:
                        results[k] = run_session(self._session.run, names, feeds_list[k])
                    except Exception as error:  # raised below, in the caller's thread
                        errors[k] = error

        helpers = [self._pool.submit(work) for _ in range(min(self.callers, len(feeds_list)) - 1)]
        try:
            work()
        finally:
            stopped.append(True)
            for helper in helpers:  # each ends with the run it is in
                helper.result()
        if errors:
            raise errors[min(errors)]
        return results
