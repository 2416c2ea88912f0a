"""Which way a session runs a batch: batched, or each instance alone, by what it measured of
both.

Planning a new mix of shapes costs time that a small batch, or a large model whose instances
onnxruntime already runs well alone, may not win back, and a plan kept for a mix seen before
may still lose to onnxruntime alone (see benchmarks/README.md). A user must never get a slower
model than onnxruntime alone for using a batcher, so a session times the two ways on the batches
it runs and takes the faster, and tries the other way again every ``PROBE_EVERY`` batches or
more (more, the slower it was), as loads change. A way's time is the median of its last
``RECENT`` runs, so that one slow run (a collection, a noisy host) does not turn the choice;
a way that really got faster or slower turns it after three tries of it. Batches are compared
with those of their kind: of the same power of two of instances (a batch of 64 gains more from
batching than one of 2), and of a new mix or one with a plan kept; a size not measured yet
starts from the nearest one measured.
Both ways give each instance's own results, so the choice changes speed only; each instance run
alone by it is counted (``SessionStats.alone``)."""

from __future__ import annotations

import statistics
from collections import Counter, deque
from dataclasses import dataclass, field

import numpy as np

BATCHED, ALONE = "batched", "alone"
# How a batch run alone runs: several instances at once, one a thread (``backends.parallel_runs``),
# or one after another on the session's own threads (onnxruntime alone, as its users run it).
AT_ONCE, IN_TURN = "at once", "in turn"
BATCHED_FIRST = 3  # batches (of any sizes of a kind) run batched before alone is tried; the first of each way is not timed
PROBE_EVERY = 16  # batches between tries of the way not taken, times how much slower it was...
MAX_SPACING = 8  # ...up to this many times: trying costs at most about a sixteenth of the time
MARGIN = 1.1  # alone is taken where it is measured this much faster
# ... in a server: a batch run alone, each instance a Python call on a thread of its own, takes
# the CPU and the interpreter lock from the event loop that reads and answers requests, which its
# own time does not show (benchmarks/SERVING.md: with 1.5 a server of either model measured
# served 4-8% more requests a second than with 1.1, about as many as always batched)
SERVED_MARGIN = 1.5
RECENT = 5  # the runs of a way whose median is its time: one slow run (a pause, a noisy host) does not turn the choice


def margin(alone_when_faster: bool | float, when_true: float = MARGIN) -> float | None:
    """How many times faster alone must be measured, from ``alone_when_faster``: ``when_true``
    for True, the number given (at least 1), None for False (always batched)."""
    if isinstance(alone_when_faster, (bool, np.bool_)):
        return when_true if alone_when_faster else None
    if not alone_when_faster >= 1:
        raise ValueError(f"alone_when_faster: True, False or a margin of at least 1, not {alone_when_faster!r}")
    return float(alone_when_faster)


@dataclass
class _Kind:
    """What was measured of batches of one kind."""

    runs: Counter[str] = field(default_factory=Counter)
    recent: dict[str, deque[float]] = field(default_factory=dict)  # way -> its last RECENT seconds an instance
    since_probe: int = 0

    def seconds(self, way: str) -> float:
        return statistics.median(self.recent[way])


@dataclass
class WayChooser:
    """``choose`` a way for a batch of ``n`` (``kept``: its mix has a plan kept), then ``record``
    how long it took. Each way's time an instance is its own kind's once measured, else the
    nearest measured size's of its kind (a server's batch sizes vary). Until both ways are
    measured at some size, ``BATCHED_FIRST`` batches in all run the ``first`` way, then the
    ``second``: a server whose first batches are of many sizes pays for its warm-up once, not
    once a size. The second is taken where measured ``margin`` times faster. The ways are
    batched or alone, and, for a batch run alone, at once or in turn."""

    first: str = BATCHED
    second: str = ALONE
    margin: float = MARGIN
    kinds: dict[tuple[int, bool], _Kind] = field(default_factory=dict)

    def choose(self, n: int, kept: bool) -> str:
        key = (n.bit_length(), kept)
        kind = self.kinds.setdefault(key, _Kind())
        guide = self._guide(key)
        if guide is None:  # a way not measured yet at any size of this kind
            first = sum(other.runs[self.first] for (_, was_kept), other in self.kinds.items() if was_kept == kept)
            return self.first if first < BATCHED_FIRST else self.second
        best = self._best(guide)
        if kind.since_probe >= _spacing(guide):
            return self.second if best == self.first else self.first
        return best

    def record(self, n: int, kept: bool, way: str, seconds: float) -> None:
        key = (n.bit_length(), kept)
        kind = self.kinds.setdefault(key, _Kind())
        guide = self._guide(key)
        probe = guide is not None and way != self._best(guide)
        # The first run of a way (at any size) types new shapes and makes sessions (a kept mix's: its one session).
        first = not any(other.runs[way] for (_, was_kept), other in self.kinds.items() if was_kept == kept)
        kind.runs[way] += 1
        if not first:
            kind.recent.setdefault(way, deque(maxlen=RECENT)).append(seconds / n)
        kind.since_probe = 0 if probe else kind.since_probe + 1

    def _guide(self, key: tuple[int, bool]) -> dict[str, float] | None:
        """Seconds an instance each way for ``key``'s batches: each way's from its own kind
        once measured, else from the nearest size of the same kind that measured it; None
        while a way has been measured at no size."""
        guide = {}
        for way in (self.first, self.second):
            near = [(abs(bits - key[0]), kind.seconds(way)) for (bits, kept), kind in self.kinds.items()
                    if kept == key[1] and way in kind.recent]
            if not near:
                return None
            guide[way] = min(near)[1]
        return guide

    def why(self, n: int, kept: bool) -> str:
        """Why a batch of ``n`` runs the second way, in words."""
        guide = self._guide((n.bit_length(), kept))
        if guide is None:
            return f"{self.second} is being measured"
        return (f"{self.second} measured {guide[self.second] * 1e3:.3f} ms an instance, "
                f"{'its kept plan' if kept else 'a new mix'} {self.first} {guide[self.first] * 1e3:.3f} ms")

    def _best(self, guide: dict[str, float]) -> str:
        return self.second if guide[self.second] * self.margin < guide[self.first] else self.first


def _spacing(guide: dict[str, float]) -> float:
    """Batches between tries of the way not taken: more, the slower it was."""
    return PROBE_EVERY * min(MAX_SPACING, max(1.0, max(guide.values()) / min(guide.values())))
