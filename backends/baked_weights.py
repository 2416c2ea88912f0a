"""Weights baked into onnxruntime template sessions, so that MatMul, Gemm and the recurrent
layers pack them once.

onnxruntime packs a MatMul's or Gemm's constant right operand, and an LSTM's, GRU's or RNN's
constant W and R, when it makes the session; fed at run time, the same weight is packed again
on every run (a bidirectional LSTM of 256 over 64 sentences in chunks of 8: 29.5 ms fed, 12.6 ms
baked; ``python -m benchmarks.sequence_chunks``). An LSTM step of 28 rows with two 256x1024
weights took 263 us fed and 195 us baked. A flat plan launches a recurrent model's step once a
time step, every launch reading the same weights, so a template bakes a weight in once the
weight is known to be stable:

* a weight is a candidate in a run that launches it at least ``BAKE_MIN_LAUNCHES`` times, or
  in a recurrent layer's call (which packs W and R whole, as the check reads them once), and
  holds at least ``BAKE_MIN_BYTES`` (the check below reads the whole weight once a run, which
  the launches must repay);
* the first run that meets an array takes a snapshot (a copy) and feeds it; every later run
  compares the array with its snapshot, bit for bit, once: equal, templates run the session
  baked from the snapshot; different, the array is volatile from then on and always fed (a
  training loop that changes weights in place pays one compare, then nothing).

So a weight changed in place, or replaced by another array, is never read stale. The cost is
memory: a snapshot copies its weight (a frozen one excepted), and every baked session holds
onnxruntime's own packed copy (onnxruntime's Python API cannot share packed weights between
sessions).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from autobatch.ir.types import same_bits

BAKE_MIN_LAUNCHES = 2
BAKE_MIN_BYTES = 64 * 1024
# What the snapshots may hold, the arrays they keep alive included (least recently used go
# first); an array above a quarter of it is never baked.
SNAPSHOT_BYTES = 256 * 1024 * 1024


@dataclass(eq=False)
class Snapshot:
    """``array`` as it was when first met (``copy``); ``copy`` is None once the array changed.
    It holds the array, so the array's id names no other array while it is kept."""

    array: np.ndarray
    copy: np.ndarray | None

    @property
    def nbytes(self) -> int:
        return self.array.nbytes + (self.copy.nbytes if self.copy is not None and self.copy is not self.array else 0)


class WeightSnapshots:
    """The snapshots of the weights that template runs may bake, shared by every run (and
    thread) of their owner's onnxruntime flat executor: an ``InferenceSession``'s own, or
    ``autobatch.batch.TRACED_SNAPSHOTS`` for traced batches. ``budget`` holds per owner."""

    def __init__(self, budget: int = SNAPSHOT_BYTES) -> None:
        self.budget = budget
        self._snapshots: OrderedDict[int, Snapshot] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def stable(self, array: np.ndarray) -> Snapshot | None:
        """The array's snapshot when the array still equals it bit for bit (a session baked
        from it is current), else None: on first meeting the array (the snapshot is taken
        now), once it has changed, and for an array too big or not contiguous."""
        if not array.flags.c_contiguous or array.dtype.hasobject or 4 * array.nbytes > self.budget:
            return None
        with self._lock:
            snapshot = self._snapshots.get(id(array))
            if snapshot is None:
                self._keep(Snapshot(array, array if is_frozen(array) else array.copy()))
                return None
            self._snapshots.move_to_end(id(array))
        if snapshot.copy is None:
            return None
        if snapshot.copy is array or same_bits(array, snapshot.copy):  # a frozen array is its own snapshot
            return snapshot
        with self._lock:
            if snapshot.copy is not None and self._snapshots.get(id(array)) is snapshot:
                self._bytes -= snapshot.copy.nbytes
            snapshot.copy = None  # volatile: fed from now on, never compared again
        return None

    def _keep(self, snapshot: Snapshot) -> None:
        self._snapshots[id(snapshot.array)] = snapshot
        self._bytes += snapshot.nbytes
        while self._bytes > self.budget:
            _, evicted = self._snapshots.popitem(last=False)
            self._bytes -= evicted.nbytes

    def __contains__(self, array: np.ndarray) -> bool:
        """Whether ``array`` has a snapshot (changed or not)."""
        return id(array) in self._snapshots

    def __len__(self) -> int:
        return len(self._snapshots)


def is_frozen(array: np.ndarray) -> bool:
    """Whether nothing can change the array's values: it and every array it views are
    read-only, over memory that is no one else's (or immutable bytes)."""
    base: object = array
    while isinstance(base, np.ndarray):
        if base.flags.writeable:
            return False
        base = base.base
    return base is None or isinstance(base, bytes)
