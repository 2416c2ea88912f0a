"""The engine: requests of one model from many concurrent callers, gathered into batches.

A worker thread (one a session of the model: ``instances``) takes the waiting requests, waiting for more until the oldest has
waited ``batch_wait_timeout_s`` (dispatching at once when ``max_batch_size`` are there),
checks each request's feeds (a bad one fails alone, with 400 semantics), runs the rest with
``run_batch`` and hands the results to the event loop, which keeps accepting requests meanwhile.
The thread takes the next batch as soon as one is done: were the worker a task of the loop, each
batch would wait for the loop to get round to it (measured: about 3 ms a batch of 25 BERT
requests under 64 clients, a sixth of the batch's run).
The instances of a batch may have different shapes, i.e. different graphs: that is the point.
If the batched run raises, each instance is re-run alone so that only the guilty one fails
(logged at WARNING, counted in the metrics). A request's work stops once its deadline has passed
(``ir.limits``): one request never holds the model's worker for longer than it waits.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from autobatch.backends import FeedError
from autobatch.serving.errors import (
    BadRequest, InferenceFailed, ModelNotFound, QueueFull, RequestTimeout, ServingError, ShuttingDown,
)
from autobatch.serving.metrics import Duration, EngineMetrics, render
from autobatch.serving.runners import Feeds, Outputs, Runner, SessionRunner, load_runner
from autobatch.ways import SERVED_MARGIN, margin
from autobatch.serving.worker_process import ProcessRunner
from autobatch.frontends.onnx_control_flow import MAX_UNROLLED_NODES
from autobatch.ir.limits import DeadlineExceeded, deadline
from autobatch.fallbacks import batched_else_alone, each_alone
from autobatch.session import InferenceSession, usable_cores


WORKERS = ("thread", "process")


@dataclass(frozen=True)
class _Outcome:
    """What the worker thread hands the loop for a batch: a result (or error) per request, and
    what the metrics count."""

    results: list[Outputs | BaseException]
    queued: float  # seconds its requests waited, together
    ran: int  # instances run (0: none, their deadline had passed)
    fell_back: bool  # the batch failed and each instance was re-run alone
    alone: int  # instances the runner chose to run alone (``autobatch.ways``)
    seconds: float  # the run's


@dataclass(eq=False)
class _Request:
    feeds: Feeds
    outputs: list[str] | None
    future: asyncio.Future[Outputs]
    deadline: float = float("inf")  # time.monotonic() past which nobody waits for the result
    arrived: float = field(default_factory=time.monotonic)

    def settle(self, result: Outputs | BaseException) -> None:
        if self.future.done():  # timed out or cancelled meanwhile: nobody is waiting
            return
        if isinstance(result, BaseException):
            self.future.set_exception(result)
        else:
            self.future.set_result(result)


class Engine:
    """Batches concurrent ``infer`` calls for one model or program.

    ``model`` is a path (``.onnx``, or ``module:function`` for a program), an ONNX model, an
    ``InferenceSession`` or a ``Runner``. ``max_queue_delay_microseconds`` (Triton's name)
    overrides ``batch_wait_timeout_s`` (Ray Serve's) when given. ``batching=False`` runs every
    request alone (the baseline; in arrival order with one instance); a batch of a model the
    engine loads runs its instances each alone where that was measured ``ways.SERVED_MARGIN``
    times faster than batched (``alone_when_faster``: a number, that many times; False, always
    batched). ``instances`` sessions of the model (each loaded from ``model``:
    a path or an ONNX model), each with a worker thread of its own and its share of the cores,
    take batches from one queue, as Triton's instance count: a batch gathers while another runs.
    ``threads``: each session's onnxruntime intra-op threads (None: the cores shared among the
    instances; one instance takes every core but one, which the event loop reading and answering
    requests needs under load: benchmarks/README.md, "What batching off is measured against").
    ``worker="process"`` runs each in a process of its own (``serving.worker_process``; the model
    given as a path), started again when a run crashes it (spawned: a script that makes such an
    engine needs the ``if __name__ == "__main__":`` guard). Invariant: the engine's state is touched
    only on the event loop it was started on; ``infer_sync`` hops onto that loop.
    """

    def __init__(self, model: Any, *, name: str | None = None, max_batch_size: int = 32,
                 batch_wait_timeout_s: float = 0.005, max_queue_delay_microseconds: int | None = None,
                 max_queue: int = 1024, request_timeout_s: float | None = 30.0, batching: bool = True,
                 backend: str = "numpy", max_unrolled_nodes: int = MAX_UNROLLED_NODES,
                 alone_when_faster: bool | float = True, worker: str = "thread", instances: int = 1,
                 threads: int | None = None) -> None:
        if max_batch_size < 1 or max_queue < 1 or instances < 1 or (threads is not None and threads < 1):
            raise ValueError("max_batch_size, max_queue, instances and threads must be positive")
        if max_queue_delay_microseconds is not None:
            batch_wait_timeout_s = max_queue_delay_microseconds / 1e6
        if batch_wait_timeout_s < 0:
            raise ValueError("the batch wait timeout must not be negative")
        if instances > 1 and not isinstance(model, (str, bytes, onnx.ModelProto)):
            raise ValueError(f"{instances} instances need a model each loads: a path or an ONNX model, not "
                             f"{type(model).__name__}")
        # Instances share the cores; one alone leaves a core to the event loop (see the docstring).
        if threads is None:
            threads = max(1, usable_cores() // instances if instances > 1 else usable_cores() - 1)
        served = margin(alone_when_faster, SERVED_MARGIN)  # alone must win by more in a server
        alone_when_faster = served if served is not None else False
        self.name, self.runner = _as_runner(model, backend, max_unrolled_nodes, alone_when_faster, worker, threads)
        self.runners = [self.runner]
        try:
            for _ in range(instances - 1):  # (worker processes share the first's feed checker)
                self.runners.append(_as_runner(model, backend, max_unrolled_nodes, alone_when_faster, worker, threads,
                                               checker=getattr(self.runner, "checker", None) and
                                               (self.name, self.runner.checker))[1])
        except BaseException:
            _close_processes(self.runners)
            raise
        if name is not None:
            self.name = name
        self.max_batch_size = max_batch_size
        self.batch_wait_timeout_s = batch_wait_timeout_s
        self.max_queue = max_queue
        self.request_timeout_s = request_timeout_s
        self.batching = batching
        self.metrics = EngineMetrics()
        self._queue: deque[_Request] = deque()  # appended on the loop, taken by the worker thread
        self._arrived = threading.Condition()  # guards the queue; notified on each arrival and on close
        self._loop: asyncio.AbstractEventLoop | None = None
        self._workers: list[threading.Thread] = []  # one a runner: a session is not safe to run from two threads at once
        self._working = 0  # workers not finished yet (guarded by ``_arrived``)
        self._stopped: asyncio.Future[None] | None = None  # set on the loop once every worker has finished
        self._closing = False
        self._thread: threading.Thread | None = None  # our own loop, for blocking callers only
        self._thread_lock = threading.Lock()

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    @property
    def ready(self) -> bool:
        return (bool(self._workers) and all(worker.is_alive() for worker in self._workers) and not self._closing
                and all(getattr(runner, "ready", True) for runner in self.runners))

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Bind to the running event loop and start the workers (done by the first ``infer``)."""
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return
        if self._loop is not None:
            raise RuntimeError(f"engine {self.name!r} already runs on another event loop")
        self._loop, self._stopped = loop, loop.create_future()
        self._working = len(self.runners)
        self._workers = [threading.Thread(target=self._work, args=(runner,), name=f"autobatch-{self.name}-{k}", daemon=True)
                         for k, runner in enumerate(self.runners)]
        for worker in self._workers:
            worker.start()

    async def close(self) -> None:
        """Graceful: refuse new requests, finish every queued and running one, then stop."""
        if self._loop is None:  # never started: only worker processes to stop
            self._closing = True
            _close_processes(self.runners)
            return
        if self._closing:
            return
        self._closing = True
        with self._arrived:
            self._arrived.notify_all()
        assert self._stopped is not None
        await self._stopped
        for worker in self._workers:  # the last one set ``_stopped`` on its way out: it ends now
            worker.join()

    def shutdown(self) -> None:
        """``close`` from a thread other than the engine's loop; stops our own loop thread."""
        if self._loop is None:
            return
        asyncio.run_coroutine_threadsafe(self.close(), self._loop).result()
        if self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()

    # ------------------------------------------------------------------ requests
    async def infer(self, feeds: Mapping[str, Any], outputs: Sequence[str] | None = None,
                    timeout: float | None = None) -> Outputs:
        """This instance's outputs ``{name: array}`` (all, or those named), batched with
        whatever else arrives meanwhile. Raises a ``ServingError`` subclass on failure."""
        await self.start()
        start = time.perf_counter()
        self.metrics.requests += 1
        request = None
        try:
            if self._closing:
                raise ShuttingDown(f"model {self.name!r} is shutting down")
            self._check_outputs(outputs)
            if len(self._queue) >= self.max_queue:
                raise QueueFull(f"model {self.name!r}: the queue is full ({self.max_queue} requests waiting)")
            future: asyncio.Future[Outputs] = asyncio.get_running_loop().create_future()
            limit = timeout if timeout is not None else self.request_timeout_s
            request = _Request({k: np.asarray(v) for k, v in feeds.items()},
                               list(outputs) if outputs is not None else None, future,
                               time.monotonic() + limit if limit is not None else float("inf"))
            with self._arrived:
                self._queue.append(request)
                self._arrived.notify()
            try:
                result = await asyncio.wait_for(asyncio.shield(future), limit)
            except TimeoutError:
                raise RequestTimeout(f"model {self.name!r}: no result within {limit} s") from None
            self.metrics.succeeded.add(time.perf_counter() - start)
            return result
        except ServingError as error:
            self.metrics.errors[error.status] += 1
            self.metrics.failed.add(time.perf_counter() - start)
            raise
        finally:
            if request is not None and not request.future.done():  # timed out or the caller went away
                request.future.cancel()
                with self._arrived:
                    if request in self._queue:
                        self._queue.remove(request)
            self.metrics.latency.observe(time.perf_counter() - start)

    def infer_sync(self, feeds: Mapping[str, Any], outputs: Sequence[str] | None = None,
                   timeout: float | None = None) -> Outputs:
        """Blocking ``infer`` for threads. Runs on the loop the engine was started on, or on
        a loop thread of its own if it was not started yet."""
        if self._closing:
            raise ShuttingDown(f"model {self.name!r} is shutting down")
        loop = self._loop or self._start_thread()
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            raise RuntimeError("infer_sync on the engine's own event loop would block it; await infer")
        return asyncio.run_coroutine_threadsafe(self.infer(feeds, outputs, timeout), loop).result()

    def _start_thread(self) -> asyncio.AbstractEventLoop:
        with self._thread_lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=loop.run_forever, name=f"autobatch-loop-{self.name}", daemon=True)
                self._thread.start()
                asyncio.run_coroutine_threadsafe(self.start(), loop).result()
            assert self._loop is not None
            return self._loop

    # ------------------------------------------------------------------ the worker
    def _work(self, runner: Runner) -> None:
        """A worker thread, one a runner: batch after batch until closed and drained. It reads a request's
        future only to skip one nobody waits for (a stale answer there costs a wasted run, not a
        wrong one); futures are settled, and metrics counted, on the loop (``_settle``)."""
        assert self._loop is not None and self._stopped is not None
        loop, stopped = self._loop, self._stopped
        try:
            while True:
                if not self._runnable(runner):
                    if self._closing:
                        break
                    continue
                if (batch := self._next_batch()) is None:
                    break
                live = [request for request in batch if not request.future.done()]
                if live:
                    try:
                        outcome = self._execute(runner, live)
                    except Exception as error:  # a bug of ours: fail this batch, keep serving
                        outcome = InferenceFailed(f"{type(error).__name__}: {error}")
                    loop.call_soon_threadsafe(self._settle, live, outcome)
        except RuntimeError:  # the loop was closed under a batch: nobody waits for its answers
            if not loop.is_closed():
                raise
        finally:
            try:
                _close_processes([runner])  # a worker process: stopped with its worker
            finally:
                with self._arrived:
                    self._working -= 1
                    last = self._working == 0
                    left = []  # queued with no worker left to run them (only where every one was down)
                    while last and self._queue:
                        left.append(self._queue.popleft())
                if last and not loop.is_closed():
                    failure = InferenceFailed(f"model {self.name!r}: no worker is left to run it")
                    loop.call_soon_threadsafe(self._settle, left, failure)
                    loop.call_soon_threadsafe(stopped.set_result, None)

    def _runnable(self, runner: Runner) -> bool:
        """Whether ``runner`` can take a batch: a worker process that is down (its start failed)
        takes none until its next start is due, so that another instance takes them."""
        revive = getattr(runner, "revive", None)
        if revive is None or revive():
            return True
        with self._arrived:
            if not self._closing:
                self._arrived.wait(max(runner.retry_in, 0.05))  # type: ignore[attr-defined]
        return False

    def _next_batch(self) -> list[_Request] | None:
        """The next batch (None: closed and nothing left), waiting for more until the oldest
        request has waited the batch wait timeout (as Triton's ``max_queue_delay_microseconds``):
        under load, requests that queued while the last batch ran go at once."""
        with self._arrived:
            while True:
                while not self._queue:
                    if self._closing:
                        return None
                    self._arrived.wait()
                size = self.max_batch_size if self.batching else 1
                if self.batching:
                    deadline = self._queue[0].arrived + self.batch_wait_timeout_s
                    while self._queue and len(self._queue) < size and not self._closing \
                            and (remaining := deadline - time.monotonic()) > 0:
                        self._arrived.wait(remaining)
                if self._queue:
                    return [self._queue.popleft() for _ in range(min(size, len(self._queue)))]

    def _execute(self, runner: Runner, batch: list[_Request]) -> _Outcome:
        """On the worker thread, the requests checked (which may unroll control flow), then the
        good ones batched when there are several, each alone when the batch fails (logged and
        counted) or is one. The work stops at the latest deadline of the batch's requests."""
        now = time.monotonic()
        queued = sum(now - request.arrived for request in batch)
        seconds = max(request.deadline for request in batch) - now
        try:
            results, ran, fell_back, alone = self._run(runner, [request.feeds for request in batch], seconds)
        except DeadlineExceeded as error:
            return _Outcome([error] * len(batch), queued, 0, False, 0, 0.0)
        return _Outcome(results, queued, ran, fell_back, alone, time.monotonic() - now)

    def _settle(self, batch: list[_Request], outcome: _Outcome | BaseException) -> None:
        """On the loop: each request's answer, and the batch counted in the metrics."""
        self.metrics.worker_restarts = sum(getattr(runner, "restarts", 0) for runner in self.runners)
        if isinstance(outcome, BaseException):
            for request in batch:
                request.settle(outcome)
            return
        self.metrics.queued.add(outcome.queued, len(batch))
        if outcome.ran:
            self.metrics.batch_sizes.observe(outcome.ran)
            self.metrics.computed.setdefault(outcome.ran, Duration()).add(outcome.seconds)
            self.metrics.last_inference_ms = int(time.time() * 1e3)
        if outcome.fell_back:
            self.metrics.batches_failed += 1
            self.metrics.instances_rerun += outcome.ran
        self.metrics.instances_alone += outcome.alone
        for request, result in zip(batch, outcome.results):
            if isinstance(result, DeadlineExceeded):
                request.settle(RequestTimeout(f"model {self.name!r}: no result within its deadline; the work stopped"))
            elif isinstance(result, BaseException):
                status = BadRequest if isinstance(result, FeedError) else InferenceFailed
                request.settle(status(f"{type(result).__name__}: {result}"))
            else:
                try:
                    request.settle(_select(result, request.outputs))
                except BadRequest as error:
                    request.settle(error)

    def _run(self, runner: Runner, feeds_list: list[Feeds],
             seconds: float) -> tuple[list[Outputs | BaseException], int, bool, int]:
        """The results (a FeedError for feeds that do not fit), how many instances ran,
        whether their batch fell back to each alone, and how many the runner chose to run alone."""
        with deadline(seconds if seconds != float("inf") else None):
            results = each_alone(runner.check, feeds_list)  # a FeedError (400) or another failure (500)
            good = [k for k, result in enumerate(results) if not isinstance(result, Exception)]
            checked = [results[k] for k in good]
            alone = 0
            if len(checked) > 1:
                outputs, fell_back = batched_else_alone(functools.partial(_run_batch, runner), runner.run, checked,
                                                        f"model {self.name!r}: a batch")
                alone = 0 if fell_back else runner.ran_alone
            else:
                outputs, fell_back = each_alone(runner.run, checked), False
            for k, result in zip(good, outputs):
                results[k] = result
            return results, len(checked), fell_back, alone

    def _check_outputs(self, outputs: Sequence[str] | None) -> None:
        known = [spec.name for spec in self.runner.outputs]
        unknown = [name for name in outputs or [] if known and name not in known]
        if unknown:
            raise BadRequest(f"unknown output(s) {unknown}; the model's outputs are {known}")


