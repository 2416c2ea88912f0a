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
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from onnx import helper

from autobatch.batcher.instances import InstanceRecords, alike
from autobatch.batcher.ragged import ELEMENTWISE, one_row_signatures, ragged_signature, record_attribute, sliced_axes
from autobatch.batcher.rule_tables import Refusal, refuse
from autobatch.batcher.signature import attributes_key
from autobatch.ir.records import Record
from autobatch.ir.types import ValueType, type_of_value

ROWS_KINDS = frozenset({"ragged", "reshape", "sequences"})  # the length-free signatures the rows layout takes
GATHER = "gather"  # a rows step: a Gather(ND) along the length by indices of each length's own (a mask's positions)
ELEMENTS = "elements"  # a rows step: a GatherElements from a shared table by each row's own indices
PICK = "pick"  # a rows step: one position of each instance (a pooler's first token): a value of one row an instance
POOLED = "pooled"  # a reduction over the length (mean pooling, an ArgMax): run padded, a value of one row an instance
POOLING = frozenset({"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ArgMax", "ArgMin"})
# a rows step: each instance's row at a position of its own computed by the graph (GPT-2's
# classifier: its last real token, found by an ArgMax): a value of one row an instance
PICKED = "picked"
CONCAT = "concat"  # a rows step: a Concat of values in rows and shared constants of one row (broadcast to every row)
PADDED_ELEMENTWISE = frozenset({*ELEMENTWISE, "IsNaN", "IsInf"})
PADDED = "padded"
Pattern = tuple  # a per-instance value's shape, None at each axis of the instance's length


