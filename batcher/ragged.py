"""Ragged batching: instances whose values differ in length (sentences of different lengths as
``[n, d]`` matrices, or as an exporter gives one instance: ``[1, n, d]``) still batch where an
op treats rows independently. A value's rows run along its first axis that is not 1
(``rows_of``); the axes before it are 1s, so its rows are contiguous, as ``[n, *row]``. The
members' rows are concatenated (no padding), the op runs once on ``[sum of n, ...]`` (its
template reshapes them to the leading 1s and back), and the result stays one block, each
instance's rows after the previous one's (``plan.Block``). The flat planner merges the
signature classes that differ only in that length (``ragged_signature``). A value of one row
(``[1, 1, d]``) could have its rows along any of its leading axes: its classes may join those
that other instances' rows say (``one_row_signatures``).

Row-wise here: elementwise ops whose per-instance operands all have one shape, kept by the
result, and whose shared operands do not reach the rows' axis (a lower rank, or a size of 1
there); MatMul of a per-instance ``[..., n, k]`` by a shared ``[k, m]``; Gemm of such an ``[n, k]``
(not transposed); Gather of a shared table by per-instance indices (embedding lookups), and of a
per-instance operand along a later axis than the rows' by shared indices;
Softmax, LogSoftmax, LayerNormalization, Concat, Split and reductions (ReduceMean, ...) over
later axes. Ops that only reshape each row (Reshape, Squeeze, Unsqueeze, Flatten, Identity,
and a Transpose that moves only axes of 1: the elements keep their order) run as views of the
rows. ReduceSum and ReduceMean over axis 0 alone are segment reductions, and so is a
SoftmaxCrossEntropyLoss summed or averaged over the rows (the loss of each row, then each
instance's sum or mean). Recurrent layers over sequences of different lengths batch as packed
sequences (``batcher.sequences``), and tree folds level by level (``batcher.folds``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from autobatch.batcher.folds import fold_signature
from autobatch.batcher.rule_tables import Refusal, install_in, refuse
from autobatch.batcher.sequences import sequence_signature
from autobatch.ir import ValueType, attribute_value
from autobatch.ir.types import MISSING

SEGMENT_REDUCTIONS = frozenset({"ReduceSum", "ReduceMean"})
ROW_RESHAPES = frozenset({"Unsqueeze", "Squeeze", "Flatten", "Reshape", "Identity"})  # they keep the elements in order
ROW_LOSS = "SoftmaxCrossEntropyLoss"  # summed (or averaged) over rows: run per row, then a segment reduction


class Rows(NamedTuple):
    """What a row-wise check sees of a record: ``data``, its per-instance operands (input index,
    type), their rows along ``axis``, of rank ``rank``; ``shared``, its shared operands' shapes."""

    record: Any
    data: list[tuple[int, ValueType]]
    axis: int
    rank: int
    shared: list[tuple[int, ...]]
    weights: Mapping[str, np.ndarray]
    opset: int  # the standard domain's (defaults changed with it)

    @property
    def inputs(self) -> list[int]:
        return [i for i, _ in self.data]

    def later(self, attribute: str, default: int) -> bool:
        """Whether the record's axis ``attribute`` is a later axis than the rows'."""
        return record_attribute(self.record, attribute, default) % self.rank > self.axis


# Whether an op treats the rows of its per-instance operands independently.
RowWise = Callable[[Rows], bool]


class RowRule(NamedTuple):
    """A row of ``ROW_WISE``: when the op is row-wise (its refusal says so otherwise, and
    ``batcher.capabilities`` prints it), and the check."""

    when: str
    check: RowWise


ROW_WISE: dict[str, RowRule] = {}


def row_wise(when: str, *op_types: str) -> Callable[[RowWise], RowWise]:
    return install_in(ROW_WISE, op_types, lambda check: RowRule(when, check))


ELEMENTWISE = (
    "Abs", "Acos", "Asin", "Atan", "Ceil", "Cos", "Cosh", "Elu", "Erf", "Exp", "Floor", "Gelu", "HardSigmoid",
    "HardSwish", "Identity", "LeakyRelu", "Log", "Neg", "Not", "Reciprocal", "Relu", "Round", "Selu", "Sigmoid",
    "Sign", "Sin", "Sinh", "Softplus", "Softsign", "Sqrt", "Tan", "Tanh", "Cast",
    "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "And", "Or", "Xor", "Equal", "Less",
    "LessOrEqual", "Greater", "GreaterOrEqual", "Where", "PRelu", "Mod", "Clip")


@row_wise("per-instance operands of the result's rank and rows, each of its shape or 1 along every other axis "
          "(a masked mean's sum by its count), and shared ones that do not reach the rows' axis", *ELEMENTWISE)
