"""A node-level plan (``batcher.instance_axis``) lowered to one ONNX graph that serves every mix
of lengths, and run: the mix's inputs concatenated along their length axis, the index arrays of
its lengths fed, the outputs cut back into instances.

The graph is the model's own nodes: a rows step over ``[1, N, d]`` in place of ``[1, L, d]`` (a
reshape of each row a Reshape to its row shape), a padded step over ``[B, ..., Lmax, ...]`` with
its masks (``padded/valid``), and a recurrent layer as padded chunks of sequences sorted by length
(``batcher.sequences``, whose ``chunks`` the feeds come from). A value goes from rows to padded
by one Gather of every (instance, position) from the rows with a zero row past the last
(``padded/source``), and back by one Gather of the real positions (``padded/targets``). The graph
depends on the mix only through its number of chunks, so a runner keeps one session for each (at
most ``ceil(instances / CHUNK)``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from autobatch.backends.interpreter import Interpreter
from autobatch.backends.ort_runtime import OrtSettings, new_session, run_session
from autobatch.batcher.instance_axis import (CONCAT, GATHER, PADDED, PICK, PICKED, POOLED, InstanceAxisPlan, aligned,
                                             pattern_at)
from autobatch.batcher.ragged import record_attribute
from autobatch.batcher.sequences import CHUNK, PEEPHOLE, SEQUENCE_LENS, chunk_members, chunks
from autobatch.ir import Recent, from_onnx
from autobatch.ir.onnx_io import choose_ir_version

ROWS = "rows"  # the symbolic size of the batch's rows axis
TARGETS = "instance_axis/targets"  # where each row of a recurrent layer's output is in its chunks' outputs
AXIS_DEFAULTS = {"Gather": 0, "GatherElements": 0, "Split": 0, "Concat": 0, "Softmax": -1,
                 "LogSoftmax": -1}  # (Softmax before 13: 1)
# Sessions a runner keeps, one per number of chunks (a batch of 64 has 8): each holds the weights.
SESSIONS_KEPT = 8
BACK = "padded/targets"  # where each row of a padded value is in its chunks' values, flattened and concatenated
INSTANCES = "padded/instances"  # where each instance is among the chunks' members, in order
STARTS, LENGTHS = "instance_axis/starts", "instance_axis/lengths"  # each instance's first row and its length
POSITIONS_OK = "instance_axis/positions_ok"  # 1 where every position a ``PICKED`` step read was inside its instance


class PositionOutOfRange(IndexError):
    """A position the graph computed is past its instance's length: the batch is not run by the
    node-level plan (run alone, that instance fails; the others do not)."""


def chunk_feeds(k: int) -> tuple[str, str, str]:
    """The feeds of chunk ``k``: its source rows, its ``[T, size, -1]`` shape and its lengths."""
    return f"instance_axis/chunk{k}/source", f"instance_axis/chunk{k}/shape", f"instance_axis/chunk{k}/lengths"


def padded_feeds(k: int) -> tuple[str, str, str, str]:
    """The feeds of chunk ``k`` of the padded layout: the row each (instance, position) reads
    from the rows and a zero row past them, and which are real, both ``[size, Lmax]``; its size
    and its longest."""
    return (f"padded/chunk{k}/source", f"padded/chunk{k}/valid", f"padded/chunk{k}/size",
            f"padded/chunk{k}/longest")


class _Lowering:
    def __init__(self, plan: InstanceAxisPlan, chunk_count: int) -> None:
        self.plan = plan
        self.chunk_count = chunk_count
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: dict[str, np.ndarray] = {}
        self.padded: set[str] = set()  # values made in the padded layout: a tensor a chunk, "{name}/chunk{k}"
        self.zeros: dict[str, set[int]] = {}  # a padded value's axes along which its padded positions are 0
        self.converted: dict[str, str] = {}  # (value, layout) -> its name in that layout
        self.positions_ok: list[str] = []  # per ``PICKED`` step: whether each position read is its instance's

    def node(self, op: str, inputs: Sequence[str], output: str, **attributes: Any) -> str:
        self.nodes.append(helper.make_node(op, list(inputs), [output], **attributes))
        return output

    def constant(self, name: str, array: np.ndarray) -> str:
        """A constant of the lowering's own, named apart from every value of the model's (a weight
        of the same name would replace it, or it the weight: a review found wrong results)."""
        name = f"autobatch/{name}"
        while name in self.plan.weights or name in self.plan.patterns:
            name += "'"
        self.initializers[name] = array
        return name

    def lower(self) -> onnx.ModelProto:
        for record, step in zip(self.plan.records, self.plan.steps):
            self.initializers.update((e, self.plan.weights[e]) for e in record.entries if type(e) is str
                                     and e in self.plan.weights and e not in step.fed and step.reads_constants)
            if step.kind == PADDED:
                self.padded_node(record, step)
            elif step.kind == "sequences":
                self.recurrent(record, self.rows(record.inputs[0]))
            elif step.kind == POOLED:
                self.pooled(record, step.reduced)
            elif step.kind == PICK:  # each instance's row at the position (``mix_feeds``), one row an instance
                out = self.plan.patterns[record.outputs[0]]
                axis = self.plan.axis(record.inputs[0])
                rows = self.node("Gather", [self.rows(record.inputs[0]), picked_rows(record)], f"{record.outputs[0]}/rows",
                                 axis=axis)
                self.node("Reshape", [rows, self.constant(f"{record.outputs[0]}/shape", np.array([-1, *out[1:]], np.int64))],
                          record.outputs[0])
            elif step.kind == PICKED:
                self.picked(record, step.component)
            elif step.kind == CONCAT:
                self.concat(record)
            elif step.kind == GATHER:  # its indices given offset to each instance's rows (``mix_feeds``)
                self.nodes.append(helper.make_node(record.op_type, [self.rows(record.inputs[0]), record.inputs[1]],
                                                   record.outputs))
                self.nodes[-1].attribute.extend(record.attributes.values())
            elif step.kind == "reshape":
                out_axis, row = step.signature[4]
                target = self.constant(f"{record.outputs[0]}/row_shape", np.array([1] * out_axis + [-1, *row], np.int64))
                self.node("Reshape", [self.rows(record.inputs[0]), target], record.outputs[0])
            else:
                self.nodes.append(helper.make_node(record.op_type, [self.rows(n) if n else n for n in record.inputs],
                                                   record.outputs, domain=record.domain or None))
                self.nodes[-1].attribute.extend(record.attributes.values())
        outputs = [_info(self.rows(name), (None, *self.plan.patterns[name][1:]) if self.plan.one_row(name)
                         else self.plan.patterns[name], "", record_type(self.plan, name)) for name in self.plan.outputs]
        for info, name in zip(outputs, self.plan.outputs):
            info.name = name
            if self.rows(name) != name:
                self.node("Identity", [self.rows(name)], name)
        if self.positions_ok:
            ok = [self.node("Cast", [valid], f"{valid}/int", to=TensorProto.INT64) for valid in self.positions_ok]
            every = self.node("Concat", ok, f"{POSITIONS_OK}/each", axis=0) if len(ok) > 1 else ok[0]
            self.reduce("ReduceMin", every, 0, POSITIONS_OK, keepdims=0)  # (of no positions: int64's max)
            outputs.append(helper.make_tensor_value_info(POSITIONS_OK, TensorProto.INT64, []))
        graph = helper.make_graph(self.nodes, "instance_axis", self.inputs(), outputs,
                                  [numpy_helper.from_array(np.asarray(a), n) for n, a in self.initializers.items()])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.plan.opset)])
        model.ir_version = choose_ir_version(model, None)
        return model

    def inputs(self) -> list[onnx.ValueInfoProto]:
        plan = self.plan
        infos = [_info(name, plan.patterns[name], ROWS, record_type(plan, name)) for name in plan.inputs]
        for name, layouts in plan.fed.items():
            elem_type = helper.np_dtype_to_tensor_dtype(plan.weights[name].dtype)
            for padded, pattern in layouts.items():
                if padded:  # a chunk's, after a batch axis
                    infos += [helper.make_tensor_value_info(f"{name}/chunk{k}", elem_type, [None] * (len(pattern) + 1))
                              for k in range(self.chunk_count)]
                else:
                    infos.append(helper.make_tensor_value_info(name, elem_type, [None] * len(pattern)))
        infos += [helper.make_tensor_value_info(picked_rows(record), TensorProto.INT64, [None]) for record, _ in plan.picks]
        if plan.picked:
            infos += [helper.make_tensor_value_info(name, TensorProto.INT64, [None]) for name in (STARTS, LENGTHS)]
        if plan.padded:
            infos.append(helper.make_tensor_value_info(BACK, TensorProto.INT64, [ROWS]))
            infos.append(helper.make_tensor_value_info(INSTANCES, TensorProto.INT64, [None]))
            for k in range(self.chunk_count):
                source, valid, size, longest = padded_feeds(k)
                infos += [helper.make_tensor_value_info(source, TensorProto.INT64, [None, None]),
                          helper.make_tensor_value_info(valid, TensorProto.BOOL, [None, None]),
                          helper.make_tensor_value_info(size, TensorProto.INT64, [1]),
                          helper.make_tensor_value_info(longest, TensorProto.INT64, [1])]
        if plan.recurrent:
            for k in range(self.chunk_count):
                source, shape, lengths = chunk_feeds(k)
                infos += [helper.make_tensor_value_info(source, TensorProto.INT64, [None]),
                          helper.make_tensor_value_info(shape, TensorProto.INT64, [3]),
                          helper.make_tensor_value_info(lengths, TensorProto.INT32, [None])]
            infos.append(helper.make_tensor_value_info(TARGETS, TensorProto.INT64, [ROWS]))
        return infos

    # ------------------------------------------------------------------ layouts
    def rows(self, name: str) -> str:
        """Value ``name`` in the rows layout: ``[1.., N, *row]``."""
        if name not in self.padded:
            return name
        key = f"{name}/rows"
        if key not in self.converted:
            pattern = self.plan.patterns[name]
            axis, row = pattern.index(None), [int(d) for d in pattern[pattern.index(None) + 1:]]
            width = self.constant(f"{key}/flat", np.array([-1, *row], np.int64))
            flat = [self.node("Reshape", [f"{name}/chunk{k}", width], f"{key}/chunk{k}") for k in range(self.chunk_count)]
            kept = self.node("Gather", [self.node("Concat", flat, f"{key}0", axis=0), BACK], f"{key}1")
            self.converted[key] = self.node(
                "Reshape", [kept, self.constant(f"{key}/shape", np.array([1] * axis + [-1, *row], np.int64))], key)
        return self.converted[key]

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
            dtype = helper.tensor_dtype_to_np_dtype(record_type(self.plan, name))
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
                zero = self.constant(f"{out}/zero{i}", np.zeros((), _dtype_of(self.plan, record.inputs[i])))
                inputs[i] = self.node("Where", [self.valid(k, rank + 1, axis + 1), inputs[i], zero],
                                      f"{out}/zeroed{i}/chunk{k}")
            if step.key_mask is not None:
                rank = len(self.plan.patterns[out])  # (its input's: a Softmax's, maybe of a constant given per mix)
                low = self.constant(f"{out}/-inf", np.array(-np.inf, _dtype_of(self.plan, record.inputs[0])))
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
        dtype = _dtype_of(self.plan, record.inputs[0])
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

    def concat(self, record: Any) -> None:
        """A Concat of values in rows and shared constants of one row, each constant expanded
        to the rows of the first value (``CONCAT``)."""
        out = record.outputs[0]
        axis = record_attribute(record, "axis", 0) % len(self.plan.patterns[out])
        first = self.rows(next(name for name in record.inputs if name in self.plan.patterns))
        shape = self.node("Shape", [first], f"{out}/rows_shape")
        ends = [self.constant(f"{out}/{name}", np.array([value], np.int64))
                for name, value in (("start", 0), ("axis", axis), ("after", axis + 1), ("end", np.iinfo(np.int64).max))]
        before, after = (self.node("Slice", [shape, *ends[k:k + 2]], f"{out}/rows_shape{k}") for k in (0, 2))
        inputs = []
        for k, name in enumerate(record.inputs):
            if name in self.plan.patterns:
                inputs.append(self.rows(name))
                continue
            size = self.constant(f"{out}/size{k}", np.array([np.shape(self.plan.weights[name])[axis]], np.int64))
            target = self.node("Concat", [before, size, after], f"{out}/shape{k}", axis=0)
            inputs.append(self.node("Expand", [name, target], f"{out}/expanded{k}"))
        self.node("Concat", inputs, out, axis=axis)

    def picked(self, record: Any, component: int | None) -> None:
        """Each instance's rows at positions of its own (``PICKED``): a position counted from the
        instance's end where negative, offset to its first row; one past the instance (or a
        GatherND's entry before the length, other than 0 or -1, on an axis of 1) reads row 0
        instead and is told by ``POSITIONS_OK``, which the runner checks."""
        out = record.outputs[0]
        data, positions = record.inputs
        rank = len(self.plan.patterns[positions]) - (component is not None)  # of the positions, a row an instance
        entry = (lambda j: self.node("Gather", [positions, self.constant(f"{out}/entry{j}/index", np.array(j, np.int64))],
                                     f"{out}/entry{j}", axis=-1))
        position = self.node("Cast", [positions if component is None else entry(component)], f"{out}/position",
                             to=TensorProto.INT64)
        wide = self.constant(f"{out}/wide", np.array([-1, *[1] * (rank - 1)], np.int64))
        length, start = (self.node("Reshape", [name, wide], f"{out}/{name}") for name in (LENGTHS, STARTS))
        zero = self.constant(f"{out}/zero", np.array(0, np.int64))
        negative = self.node("Less", [position, zero], f"{out}/negative")
        inside = self.node("Where", [negative, self.node("Add", [position, length], f"{out}/from_end"), position],
                           f"{out}/inside")
        valid = self.node("And", [self.node("Not", [self.node("Less", [inside, zero], f"{out}/before")], f"{out}/after0"),
                                  self.node("Less", [inside, length], f"{out}/within")], f"{out}/valid")
        for j in range(component or 0):  # an axis of 1 before the length: 0 or -1 only
            first = self.node("Cast", [entry(j)], f"{out}/entry{j}/64", to=TensorProto.INT64)
            ones = self.node("Or", [self.node("Equal", [first, zero], f"{out}/entry{j}/0"),
                                    self.node("Equal", [first, self.constant(f"{out}/-1", np.array(-1, np.int64))],
                                              f"{out}/entry{j}/-1")], f"{out}/entry{j}/ok")
            valid = self.node("And", [valid, ones], f"{out}/valid{j}")
        rows = self.node("Where", [valid, self.node("Add", [inside, start], f"{out}/global"), zero], f"{out}/rows_read")
        self.positions_ok.append(self.node("Reshape", [valid, self.constant(f"{out}/flat", np.array([-1], np.int64))],
                                           f"{out}/valid_flat"))
        gathered = self.node("Gather", [self.rows(data), rows], f"{out}/gathered", axis=self.plan.axis(data))
        shape = self.constant(f"{out}/shape", np.array([-1, *self.plan.patterns[out][1:]], np.int64))
        self.node("Reshape", [gathered, shape], out)

    def reduce(self, op: str, value: str, axis: int, output: str, keepdims: int) -> str:
        """``op`` over one ``axis``: given as an input where the opset says so (ReduceSum from 13,
        the others from 18), else as an attribute."""
        if self.plan.opset >= (13 if op == "ReduceSum" else 18):
            return self.node(op, [value, self.constant(f"{output}/axes", np.array([axis], np.int64))], output,
                             keepdims=keepdims)
        return self.node(op, [value], output, keepdims=keepdims, axes=[axis])

    def recurrent(self, record: Any, x: str) -> None:
        """A recurrent layer over ``X [rows, 1, d]`` as chunk calls whose ``Y [T, dirs, size, h]``
        are put back as ``[rows, dirs, 1, h]`` (initial states that are shared zeros are left out:
        the layer starts from zeros without them)."""
        y = record.outputs[0]
        width = record.entries[0].shape[2]
        dirs = 2 if record_attribute(record, "direction", "forward") == "bidirectional" else 1
        hidden = record_attribute(record, "hidden_size", None)
        given = list(record.inputs) + [""] * (PEEPHOLE + 1 - len(record.inputs))
        weights = given[1:SEQUENCE_LENS]  # W, R and B; the peephole P comes after the initial states
        peephole = ["", ""] + given[PEEPHOLE:PEEPHOLE + 1] if given[PEEPHOLE] else []
        attributes = [a for name, a in record.attributes.items() if name != "layout"]
        flat = self.node("Reshape", [x, self.constant(f"{y}/width", np.array([-1, width], np.int64))], f"{y}/x_rows0")
        rows = self.node("Concat", [flat, self.constant(f"{y}/zero", np.zeros((1, width), _dtype_of(self.plan, record.inputs[0])))],
                         f"{y}/x_rows", axis=0)
        outs = []
        for k in range(self.chunk_count):
            source, shape, lengths = chunk_feeds(k)
            padded = self.node("Reshape", [self.node("Gather", [rows, source], f"{y}/chunk{k}/x0"), shape], f"{y}/chunk{k}/x")
            out = self.node(record.op_type, [padded, *weights, lengths, *peephole], f"{y}/chunk{k}/y")
            self.nodes[-1].attribute.extend(attributes)
            turned = self.node("Transpose", [out], f"{out}t", perm=[0, 2, 1, 3])
            outs.append(self.node("Reshape", [turned, self.constant(f"{y}/flat", np.array([-1, dirs * hidden], np.int64))],
                                  f"{out}f"))
        every = self.node("Gather", [self.node("Concat", outs, f"{y}/chunks", axis=0), TARGETS], f"{y}/rows")
        self.node("Reshape", [every, self.constant(f"{y}/shape", np.array([-1, dirs, 1, hidden], np.int64))], y)


def lower(plan: InstanceAxisPlan, chunk_count: int) -> onnx.ModelProto:
    """The plan as one ONNX graph for a mix whose recurrent layers run in ``chunk_count`` chunks."""
    return _Lowering(plan, chunk_count).lower()


def mix_feeds(plan: InstanceAxisPlan, feeds_list: Sequence[Mapping[str, np.ndarray]], lengths: Sequence[int],
              constants: Sequence[Mapping[str, np.ndarray]]) -> tuple[dict[str, np.ndarray], int]:
    """The lowered graph's feeds for this mix (instances of these ``lengths``, whose own
    ``constants`` give those fed per mix), and its chunks."""
    lengths = np.asarray(lengths, np.int64)
    feeds = {name: np.concatenate([f[name] for f in feeds_list], axis=plan.axis(name)) for name in plan.inputs}
    members = chunk_members(lengths, CHUNK)  # (a padded layout needs no more of the chunks than who is in each)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    for name, size in plan.bounded.items():  # (a padded position reads index 0: past the axis, an error for all)
        if any(np.any((c[name] < -size) | (c[name] >= size)) for c in constants):
            raise PositionOutOfRange(f"GatherElements indices {name!r} reach past an axis of {size}")
    for name, layouts in plan.fed.items():
        for padded, pattern in layouts.items():
            arrays = [aligned(c[name], pattern) for c in constants]
            if name in plan.indices:  # positions along each instance's length: to the rows of all
                arrays = [_positions(array, plan.indices[name], int(length), int(start), name)
                          for array, length, start in zip(arrays, lengths, starts)]
            if padded:
                for k, chunk in enumerate(members):
                    feeds[f"{name}/chunk{k}"] = _padded([arrays[m] for m in chunk], pattern, int(lengths[chunk[0]]))
            else:
                feeds[name] = np.concatenate(arrays, axis=pattern.index(None))
    if plan.picked:
        feeds[STARTS], feeds[LENGTHS] = starts, lengths
    for record, step in plan.picks:  # each instance's row at the position, counted from its own end where negative
        if np.any(step.position < -lengths) or np.any(step.position >= lengths):  # (``takes`` sends such batches away)
            raise IndexError(f"position {step.position} of {record.outputs[0]!r} is past an instance's length")
        feeds[picked_rows(record)] = starts + step.position % lengths
    if plan.padded:
        feeds.update(_padded_chunks(members, lengths))
    if not plan.recurrent:
        return feeds, len(members)
    targets = np.empty(int(lengths.sum()), np.int64)
    offset = 0
    for k, part in enumerate(chunks(lengths, CHUNK)):
        source, shape, sizes = chunk_feeds(k)
        size = len(part.members)
        feeds[source], feeds[shape], feeds[sizes] = part.source, np.array([len(part.source) // size, size, -1]), part.lengths
        targets[part.targets] = offset + part.time * size + part.column
        offset += len(part.source)
    feeds[TARGETS] = targets
    return feeds, len(members)


def picked_rows(record: Any) -> str:
    """The feed of a ``PICK``'s rows: each instance's row at its position."""
    return f"{record.outputs[0]}/picked"


def _positions(indices: np.ndarray, component: int | None, length: int, start: int, name: str) -> np.ndarray:
    """An instance's Gather indices along its length (a GatherND's: that ``component`` of its
    index tuples, those before it indexing axes of size 1), as rows of the whole mix. Past the
    length, the instance alone would fail: an IndexError here, never another instance's row."""
    if component is not None:
        ones, positions = indices[..., :component], indices[..., component]
        if ones.size and (ones.min() < -1 or ones.max() > 0):
            raise IndexError(f"GatherND indices {name!r} reach past an axis of size 1")
        result = np.zeros_like(indices)
        result[..., component] = _positions(positions, None, length, start, name)
        result[..., component + 1:] = indices[..., component + 1:]
        return result
    if indices.size and (indices.min() < -length or indices.max() >= length):
        raise IndexError(f"Gather indices {name!r} reach past an instance's length {length}")
    return indices % length + start if length else indices


