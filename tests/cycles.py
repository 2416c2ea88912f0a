"""A check that work leaves no reference cycles: what it drops is freed by reference counting
at once, so nothing waits for the collector's next pass over the heap (a pass over a kept
plan's many objects costs milliseconds)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def no_cycles_left() -> Iterator[None]:
    """Fails if what the block drops holds cycles the collector would have to free."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
        found = gc.collect()
        assert found == 0, f"{found} objects in reference cycles"
    finally:
        if was_enabled:
            gc.enable()