def _elementwise(rows: Rows) -> bool:
    record, data, axis, rank = rows.record, rows.data, rows.axis, rows.rank
    out = record.types[0].shape if record.types and record.types[0] is not None else None
    return (out is not None and len(out) == rank
            and all(len(entry.shape) == rank and entry.shape[axis] == out[axis]
                    and all(d in (1, o) for k, (d, o) in enumerate(zip(entry.shape, out)) if k != axis)
                    for _, entry in data)
            and all(len(shape) <= rank and (axis < rank - len(shape) or shape[axis - rank + len(shape)] == 1)
                    for shape in rows.shared))


@row_wise("a per-instance [..., n, k] by a shared [k, m]", "MatMul")
def _matmul(rows: Rows) -> bool:
    return rows.inputs == [0] and rows.axis <= rows.rank - 2 and [len(shape) for shape in rows.shared] == [2]


@row_wise("a per-instance A [n, k], not transposed, by a shared B and a shared C of a row at most", "Gemm")
def _gemm(rows: Rows) -> bool:
    shared = rows.shared
    return (rows.inputs == [0] and rows.rank == 2 and rows.axis == 0 and not record_attribute(rows.record, "transA", 0)
            and len(shared[0]) == 2 and all(len(shape) < 2 or shape[0] == 1 for shape in shared[1:]))


@row_wise("per-instance operands along a later axis than the rows'", "Concat")
def _concat(rows: Rows) -> bool:
    return len(rows.data) == len(rows.record.entries) and rows.later("axis", 0)


@row_wise("over later axes than the rows', by a shared scale and bias", "LayerNormalization")
def _layer_normalization(rows: Rows) -> bool:
    return rows.inputs == [0] and rows.later("axis", -1)


@row_wise("a shared table on axis 0 by per-instance indices, or a per-instance operand along a later axis "
          "than the rows' by shared indices", "Gather")
def _gather(rows: Rows) -> bool:
    if rows.inputs == [0]:  # (PyTorch's select of q, k or v, ``ir.select_first``)
        return rows.later("axis", 0)
    return rows.inputs == [1] and record_attribute(rows.record, "axis", 0) == 0  # embeddings


@row_wise("a per-instance operand along a later axis than the rows', by shared sizes", "Split")
def _split(rows: Rows) -> bool:
    return rows.inputs == [0] and rows.later("axis", 0)


@row_wise("over a later axis than the rows' (before opset 13: over every axis from its axis on, 1 by default)",
          "Softmax", "LogSoftmax")
def _softmax(rows: Rows) -> bool:
    return len(rows.data) == 1 and rows.rank >= 2 and rows.later("axis", -1 if rows.opset >= 13 else 1)


@row_wise("over later axes than the rows', by shared axes",
          "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2", "ReduceLogSumExp")
def _reduction(rows: Rows) -> bool:
    axes = _reduced_axes(rows.record, rows.weights) if rows.inputs == [0] else None
    return bool(axes) and all(a % rows.rank > rows.axis for a in axes)


@row_wise("along later axes than the rows', by shared starts, ends, axes and steps (rotary embeddings' halves)",
          "Slice")
def _slice(rows: Rows) -> bool:
    axes = sliced_axes(rows.record, rows.weights, rows.rank) if rows.inputs == [0] else None
    return axes is not None and all(axis > rows.axis for axis in axes)


@row_wise("over a later axis than the rows' (a tagger's best tag)", "ArgMax", "ArgMin")
def _arg_reduction(rows: Rows) -> bool:
    return rows.inputs == [0] and rows.later("axis", 0)


def rows_of(shape: Sequence[int], axis: int | None = None) -> tuple[int, int, tuple[int, ...]] | None:
    """``(axis, length, row)`` of a value of ``shape``: its rows run along its first axis that is
    not 1 (exporters give one instance's values leading axes of 1: ``[1, L, d]``), or along
    ``axis`` when given, ``length`` of them, each of shape ``row``; None when every axis is 1."""
    if axis is not None:
        return (axis, shape[axis], tuple(shape[axis + 1:])) if len(shape) > axis and not any(
            size != 1 for size in shape[:axis]) else None
    for axis, size in enumerate(shape):
        if size != 1:
            return axis, size, tuple(shape[axis + 1:])
    return None


