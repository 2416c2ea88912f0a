"""Ragged batching: instances whose values differ in length along axis 0 (sentences of
different lengths as ``[n, d]`` matrices) still batch where an op treats rows independently.
Their rows are concatenated (no padding), the op runs once on ``[sum of n, ...]``, and the
result stays one block, each instance's rows after the previous one's (``flat.Block``); a
reduction over axis 0 reduces each instance's run of rows. The flat
planner merges the signature classes that differ only in that length (``ragged_signature``).

Row-wise here: elementwise ops whose per-instance operands all have one shape and whose shared
operands do not reach axis 0 (a lower rank, or a size of 1 there); MatMul of a per-instance
``[n, k]`` by a shared ``[k, m]``; Gemm of such an ``[n, k]`` (not transposed); Gather of a
shared table by per-instance indices ``[n]`` (embedding lookups); Softmax, LogSoftmax and
LayerNormalization over a later axis; Concat of per-instance operands along a later axis;
Unsqueeze and Squeeze of axes after axis 0; Flatten from axis 1. ReduceSum and ReduceMean over
axis 0 alone are segment reductions, and so is a SoftmaxCrossEntropyLoss summed or averaged over
the rows (the loss of each row, then each instance's sum or mean). Recurrent layers over
sequences of different lengths batch as packed sequences (``batcher.sequences``), and tree folds
level by level (``batcher.folds``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from autobatch.batcher.folds import fold_signature
from autobatch.batcher.sequences import sequence_signature
from autobatch.ir import ValueType, attribute_value
from autobatch.ir.types import MISSING

ELEMENTWISE = frozenset({
    "Abs", "Acos", "Asin", "Atan", "Ceil", "Cos", "Cosh", "Elu", "Erf", "Exp", "Floor", "Gelu", "HardSigmoid",
    "HardSwish", "Identity", "LeakyRelu", "Log", "Neg", "Not", "Reciprocal", "Relu", "Round", "Selu", "Sigmoid",
    "Sign", "Sin", "Sinh", "Softplus", "Softsign", "Sqrt", "Tan", "Tanh", "Cast",
    "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "And", "Or", "Xor", "Equal", "Less",
    "LessOrEqual", "Greater", "GreaterOrEqual", "Where", "PRelu", "Mod", "Clip",
})
SEGMENT_REDUCTIONS = frozenset({"ReduceSum", "ReduceMean"})
ROW_RESHAPES = frozenset({"Unsqueeze", "Squeeze", "Flatten"})  # row-wise, they only reshape each row
ROW_LOSS = "SoftmaxCrossEntropyLoss"  # summed (or averaged) over rows: run per row, then a segment reduction


def ragged_signature(record: Any, weights: Mapping[str, np.ndarray], opset: int, attributes: tuple) -> tuple | None:
    """The record's signature without the length of its rows, or None when the op is not
    row-wise for these operands (see the module). ``record`` is a ``flat.TraceRecord``,
    ``attributes`` its ``attributes_key``."""
    if record.domain:
        return fold_signature(record, attributes)
    sequences = sequence_signature(record, attributes, weights)
    if sequences is not None:
        return sequences
    if record.op_type == ROW_LOSS:
        return _loss_signature(record, attributes)
    data = [(i, entry) for i, entry in enumerate(record.entries) if isinstance(entry, ValueType)]
    shapes = [entry.shape for _, entry in data]
    if not shapes or any(not shape for shape in shapes) or any(shape[0] != shapes[0][0] for shape in shapes):
        return None
    length, rank = shapes[0][0], len(shapes[0])
    if length == 0:  # no rows: an empty reduction has a value of its own (0, or NaN for a mean)
        return None
    if record.op_type in SEGMENT_REDUCTIONS:
        if segment_keepdims(record, weights, opset) is None:
            return None
    elif not _row_wise(record, data, rank, weights):
        return None
    else:
        for name, vtype in zip(record.outputs, record.types):
            if name and (not vtype.shape or vtype.shape[0] != length):
                return None
    entries = tuple(("rows", e.elem_type, e.shape[1:]) if isinstance(e, ValueType) else e for e in record.entries)
    return ("ragged", record.op_type, attributes, entries, tuple(map(bool, record.outputs)))


def _row_wise(record: Any, data: list[tuple[int, ValueType]], rank: int, weights: Mapping[str, np.ndarray]) -> bool:
    op, entries = record.op_type, record.entries
    shared = [np.shape(weights[e]) for e in entries if isinstance(e, str) and e]
    if op in ELEMENTWISE:  # a shared operand may broadcast along axis 0 only from a size of 1
        return (all(entry.shape == data[0][1].shape for _, entry in data)
                and all(len(shape) < rank or len(shape) == rank and shape[0] == 1 for shape in shared))
    if op == "MatMul":
        return [i for i, _ in data] == [0] and rank == 2 and [len(shape) for shape in shared] == [2]
    if op == "Gemm":  # A [n, k] by a shared B, plus a shared C that is a row at most
        return ([i for i, _ in data] == [0] and rank == 2 and not _attribute(record, "transA", 0)
                and len(shared[0]) == 2 and all(len(shape) < 2 or shape[0] == 1 for shape in shared[1:]))
    if op == "Concat":  # per-instance operands along a later axis
        return len(data) == len(entries) and _attribute(record, "axis", 0) % rank != 0
    if op == "LayerNormalization":  # over later axes, by a shared scale and bias
        return [i for i, _ in data] == [0] and _attribute(record, "axis", -1) % rank != 0
    if op == "Gather":
        return [i for i, _ in data] == [1] and rank == 1 and _attribute(record, "axis", 0) == 0
    if op == "Flatten":  # rows flattened from axis 1 on
        return len(data) == 1 and _attribute(record, "axis", 1) == 1
    if op in ("Unsqueeze", "Squeeze"):  # axes of size 1 added or dropped after axis 0
        if [i for i, _ in data] != [0]:
            return False
        axes = _axes(record, weights)
        axes_of = len(record.types[0].shape) if op == "Unsqueeze" else rank
        return axes is not None and all(a % axes_of != 0 for a in axes)
    if op in ("Softmax", "LogSoftmax"):
        return len(data) == 1 and rank >= 2 and _attribute(record, "axis", -1) % rank != 0
    return False


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
        axes = list(_attribute(record, "axes", []))
    rank = len(data.shape)
    if [a % rank for a in axes] != [0] or _attribute(record, "noop_with_empty_axes", 0):
        return None
    return bool(_attribute(record, "keepdims", 1))


def _loss_signature(record: Any, attributes: tuple) -> tuple | None:
    """SoftmaxCrossEntropyLoss of per-instance scores ``[n, C]`` and labels ``[n]``, summed or
    averaged over the rows, with no class weights, its loss alone wanted."""
    scores, labels = (record.entries + (MISSING,))[:2]
    if len(record.entries) > 2 and record.inputs[2] or any(record.outputs[1:]):
        return None
    if not (isinstance(scores, ValueType) and isinstance(labels, ValueType) and len(scores.shape) == 2
            and labels.shape == scores.shape[:1] and scores.shape[0] > 0):
        return None
    reduction = _attribute(record, "reduction", "mean")
    reduction = reduction.decode() if isinstance(reduction, bytes) else reduction
    if reduction not in ("sum", "mean") or reduction == "mean" and "ignore_index" in record.attributes:
        return None
    entries = (("rows", scores.elem_type, scores.shape[1:]), ("rows", labels.elem_type, ()))
    return ("loss", record.op_type, attributes, entries, tuple(map(bool, record.outputs)))


def _axes(record: Any, weights: Mapping[str, np.ndarray]) -> list[int] | None:
    """An Unsqueeze's or Squeeze's axes: its second input (opset 13 on) or its attribute."""
    if len(record.inputs) > 1 and record.inputs[1]:
        return np.asarray(weights[record.inputs[1]]).ravel().tolist()
    axes = _attribute(record, "axes", None)
    return None if axes is None else list(axes)


def _attribute(record: Any, name: str, default: Any) -> Any:
    proto = record.attributes.get(name)
    return default if proto is None else attribute_value(proto)
