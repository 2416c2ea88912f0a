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
most ``ceil(instances / CHUNK)``). What a mix feeds it is ``backends.axis_feeds``'s; the padded
layout's values and steps, ``backends.axis_padded``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from autobatch.backends.axis_padded import PaddedLowering
from autobatch.backends.interpreter import Interpreter
from autobatch.backends.ort_runtime import OrtSettings, new_session, run_session
from autobatch.backends.axis_feeds import (BACK, INSTANCES, LENGTHS, POSITIONS_OK, STARTS, TARGETS, PositionOutOfRange,
                                           chunk_feeds, mix_feeds, padded_feeds, picked_rows)
from autobatch.batcher.axis_steps import CONCAT, GATHER, PADDED, PICK, PICKED, POOLED
from autobatch.batcher.instance_axis import InstanceAxisPlan
from autobatch.batcher.ragged import record_attribute
from autobatch.batcher.sequences import PEEPHOLE, SEQUENCE_LENS
from autobatch.ir import Recent, from_onnx
from autobatch.ir.onnx_io import choose_ir_version

ROWS = "rows"  # the symbolic size of the batch's rows axis
# Sessions a runner keeps, one per number of chunks (a batch of 64 has 8): each holds the weights.
SESSIONS_KEPT = 8


class _Lowering(PaddedLowering):
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
                         else self.plan.patterns[name], "", self.plan.elem_type(name)) for name in self.plan.outputs]
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
        infos = [_info(name, plan.patterns[name], ROWS, plan.elem_type(name)) for name in plan.inputs]
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
        rows = self.node("Concat", [flat, self.constant(f"{y}/zero", np.zeros((1, width), self.plan.dtype(record.inputs[0])))],
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


def _info(name: str, pattern: tuple, size: str | None, elem_type: int) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem_type, [size or None if d is None else d for d in pattern])