def ragged_signature(record: Any, weights: Mapping[str, np.ndarray], opset: int, attributes: tuple,
                     axis: int | None = None, out_axis: int | None = None) -> tuple | Refusal:
    """The record's signature without the length of its rows (along ``axis`` of every value,
    when given; else ``rows_of``'s), or a refusal saying why the op is not row-wise for these
    operands (see the module). ``record`` is an ``ir.records.Record``, ``attributes`` its ``attributes_key``. Its
    per-instance entries are ``("rows", element type, axis, row)``; the last item, per output,
    ``(axis, row)`` (None for an output not wanted); ``out_axis``: the outputs' axis, when given
    (else ``axis``)."""
    if record.domain:
        return fold_signature(record, attributes) or refuse(f"an op of domain {record.domain}")
    sequences = sequence_signature(record, attributes, weights)
    if sequences is not None:
        return sequences
    if record.op_type == ROW_LOSS:
        return _loss_signature(record, attributes)
    data = [(i, entry) for i, entry in enumerate(record.entries) if isinstance(entry, ValueType)]
    runs = [rows_of(entry.shape, axis) if entry.shape is not None else None for _, entry in data]
    if not runs:
        return refuse("no per-instance operand")
    if None in runs:
        return refuse("a per-instance operand of no rows (every axis 1) or of a shape not known")
    if len({run[:2] for run in runs}) != 1:  # type: ignore[index]
        return refuse("per-instance operands whose rows differ in axis or number")
    given = axis
    axis, length, _ = runs[0]  # type: ignore[misc]
    if length == 0 or any(0 in run[2] for run in runs):  # type: ignore[index]  # no rows: an empty reduction has a value of its own
        return refuse("an empty operand")
    if record.op_type in SEGMENT_REDUCTIONS and axis == 0 and segment_keepdims(record, weights, opset) is not None:
        entries = tuple(("rows", e.elem_type, 0, e.shape[1:]) if isinstance(e, ValueType) else e for e in record.entries)
        return ("segment", record.op_type, attributes, entries)
    outs = _output_rows(record, length, given if out_axis is None else out_axis)
    if outs is None:
        return refuse("an output whose rows are not its operands' in number")
    if _row_reshape(record, data, runs[0][2], outs):  # type: ignore[index]
        (_, only), = data
        return ("reshape", only.elem_type, axis, runs[0][2], outs[0])  # type: ignore[index]
    if any(out is not None and out[0] != axis for out in outs):
        return refuse("an output whose rows run along another axis than its operands'")
    row = ROW_WISE.get(record.op_type)
    if row is None:
        return refuse("not a row-wise op")
    shared = [np.shape(weights[e]) for e in record.entries if isinstance(e, str) and e]
    if not row.check(Rows(record, data, axis, len(data[0][1].shape), shared, weights, opset)):
        return refuse(f"row-wise only as {row.when}")
    entries = tuple(("rows", e.elem_type, axis, run[2]) if isinstance(e, ValueType) else e
                    for e, run in zip(record.entries, _aligned(record.entries, runs)))
    return ("ragged", record.op_type, attributes, entries, outs)


def one_row_signatures(record: Any, weights: Mapping[str, np.ndarray], opset: int, attributes: tuple) -> list[tuple]:
    """The signatures of a record whose values are of one row (``[1, 1, d]``) along each axis
    that may be their rows' (each of its leading 1s; for a reshape, to each of its result's):
    the first axis that is not 1 is not their rows', and other instances' rows tell which is."""
    data = next((entry for entry in record.entries if isinstance(entry, ValueType)), None)
    out = record.types[0] if record.types else None
    if data is None or not data.shape or data.shape[0] != 1 or out is None or out.shape is None:
        return []
    ones = [axis for axis in range(len(data.shape)) if all(size == 1 for size in data.shape[:axis + 1])]
    out_ones = [axis for axis in range(len(out.shape)) if all(size == 1 for size in out.shape[:axis + 1])]
    if record.op_type == "Transpose" and len(record.outputs) == 1:
        perm = record_attribute(record, "perm", None)
        perm = list(reversed(range(len(data.shape)))) if perm is None else list(perm)
        pairs = [(axis, perm.index(axis)) for axis in ones]
    elif record.op_type in ROW_RESHAPES:
        pairs = [(axis, out_axis) for axis in ones for out_axis in out_ones]
    else:
        pairs = [(axis, axis) for axis in ones]
    found = (ragged_signature(record, weights, opset, attributes, axis, out_axis) for axis, out_axis in pairs)
    return list(dict.fromkeys(signature for signature in found if signature))


def _aligned(entries: tuple, runs: list) -> list:
    """``runs`` (of the per-instance entries) beside every entry (None for a shared one)."""
    it = iter(runs)
    return [next(it) if isinstance(entry, ValueType) else None for entry in entries]


def _output_rows(record: Any, length: int, axis: int | None) -> tuple | None:
    """Per output, ``(axis, row)`` when its rows (along ``axis``, when given) are ``length``
    long, None for one not wanted; None when a wanted output's are not."""
    outs = []
    for name, vtype in zip(record.outputs, record.types):
        if not name:
            outs.append(None)
            continue
        run = rows_of(vtype.shape, axis) if vtype is not None and vtype.is_tensor and vtype.shape is not None else None
        if run is None or run[1] != length or 0 in run[2]:
            return None
        outs.append((run[0], run[2]))
    return tuple(outs)