@dataclass
class Step:
    """What the plan does with one record: its ``kind`` (a rows kind or ``PADDED``), the
    length-free ``signature`` every instance's record must sign (rows kinds), the constants given
    per mix (``fed``: name -> its pattern), and for a padded step the input indices whose padded
    positions are zeroed along an axis first (``zeroed``), the axis a Softmax masks (``key_mask``),
    a Reshape's target (``target``: 0 keeps the batch axis, -1 the length) and an Expand's output
    pattern (``broadcast``); its axes are the instance's (the padded layout's are one further right)."""

    kind: str
    signature: tuple = ()
    fed: dict[str, Pattern] = field(default_factory=dict)
    zeroed: dict[int, int] = field(default_factory=dict)
    key_mask: int | None = None
    target: tuple[int, ...] | None = None
    broadcast: Pattern | None = None  # an Expand's: its output's pattern (the chunk's longest at each None)
    component: int | None = None  # a GatherND's (``GATHER``, ``PICKED``): the entry of its index tuples that is a position
    axis_input: int | None = None  # a padded CumSum's axis (an input, one further right in the padded layout)
    sliced: tuple[int, ...] | None = None  # a padded Slice's axes (an input, one further right too)
    position: int | None = None  # a ``PICK``'s position along the length (negative: from the end)
    reduced: int | None = None  # a ``POOLED``'s axis: the length's

    @property
    def reads_constants(self) -> bool:
        """Whether the node's shared constants are read as they are: a reshape's target or an
        Expand's shape, folded per length, is not (its shape comes from the patterns)."""
        return self.kind != "reshape" and self.target is None and self.broadcast is None


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
            shared = [name for name in _constants(record, instance.weights) if name not in step.fed]
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
            found = _signature(record, instance.weights, self.opset, step.fed, _row_axis(mine, self.patterns))
            if found != step.signature and step.signature not in one_row_signatures(
                    _with_fed(record, instance.weights, step.fed), instance.weights, self.opset,
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
        if pattern is None or pattern.count(None) != 1 or _rows_axis(pattern) is None:
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
        for name in _constants(a, first.weights):
            if not alike(first.weights[name], second.weights[name]):
                pattern = _pattern(type_of_value(first.weights[name]), type_of_value(second.weights[name]), lengths)  # type: ignore[arg-type]
                fed[name] = pattern  # (None: no pattern; refused below unless a reshape's target)
        for name, (type_a, type_b) in zip(a.outputs, zip(a.types, b.types)):
            if name:
                pattern = _pattern(type_a, type_b, lengths)  # type: ignore[arg-type]
                if pattern is None:
                    return refuse(f"{where}: its output {name!r} is not of the instance's length")
                patterns[name] = pattern
        step = _gather_step(a, fed, patterns) or _elements_step(a, first.weights, fed, patterns) or \
            _pick_step(a, first.weights, fed, patterns) or _picked_step(a, fed, patterns) or \
            _pooled_step(a, first.weights, fed, patterns) or _concat_step(a, first.weights, fed, patterns, opset) or \
            _rows_step(a, b, first, second, opset, fed, _row_axis(a, patterns))
        if not isinstance(step, Refusal) and step.kind not in (PICK, PICKED, POOLED, "sequences") and \
                _mixes_rows(a, patterns):
            step = refuse("it reads values of the length and values of one row an instance")
        if isinstance(step, Refusal):
            step = _padded_step(a, first.weights, fed, patterns, opset)
            if isinstance(step, Refusal):
                return refuse(f"{where}: {step.reason}")
            padded.update(name for name in a.outputs if name)
        elif step.kind == "reshape" and a.inputs[0] in padded:  # a padded value kept padded: no moves
            kept = _padded_reshape(a.op_type, patterns[a.inputs[0]], patterns[a.outputs[0]])
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
            if any(name in padded and _rows_axis(patterns[name]) is None for name in a.inputs):
                return refuse(f"{where} reads a padded value that has no rows")
        steps.append(step)
    for name in outputs:
        one_row = name in patterns and None not in patterns[name] and patterns[name][:1] == (1,)
        if name not in patterns or not one_row and (patterns[name].count(None) != 1 or _rows_axis(patterns[name]) is None):
            return refuse(f"output {name!r} has no rows along one axis of its length, nor one row an instance")
    return InstanceAxisPlan(first.records, steps, first.weights, patterns, list(inputs), list(outputs), opset, fed_as,
                            {name: positions for name, positions in indices.items() if positions is not False})


def _gather_step(record: Record, fed: dict[str, Pattern | None], patterns: dict[str, Pattern]) -> Step | None:
    """A Gather along the length of a value in rows (its only length axis, every axis before it
    1), or a GatherND whose index tuples reach that axis, by indices of each length's own that
    are in rows too: a rows step, its indices given per mix offset to each instance's rows
    (Hugging Face's exports pick a mask's positions so, the legacy exporter by Gather, dynamo's
    by GatherND). None for any other record."""
    if record.op_type not in ("Gather", "GatherND") or record.domain or len(record.inputs) != 2 \
            or record.inputs[1] not in fed or not isinstance(record.entries[0], ValueType):
        return None
    data, positions, out = patterns[record.inputs[0]], fed[record.inputs[1]], patterns.get(record.outputs[0])
    rows = _rows_axis(data)
    if positions is None or rows is None:
        return None
    if record.op_type == "Gather":
        axis = record_attribute(record, "axis", 0) % len(data)
        if axis != rows or _rows_axis(positions) is None or out != (*data[:axis], *positions, *data[axis + 1:]):
            return None
        return Step(GATHER, fed={record.inputs[1]: positions})
    tuples = positions[-1]  # an index tuple: its first entries index the data's first axes
    if record_attribute(record, "batch_dims", 0) != 0 or tuples is None or not rows < tuples <= len(data) \
            or _rows_axis(positions[:-1]) is None or out != (*positions[:-1], *data[tuples:]):
        return None
    return Step(GATHER, fed={record.inputs[1]: positions}, component=rows)


def _elements_step(record: Record, weights: Mapping[str, np.ndarray], fed: dict[str, Pattern | None],
                   patterns: dict[str, Pattern]) -> Step | None:
    """A GatherElements from a shared table along the rows axis of its per-instance indices:
    each output row reads only its own row of indices, so it runs over every instance's rows
    (RoBERTa's exports pick its token types so, by position ids). None for any other record."""
    if record.op_type != "GatherElements" or record.domain or len(record.inputs) != 2:
        return None
    table, indices = record.inputs
    if table not in weights or table in fed or not isinstance(record.entries[1], ValueType):
        return None
    pattern = patterns[indices]
    axis = record_attribute(record, "axis", 0) % len(pattern)
    if _rows_axis(pattern) != axis or patterns.get(record.outputs[0]) != pattern:
        return None
    return Step(ELEMENTS)


def _pick_step(record: Record, weights: Mapping[str, np.ndarray], fed: dict[str, Pattern | None],
               patterns: dict[str, Pattern]) -> Step | None:
    """A Gather of one shared position (a scalar: the first token, or the last) along the length
    of a value in rows: a value of one row an instance (``[1, d]`` of each, ``[n, d]`` of the mix),
    read per mix at each instance's row of that position (a classifier's pooler). None for any
    other record."""
    if record.op_type != "Gather" or record.domain or len(record.inputs) != 2 or record.inputs[1] in fed \
            or record.inputs[1] not in weights or np.ndim(weights[record.inputs[1]]) != 0:
        return None
    data, out = patterns.get(record.inputs[0]), patterns.get(record.outputs[0])
    axis = record_attribute(record, "axis", 0) % len(data) if data else None
    if data is None or _rows_axis(data) != axis or out != data[:axis] + data[axis + 1:] or out[:1] != (1,):
        return None
    return Step(PICK, position=int(weights[record.inputs[1]]))


def _picked_step(record: Record, fed: dict[str, Pattern | None], patterns: dict[str, Pattern]) -> Step | None:
    """A Gather along the length of a value in rows by positions that are a value of one row an
    instance (an ArgMax's), or a GatherND whose index tuples end at that axis (the entries before
    it index axes of 1): each instance's rows at its own positions, a value of one row an
    instance. None for any other record."""
    if record.op_type not in ("Gather", "GatherND") or record.domain or len(record.inputs) != 2 or fed:
        return None
    data, positions, out = (patterns.get(name) for name in (*record.inputs, record.outputs[0]))
    if data is None or positions is None or out is None or None in positions or positions[:1] != (1,):
        return None
    rows = _rows_axis(data)
    if rows is None or out[:1] != (1,):
        return None
    if record.op_type == "Gather":
        axis = record_attribute(record, "axis", 0) % len(data)
        return Step(PICKED) if axis == rows and out == (*data[:axis], *positions, *data[axis + 1:]) else None
    if record_attribute(record, "batch_dims", 0) != 0 or len(positions) < 2 or positions[-1] != rows + 1 \
            or out != (*positions[:-1], *data[rows + 1:]):
        return None
    return Step(PICKED, component=rows)


def _concat_step(record: Record, weights: Mapping[str, np.ndarray], fed: dict[str, Pattern | None],
                 patterns: dict[str, Pattern], opset: int) -> Step | None:
    """A Concat along a later axis than the rows' of values in rows (all of the length, or all of
    one row an instance) and shared constants of one row: each constant broadcast to every row
    (dynamo's GatherND indices: a batch index 0 beside each instance's position). None for any
    other record, or one of values only (a ragged rows step)."""
    if record.op_type != "Concat" or record.domain or fed or opset < 10:
        return None
    values = [patterns[name] for name in record.inputs if name in patterns]
    shared = [np.shape(weights[name]) for name in record.inputs if name in weights]
    out = patterns.get(record.outputs[0])
    if not values or not shared or len(values) + len(shared) != len(record.inputs) or out is None:
        return None
    rows = {0 if None not in pattern else _rows_axis(pattern) for pattern in (*values, out)}
    axis = record_attribute(record, "axis", 0) % len(out)
    if len(rows) != 1 or None in rows or len({None in pattern for pattern in (*values, out)}) != 1:
        return None
    row = rows.pop()
    if axis <= row or any(len(shape) != len(out) or shape[row] != 1 for shape in shared):
        return None
    return Step(CONCAT)


def _pooled_step(record: Record, weights: Mapping[str, np.ndarray], fed: dict[str, Pattern | None],
                 patterns: dict[str, Pattern]) -> Step | None:
    """A sum, mean, max or min over the length of a value (its only length axis), or the
    position of the first max or min: each instance's, a value of one row an instance, computed
    in padded chunks (padded positions 0 for a sum or mean, whose count is each instance's own;
    the lowest or highest value for a max or min, or their positions: a padded position comes
    after every real one, so that the first wins a tie). None for any other record."""
    if record.op_type not in POOLING or record.domain or not isinstance(record.entries[0], ValueType) \
            or record.entries[0].dtype == np.bool_:  # (a bool's padded positions: no Where of bools in onnxruntime)
        return None
    data, out = patterns.get(record.inputs[0]), patterns.get(record.outputs[0])
    axes = record_attribute(record, "axes", None)
    if record.op_type in ("ArgMax", "ArgMin"):  # (the last of equal values: a padded one might win)
        if record_attribute(record, "select_last_index", 0):
            return None
        axes = record_attribute(record, "axis", 0)
    if axes is None and len(record.inputs) > 1 and record.inputs[1]:
        if record.inputs[1] not in weights or record.inputs[1] in fed:
            return None
        axes = weights[record.inputs[1]].tolist()
    if data is None or out is None or axes is None or data.count(None) != 1 or out[:1] != (1,) or None in out:
        return None
    axis = data.index(None)
    if sorted(a % len(data) for a in np.atleast_1d(axes)) != [axis]:
        return None
    return Step(POOLED, reduced=axis)


def _of_length(record: Record, patterns: dict[str, Pattern]) -> set[bool]:
    """Per per-instance value the record reads or makes, whether it has the length (else it is
    of one row an instance): the kinds among them."""
    return {None in patterns[name] for name in (*record.inputs, *record.outputs) if name in patterns}


def _row_axis(record: Record, patterns: dict[str, Pattern]) -> int | None:
    """0 for a record of values of one row an instance (their rows are their first axis, of 1),
    else None (``rows_of`` finds them)."""
    return 0 if _of_length(record, patterns) == {False} else None


def _mixes_rows(record: Record, patterns: dict[str, Pattern]) -> bool:
    """Whether a record reads or makes both values of the length and values of one row an
    instance (whose rows would not line up: ``[1, N, d]`` against ``[n, d]``)."""
    return len(_of_length(record, patterns)) > 1


def _rows_step(a: Record, b: Record, first: InstanceRecords, second: InstanceRecords, opset: int,
               fed: dict[str, Pattern | None], axis: int | None = None) -> Step | Refusal:
    """The record as a rows step (its signature the same at both lengths), or why not. (A padded
    value it reads goes back to rows: a Gather of its real positions, cheaper than running every
    padded position.)"""
    sig_a = _signature(a, first.weights, opset, {}, axis)
    if not isinstance(sig_a, Refusal) and sig_a[0] == "reshape":  # its target, folded per length, is not read
        return Step("reshape", sig_a) if sig_a == _signature(b, second.weights, opset, {}, axis) else refuse("a reshape")
    if any(pattern is None or _rows_axis(pattern) is None for pattern in fed.values()):
        return refuse("a constant that differs between lengths, not along its rows")
    if fed:
        sig_a = _signature(a, first.weights, opset, fed, axis)
    if isinstance(sig_a, Refusal):
        return sig_a
    if sig_a[0] not in ROWS_KINDS:
        return refuse(f"a {sig_a[0]} step")
    if sig_a[0] == "sequences" and (fed or any(isinstance(e, ValueType) for e in a.entries[1:])):
        return refuse("a recurrent layer with initial states of its own")
    if sig_a != _signature(b, second.weights, opset, fed, axis):
        return refuse("it signs otherwise at another length")
    return Step(sig_a[0], sig_a, dict(fed))  # type: ignore[arg-type]


def _padded_step(record: Record, weights: Mapping[str, np.ndarray], fed: dict[str, Pattern | None],
                 patterns: dict[str, Pattern], opset: int) -> Step | Refusal:
    """The record as a padded step (see the module), or why not."""
    data = {k: patterns[name] for k, (name, entry) in enumerate(zip(record.inputs, record.entries))
            if isinstance(entry, ValueType)}
    outs = [patterns[name] for name in record.outputs if name]
    if any(None not in pattern for pattern in data.values()):
        return refuse("a value of one row an instance, not padded")
    if any(None not in pattern for pattern in outs):  # (a reduction over the length)
        return refuse("not row-wise, and no padded rule")
    if outs:  # a constant of a lower rank broadcasts as one with leading 1s
        fed = {name: p if p is None else (1,) * (len(outs[0]) - len(p)) + p for name, p in fed.items()}
    if record.domain or not outs:
        return refuse("not row-wise, and no padded rule")
    if any(p is None for p in fed.values()):
        return refuse("a constant that differs between lengths, not along its length")
    step = Step(PADDED, fed=dict(fed))  # type: ignore[arg-type]
    op, rank = record.op_type, len(outs[0])
    # The batch axis goes before every per-instance operand: broadcasting (from the right) keeps it
    # apart only where they all have the output's rank, and shared ones no more.
    shared = [np.ndim(weights[e]) for e in record.entries if type(e) is str and e in weights and e not in fed]
    if (op in PADDED_ELEMENTWISE or op == "Concat") and (any(len(p) != rank for p in data.values())
                                                       or any(r > rank for r in shared)):
        return refuse("operands of other ranks than its output's")
    if op in ("Div", "Mod") and record.types[0] is not None and \
            np.dtype(helper.tensor_dtype_to_np_dtype(record.types[0].elem_type)).kind in "iub":
        return refuse(f"an integer {op}: padded positions would divide by zero")
    if op in PADDED_ELEMENTWISE or op == "Concat" and (len(record.inputs) == 1 or outs[0][
            record_attribute(record, "axis", 0) % rank] is not None):
        return step
    if op in ("Gather", "Split") and list(data) == [0]:  # along an axis of the instance's own, not the length
        if any(name in fed for name in record.inputs[1:]):  # (one Gather of a chunk reads one set of indices)
            return refuse(f"a {op} by indices or sizes of each length's own")
        axis = record_attribute(record, "axis", 0) % len(data[0])
        return step if data[0][axis] is not None else refuse(f"a {op} along the length")
    if op == "Transpose":
        perm = record_attribute(record, "perm", None)
        return step if perm is not None else refuse("a Transpose without its perm")
    if op in ("Softmax", "LogSoftmax"):
        axis = record_attribute(record, "axis", -1 if opset >= 13 else 1) % rank
        if opset < 13 and axis != rank - 1:
            return refuse(f"{op}-{opset} over more than its last axis")
        step.key_mask = axis if outs[0][axis] is None else None
        return step
    if op == "MatMul" and 0 in data:
        a = data[0]
        if len(a) != rank or 1 in data and len(data[1]) != rank or any(r > rank for r in shared):
            return refuse("a product of operands of other ranks than its output's")
        if a[-1] is None:  # a sum over the length: both sides' padded positions zeroed
            if 1 not in data or len(data[1]) < 2:
                return refuse("a product over the length by a shared operand")
            step.zeroed = {0: len(a) - 1, 1: len(data[1]) - 2}
        return step
    if op in ("Reshape", "Squeeze", "Unsqueeze", "Flatten") and list(data) == [0]:
        return _padded_reshape(op, data[0], outs[0])
    if op == "CumSum" and list(data) == [0]:  # (RoBERTa's position ids: the count of real tokens so far)
        if record.inputs[1] not in weights or record.inputs[1] in fed:
            return refuse("a CumSum along an axis given per instance")
        axis = int(weights[record.inputs[1]]) % rank
        if record_attribute(record, "reverse", 0) and data[0][axis] is None:  # past the end, padding would count
            step.zeroed = {0: axis}
        step.axis_input = axis
        return step
    if op == "Conv" and list(data) == [0]:  # (a text CNN: a convolution along the length, as long as its input)
        x = data[0]
        if len(x) != 3 or x[0] != 1 or x[1] is None or x[2] is not None or outs[0][2] is not None or fed:
            return refuse("a Conv other than along the length of an instance's [1, C, L] by shared weights")
        step.zeroed = {0: 2}  # (its padding: zeros past the length, as the instance's own)
        return step
    if op == "GatherElements" and list(data) == [0]:  # (DeBERTa's scores by relative positions, given per mix)
        axis = record_attribute(record, "axis", 0) % rank
        return step if data[0][axis] is not None else refuse("a GatherElements along the length")
    if op == "Slice" and list(data) == [0]:  # (rotary embeddings' halves of each head)
        axes = sliced_axes(record, weights, rank)
        if axes is None or "starts" in record.attributes or any(data[0][a] is None for a in axes) \
                or any(name in fed for name in record.inputs[1:]):
            return refuse("a Slice along the length, or by bounds of each length's own")
        step.sliced = tuple(axes)
        return step
    if op == "Expand" and list(data) == [0]:  # (a mask's positions to an attention's [1, 1, L, L])
        if len(data[0]) != rank or any(d != o and d != 1 for d, o in zip(data[0], outs[0])):
            return refuse("an Expand that adds axes, or changes its length's")
        return Step(PADDED, broadcast=outs[0])
    return refuse("not row-wise, and no padded rule")


def _padded_reshape(op: str, source: Pattern, out: Pattern) -> Step | Refusal:
    """A reshape as a padded step: a Reshape of each chunk to ``target`` (its shape read from
    the patterns, not the node's target, which is folded per length), or why not."""
    lengths = source.count(None)
    if not lengths or out.count(None) != lengths or 0 in out:  # (its target's 0 copies the batch axis)
        return refuse(f"a {op} that adds or drops a length axis")
    first = [p.index(None) for p in (source, out)]
    if math.prod(source[:first[0]]) != math.prod(out[:first[1]]):  # (each position's elements stay its own)
        return refuse(f"a {op} that moves the length")
    if lengths > 1 and source[first[0]:] != out[first[1]:]:  # (ALiBi's [H, L, L] to [1, H, L, L])
        return refuse(f"a {op} of several length axes that reshapes them or the axes after them")
    return Step(PADDED, target=(0, *(-1 if d is None else d for d in out)))


def _signature(record: Record, weights: Mapping[str, np.ndarray], opset: int, fed: Mapping[str, object],
               axis: int | None = None) -> tuple | Refusal:
    return ragged_signature(_with_fed(record, weights, fed), weights, opset, attributes_key(record.attributes), axis)


def _with_fed(record: Record, weights: Mapping[str, np.ndarray], fed: Mapping[str, object]) -> Record:
    """The record with its ``fed`` constants as per-instance operands (their types)."""
    if not fed:
        return record
    return record._replace(entries=tuple(type_of_value(weights[e]) if type(e) is str and e in fed else e
                                         for e in record.entries))


def _constants(record: Record, weights: Mapping[str, np.ndarray]) -> list[str]:
    return [entry for entry in record.entries if type(entry) is str and entry in weights]


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


def _rows_axis(pattern: Pattern) -> int | None:
    """The length axis of a value whose rows are contiguous (every axis before it 1)."""
    if pattern.count(None) != 1:
        return None
    axis = pattern.index(None)
    return axis if all(d == 1 for d in pattern[:axis]) else None


def aligned(array: np.ndarray, pattern: Pattern) -> np.ndarray:
    """A constant given per mix, with the leading 1s of its pattern's rank."""
    return array.reshape((1,) * (len(pattern) - array.ndim) + array.shape) if array.ndim < len(pattern) else array


def pattern_at(pattern: Pattern, length: int) -> tuple[int, ...]:
    """The shape of a value of this pattern in an instance of ``length``."""
    return tuple(length if d is None else d for d in pattern)


def fits_pattern(shape: Sequence[int] | None, pattern: Pattern, length: int) -> bool:
    return shape is not None and tuple(shape) == pattern_at(pattern, length)


