"""A session's batches planned once per node of its model (``batcher.instance_axis``): made
from the first batch with two instances of different lengths, then used by every batch whose
instances' input signatures each fit it (checked once per signature); other batches, and every
batch of a model it refuses, are planned per mix by the flat planner."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx

from autobatch.backends.instance_axis import InstanceAxisRunner, lower
from autobatch.backends.ort_runtime import OrtSettings
from autobatch.batcher.instance_axis import InstanceAxisPlan, probe
from autobatch.batcher.plan import BatchReport
from autobatch.batcher.rule_tables import Refusal
from autobatch.batcher.sequences import CHUNK, chunk_members
from autobatch.feed_keys import input_signature
from autobatch.ir import Graph, Recent
from autobatch.length_check import LengthCheck
from autobatch.typed_instances import SHAPES_KEPT, ModelInstances

log = logging.getLogger("autobatch")

PROBES = 4  # batches whose two instances did not tell the rows' axis (one row each?) before the model is refused


class AxisBatches:
    """``fits(batch, signatures)``: each instance's length and constants where the node-level plan
    computes the batch, else None; ``run`` then computes it. ``refusal``: why the model has no such plan
    (None while it has one, or has not met two lengths yet)."""

    def __init__(self, graph: Graph, instances: ModelInstances, settings: OrtSettings | None) -> None:
        self.graph = graph
        self.instances = instances
        self.settings = settings  # None: the NumPy interpreter
        self.runner: InstanceAxisRunner | None = None
        self.lengths: LengthCheck | None = None  # a new length checked without typing the model for it
        self.refusal: str | None = None
        self._fits: Recent = Recent(SHAPES_KEPT)  # input signature -> its rows, or why it does not fit
        self._undecided = 0  # probes that could not tell the rows' axis
        # whether the last batch did work once for all later ones (a probe, a signature checked,
        # a session made): its time says little of the next batches' (``autobatch.ways``)
        self.fresh = False
        self.planned_now = False  # whether the last batch made the node-level plan (else it was kept)

    def fits(self, batch: Sequence[Mapping[str, Any]],
             signatures: Sequence[tuple]) -> list[tuple[int, Mapping[str, np.ndarray]]] | None:
        """``signatures``: the instances' input signatures (``feed_keys.input_signature``)."""
        try:
            return self._fits_of(batch, signatures)
        except Exception as error:  # noqa: BLE001 - said at WARNING; the batch is planned per mix instead
            self.refuse(f"its node-level plan failed ({type(error).__name__}: {error})", logging.WARNING)
            return None

    def _fits_of(self, batch: Sequence[Mapping[str, Any]],
                 signatures: Sequence[tuple]) -> list[tuple[int, Mapping[str, np.ndarray]]] | None:
        self.fresh = self.planned_now = self.runner is None
        if self.refusal is not None or len(batch) < 2 or self.runner is None and not self._probe(batch, signatures):
            return None
        fits = []
        for feeds, signature in zip(batch, signatures):
            fit = self._fits.get(signature)
            if fit is None:
                fit = self._fits[signature] = self._fit(self.runner.plan, feeds)  # type: ignore[union-attr]
                self.fresh = True
            if isinstance(fit, Refusal):
                log.debug("a batch of %s is planned per mix: an instance %s", self.graph.name, fit.reason)
                return None
            fits.append(fit)
        return fits if any(length for length, _ in fits) else None  # (no rows at all: no chunks to run)

    def run(self, names: Sequence[str], batch: Sequence[Mapping[str, Any]],
            fits: Sequence[tuple[int, Mapping[str, np.ndarray]]]) -> tuple[list[list[np.ndarray]], BatchReport]:
        """Outputs ``names`` of every instance (``fits``: what ``lengths`` gave), and what ran."""
        lengths, constants = [length for length, _ in fits], [weights for _, weights in fits]
        made = self.runner.made  # type: ignore[union-attr]
        results, chunk_count = self.runner.run(names, batch, lengths, constants)  # type: ignore[union-attr]
        self.fresh = self.fresh or self.runner.made > made  # type: ignore[union-attr]
        plan = self.runner.plan  # type: ignore[union-attr]
        by_op = self.runner.launches(chunk_count)  # type: ignore[union-attr]
        return results, BatchReport("instance axis", len(plan.records) * len(batch), sum(by_op.values()),
                                    len(plan.records), 0, 0, 0, 0, launches_by_op=by_op)

    def model(self, batch: Sequence[Mapping[str, Any]]) -> onnx.ModelProto | None:
        """The one graph that runs this batch (``autobatch inspect --draw``), or None where the
        batch is planned per mix."""
        fits = self.fits(batch, [input_signature(feeds) for feeds in batch])
        if fits is None:
            return None
        return lower(self.runner.plan, len(chunk_members(np.array([length for length, _ in fits]), CHUNK)))  # type: ignore[union-attr]

    def refuse(self, reason: str, level: int = logging.INFO) -> None:
        self.refusal, self.runner, self.lengths = reason, None, None
        log.log(level, "batches of %s are planned per mix: %s", self.graph.name, reason)

    def _probe(self, batch: Sequence[Mapping[str, Any]], signatures: Sequence[tuple]) -> bool:
        """Makes the plan from the batch's two biggest instances of different input signatures;
        False where the batch has no two that tell (its plan waits for a batch that has)."""
        if any(not isinstance(value, np.ndarray) for feeds in batch for value in feeds.values()):
            return False  # sequences, optionals: no rows to concatenate
        by_signature = dict(zip(signatures, batch))
        if len(by_signature) < 2:
            return False
        two = sorted(by_signature.values(), key=lambda feeds: -sum(value.size for value in feeds.values()))[:2]
        plan = probe([self.instances.records_of(feeds) for feeds in two], list(self.graph.inputs),
                     list(self.graph.outputs), self.graph.opset_imports.get("", 0))
        if plan is None:
            self._undecided += 1
            if self._undecided == PROBES:
                self.refuse(f"{PROBES} batches did not tell the axis of its inputs' and outputs' rows")
            return False
        if isinstance(plan, Refusal):
            self.refuse(plan.reason)
            return False
        self.runner = InstanceAxisRunner(plan, self.settings)
        try:
            self.lengths = LengthCheck(self.graph, self.instances.graph_of(two[0]), plan)
        except Exception as error:  # noqa: BLE001 - each new length is typed instead
            log.debug("new lengths of %s are typed: %s: %s", self.graph.name, type(error).__name__, error)
        log.info("batches of %s run as one graph of its nodes over every instance's rows", self.graph.name)
        return True

    def _fit(self, plan: InstanceAxisPlan, feeds: Mapping[str, Any]) -> tuple[int, Mapping[str, np.ndarray]] | Refusal:
        """The instance's length and its constants (some are given per mix), or why it does not fit."""
        length = plan.length({name: np.shape(value) for name, value in feeds.items()})
        if isinstance(length, Refusal):
            return length
        refusal = plan.takes(length)
        if refusal is not None:
            return refusal
        constants = None if self.lengths is None else self.lengths.constants(
            length, {name: np.asarray(value).dtype for name, value in feeds.items()})
        if constants is not None:
            return length, constants
        records = self.instances.records_of(feeds)
        refusal = plan.refusal(records)  # (a Refusal is falsy: not ``or``)
        return (length, records.weights) if refusal is None else refusal