def _row_reshape(record: Any, data: list[tuple[int, ValueType]], row: tuple[int, ...], outs: tuple) -> bool:
    """Whether the record only reshapes each row: an op that keeps the order of the elements
    (``ROW_RESHAPES``, or a Transpose that moves only axes of 1), from a per-instance value to one
    output of as many rows of as many elements. Then each row's elements stay where they were."""
    if len(data) != 1 or data[0][0] != 0 or len(outs) != 1 or record.domain:
        return False
    shape = data[0][1].shape
    if record.op_type == "Transpose":
        perm = record_attribute(record, "perm", None)
        perm = list(reversed(range(len(shape)))) if perm is None else list(perm)
        moved = [axis for axis in perm if shape[axis] != 1]
        if moved != sorted(moved):
            return False
    elif record.op_type not in ROW_RESHAPES:
        return False
    return math.prod(row) == math.prod(outs[0][1])


def _reduced_axes(record: Any, weights: Mapping[str, np.ndarray]) -> list[int] | None:
    """A reduction's axes (its second input or its attribute); None or empty: all of them."""
    if len(record.inputs) > 1 and record.inputs[1]:
        return np.asarray(weights[record.inputs[1]]).ravel().tolist()
    axes = record_attribute(record, "axes", None)
    return None if axes is None else list(axes)


def sliced_axes(record: Any, weights: Mapping[str, np.ndarray], rank: int) -> list[int] | None:
    """The axes a Slice slices (from 0, or as given; before opset 10, its attributes), or None
    where they are not shared constants."""
    if "starts" in record.attributes:  # (before opset 10)
        axes = record_attribute(record, "axes", None)
        return [a % rank for a in (range(len(record_attribute(record, "starts", []))) if axes is None else axes)]
    given = [name if name in weights else None for name in (*record.inputs[1:], "", "", "")[:3]]
    starts, _, axes = given
    if starts is None or axes is None and len(record.inputs) > 3 and record.inputs[3]:
        return None
    return [int(a) % rank for a in (range(np.size(weights[starts])) if axes is None else np.ravel(weights[axes]))]


def segment_keepdims(record: Any, weights: Mapping[str, np.ndarray], opset: int) -> bool | None:
    """For a ReduceSum/ReduceMean of float32 or float64 values over axis 0 alone: whether it
    keeps that axis; else None. (NumPy reduces them; float16 sums would round differently.)"""
    data = record.entries[0]
    if not isinstance(data, ValueType) or data.dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
        return None
    if any(isinstance(entry, ValueType) for entry in record.entries[1:]):
        return None
    uses_input = record.op_type == "ReduceSum" and opset >= 13 or opset >= 18
    if uses_input:
        if len(record.entries) < 2 or not isinstance(record.entries[1], str) or not record.entries[1]:
            return None
        axes = np.asarray(weights[record.entries[1]]).ravel().tolist()
    else:
        axes = list(record_attribute(record, "axes", []))
    rank = len(data.shape)
    if [a % rank for a in axes] != [0] or record_attribute(record, "noop_with_empty_axes", 0):
        return None
    return bool(record_attribute(record, "keepdims", 1))


def _loss_signature(record: Any, attributes: tuple) -> tuple | Refusal:
    """SoftmaxCrossEntropyLoss of per-instance scores ``[n, C]`` and labels ``[n]``, summed or
    averaged over the rows, with no class weights, its loss alone wanted."""
    scores, labels = (record.entries + (MISSING,))[:2]
    if len(record.entries) > 2 and record.inputs[2] or any(record.outputs[1:]):
        return refuse("a loss with class weights, or its log-probabilities wanted")
    if not (isinstance(scores, ValueType) and isinstance(labels, ValueType) and len(scores.shape) == 2
            and labels.shape == scores.shape[:1] and scores.shape[0] > 0):
        return refuse("a loss of other than per-instance scores [n, C] and labels [n]")
    reduction = record_attribute(record, "reduction", "mean")
    reduction = reduction.decode() if isinstance(reduction, bytes) else reduction
    if reduction not in ("sum", "mean") or reduction == "mean" and "ignore_index" in record.attributes:
        return refuse(f"a loss reduced by {reduction!r}" + (" with ignore_index" if reduction == "mean" else ""))
    entries = (("rows", scores.elem_type, scores.shape[1:]), ("rows", labels.elem_type, ()))
    return ("loss", record.op_type, attributes, entries, tuple(map(bool, record.outputs)))


def record_attribute(record: Any, name: str, default: Any) -> Any:
    """A record's (or node's) attribute value, ``default`` where it has none."""
    proto = record.attributes.get(name)
    return default if proto is None else attribute_value(proto)
