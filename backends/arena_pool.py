"""Memory for plans' arenas, kept from one run for the next.

A minibatch's arenas are large (94 MB for a BiLSTM tagger's 64 sentences traced op by op, size
256) and new every run: each page the steps write first faults in (the kernel zeroes it), which
made the executor's arena writes twice as slow as writes to memory touched before. A pool
hands the next run the memory the last one gave back. A caller gives back only the arenas that
none of the values it keeps is read from (``Batch``: its results are views of their arenas,
which keep their memory), so that no result is a view of memory a later run writes."""

from __future__ import annotations

import threading

import numpy as np

POOL_BYTES = 512 << 20  # kept at most; memory past it goes back to the allocator


class ArenaPool:
    def __init__(self, max_bytes: int = POOL_BYTES) -> None:
        self.max_bytes = max_bytes
        self._free: list[np.ndarray] = []  # byte buffers, smallest first
        self._lock = threading.Lock()  # batches may run in several threads

    def take(self, nbytes: int) -> np.ndarray:
        """A byte buffer of at least ``nbytes``: the smallest kept one that holds them (no more
        than twice their size: a small arena does not hold a large buffer away from a large
        one), else a new one (``MemoryError`` where none can be had)."""
        with self._lock:
            for k, buffer in enumerate(self._free):
                if nbytes <= buffer.nbytes <= 2 * nbytes + 4096:
                    return self._free.pop(k)
        return np.empty(nbytes, dtype=np.uint8)

    def give(self, buffers: list[np.ndarray]) -> None:
        """Buffers a run no longer reads (nor does anything else), kept up to ``max_bytes``."""
        with self._lock:
            kept = sorted([*self._free, *buffers], key=lambda b: b.nbytes)
            while kept and sum(b.nbytes for b in kept) > self.max_bytes:
                kept.pop()  # the largest first: it is the likeliest to miss the next run's sizes
            self._free = kept

    @property
    def kept_bytes(self) -> int:
        with self._lock:
            return sum(b.nbytes for b in self._free)