def _padded_chunks(members: Sequence[np.ndarray], lengths: np.ndarray) -> dict[str, np.ndarray]:
    """The padded layout's feeds: each chunk's (``padded_feeds``), and where each row is."""
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    total = int(lengths.sum())
    feeds, back, offset = {}, np.empty(total, np.int64), 0
    for k, chunk in enumerate(members):
        source, valid, size, longest = padded_feeds(k)
        count, most = len(chunk), int(lengths[chunk[0]])
        positions = np.arange(most)[None, :]
        real = positions < lengths[chunk][:, None]
        feeds[valid], feeds[size], feeds[longest] = real, np.array([count]), np.array([most])
        rows = starts[chunk][:, None] + positions
        feeds[source] = np.where(real, rows, total)
        back[rows[real]] = offset + np.flatnonzero(real)
        offset += count * most
    feeds[BACK] = back
    feeds[INSTANCES] = np.argsort(np.concatenate(members)) if members else np.zeros(0, np.int64)
    return feeds


def _padded(arrays: Sequence[np.ndarray], pattern: tuple, longest: int) -> np.ndarray:
    """Each instance's constant in a batch padded to ``longest`` (zeros past its length)."""
    result = np.zeros((len(arrays), *pattern_at(pattern, longest)), arrays[0].dtype)
    for b, array in enumerate(arrays):
        result[(b, *(slice(0, n) for n in array.shape))] = array
    return result


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


