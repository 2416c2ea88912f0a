"""Limits on the work of the current thread, for input that chooses how much work it makes.

A deadline: long loops (unrolling control flow, running a Loop or Scan, a plan's steps)
call ``check_deadline()``, which raises ``DeadlineExceeded`` once the deadline has passed,
so work for a request that nobody waits for any more stops and the next request of that model
does not wait behind it.

A work limit: the nodes that If, Loop and Scan may run (or unroll into) for one instance.
``spend(nodes)`` charges them and raises ``WorkLimit`` past the limit its caller set with
``work_limit`` (``InferenceSession`` sets its ``max_unrolled_nodes``), so that a trip count in a
request, or a Loop whose condition never turns false, cannot run away.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

_local = threading.local()


class DeadlineExceeded(TimeoutError):
    """The work went past the deadline its caller set."""


class WorkLimit(ValueError):
    """Control flow would run or unroll more nodes than its limit."""


@contextmanager
def deadline(seconds: float | None) -> Iterator[None]:
    """Work in this block (on this thread) must end within ``seconds`` (None: no deadline; an
    outer, earlier deadline still holds)."""
    outer = getattr(_local, "at", None)
    at = None if seconds is None else time.monotonic() + seconds
    _local.at = at if outer is None or (at is not None and at < outer) else outer
    try:
        yield
    finally:
        _local.at = outer


def remaining() -> float | None:
    """Seconds left before this thread's deadline (None: no deadline)."""
    at = getattr(_local, "at", None)
    return None if at is None else at - time.monotonic()


def check_deadline() -> None:
    at = getattr(_local, "at", None)
    if at is not None and time.monotonic() > at:
        raise DeadlineExceeded("the work went past its deadline and was stopped")


@contextmanager
def work_limit(nodes: int) -> Iterator[None]:
    """Control flow in this block (on this thread) may run at most ``nodes`` nodes in all."""
    outer = getattr(_local, "work", None)
    _local.work = [nodes, nodes]  # [left, limit]
    try:
        yield
    finally:
        _local.work = outer


def spend(nodes: int, what: str) -> None:
    """Charge ``nodes`` to this thread's work limit (if its caller set one); ``WorkLimit``
    naming ``what`` past it."""
    work = getattr(_local, "work", None)
    if work is None:
        return
    work[0] -= nodes
    if work[0] < 0:
        raise WorkLimit(f"{what} would run more than {work[1]} nodes (max_unrolled_nodes={work[1]})")
