"""Which way a session runs a batch: batched, or each instance alone, by what it measured of
both.

Planning a new mix of shapes costs time that a small batch, or a large model whose instances
onnxruntime already runs well alone, may not win back, and a plan kept for a mix seen before
may still lose to onnxruntime alone (see benchmarks/README.md). A user must never get a slower
model than onnxruntime alone for using a batcher, so a session times the two ways on the batches
it runs and takes the faster, and tries the other way again every ``PROBE_EVERY`` batches or
more (more, the slower it was), as loads change. Batches are compared with those of their kind: of the
same power of two of instances (a batch of 64 gains more from batching than one of 2), and of a
new mix or one with a plan kept; a size not measured yet starts from the nearest one measured.
Both ways give each instance's own results, so the choice changes speed only; each instance run
alone by it is counted (``SessionStats.alone``)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

BATCHED, ALONE = "batched", "alone"
BATCHED_FIRST = 3  # batches run batched before alone is tried (the first of each way is not timed)
PROBE_EVERY = 16  # batches between tries of the way not taken, times how much slower it was...
MAX_SPACING = 8  # ...up to this many times: trying costs at most about a sixteenth of the time
MARGIN = 1.1  # alone is taken where it is measured this much faster


@dataclass
class _Kind:
    """What was measured of batches of one kind."""

    runs: Counter[str] = field(default_factory=Counter)
    seconds: dict[str, float] = field(default_factory=dict)  # way -> seconds an instance, a moving average
    since_probe: int = 0

    @property
    def measured(self) -> bool:
        return BATCHED in self.seconds and ALONE in self.seconds


@dataclass
class WayChooser:
    """``choose`` a way for a batch of ``n`` (``kept``: its mix has a plan kept), then ``record``
    how long it took. A kind not measured both ways yet starts from the nearest measured size of
    its kind (a server's batch sizes vary), else runs each way a few times first."""

    kinds: dict[tuple[int, bool], _Kind] = field(default_factory=dict)

    def choose(self, n: int, kept: bool) -> str:
        key = (n.bit_length(), kept)
        kind = self.kinds.setdefault(key, _Kind())
        guide = self._guide(key)
        if guide is None:  # nothing of this kind measured yet
            return BATCHED if kind.runs[BATCHED] < BATCHED_FIRST else ALONE
        best = _best(guide)
        if kind.since_probe >= _spacing(guide):
            return ALONE if best == BATCHED else BATCHED
        return best

    def record(self, n: int, kept: bool, way: str, seconds: float) -> None:
        key = (n.bit_length(), kept)
        kind = self.kinds.setdefault(key, _Kind())
        guide = self._guide(key)
        probe = guide is not None and way != _best(guide)
        kind.runs[way] += 1
        if kind.runs[way] > 1:  # the first run of a way types new shapes, makes sessions (a kept mix's: its one session)
            old = kind.seconds.get(way)
            kind.seconds[way] = seconds / n if old is None else (old + seconds / n) / 2
        kind.since_probe = 0 if probe else kind.since_probe + 1

    def _guide(self, key: tuple[int, bool]) -> _Kind | None:
        """The kind whose measurements decide for ``key``'s: its own once measured both ways,
        else the nearest measured size of the same kind."""
        if self.kinds[key].measured:
            return self.kinds[key]
        near = [(abs(bits - key[0]), bits) for (bits, kept), kind in self.kinds.items() if kept == key[1] and kind.measured]
        return self.kinds[min(near)[1], key[1]] if near else None

    def why(self, n: int, kept: bool) -> str:
        """Why a batch of ``n`` runs alone, in words."""
        guide = self._guide((n.bit_length(), kept)) if (n.bit_length(), kept) in self.kinds else None
        if guide is None:
            return "alone is being measured"
        return (f"alone measured {guide.seconds[ALONE] * 1e3:.3f} ms an instance, {'its kept plan' if kept else 'a new mix'} "
                f"batched {guide.seconds[BATCHED] * 1e3:.3f} ms")


def _best(kind: _Kind) -> str:
    return ALONE if kind.seconds[ALONE] * MARGIN < kind.seconds[BATCHED] else BATCHED


def _spacing(kind: _Kind) -> float:
    """Batches between tries of the way not taken: more, the slower it was."""
    batched, alone = kind.seconds[BATCHED], kind.seconds[ALONE]
    return PROBE_EVERY * min(MAX_SPACING, max(1.0, max(batched, alone) / min(batched, alone)))