class InstanceAxisRunner:
    """Runs a node-level plan on onnxruntime (``settings``) or the NumPy interpreter (None): one
    lowered graph, and its session, per number of chunks (the ``SESSIONS_KEPT`` last used)."""

    def __init__(self, plan: InstanceAxisPlan, settings: OrtSettings | None) -> None:
        self.plan = plan
        self.settings = settings
        self.runs: Recent = Recent(SESSIONS_KEPT)  # chunks -> run(output names, feeds)
        self.made = 0  # sessions made so far
        self._launches: tuple[Counter[str], Counter[str]] = (Counter(), Counter())  # by op: once, once a chunk
        for record, step in zip(plan.records, plan.steps):
            self._launches[step.kind in ("sequences", PADDED, POOLED)][record.op_type] += 1

    def run(self, names: Sequence[str], feeds_list: Sequence[Mapping[str, np.ndarray]], lengths: Sequence[int],
            constants: Sequence[Mapping[str, np.ndarray]]) -> tuple[list[list[np.ndarray]], int]:
        """Outputs ``names`` of every instance (``lengths``: its rows), and the chunks it ran in."""
        feeds, count = mix_feeds(self.plan, feeds_list, lengths, constants)
        values = run_session(self._run(count), [*names, *[POSITIONS_OK] * self.plan.picked], feeds)
        if self.plan.picked and not values.pop():
            raise PositionOutOfRange("a position the model computed is past its instance's length")
        cuts, ones = np.cumsum(lengths)[:-1], np.arange(1, len(lengths))
        split = [np.split(value, ones if self.plan.one_row(name) else cuts, axis=self.plan.axis(name))
                 for name, value in zip(names, values)]
        return [list(outputs) for outputs in zip(*split)], count

    def launches(self, chunk_count: int) -> dict[str, int]:
        """The lowered graph's launches by op type of the model (a recurrent layer's and a padded
        step's: one a chunk)."""
        once, per_chunk = self._launches
        return {op: once.get(op, 0) + chunk_count * per_chunk.get(op, 0) for op in {*once, *per_chunk}}

    def _run(self, count: int) -> Any:
        run = self.runs.get(count)
        if run is None:
            self.made += 1
            model = lower(self.plan, count)
            if self.settings is None:
                interpreter = Interpreter(from_onnx(model))
                run = self.runs[count] = lambda names, feeds, *_: interpreter.run(feeds, names)
            else:
                run = self.runs[count] = new_session(model, self.settings.options, self.settings.providers).run
        return run


