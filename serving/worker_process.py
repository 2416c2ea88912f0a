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
from collections.abc import Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

from autobatch.frontends.onnx_control_flow import MAX_UNROLLED_NODES
from autobatch.ir.limits import DeadlineExceeded, deadline, remaining
from autobatch.serving.runners import Feeds, Outputs, load_runner

log = logging.getLogger("autobatch.serving")

SPAWN = multiprocessing.get_context("spawn")  # forking a process with threads (the loop's, onnxruntime's) is unsafe
READY_TIMEOUT_S = 300.0  # loading a model (and importing onnxruntime) in the child
GRACE_S = 5.0  # past a call's deadline, how long the child may take to stop by itself before it is killed
STOP_TIMEOUT_S = 5.0


class WorkerDied(RuntimeError):
    """The worker process exited during a call; a new one has been started."""


class ProcessRunner:
    """A ``Runner`` whose ``run_batch`` and ``run`` go to a child process that loads ``spec``
    (a ``.onnx`` path or ``module:function``) as ``load_runner`` does. One caller at a time:
    the engine's worker thread."""

    def __init__(self, spec: str, backend: str = "numpy", max_unrolled_nodes: int = MAX_UNROLLED_NODES,
                 alone_when_faster: bool = True, threads: int | None = None) -> None:
        self.name, self._local = load_runner(spec, "numpy", max_unrolled_nodes, alone_when_faster)
        self.inputs, self.outputs = self._local.inputs, self._local.outputs
        self._load = (spec, backend, max_unrolled_nodes, alone_when_faster, threads)
        self.ran_alone = 0  # instances of the last batch the child's session ran each alone
        self.restarts = 0
        self._conn: Connection | None = None
        self._process: Any = None
        self._start()

    def check(self, feeds: Any) -> Feeds:
        return self._local.check(feeds)

    def run_batch(self, feeds_list: Sequence[Feeds]) -> list[Outputs | BaseException]:
        results, self.ran_alone = self._call("batch", list(feeds_list))
        return results

    def run(self, feeds: Feeds) -> Outputs:
        return self._call("one", feeds)[0]

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.is_alive()

    def close(self) -> None:
        """Stop the child: asked first, then terminated, then killed."""
        if self._process is None:
            return
        try:
            self._conn.send(None)  # type: ignore[union-attr]
        except OSError:
            pass  # it is gone already
        self._process.join(STOP_TIMEOUT_S)
        if self._process.is_alive():
            self._process.terminate()
            self._process.join(STOP_TIMEOUT_S)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        self._conn.close()  # type: ignore[union-attr]
        self._process = None

    # ------------------------------------------------------------------ the pipe
    def _start(self) -> None:
        parent, child = SPAWN.Pipe()
        self._process = SPAWN.Process(target=_serve_calls, args=(child, *self._load), daemon=True,
                                      name=f"autobatch-{self.name}")
        self._process.start()
        child.close()
        self._conn = parent
        try:
            self._receive(READY_TIMEOUT_S)
        except _Silent as silent:
            self.close()
            raise RuntimeError(f"the worker process of {self.name!r} "
                               f"{silent.how or f'did not load the model within {READY_TIMEOUT_S:g} s'}") from None
        except BaseException:
            self.close()
            raise

    def _call(self, kind: str, payload: Any) -> Any:
        if self._process is None:
            raise RuntimeError(f"the worker process of {self.name!r} was closed")
        if not self._process.is_alive():  # it died between calls (the OOM killer, a signal): no run is lost
            self._process.join()
            self._restart(f"it {_exit_text(self._process.exitcode)} between runs")
        seconds = remaining()  # the engine's deadline for this batch, if any
        try:
            self._conn.send((kind, payload, seconds))  # type: ignore[union-attr]
        except OSError:
            pass  # the child is gone: _receive finds it so
        timeout = None if seconds is None else max(seconds, 0.0) + GRACE_S
        try:
            return self._receive(timeout)
        except _Silent as silent:
            if silent.how is None:
                self._restart(f"a run went {GRACE_S:g} s past its deadline and was killed")
                raise DeadlineExceeded("the work went past its deadline and was stopped") from None
            self._restart(f"it {silent.how} during a run")
            raise WorkerDied(f"the worker process of {self.name!r} {silent.how}; a new one was started") from None

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
        self._process.join()
        raise _Silent(_exit_text(self._process.exitcode))

    def _restart(self, why: str) -> None:
        self.restarts += 1
        log.warning("model %r: worker process %d stopped (%s); starting another (restart %d)",
                    self.name, self._process.pid, why, self.restarts)
        self._process.kill()
        self._process.join()
        self._conn.close()  # type: ignore[union-attr]
        self._start()


class _Silent(Exception):
    """No answer came: the child exited (``how``), or the timeout passed (``how`` is None)."""

    def __init__(self, how: str | None) -> None:
        super().__init__(how)
        self.how = how


def _serve_calls(conn: Connection, spec: str, backend: str, max_unrolled_nodes: int, alone_when_faster: bool,
                 threads: int | None) -> None:
    """The child: load the model, say so, then answer calls until told to stop or the parent is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the parent stops us
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
