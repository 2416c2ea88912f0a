"""Pausing Python's cyclic garbage collector during bulk graph work.

Building or rewriting a graph allocates many small objects that live on; each allocation
burst triggers collections that walk the whole (large, long-lived) heap, which more than
doubles the cost of a union or a batching pass. Nothing we build has reference cycles that
need collecting meanwhile.
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


@contextmanager
def gc_paused() -> Iterator[None]:
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def without_gc(fn: Callable[P, R]) -> Callable[P, R]:
    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with gc_paused():
            return fn(*args, **kwargs)

    return wrapper