class ModelRegistry:
    """The served models by name: one engine (one queue, a worker an instance) each."""

    def __init__(self, engines: Iterable[Engine] = ()) -> None:
        self.engines: dict[str, Engine] = {}
        for engine in engines:
            self.add(engine)

    def add(self, engine: Engine) -> Engine:
        if engine.name in self.engines:
            raise ValueError(f"a model named {engine.name!r} is served already")
        self.engines[engine.name] = engine
        return engine

    def get(self, name: str) -> Engine:
        engine = self.engines.get(name)
        if engine is None:
            raise ModelNotFound(f"unknown model {name!r}; served: {sorted(self.engines)}")
        return engine

    async def start(self) -> None:
        for engine in self.engines.values():
            await engine.start()

    async def close(self) -> None:
        await asyncio.gather(*(engine.close() for engine in self.engines.values()))

    def metrics_text(self) -> str:
        return render((name, e.metrics, e.queue_depth) for name, e in self.engines.items())


def _as_runner(model: Any, backend: str, max_unrolled_nodes: int, alone_when_faster: bool | float, worker: str,
               threads: int | None = None, checker: tuple[str, Runner] | None = None) -> tuple[str, Runner]:
    if worker not in WORKERS:
        raise ValueError(f"worker must be one of {', '.join(WORKERS)}, not {worker!r}")
    if worker == "process":
        if not isinstance(model, str):
            raise ValueError("a worker process loads its model itself: give a path (.onnx or module:function), "
                             f"not {type(model).__name__}")
        runner = ProcessRunner(model, backend, max_unrolled_nodes, alone_when_faster, threads, checker)
        return runner.name, runner
    if isinstance(model, str):
        return load_runner(model, backend, max_unrolled_nodes, alone_when_faster, threads)
    if isinstance(model, InferenceSession):
        return model.graph.name or "model", SessionRunner(model)
    if hasattr(model, "run_batch") and hasattr(model, "check"):
        return getattr(model, "name", None) or "model", model
    session = InferenceSession(model, backend=backend, max_unrolled_nodes=max_unrolled_nodes,
                               alone_when_faster=alone_when_faster, threads=threads)
    return session.graph.name or "model", SessionRunner(session)


def _close_processes(runners: Iterable[Runner]) -> None:
    """Stop the worker processes among ``runners`` (the engine made them; a runner given to it is
    its caller's to close)."""
    for runner in runners:
        if isinstance(runner, ProcessRunner):
            runner.close()


def _run_batch(runner: Runner, feeds_list: list[Feeds]) -> list[Outputs | BaseException]:
    results = runner.run_batch(feeds_list)
    if len(results) != len(feeds_list):
        raise RuntimeError(f"the runner gave {len(results)} results for {len(feeds_list)} instances")
    return results


def _select(outputs: Outputs, names: list[str] | None) -> Outputs:
    if names is None:
        return outputs
    missing = [n for n in names if n not in outputs]
    if missing:
        raise BadRequest(f"unknown output(s) {missing}; this instance produced {sorted(outputs)}")
    return {name: outputs[name] for name in names}
