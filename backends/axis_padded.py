"""The padded half of the node-level lowering (``backends.instance_axis``): values in chunks of
instances sorted by length, each padded to its longest (``[size, 1.., Lmax, *row]``), a padded
step as the model's node on a new leading batch axis with its masks, and a reduction over the
length (``POOLED``) chunk by chunk. ``PaddedLowering`` is a part of ``instance_axis._Lowering``,
whose ``node``, ``constant``, ``rows`` and ``reduce`` it uses.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper

from autobatch.backends.axis_feeds import INSTANCES, padded_feeds
from autobatch.batcher.ragged import record_attribute

AXIS_DEFAULTS = {"Gather": 0, "GatherElements": 0, "Split": 0, "Concat": 0, "Softmax": -1,
                 "LogSoftmax": -1}  # (Softmax before 13: 1)


class PaddedLowering:
    """The padded layout's values and steps (a part of ``instance_axis._Lowering``)."""

    def padded_value(self, name: str, k: int) -> str:
        """Chunk ``k`` of value ``name`` in the padded layout: ``[size, 1.., Lmax, *row]``, the
        instance's shape after a batch axis (a constant given per mix: as given)."""
        if name in self.plan.fed:
            return f"{name}/chunk{k}"
        if name in self.padded:
            return f"{name}/chunk{k}"
        key = f"{name}/padded"
        if key not in self.converted:
            pattern = self.plan.patterns[name]
            axis, row = pattern.index(None), [int(d) for d in pattern[pattern.index(None) + 1:]]
            dtype = helper.tensor_dtype_to_np_dtype(self.plan.elem_type(name))
            flat = self.node("Reshape", [name, self.constant(f"{key}/flat", np.array([-1, *row], np.int64))], f"{key}0")
            zero = self.constant(f"{key}/zero", np.zeros((1, *row), dtype))
            self.converted[key] = self.node("Concat", [flat, zero], f"{key}1", axis=0)
            self.zeros[key] = {k for k, d in enumerate(pattern) if d is None}
            for c in range(self.chunk_count):  # (the indices' shape is the chunk's: [size, 1.., Lmax])
                self.node("Gather", [self.converted[key], self.source(c, axis)], f"{key}/chunk{c}")
        return f"{key}/chunk{k}"

    def source(self, k: int, ones: int) -> str:
        """Chunk ``k``'s rows of each (instance, position), ``[size, Lmax]``, with ``ones`` axes of 1
        between: ``[size, 1.., Lmax]``."""
        source = padded_feeds(k)[0]
        if not ones:
            return source
        return self.unsqueezed(source, list(range(1, ones + 1)), f"{source}/{ones}")

    def valid(self, k: int, rank: int, axis: int) -> str:
        """Chunk ``k``'s mask of real positions, of rank ``rank`` along ``axis``: ``[size, 1.., Lmax, 1..]``."""
        mask = padded_feeds(k)[1]
        axes = [a for a in range(1, rank) if a != axis]
        return self.unsqueezed(mask, axes, f"{mask}/{rank}/{axis}") if axes else mask

    def unsqueezed(self, name: str, axes: list[int], key: str) -> str:
        """``name`` with axes of 1 at ``axes``, made once (``key``)."""
        if key not in self.converted:
            self.converted[key] = self.node("Unsqueeze", [name], key, axes=axes) if self.plan.opset < 13 else \
                self.node("Unsqueeze", [name, self.constant(f"{key}/axes", np.array(axes, np.int64))], key)  # (axes an input from 13)
        return self.converted[key]

    def padded_node(self, record: Any, step: Any) -> None:
        """The node once a chunk, over each chunk's values, with its masks (see ``batcher.instance_axis``)."""
        out = record.outputs[0]
        per_instance = [bool(name) and (name in self.plan.patterns or name in step.fed) for name in record.inputs]
        for k in range(self.chunk_count):
            inputs = [self.padded_value(name, k) if mine else name for name, mine in zip(record.inputs, per_instance)]
            for i, axis in step.zeroed.items():
                if axis in self._zeros_of(record.inputs[i]):
                    continue  # its padded positions are zeros already
                rank = len(self.plan.patterns[record.inputs[i]])
                zero = self.constant(f"{out}/zero{i}", np.zeros((), self.plan.dtype(record.inputs[i])))
                inputs[i] = self.node("Where", [self.valid(k, rank + 1, axis + 1), inputs[i], zero],
                                      f"{out}/zeroed{i}/chunk{k}")
            if step.key_mask is not None:
                rank = len(self.plan.patterns[out])  # (its input's: a Softmax's, maybe of a constant given per mix)
                low = self.constant(f"{out}/-inf", np.array(-np.inf, self.plan.dtype(record.inputs[0])))
                inputs[0] = self.node("Where", [self.valid(k, rank + 1, step.key_mask + 1), inputs[0], low],
                                      f"{out}/masked/chunk{k}")
            if step.target is not None:  # (a Squeeze, Unsqueeze or Flatten too)
                target = self.constant(f"{out}/target", np.array(step.target, np.int64)) if step.target.count(-1) < 2 \
                    else self.padded_shape((0, *self.plan.patterns[out]), k, f"{out}/target/chunk{k}")
                self.node("Reshape", [inputs[0], target], f"{out}/chunk{k}")
                continue
            if step.axis_input is not None:  # an axis given as an input: one further right too
                inputs[1] = self.constant(f"{out}/axis", np.array(step.axis_input + 1, np.int64))
            if step.sliced is not None:  # a Slice's axes (given or by default): one further right too
                inputs = [*inputs, *[""] * (4 - len(inputs))]
                inputs[3] = self.constant(f"{out}/axes", np.array(step.sliced, np.int64) + 1)
            if step.broadcast is not None:  # to the output's pattern at the chunk's longest (its batch axis kept)
                self.node("Expand", [inputs[0], self.padded_shape((1, *step.broadcast), k, f"{out}/shape/chunk{k}")],
                          f"{out}/chunk{k}")
                continue
            outputs = [f"{n}/chunk{k}" if n else n for n in record.outputs]
            merged = record.op_type == "Conv"  # (its N: the instance's batch axis of 1 and the chunk's as one)
            if merged:
                inputs[0] = self.squeezed(inputs[0], f"{out}/merged{k}")
                outputs[0] = f"{out}/merged/chunk{k}"
            self.nodes.append(helper.make_node(record.op_type, inputs, outputs, domain=record.domain or None,
                                               **_batched_attributes(record, len(self.plan.patterns.get(
                                                   record.inputs[0], self.plan.patterns[out])), self.plan.opset)))
            if merged:
                self.unsqueezed(outputs[0], [1], f"{out}/chunk{k}")
        self.zeros[out] = self._zeros_after(record, step)  # (once its inputs are converted: theirs known)
        self.padded.update(name for name in record.outputs if name)

    def squeezed(self, name: str, output: str) -> str:
        """``name`` without its axis 1 (of size 1)."""
        if self.plan.opset < 13:
            return self.node("Squeeze", [name], output, axes=[1])
        return self.node("Squeeze", [name, self.constant("instance_axis/axis1", np.array([1], np.int64))], output)

    def padded_shape(self, dims: Sequence[int | None], k: int, name: str) -> str:
        """A shape of chunk ``k``: ``dims``, each None the chunk's longest."""
        sizes = [padded_feeds(k)[3] if d is None else self.constant(f"instance_axis/size{d}", np.array([d], np.int64)) for d in dims]
        return self.node("Concat", sizes, name, axis=0)

    def _zeros_of(self, name: str) -> set[int]:
        return self.zeros.get(name if name in self.padded else f"{name}/padded", set())

    def _zeros_after(self, record: Any, step: Any) -> set[int]:
        """The axes along which the node's output is 0 at padded positions: those of its input
        where it only moves values (Transpose, Reshape, Identity, a Gather of shared indices off
        the length: the dynamo exporter's Q, K, V picked from one tensor), a masked Softmax's axis."""
        if step.key_mask is not None and record.op_type == "Softmax":
            return {step.key_mask}
        source = self._zeros_of(record.inputs[0]) if record.inputs else set()
        if step.target is not None:  # a reshape keeps each length axis's positions: the k-th stays the k-th
            before, after = ([a for a, d in enumerate(self.plan.patterns[name]) if d is None]
                             for name in (record.inputs[0], record.outputs[0]))
            return {after[before.index(axis)] for axis in source if axis in before}
        if record.op_type == "Transpose":
            perm = list(record_attribute(record, "perm", []))
            return {perm.index(axis) for axis in source}
        if record.op_type == "Identity":
            return source
        if record.op_type == "Gather" and record.inputs[1] in self.plan.weights and record.inputs[1] not in step.fed:
            axis = record_attribute(record, "axis", 0) % len(self.plan.patterns[record.inputs[0]])  # (never a length's)
            moved = np.ndim(self.plan.weights[record.inputs[1]]) - 1  # the indices' axes in place of one
            return {z if z < axis else z + moved for z in source}
        return set()

    def pooled(self, record: Any, axis: int) -> None:
        """A reduction over the length (``POOLED``), a chunk at a time over its padded values (a
        mean: their sum over each instance's own count), the chunks' rows put back in the
        instances' order: one row an instance."""
        out, pattern = record.outputs[0], self.plan.patterns[record.inputs[0]]
        dtype = self.plan.dtype(record.inputs[0])
        op = "ReduceSum" if record.op_type == "ReduceMean" else record.op_type
        fill = _fill(record.op_type, dtype)
        shape = self.constant(f"{out}/shape", np.array([-1, *self.plan.patterns[out][1:]], np.int64))
        parts = []
        for k in range(self.chunk_count):
            value = self.padded_value(record.inputs[0], k)
            if fill or axis not in self._zeros_of(record.inputs[0]):  # (a sum's padded positions may be 0 already)
                value = self.node("Where", [self.valid(k, len(pattern) + 1, axis + 1), value,
                                            self.constant(f"{out}/fill", np.array(fill, dtype))], f"{out}/filled/chunk{k}")
            reduced = self.node(op, [value], f"{out}/reduced/chunk{k}", axis=axis + 1, keepdims=1) \
                if op in ("ArgMax", "ArgMin") else self.reduce(op, value, axis + 1, f"{out}/reduced/chunk{k}", keepdims=1)
            if record.op_type == "ReduceMean":  # over each instance's own count of positions
                valid = self.node("Cast", [padded_feeds(k)[1]], f"{out}/valid/chunk{k}", to=onnx.TensorProto.INT64)
                counts = self.node("Cast", [self.reduce("ReduceSum", valid, 1, f"{out}/count64/chunk{k}", keepdims=0)],
                                   f"{out}/count/chunk{k}", to=helper.np_dtype_to_tensor_dtype(dtype))
                wide = self.constant(f"{out}/wide", np.array([-1, *[1] * len(pattern)], np.int64))
                reduced = self.node("Div", [reduced, self.node("Reshape", [counts, wide], f"{out}/counts/chunk{k}")],
                                    f"{out}/mean/chunk{k}")
            parts.append(self.node("Reshape", [reduced, shape], f"{out}/rows/chunk{k}"))
        stacked = self.node("Concat", parts, f"{out}/chunks", axis=0) if len(parts) > 1 else parts[0]
        self.node("Gather", [stacked, INSTANCES], out, axis=0)