def _fill(op: str, dtype: np.dtype) -> Any:
    """What a reduction over padded chunks sets their padded positions to: 0 (a sum, a mean),
    the lowest value (a max, an ArgMax) or the highest (a min, an ArgMin)."""
    if op not in ("ReduceMax", "ReduceMin", "ArgMax", "ArgMin"):
        return 0
    lowest, highest = (-np.inf, np.inf) if dtype.kind == "f" else (np.iinfo(dtype).min, np.iinfo(dtype).max)
    return highest if op in ("ReduceMin", "ArgMin") else lowest


def _info(name: str, pattern: tuple, size: str | None, elem_type: int) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem_type, [size or None if d is None else d for d in pattern])


def record_type(plan: InstanceAxisPlan, name: str) -> int:
    """The element type of a per-instance value of the plan."""
    for record in plan.records:
        if name in record.outputs:
            return record.types[record.outputs.index(name)].elem_type
        for read, entry in zip(record.inputs, record.entries):
            if read == name and hasattr(entry, "elem_type"):
                return entry.elem_type
    raise KeyError(name)


def _dtype_of(plan: InstanceAxisPlan, name: str) -> np.dtype:
    if name in plan.weights:
        return plan.weights[name].dtype
    return helper.tensor_dtype_to_np_dtype(record_type(plan, name))
