"""One model's instances batched node by node along their length axis: a plan decided once per
node of the model, not once per record of every mix.

A model exported for one instance (``ids [1, L]``) computes every instance with the same nodes;
only the length differs. Where each node is row-wise across lengths (``batcher.ragged``: its
length-free signature is the same at every length) or a recurrent layer over the sequence
(``batcher.sequences``), the batch of any mix is the model's own graph run once over every
instance's rows concatenated along that axis: ``[1, L, d]`` becomes ``[1, N, d]``, N the rows of
the whole batch. So the plan is made once, from two instances of different lengths (``probe``),
and a new mix only has to show that each of its input signatures signs as the plan does
(``InstanceAxisPlan.refusal``, once per signature) and to give the index arrays of its lengths
(``backends.instance_axis``). Planning a new mix then costs microseconds, not a pass over its
records, and the lowered graph serves every mix.

Not taken (a refusal says which node and why, and the flat planner plans such mixes): an op that
is not row-wise (attention's products of two per-instance values), segment reductions and
losses, a recurrent layer whose final states are read, instances whose inputs differ in length,
and constants that differ between lengths other than a reshape's target.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from autobatch.batcher.instances import InstanceRecords, alike
from autobatch.batcher.ragged import one_row_signatures, ragged_signature, rows_of
from autobatch.batcher.rule_tables import Refusal, refuse
from autobatch.batcher.signature import attributes_key
from autobatch.ir.records import Record

KINDS = frozenset({"ragged", "reshape", "sequences"})  # the length-free signatures a node-level plan takes
ONE_ROW = -1  # a value of at most one row says nothing of its axis


@dataclass
class InstanceAxisPlan:
    """Every node of a model's instance, batched along the rows' axis: ``records`` (the probe's,
    in order) with their length-free ``signatures``; the model's ``inputs`` and ``outputs`` with the
    axis their rows run along; the shared constants the records read (``weights``)."""

    records: list[Record]
    signatures: list[tuple]
    weights: dict[str, np.ndarray]
    inputs: dict[str, int]
    outputs: dict[str, int]
    opset: int

    def refusal(self, instance: InstanceRecords) -> Refusal | None:
        """Why an instance of another input signature is not computed by this plan (its nodes
        sign otherwise, or read other constants), or None."""
        if len(instance.records) != len(self.records):
            return refuse(f"its graph has {len(instance.records)} nodes, not {len(self.records)}")
        for record, mine, signature in zip(instance.records, self.records, self.signatures):
            if record.op_type != mine.op_type:
                return refuse(f"node {mine.outputs[0]!r} is {record.op_type}, not {mine.op_type}")
            found = _signature(record, instance.weights, self.opset)
            if found != signature and signature not in one_row_signatures(
                    record, instance.weights, self.opset, attributes_key(record.attributes)):
                return refuse(f"{mine.op_type} {mine.outputs[0]!r} signs otherwise at this length")
            if signature[0] != "reshape" and any(not alike(instance.weights[name], self.weights[name])
                                                 for name in _constants(record, instance.weights)):
                return refuse(f"{mine.op_type} {mine.outputs[0]!r} reads a constant of this length's own")
        return None

    def length(self, shapes: Mapping[str, Sequence[int]]) -> int | Refusal:
        """The rows of an instance whose inputs have these ``shapes``: the same along every input's axis."""
        lengths = {shapes[name][axis] for name, axis in self.inputs.items()}
        if len(lengths) != 1:
            return refuse(f"its inputs differ in length: {sorted(lengths)}")
        return lengths.pop()


def probe(instances: Sequence[InstanceRecords], inputs: Sequence[str], outputs: Sequence[str],
          opset: int) -> InstanceAxisPlan | Refusal | None:
    """The plan of a model from two of its instances of different lengths, a refusal naming the
    node that stops it, or None where their inputs' or outputs' rows do not run along one axis:
    a value of one row (or none) does not tell its axis, and two other instances may."""
    first, second = instances
    if len(first.records) != len(second.records):
        return refuse("its graph differs between lengths")
    read = {name for record in first.records for name in record.inputs} | set(outputs)
    signatures = []
    for a, b in zip(first.records, second.records):
        where = f"{a.op_type} {a.outputs[0]!r}"
        sig_a, sig_b = _signature(a, first.weights, opset), _signature(b, second.weights, opset)
        for found in (sig_a, sig_b):
            if isinstance(found, Refusal):
                return refuse(f"{where}: {found.reason}")
        if sig_a[0] not in KINDS:
            return refuse(f"{where}: a {sig_a[0]} step")
        if sig_a != sig_b:
            return refuse(f"{where} signs otherwise at another length")
        if sig_a[0] == "sequences" and any(name in read for name in a.outputs[1:]):
            return refuse(f"{where}: its final states are read")
        if sig_a[0] != "reshape" and any(not alike(first.weights[name], second.weights[name])
                                         for name in _constants(a, first.weights)):
            return refuse(f"{where} reads a constant that differs between lengths")
        signatures.append(sig_a)
    axes = {}
    for name in [*inputs, *outputs]:
        found = [_rows_axis(piece, name) for piece in instances]
        if None in found:
            return refuse(f"{name!r} has no shape known")
        if ONE_ROW in found or found[0] != found[1]:  # (a value of one row [1, 1, d] seems to run along d)
            return None
        axes[name] = found[0]
    return InstanceAxisPlan(first.records, signatures, first.weights, {n: axes[n] for n in inputs},
                            {n: axes[n] for n in outputs}, opset)


def _signature(record: Record, weights: Mapping[str, np.ndarray], opset: int) -> tuple | Refusal:
    return ragged_signature(record, weights, opset, attributes_key(record.attributes))


def _constants(record: Record, weights: Mapping[str, np.ndarray]) -> list[str]:
    return [entry for entry in record.entries if type(entry) is str and entry in weights]


def _rows_axis(instance: InstanceRecords, name: str) -> int | None:
    """The axis the rows of value ``name`` run along in this instance, ``ONE_ROW``, or None
    where its shape is not known."""
    if name in instance.producer:
        record = instance.records[instance.producer[name]]
        vtype = record.types[record.outputs.index(name)]
    else:
        vtype = next((entry for record in instance.records for entry, read in zip(record.entries, record.inputs)
                      if read == name), None)
    shape = getattr(vtype, "shape", None)
    if shape is None or not all(isinstance(d, int) for d in shape):
        return None
    run = rows_of(shape)
    return ONE_ROW if run is None or run[1] < 2 else run[0]
