"""A deadline for the work of the current thread. Long loops (unrolling control flow, running a
Loop or Scan, a plan's steps) call ``check_deadline()``, which raises ``DeadlineExceeded`` once
the deadline has passed: work for a request that nobody waits for any more stops, and the next
request of that model does not wait behind it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

_local = threading.local()


class DeadlineExceeded(TimeoutError):
    """The work went past the deadline its caller set."""


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
