"""One model's instances batched node by node along their length axis: a plan decided once per
node of the model, not once per record of every mix.

A model exported for one instance (``ids [1, L]``) computes every instance with the same nodes;
only the length differs. The batch of any mix then runs the model's own graph once, over every
instance's rows: so the plan is made once, from two instances of different lengths (``probe``),
and a new mix only has to show that each of its input signatures fits it
(``InstanceAxisPlan.refusal``, once per signature) and to give the index arrays of its lengths
(``backends.instance_axis``). A new mix costs microseconds of planning, and one lowered graph
serves every mix. A node runs in one of two layouts:

- **rows**: where it is row-wise across lengths (``batcher.ragged``: its length-free signature is
  the same at every length), over every instance's rows concatenated: ``[1, L, d]`` becomes
  ``[1, N, d]``. A reshape of each row is a Reshape to its row shape; a recurrent layer runs as
  padded chunks of sequences (``batcher.sequences``); a Gather (or GatherND) along the length by
  positions of each length's own (Hugging Face's exports pick their attention mask so) reads
  them given per mix, offset to each instance's rows (``GATHER``); a GatherElements from a shared
  table by each row's own indices (``ELEMENTS``). One position of each instance picked along the
  length (a classifier's first token: ``PICK``) is a value of **one row an instance** (``[1, d]``
  each, ``[n, d]`` for the mix): the row-wise ops after it (the pooler, the head) run over those
  rows, and such a value is never padded nor read beside a value of the length; so is a sum,
  mean, max or min over the length (mean pooling: ``POOLED``), computed in padded chunks (padded
  positions 0, a mean over each instance's own count; -inf or +inf for a max or min). An
  instance shorter than a picked position, or empty under a reduction, sends its batch to the
  flat planner (``InstanceAxisPlan.takes``). An ArgMax or ArgMin over the length is such a
  reduction (padded positions the lowest or highest value, after every real one: never picked);
  a Gather (or GatherND) along the length by positions that are values of one row an instance
  (``PICKED``: GPT-2's classifier reads its last real token so) reads each instance's row at its
  own position, counted from its own end where negative; a position past an instance's length
  sends the batch to the flat planner, where that instance fails alone.
- **padded**: where it is not (attention: a product of two per-instance values, ``[1, H, L, L]``),
  over the instances sorted by length and cut into chunks of 8, each padded to its longest:
  ``[8, 1, H, Lmax, Lmax]``, the model's node itself on a new leading batch axis (its axis
  attributes one further right). A padded position never reaches a real one: a Softmax over a
  length axis first sets its padded positions to -inf (``key_mask``), a product summing over a
  length axis first zeroes both operands' padded positions there (``zeroed``), and the only other
  nodes taken keep each position apart (elementwise ops, Transpose, Reshape keeping the
  positions, Concat along other axes, an Expand of size-1 axes to the chunk's longest) or read
  only earlier positions (a CumSum; reversed, its padded positions zeroed first). So
  every real position is computed from real ones only,
  in the kernels' own summation order (float32 within 1e-5 relative).

A constant folded for each length (a position-embedding slice, a causal mask) is given per mix:
each instance's own, concatenated (rows) or padded (``fed``). Not taken (a refusal names the
node, and the flat planner plans such mixes): other ops, segment reductions and losses, a
recurrent layer whose final states are read, instances whose inputs differ in length.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from onnx import helper

from autobatch.batcher.axis_steps import (CONCAT, ELEMENTS, GATHER, PADDED, PICK, PICKED, POOLED, Pattern, Step,
                                          aligned, constants_read, fits_pattern, length_free_signature, padded_reshape,
                                          row_axis, rows_axis, step_for, with_fed)
from autobatch.batcher.instances import InstanceRecords, alike
from autobatch.batcher.ragged import one_row_signatures, record_attribute
from autobatch.batcher.rule_tables import Refusal, refuse
from autobatch.batcher.signature import attributes_key
from autobatch.ir.records import Record
from autobatch.ir.types import ValueType, type_of_value


@dataclass
class InstanceAxisPlan:
    """Every node of a model's instance, batched along the length axis: ``records`` (the probe's,
    in order) and their ``steps``; the ``patterns`` of per-instance values (the model's inputs,
    outputs and every node's); the shared constants (``weights``)."""

    records: list[Record]
    steps: list[Step]
    weights: dict[str, np.ndarray]
    patterns: dict[str, Pattern]
    inputs: list[str]
    outputs: list[str]
    opset: int
    # a constant given per mix -> its pattern in each layout that reads it (True: padded; Falcon's
    # rotary tables are read by rows and by padded steps: a feed each)
    fed: dict[str, dict[bool, Pattern]]
    # those fed as positions along a length (``GATHER``): offset per instance; a GatherND's, the
    # component of each index tuple that is the position (the ones before index axes of size 1)
    indices: dict[str, int | None] = field(default_factory=dict)

    @functools.cached_property
    def padded(self) -> bool:
        return any(step.kind in (PADDED, POOLED) for step in self.steps)

    @functools.cached_property
    def recurrent(self) -> bool:
        return any(step.kind == "sequences" for step in self.steps)

    @functools.cached_property
    def picks(self) -> list[tuple[Record, Step]]:
        """The ``PICK`` steps and their records (a mix's feeds and its lengths' check read them)."""
        return [(record, step) for record, step in zip(self.records, self.steps) if step.kind == PICK]

    @functools.cached_property
    def picked(self) -> bool:
        """Whether a step reads positions the graph computes (a mix's feeds give each instance's
        first row and length; the run checks the positions)."""
        return any(step.kind == PICKED for step in self.steps)

    @functools.cached_property
    def bounded(self) -> dict[str, int]:
        """The indices given per mix of a padded GatherElements, and the size of the axis they
        index (a mix's feeds check them: past it, only that instance fails alone)."""
        return {record.inputs[1]: self.patterns[record.inputs[0]][record_attribute(record, "axis", 0) % len(
            self.patterns[record.inputs[0]])] for record, step in zip(self.records, self.steps)
            if step.kind == PADDED and record.op_type == "GatherElements" and record.inputs[1] in step.fed}

    @functools.cached_property
    def pooled(self) -> bool:
        return any(step.kind == POOLED for step in self.steps)

    def axis(self, name: str) -> int:
        """The axis of a per-instance value's rows (of the model's inputs and outputs: the first
        axis of the instance's length, or the first of a value of one row an instance)."""
        pattern = self.patterns[name]
        return pattern.index(None) if None in pattern else 0

    def one_row(self, name: str) -> bool:
        """Whether a per-instance value has one row an instance (no length axis: a pooled output)."""
        return None not in self.patterns[name]

    def elem_type(self, name: str) -> int:
        """The ONNX element type of a per-instance value."""
        for record in self.records:
            if name in record.outputs:
                return record.types[record.outputs.index(name)].elem_type
            for read, entry in zip(record.inputs, record.entries):
                if read == name and hasattr(entry, "elem_type"):
                    return entry.elem_type
        raise KeyError(name)

    def dtype(self, name: str) -> np.dtype:
        """The NumPy dtype of a per-instance value or a shared constant."""
        return self.weights[name].dtype if name in self.weights else helper.tensor_dtype_to_np_dtype(self.elem_type(name))

    def refusal(self, instance: InstanceRecords) -> Refusal | None:
        """Why an instance of another input signature is not computed by this plan (its nodes
        sign otherwise, or read other constants), or None."""
        if len(instance.records) != len(self.records):
            return refuse(f"its graph has {len(instance.records)} nodes, not {len(self.records)}")
        length = self.length({name: getattr(_type(instance, name), "shape", None) for name in self.inputs})
        if isinstance(length, Refusal):
            return length
        for record, mine, step in zip(instance.records, self.records, self.steps):
            where = f"{mine.op_type} {mine.outputs[0]!r}"
            if record.op_type != mine.op_type:
                return refuse(f"node {mine.outputs[0]!r} is {record.op_type}, not {mine.op_type}")
            shared = [name for name in constants_read(record, instance.weights) if name not in step.fed]
            if step.reads_constants and any(not alike(instance.weights[name], self.weights[name]) for name in shared):
                return refuse(f"{where} reads a constant of this length's own")
            if any(not fits_pattern(aligned(instance.weights[name], pattern).shape, pattern, length)
                   for name, pattern in step.fed.items()):
                return refuse(f"{where} reads a constant of another shape")
            if step.kind in (GATHER, ELEMENTS, PICK, PICKED, POOLED, CONCAT):  # (its indices' shape checked above, their values when fed or run)
                continue
            if step.kind == PADDED:
                values = [(name, vtype) for name, vtype in zip(record.outputs, record.types) if name] + \
                    [(name, entry) for name, entry in zip(record.inputs, record.entries) if isinstance(entry, ValueType)]
                if any(vtype is None or not fits_pattern(vtype.shape, self.patterns[name], length) for name, vtype in values):
                    return refuse(f"{where} has other shapes at this length")
                continue
            found = length_free_signature(record, instance.weights, self.opset, step.fed, row_axis(mine, self.patterns))
            if found != step.signature and step.signature not in one_row_signatures(
                    with_fed(record, instance.weights, step.fed), instance.weights, self.opset,
                    attributes_key(record.attributes)):
                return refuse(f"{where} signs otherwise at this length")
        return None

    def takes(self, length: int) -> Refusal | None:
        """Why an instance of this length is not computed by this plan (a position picked past
        it, a reduction over none of it: run alone it fails, or its backend decides), or None."""
        for record, step in self.picks:
            if not -length <= step.position < length:  # type: ignore[operator]
                return refuse(f"{record.op_type} {record.outputs[0]!r} picks position {step.position} of {length}")
        return refuse("a reduction over the length reduces over no positions") if self.pooled and not length else None

    def length(self, shapes: Mapping[str, Sequence[int] | None]) -> int | Refusal:
        """The length of an instance whose inputs have these ``shapes``: the same along each
        input's length axes, the rest as the model's."""
        lengths = {shapes[name][k] for name in self.inputs for k, d in enumerate(self.patterns[name])  # type: ignore[index]
                   if d is None and shapes[name] is not None and len(shapes[name]) == len(self.patterns[name])}  # type: ignore[arg-type]
        if len(lengths) != 1:
            return refuse(f"its inputs differ in length: {sorted(lengths)}" if lengths else "its inputs have other ranks")
        length = lengths.pop()
        if not all(fits_pattern(shapes[name], self.patterns[name], length) for name in self.inputs):
            return refuse("its inputs have other shapes than the model's")
        return length


def probe(instances: Sequence[InstanceRecords], inputs: Sequence[str], outputs: Sequence[str],
          opset: int) -> InstanceAxisPlan | Refusal | None:
    """The plan of a model from two of its instances of different lengths, a refusal naming the
    node that stops it, or None where they do not tell the length axes (an input of one row)."""
    first, second = instances
    if len(first.records) != len(second.records):
        return refuse("its graph differs between lengths")
    read = {name for record in first.records for name in record.inputs}
    inputs = [name for name in inputs if name in read]  # (one no node reads is not fed)
    lengths = _lengths(instances, inputs[0]) if inputs else None
    if lengths is None or min(lengths) < 2:  # (at one row, rows_of may take another axis for the rows')
        return None
    patterns: dict[str, Pattern] = {}
    for name in inputs:
        pattern = _pattern(_type(first, name), _type(second, name), lengths)  # type: ignore[arg-type]
        if pattern is None or pattern.count(None) != 1 or rows_axis(pattern) is None:
            return refuse(f"input {name!r} has no rows along one axis of its length")
        patterns[name] = pattern
    if opset < 9:
        return refuse(f"opset {opset}: its masks need Where (opset 9)")
    padded = set()  # values in the padded layout
    fed_as: dict[str, dict[bool, Pattern]] = {}  # a constant given per mix: its pattern in each layout read (padded?)
    indices: dict[str, int | None | bool] = {}  # a constant given per mix -> as positions (``_gather_step``) or False
    read |= set(outputs)
    steps = []
    for a, b in zip(first.records, second.records):
        where = f"{a.op_type} {a.outputs[0]!r}"
        fed = {}
        for name in constants_read(a, first.weights):
            if not alike(first.weights[name], second.weights[name]):
                pattern = _pattern(type_of_value(first.weights[name]), type_of_value(second.weights[name]), lengths)  # type: ignore[arg-type]
                fed[name] = pattern  # (None: no pattern; refused below unless a reshape's target)
        for name, (type_a, type_b) in zip(a.outputs, zip(a.types, b.types)):
            if name:
                pattern = _pattern(type_a, type_b, lengths)  # type: ignore[arg-type]
                if pattern is None:
                    return refuse(f"{where}: its output {name!r} is not of the instance's length")
                patterns[name] = pattern
        step = step_for(a, b, first, second, opset, fed, patterns)
        if isinstance(step, Refusal):
            return refuse(f"{where}: {step.reason}")
        if step.kind == PADDED:
            padded.update(name for name in a.outputs if name)
        elif step.kind == "reshape" and a.inputs[0] in padded:  # a padded value kept padded: no moves
            kept = padded_reshape(a.op_type, patterns[a.inputs[0]], patterns[a.outputs[0]])
            if not isinstance(kept, Refusal):
                step = kept
                padded.add(a.outputs[0])
        elif step.kind == "sequences" and any(name in read for name in a.outputs[1:]):
            return refuse(f"{where}: its final states are read")
        elif step.kind == "sequences" and None not in patterns[a.inputs[0]]:  # (its chunks run each instance's length)
            return refuse(f"{where}: a recurrent layer over one row an instance")
        for name, pattern in step.fed.items():  # a feed a layout: each of its readers reads it alike
            positions = step.component if step.kind == GATHER else False
            if fed_as.setdefault(name, {}).setdefault(step.kind == PADDED, pattern) != pattern or \
                    indices.setdefault(name, positions) != positions:
                return refuse(f"{where} reads a constant given per mix that another node reads otherwise")
        if step.kind not in (PADDED, POOLED):  # what it reads in the padded layout goes back to rows
            if any(name in padded and rows_axis(patterns[name]) is None for name in a.inputs):
                return refuse(f"{where} reads a padded value that has no rows")
        steps.append(step)
    for name in outputs:
        one_row = name in patterns and None not in patterns[name] and patterns[name][:1] == (1,)
        if name not in patterns or not one_row and (patterns[name].count(None) != 1 or rows_axis(patterns[name]) is None):
            return refuse(f"output {name!r} has no rows along one axis of its length, nor one row an instance")
    return InstanceAxisPlan(first.records, steps, first.weights, patterns, list(inputs), list(outputs), opset, fed_as,
                            {name: positions for name, positions in indices.items() if positions is not False})


def _type(instance: InstanceRecords, name: str) -> ValueType | None:
    """The type of value ``name`` in this instance."""
    if name in instance.producer:
        record = instance.records[instance.producer[name]]
        return record.types[record.outputs.index(name)]
    return next((entry for record in instance.records for entry, read in zip(record.entries, record.inputs)
                 if read == name and isinstance(entry, ValueType)), None)


def _lengths(instances: Sequence[InstanceRecords], name: str) -> tuple[int, int] | None:
    """The two instances' lengths: the sizes of the one axis where input ``name`` differs."""
    shapes = [getattr(_type(piece, name), "shape", None) for piece in instances]
    if None in shapes or len(shapes[0]) != len(shapes[1]):  # type: ignore[arg-type]
        return None
    differ = [(x, y) for x, y in zip(*shapes) if x != y]  # type: ignore[call-overload]
    return differ[0] if len(differ) == 1 and all(isinstance(d, int) for d in differ[0]) else None


def _pattern(a: ValueType | None, b: ValueType | None, lengths: Sequence[int]) -> Pattern | None:
    """The shape of a value at both lengths, None where it is each length; None where the two
    differ otherwise."""
    if a is None or b is None or a.shape is None or b.shape is None or len(a.shape) != len(b.shape):
        return None
    pattern = []
    for x, y in zip(a.shape, b.shape):
        if not isinstance(x, int) or not isinstance(y, int):
            return None
        if x == y:
            pattern.append(x)
        elif (x, y) == tuple(lengths):
            pattern.append(None)
        else:
            return None
    return tuple(pattern)
