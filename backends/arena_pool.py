"""Memory for plans' arenas, kept from one run for the next.

A minibatch's arenas are large (94 MB for a BiLSTM tagger's 64 sentences traced op by op, size
256) and new every run: each page the steps write first faults in (the kernel zeroes it), which
made the executor's arena writes twice as slow as writes to memory touched before. A pool
hands the next run the memory the last one gave back. A caller gives back only the memory that
none of the values it keeps is a view of (``Batch``: its results are views of arenas, and a
block may be a view of another arena; ``Values.release`` follows each view to its memory), so
that no result is a view of memory a later run writes. Small
arenas come from the allocator's heap, already faulted in: they skip the pool, whose
bookkeeping cost a lockstep round of a few records more than it saved."""

from __future__ import annotations

import bisect
import threading

import numpy as np

POOL_BYTES = 256 << 20  # kept at most (the largest buffers go first); memory past it goes back to the allocator
MIN_POOLED_BYTES = 128 << 10  # glibc's malloc maps blocks from this size on (its default threshold)


class ArenaPool:
    def __init__(self, max_bytes: int = POOL_BYTES) -> None:
        self.max_bytes = max_bytes
        self._free: list[np.ndarray] = []  # byte buffers, smallest first
        self._sizes: list[int] = []  # theirs, for bisect
        self._lock = threading.Lock()  # batches may run in several threads

    def take(self, nbytes: int) -> np.ndarray:
        """A byte buffer of at least ``nbytes``: the smallest kept one that holds them (no more
        than twice their size: a small arena does not hold a large buffer away from a large
        one), else a new one (``MemoryError`` where none can be had)."""
        with self._lock:
            k = bisect.bisect_left(self._sizes, nbytes)
            if k < len(self._sizes) and self._sizes[k] <= 2 * nbytes + 4096:
                del self._sizes[k]
                return self._free.pop(k)
        return np.empty(nbytes, dtype=np.uint8)

    def give(self, buffers: list[np.ndarray]) -> None:
        """Buffers a run no longer reads (nor does anything else), kept up to ``max_bytes``."""
        with self._lock:
            for buffer in buffers:
                k = bisect.bisect_left(self._sizes, buffer.nbytes)
                self._sizes.insert(k, buffer.nbytes)
                self._free.insert(k, buffer)
            total = sum(self._sizes)
            while total > self.max_bytes:  # the largest first: the likeliest to miss the next run's sizes
                total -= self._sizes.pop()
                self._free.pop()

    @property
    def kept_bytes(self) -> int:
        with self._lock:
            return sum(self._sizes)
