"""Small non-negative integer keys numbered and ordered by counting rather than sorting.

The planner keys nodes by ``class * levels + level`` and launches by pairs of launches: keys
below a few times the number of nodes. ``np.unique`` and a stable ``argsort`` of int64 sort
them (1.2 ms each for the 38,418 nodes of a Tree-LSTM minibatch of primitive ops, a scheduling
pass running several); counting takes a tenth of that. Larger keys fall back to sorting."""

from __future__ import annotations

import numpy as np

# Counting allocates a table of the key range: worth it while the range is a few times the keys.
RANGE_PER_KEY = 8
_RADIX_BOUND = 1 << 16  # NumPy's stable sort is a radix sort on 16-bit integers


def unique_keys(keys: np.ndarray, bound: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``np.unique(keys, return_inverse=True, return_counts=True)`` for keys in ``[0, bound)``."""
    if bound > RANGE_PER_KEY * len(keys) + 1024:
        return np.unique(keys, return_inverse=True, return_counts=True)
    counts = np.bincount(keys, minlength=bound)
    present = counts > 0
    number = np.cumsum(present) - 1  # each present key's rank among them
    return np.flatnonzero(present), number[keys], counts[present]


def distinct_keys(keys: np.ndarray, bound: int) -> np.ndarray:
    """``np.unique(keys)`` for keys in ``[0, bound)``."""
    if bound > RANGE_PER_KEY * len(keys) + 1024:
        return np.unique(keys)
    seen = np.zeros(bound, dtype=bool)
    seen[keys] = True
    return np.flatnonzero(seen)


def stable_order(keys: np.ndarray, bound: int) -> np.ndarray:
    """``np.argsort(keys, kind="stable")`` for keys in ``[0, bound)``."""
    if bound <= _RADIX_BOUND:
        keys = keys.astype(np.uint16 if bound > 256 else np.uint8)
    return np.argsort(keys, kind="stable")


def bucket_starts(keys: np.ndarray, bound: int) -> np.ndarray:
    """Where each key's run starts in ``keys`` sorted, and where the last ends: ``np.searchsorted(
    sorted_keys, np.arange(bound + 1))``, counted."""
    starts = np.zeros(bound + 1, dtype=np.int64)
    np.cumsum(np.bincount(keys, minlength=bound), out=starts[1:])
    return starts
