"""``Batch``: a tracer (``frontends.tracing.Tracer``) whose pending records are planned by the
batcher and run on a backend, and ``run_programs``, lockstep programs run in one."""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import numpy as np

from autobatch.backends.baked_weights import WeightSnapshots
from autobatch.batcher import BatchingPass, get_scheduler
from autobatch.batcher.flat import plan_records
from autobatch.batcher.plan import NotFlat, TemplateCache
from autobatch.frontends.programs import run_in_lockstep
from autobatch.frontends.tracing import OPSET, Tensor, TraceError, Tracer
from autobatch.session import flat_executor, make_runner_factory

# Templates of traced batches, shared by every ``Batch``: a batch lives for one minibatch, and
# the next one's classes are mostly the same.
TRACED_TEMPLATES = TemplateCache()
# ... and the weights their templates may bake: a weight one minibatch baked, the next reads baked.
TRACED_SNAPSHOTS = WeightSnapshots()


class Batch(Tracer):
    """Traces many instances and runs them batched.

    >>> with Batch() as batch:
    ...     losses = [model(example) for example in examples]   # traced, not run
    ...     values = batch.run(losses)                           # batched and run once
    """

    def __init__(self, backend: str = "numpy", scheduler: str = "level", threads: int = 0,
                 providers: Sequence[str] | None = None, flat: bool = True, reuse_calls: bool = True) -> None:
        """``backend``: "numpy" or "onnxruntime"; ``scheduler``: "depth", "agenda" or "level".
        ``threads``: onnxruntime's intra-op threads (0: its own choice); NumPy's BLAS takes its
        thread count from the environment (``OPENBLAS_NUM_THREADS``, ``OMP_NUM_THREADS``), as
        NumPy does everywhere. ``providers``: onnxruntime's execution providers (default: CUDA
        when it loads, else the CPU). ``flat``: plan straight from the trace records (the flat
        plan, ``autobatch.batcher.flat``; not on CUDA, where the batched graph keeps values on
        the device); False builds the IR graph and rewrites it (the general path).
        ``reuse_calls``: see ``Tracer``."""
        get_scheduler(scheduler)  # an unknown name fails here, not at the first run
        super().__init__(reuse_calls)
        self.backend = backend
        self.scheduler = scheduler
        self._make_runner = make_runner_factory(backend, threads, providers)
        self._flat = flat_executor(backend, threads, providers, snapshots=TRACED_SNAPSHOTS) if flat else None
        self.reports: list[Any] = []  # one BatchReport for every time the batch ran
        self.last_plan: Any = None  # the last run's FlatPlan, or PassResult (batched graph and report)

    def _execute(self, wanted: list[Tensor]) -> list[np.ndarray]:
        names = [t.name for t in wanted]
        if self._flat is None:
            return self._run_graph(*self.records_for(names), names)
        return self._run_flat([t.producer for t in wanted], names)

    def _run_flat(self, producers: list[int], names: list[str]) -> list[Any]:
        """Values of ``names`` (made by the records at ``producers``) by the flat plan."""
        try:
            plan = plan_records(self._records, names, producers, self._weights, self._literals, self.functions,
                                self._opsets(), self.scheduler, cache=TRACED_TEMPLATES)
        except NotFlat as why:
            raise TraceError(str(why)) from None
        values = self._flat.run(plan, self._weights, self._literals, plan.report.execution)  # type: ignore[union-attr]
        self.reports.append(plan.report)
        self.last_plan = plan
        return [values[plan.locations[name]] for name in names]

    def _run_graph(self, records: list, needed: set[str], names: list[str]) -> list[np.ndarray]:
        start = time.perf_counter()
        graph = self._graph(records, needed, names)
        built = time.perf_counter() - start
        result = BatchingPass(self.scheduler, as_rows=True)(graph)
        result.report.seconds["build"] = built  # the IR graph of the records, as a session reports it
        outputs = list(result.graph.outputs)
        values = dict(zip(outputs, self._make_runner(result.graph).run({}, outputs)))
        self.reports.append(result.report)
        self.last_plan = result
        located = (result.locations[name] for name in names)
        return [values[source] if row is None else values[source][row, ...] for source, row in located]  # views


def run_programs(fn: Callable[[Any], Coroutine[Any, Any, Any]], inputs: Sequence[Any], backend: str = "numpy",
                 scheduler: str = "level", max_rounds: int = 10_000, threads: int = 0,
                 batch: Batch | None = None) -> list[Any]:
    """Results of ``fn(x)`` for each input, in order, the programs run in lockstep
    (``frontends.programs``) in one batch. A program that raises gets a ``ProgramFailure`` in
    its place; the others complete. Pass ``batch`` to trace into a batch of your own (and read
    its ``reports`` afterwards)."""
    with batch if batch is not None else Batch(backend, scheduler, threads) as batch:
        return run_in_lockstep(fn, inputs, batch, max_rounds)


__all__ = ["OPSET", "Batch", "run_programs"]
