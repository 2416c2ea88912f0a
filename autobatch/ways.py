"""Which way a session runs a batch: batched, or each instance alone, by what it measured of
both.

Planning a new mix of shapes costs time that a small batch, or a large model whose instances
onnxruntime already runs well alone, may not win back, and a plan kept for a mix seen before
may still lose to onnxruntime alone (see benchmarks/README.md). A user must never get a slower
model than onnxruntime alone for using a batcher, so a session times the two ways on the batches
it runs and takes the faster, and tries the other again every ``PROBE_EVERY`` batches, as loads
change. Batches are compared with those of their kind: of the same power of two of instances (a
batch of 64 gains more from batching than one of 2), and of a new mix or one with a plan kept.
Both ways give each instance's own results, so the choice changes speed only; each instance run
alone by it is counted (``SessionStats.alone``)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

BATCHED, ALONE = "batched", "alone"
BATCHED_FIRST = 4  # batches of a size run batched before alone is tried (the first of each way is not timed)
PROBE_EVERY = 16  # batches of a size between tries of the way not taken
MARGIN = 1.1  # alone is taken where it is measured this much faster


@dataclass
class _Size:
    """What was measured of batches of one kind."""

    runs: Counter[str] = field(default_factory=Counter)
    seconds: dict[str, float] = field(default_factory=dict)  # way -> seconds an instance, a moving average
    since_probe: int = 0


@dataclass
class WayChooser:
    """``choose`` a way for a batch of ``n`` (``kept``: its mix has a plan kept), then ``record``
    how long it took."""

    sizes: dict[tuple[int, bool], _Size] = field(default_factory=dict)

    def choose(self, n: int, kept: bool) -> str:
        size = self.sizes.setdefault((n.bit_length(), kept), _Size())
        if size.runs[BATCHED] < BATCHED_FIRST:
            return BATCHED
        if size.runs[ALONE] < 2:
            return ALONE
        best = self.best(size)
        if size.since_probe >= PROBE_EVERY:
            return ALONE if best == BATCHED else BATCHED
        return best

    def record(self, n: int, kept: bool, way: str, seconds: float) -> None:
        size = self.sizes.setdefault((n.bit_length(), kept), _Size())
        probe = way != self.best(size)
        size.runs[way] += 1
        if size.runs[way] > 1:  # the first run of a way types new shapes, makes sessions (a kept mix's: its one session)
            old = size.seconds.get(way)
            size.seconds[way] = seconds / n if old is None else (old + seconds / n) / 2
        size.since_probe = 0 if probe else size.since_probe + 1

    @staticmethod
    def best(size: _Size) -> str:
        batched, alone = size.seconds.get(BATCHED), size.seconds.get(ALONE)
        return ALONE if batched is not None and alone is not None and alone * MARGIN < batched else BATCHED

    def why(self, n: int, kept: bool) -> str:
        """Why a batch of ``n`` runs alone, in words."""
        size = self.sizes.get((n.bit_length(), kept))
        if size is None or ALONE not in size.seconds or BATCHED not in size.seconds:
            return "alone is being measured"
        return (f"alone measured {size.seconds[ALONE] * 1e3:.3f} ms an instance, {'its kept plan' if kept else 'a new mix'} "
                f"batched {size.seconds[BATCHED] * 1e3:.3f} ms")