def _batched_attributes(record: Any, rank: int, opset: int) -> dict[str, Any]:
    """The node's attributes on a new leading batch axis (its operands of ``rank`` before it):
    an axis, given or by default, or a perm, one further right."""
    attributes = {name: helper.get_attribute_value(proto) for name, proto in record.attributes.items()}
    if record.op_type == "Transpose":
        attributes["perm"] = [0, *(p + 1 for p in attributes["perm"])]
    elif record.op_type in AXIS_DEFAULTS:
        default = AXIS_DEFAULTS[record.op_type] if opset >= 13 or record.op_type not in ("Softmax", "LogSoftmax") else 1
        attributes["axis"] = record_attribute(record, "axis", default) % rank + 1
    return attributes


def _fill(op: str, dtype: np.dtype) -> Any:
    """What a reduction over padded chunks sets their padded positions to: 0 (a sum, a mean),
    the lowest value (a max, an ArgMax) or the highest (a min, an ArgMin)."""
    if op not in ("ReduceMax", "ReduceMin", "ArgMax", "ArgMin"):
        return 0
    lowest, highest = (-np.inf, np.inf) if dtype.kind == "f" else (np.iinfo(dtype).min, np.iinfo(dtype).max)
    return highest if op in ("ReduceMin", "ArgMin") else lowest
