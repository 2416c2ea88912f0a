"""Instances run alone, several at once: the way a batch runs alone on onnxruntime's CPU.

One instance of a small model (an exported tagger, a small BERT over a short text) is too little
work to keep several intra-op threads busy: each op wakes them for microseconds of work. Run
one instance per thread instead, each on a session of one intra-op thread, and every core does
a whole instance's work. Measured on this repository's 2-core CPU over new mixes of 64 texts of
each exported model (benchmarks/README.md): 1.18x-1.63x onnxruntime's own default of one
instance at a time on both cores for the tagger and the transformers, 0.98x-1.19x for a CNN.
Each instance still runs the model alone, on the same kernels: onnxruntime's threads split a
product's rows and columns, never its sums, so one thread gives the bits that two give.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

from autobatch.backends.ort_backend import OrtBackendRep
from autobatch.backends.ort_runtime import run_session
from autobatch.ir import Graph
from autobatch.ir.limits import deadline, remaining


class ParallelRuns:
    """``run`` instances on ``callers`` threads at once (the calling thread is one of them),
    each instance on a one-thread session of ``graph``, one session a thread (sharing one, two
    threads ran 1-11% slower over the exported CNN here). The sessions are more copies of the model (and its weights),
    made by ``prepare`` or the first ``run``; the other threads wait in a pool between batches."""

    def __init__(self, graph: Graph, providers: Sequence[str], callers: int) -> None:
        if callers < 2:
            raise ValueError(f"running instances at once needs 2 callers or more, not {callers}")
        self.graph, self.providers, self.callers = graph, providers, callers
        self._sessions: list[Any] = []
        self._pool: ThreadPoolExecutor | None = None
        self._pool_pid = 0

    def prepare(self) -> None:
        """Make the one-thread sessions now (before a run that is timed)."""
        if not self._sessions:
            self._sessions = [OrtBackendRep(self.graph, self.providers, threads=1).session for _ in range(self.callers)]

    def run(self, names: list[str], feeds_list: Sequence[Mapping[str, Any]]) -> list[list[Any]]:
        """Each instance's ``names`` outputs, in order. Every caller takes the next instance not
        taken (long and short ones balance out); the caller's deadline holds on every thread.
        Where instances fail, the others stop taking new ones and the first failed instance's
        error is raised once every thread is done (as running them in order would raise it)."""
        self.prepare()
        results: list[Any] = [None] * len(feeds_list)
        errors: dict[int, Exception] = {}
        taken = iter(range(len(feeds_list)))
        lock = threading.Lock()
        stopped = threading.Event()  # a thread left by an interrupt: the others take no more
        seconds = remaining()
        at = None if seconds is None else time.monotonic() + seconds

        def work(session: Any) -> None:
            try:
                with deadline(None if at is None else at - time.monotonic()):
                    while not errors and not stopped.is_set():
                        with lock:
                            k = next(taken, None)
                        if k is None:
                            return
                        try:
                            results[k] = run_session(session.run, names, feeds_list[k])
                        except Exception as error:  # raised below, in the caller's thread
                            errors[k] = error
            except BaseException:
                stopped.set()
                raise

        helpers: list[Future] = []
        try:
            try:
                pool = self._helpers()
                helpers += [pool.submit(work, session) for session in self._sessions[1:len(feeds_list)]]
            except RuntimeError:  # the interpreter is shutting down: no new threads, the caller runs them all
                pass
            work(self._sessions[0])
        finally:
            stopped.set()
            wait(helpers)  # each ends with the run it is in
        for helper in helpers:
            if helper.exception() is not None:  # an interrupt, not an instance's error
                raise helper.exception()  # type: ignore[misc]
        if errors:
            raise errors[min(errors)]
        return results

    def _helpers(self) -> ThreadPoolExecutor:
        # A pool made before fork() has no threads in the child: its work would never run there.
        if self._pool is None or self._pool_pid != os.getpid():
            self._pool = ThreadPoolExecutor(self.callers - 1, thread_name_prefix="autobatch-alone")
            self._pool_pid = os.getpid()
        return self._pool
