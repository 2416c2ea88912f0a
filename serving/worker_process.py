"""A model's runs in a process of their own (``Engine(worker="process")``, ``autobatch serve
--worker process``): a run that crashes (a fault in a kernel, the OOM killer) takes down that
process, not the server, and a run stuck past its deadline is killed, where a thread could only
be waited for. The batch's Python (its plan lookup, feeds and results) then also holds its own
GIL, not the server's; measured, that did not make BERT served under 64 clients faster on this
2-core machine (benchmarks/README.md, "A worker process"), so a thread stays the default.

The child loads the model itself (``load_runner``) and answers one call at a time over a pipe;
feeds are checked here, on a NumPy-backend copy of the model (no second onnxruntime session).
A child that dies is started again and the call raises ``WorkerDied``, so the engine runs the
batch's instances again each alone (the guilty one fails, the others are answered); one that
runs past its call's deadline (plus ``GRACE_S``) is killed and started again, and the call
raises ``DeadlineExceeded``. Each restart is logged at WARNING and counted.
"""

from __future__ import annotations

import logging
import multiprocessing
import pickle
import signal
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

from autobatch.frontends.onnx_control_flow import MAX_UNROLLED_NODES
from autobatch.ir.limits import DeadlineExceeded, deadline, remaining
from autobatch.serving.runners import Feeds, Outputs, Runner, load_runner

log = logging.getLogger("autobatch.serving")

SPAWN = multiprocessing.get_context("spawn")  # forking a process with threads (the loop's, onnxruntime's) is unsafe
READY_TIMEOUT_S = 300.0  # loading a model (and importing onnxruntime) in the child
GRACE_S = 5.0  # past a call's deadline, how long the child may take to stop by itself before it is killed
STOP_TIMEOUT_S = 5.0
RETRY_S = 5.0  # after a child failed to start, how long before the next try


class WorkerDied(RuntimeError):
    """The worker process exited during a call."""


class WorkerDown(RuntimeError):
    """No worker process runs: the last start failed, and the next try is not due yet."""


