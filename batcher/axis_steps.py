"""How the node-level plan (``batcher.instance_axis``) runs each node of a model's instance:
the kinds of step (a rows layout's, or ``PADDED``), a ``Step``, and ``step_for``, which tries the
rows kinds first (the cheapest: every instance's rows at once) and the padded layout where none
takes the node. The patterns of per-instance values (their shapes, None along the length) are
what each rule reads; ``batcher.instance_axis`` says what each kind does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from onnx import helper

from autobatch.batcher.instances import InstanceRecords
from autobatch.batcher.ragged import ELEMENTWISE, ragged_signature, record_attribute, sliced_axes
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


def step_for(a: Record, b: Record, first: InstanceRecords, second: InstanceRecords, opset: int,
             fed: dict[str, Pattern | None], patterns: dict[str, Pattern]) -> Step | Refusal:
    """How the plan runs record ``a`` (``b``: the same node in the second instance): a rows
    step where one takes it, else a padded one, else why neither."""
    step = _gather_step(a, fed, patterns) or _elements_step(a, first.weights, fed, patterns) or \
        _pick_step(a, first.weights, fed, patterns) or _picked_step(a, fed, patterns) or \
        _pooled_step(a, first.weights, fed, patterns) or _concat_step(a, first.weights, fed, patterns, opset) or \
        _rows_step(a, b, first, second, opset, fed, row_axis(a, patterns))
    if not isinstance(step, Refusal) and step.kind not in (PICK, PICKED, POOLED, "sequences") and \
            _mixes_rows(a, patterns):
        step = refuse("it reads values of the length and values of one row an instance")
    return _padded_step(a, first.weights, fed, patterns, opset) if isinstance(step, Refusal) else step


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
    rows = rows_axis(data)
    if positions is None or rows is None:
        return None
    if record.op_type == "Gather":
        axis = record_attribute(record, "axis", 0) % len(data)
        if axis != rows or rows_axis(positions) is None or out != (*data[:axis], *positions, *data[axis + 1:]):
            return None
        return Step(GATHER, fed={record.inputs[1]: positions})
    tuples = positions[-1]  # an index tuple: its first entries index the data's first axes
    if record_attribute(record, "batch_dims", 0) != 0 or tuples is None or not rows < tuples <= len(data) \
            or rows_axis(positions[:-1]) is None or out != (*positions[:-1], *data[tuples:]):
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
    if rows_axis(pattern) != axis or patterns.get(record.outputs[0]) != pattern:
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
    if data is None or rows_axis(data) != axis or out != data[:axis] + data[axis + 1:] or out[:1] != (1,):
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
    rows = rows_axis(data)
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
    rows = {0 if None not in pattern else rows_axis(pattern) for pattern in (*values, out)}
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
    if record.op_type in ("ReduceSum", "ReduceMean") and record.entries[0].dtype == np.float16:
        return None  # a float16 sum (and a mean of it) rounds otherwise than alone, as ``ragged.segment_keepdims`` says
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


def row_axis(record: Record, patterns: dict[str, Pattern]) -> int | None:
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
    sig_a = length_free_signature(a, first.weights, opset, {}, axis)
    if not isinstance(sig_a, Refusal) and sig_a[0] == "reshape":  # its target, folded per length, is not read
        return Step("reshape", sig_a) if sig_a == length_free_signature(b, second.weights, opset, {}, axis) else refuse("a reshape")
    if any(pattern is None or rows_axis(pattern) is None for pattern in fed.values()):
        return refuse("a constant that differs between lengths, not along its rows")
    if fed:
        sig_a = length_free_signature(a, first.weights, opset, fed, axis)
    if isinstance(sig_a, Refusal):
        return sig_a
    if sig_a[0] not in ROWS_KINDS:
        return refuse(f"a {sig_a[0]} step")
    if sig_a[0] == "sequences" and (fed or any(isinstance(e, ValueType) for e in a.entries[1:])):
        return refuse("a recurrent layer with initial states of its own")
    if sig_a != length_free_signature(b, second.weights, opset, fed, axis):
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
        return padded_reshape(op, data[0], outs[0])
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


def padded_reshape(op: str, source: Pattern, out: Pattern) -> Step | Refusal:
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


def length_free_signature(record: Record, weights: Mapping[str, np.ndarray], opset: int, fed: Mapping[str, object],
               axis: int | None = None) -> tuple | Refusal:
    return ragged_signature(with_fed(record, weights, fed), weights, opset, attributes_key(record.attributes), axis)


def with_fed(record: Record, weights: Mapping[str, np.ndarray], fed: Mapping[str, object]) -> Record:
    """The record with its ``fed`` constants as per-instance operands (their types)."""
    if not fed:
        return record
    return record._replace(entries=tuple(type_of_value(weights[e]) if type(e) is str and e in fed else e
                                         for e in record.entries))


def constants_read(record: Record, weights: Mapping[str, np.ndarray]) -> list[str]:
    return [entry for entry in record.entries if type(entry) is str and entry in weights]


def rows_axis(pattern: Pattern) -> int | None:
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