class ProcessRunner:
    """A ``Runner`` whose ``run_batch`` and ``run`` go to a child process that loads ``spec``
    (a ``.onnx`` path or ``module:function``) as ``load_runner`` does; ``checker``: the name and a
    runner that checks feeds here (default: a NumPy-backend copy of the model, as ``load_runner``
    gives them). One caller at a time: the
    engine's worker thread. The child is spawned: a script that makes one needs the usual
    ``if __name__ == "__main__":`` guard, or the child runs the script again."""

    def __init__(self, spec: str, backend: str = "numpy", max_unrolled_nodes: int = MAX_UNROLLED_NODES,
                 alone_when_faster: bool | float = True, threads: int | None = None,
                 checker: tuple[str, Runner] | None = None) -> None:
        self.name, self.checker = checker or load_runner(spec, "numpy", max_unrolled_nodes, alone_when_faster)
        self.inputs, self.outputs = self.checker.inputs, self.checker.outputs
        self._load = (spec, backend, max_unrolled_nodes, alone_when_faster, threads)
        self.ran_alone = 0  # instances of the last batch the child's session ran each alone
        self.restarts = 0  # children that died or were killed
        self._conn: Connection | None = None
        self._process: Any = None
        self._closed = False
        self._retry_at = 0.0
        self._down = ""  # why the last start failed
        self._start()

    def check(self, feeds: Any) -> Feeds:
        return self.checker.check(feeds)

    def run_batch(self, feeds_list: Sequence[Feeds]) -> list[Outputs | BaseException]:
        results, self.ran_alone = self._call("batch", list(feeds_list))
        return results

    def run(self, feeds: Feeds) -> Outputs:
        return self._call("one", feeds)[0]

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.is_alive()

    @property
    def ready(self) -> bool:
        """Whether a call would run: a child runs, or one may be started (one killed while idle is)."""
        return not self._closed and (self.alive or time.monotonic() >= self._retry_at)

    @property
    def retry_in(self) -> float:
        return max(self._retry_at - time.monotonic(), 0.0)

    def revive(self) -> bool:
        """Whether a child runs, after starting one where none does and a try is due."""
        if self._closed:
            return False
        if self.alive:
            return True
        if self._process is not None:  # it died between calls (the OOM killer, a signal)
            self._reap(f"it {_exit_text(self._process.exitcode)} between runs")
        if time.monotonic() < self._retry_at:
            return False
        try:
            self._start()
        except Exception as error:  # noqa: BLE001 - kept, said, and tried again later
            self._retry_at, self._down = time.monotonic() + RETRY_S, f"{type(error).__name__}: {error}"
            log.error("model %r: no worker process (%s); trying again in %g s", self.name, self._down, RETRY_S)
            return False
        return True

    def close(self) -> None:
        """Stop the child: asked first, then terminated, then killed. Never raises."""
        self._closed = True
        if self._process is None:
            return
        try:
            self._conn.send(None)  # type: ignore[union-attr]
        except (OSError, ValueError):
            pass  # it is gone already
        self._stop()

    # ------------------------------------------------------------------ the pipe
    def _start(self) -> None:
        parent, child = SPAWN.Pipe()
        process = SPAWN.Process(target=_serve_calls, args=(child, *self._load), daemon=True, name=f"autobatch-{self.name}")
        process.start()
        child.close()
        self._conn, self._process = parent, process
        try:
            self._receive(READY_TIMEOUT_S)
        except _Silent as silent:
            self._stop()
            raise RuntimeError(f"the worker process of {self.name!r} "
                               f"{silent.how or f'did not load the model within {READY_TIMEOUT_S:g} s'}") from None
        except BaseException:
            self._stop()
            raise

    def _call(self, kind: str, payload: Any) -> Any:
        if self._closed:
            raise RuntimeError(f"the worker process of {self.name!r} was closed")
        if not self.revive():
            raise WorkerDown(f"model {self.name!r} has no worker process ({self._down}); "
                             f"the next start is tried in {self.retry_in:.1f} s")
        seconds = remaining()  # the engine's deadline for this batch, if any
        try:
            self._conn.send((kind, payload, seconds))  # type: ignore[union-attr]
        except OSError:
            pass  # the child is gone: _receive finds it so
        try:
            return self._receive(None if seconds is None else max(seconds, 0.0) + GRACE_S)
        except _Silent as silent:
            if silent.how is None:
                self._reap(f"a run went {GRACE_S:g} s past its deadline and was killed")
                self._restart_in_time()
                raise DeadlineExceeded("the work went past its deadline and was stopped") from None
            self._reap(f"it {silent.how} during a run")
            self._restart_in_time()
            raise WorkerDied(f"the worker process of {self.name!r} {silent.how}") from None

    def _restart_in_time(self) -> None:
        """A new child now, unless the call's deadline has passed (then the next call starts one):
        a model that crashes on every instance costs each batch at most its deadline."""
        seconds = remaining()
        if seconds is None or seconds > 0:
            self.revive()

    def _receive(self, timeout: float | None) -> Any:
        """The child's answer, raised where it is an error; ``_Silent`` where none came."""
        ready = wait([self._conn, self._process.sentinel], timeout)  # type: ignore[list-item]
        if self._conn in ready:
            try:
                status, value = self._conn.recv()  # type: ignore[union-attr]
            except (EOFError, OSError):
                pass  # it died as it answered
            else:
                if status == "error":
                    raise value
                return value
        if not ready:
            raise _Silent(None)
        self._process.join(GRACE_S)
        raise _Silent(_exit_text(self._process.exitcode))

    def _reap(self, why: str) -> None:
        """The child gone (killed if need be), counted and logged."""
        self.restarts += 1
        log.warning("model %r: worker process %s stopped (%s); restart %d", self.name, self._process.pid, why,
                    self.restarts)
        self._stop()

    def _stop(self) -> None:
        """The child gone and reaped: given ``STOP_TIMEOUT_S`` to exit when asked to (closing),
        else killed at once (it ignores SIGTERM)."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.pid is not None:  # (started)
            if self._closed:
                process.join(STOP_TIMEOUT_S)
            if process.is_alive():
                process.kill()
            process.join()
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class _Silent(Exception):
    """No answer came: the child exited (``how``), or the timeout passed (``how`` is None)."""

    def __init__(self, how: str | None) -> None:
        super().__init__(how)
        self.how = how


def _serve_calls(conn: Connection, spec: str, backend: str, max_unrolled_nodes: int, alone_when_faster: bool | float,
                 threads: int | None) -> None:
    """The child: load the model, say so, then answer calls until told to stop or the parent is gone."""
    for stop in (signal.SIGINT, signal.SIGTERM):  # sent to the whole group (Ctrl-C, systemd): the parent stops us
        signal.signal(stop, signal.SIG_IGN)
    try:
        _, runner = load_runner(spec, backend, max_unrolled_nodes, alone_when_faster, threads)
    except Exception as error:  # noqa: BLE001 - the parent raises it
        conn.send(("error", _portable(error)))
        return
    conn.send(("ok", None))
    while True:
        try:
            call = conn.recv()
        except (EOFError, OSError):
            return  # the parent is gone
        if call is None:
            return
        kind, payload, seconds = call
        try:
            with deadline(seconds):
                if kind == "batch":
                    results = [_portable(r) if isinstance(r, BaseException) else r for r in runner.run_batch(payload)]
                    reply: tuple[str, Any] = ("ok", (results, getattr(runner, "ran_alone", 0)))
                else:
                    reply = ("ok", (runner.run(payload), 0))
        except Exception as error:  # noqa: BLE001 - the parent raises it, as the runner would have
            reply = ("error", _portable(error))
        try:
            conn.send(reply)
        except (pickle.PicklingError, TypeError, AttributeError) as error:  # results that do not pickle
            conn.send(("error", RuntimeError(f"the results could not be sent back: {type(error).__name__}: {error}")))


def _exit_text(code: int | None) -> str:
    return f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"


def _portable(error: BaseException) -> BaseException:
    """The exception, or a RuntimeError saying what it was where it does not survive pickling."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:  # noqa: BLE001 - any failure to pickle or rebuild it
        return RuntimeError(f"{type(error).__name__}: {error}")
