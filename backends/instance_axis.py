"""A node-level plan (``batcher.instance_axis``) lowered to one ONNX graph that serves every mix
of lengths, and run: the mix's inputs concatenated along their rows' axis, the index arrays of
its lengths fed, the outputs cut back into instances.

The graph is the model's own nodes over ``[1, N, d]`` in place of ``[1, L, d]``: a row-wise
node as it is, a reshape of each row as a Reshape to its row shape, and a recurrent layer as
padded chunks of sequences sorted by length (``batcher.sequences``, whose ``chunks`` the feeds
come from): each chunk Gathers its time-major rows (one zero row past the last for padding),
runs the layer with ``sequence_lens``, and one Gather puts every real row back in instance
order. The graph depends on the mix only through its number of chunks, so a runner keeps one
session for each (at most ``ceil(instances / CHUNK)``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from autobatch.backends.interpreter import Interpreter
from autobatch.backends.ort_runtime import OrtSettings, new_session, run_session
from autobatch.batcher.instance_axis import InstanceAxisPlan
from autobatch.batcher.ragged import record_attribute
from autobatch.batcher.sequences import CHUNK, PEEPHOLE, SEQUENCE_LENS, Chunk, chunks
from autobatch.ir import from_onnx
from autobatch.ir.onnx_io import choose_ir_version
from autobatch.ir.types import ValueType

ROWS = "rows"  # the symbolic size of the batch's rows axis
TARGETS = "instance_axis/targets"  # feed: where each row of a recurrent layer's output is in its chunks' outputs


def chunk_feeds(k: int) -> tuple[str, str, str]:
    """The feeds of chunk ``k``: its source rows, its ``[T, size, -1]`` shape and its lengths."""
    return f"instance_axis/chunk{k}/source", f"instance_axis/chunk{k}/shape", f"instance_axis/chunk{k}/lengths"


def lower(plan: InstanceAxisPlan, chunk_count: int) -> onnx.ModelProto:
    """The plan as one ONNX graph for a mix whose recurrent layers run in ``chunk_count`` chunks."""
    nodes: list[onnx.NodeProto] = []
    initializers: dict[str, np.ndarray] = {}

    def constant(name: str, array: np.ndarray) -> str:
        initializers[name] = array
        return name

    recurrent = False
    for record, signature in zip(plan.records, plan.signatures):
        initializers.update((e, plan.weights[e]) for e in record.entries if type(e) is str and e in plan.weights
                            and signature[0] != "reshape")
        if signature[0] == "ragged":
            nodes.append(helper.make_node(record.op_type, record.inputs, record.outputs, domain=record.domain or None))
            nodes[-1].attribute.extend(record.attributes.values())
        elif signature[0] == "reshape":
            out_axis, row = signature[4]
            target = constant(f"{record.outputs[0]}/row_shape", np.array([1] * out_axis + [-1, *row], np.int64))
            nodes.append(helper.make_node("Reshape", [record.inputs[0], target], record.outputs[:1]))
        else:
            recurrent = True
            nodes += _recurrent(record, chunk_count, constant)
    inputs = [_info(name, _input_type(plan, name), axis) for name, axis in plan.inputs.items()]
    if recurrent:
        for k in range(chunk_count):
            source, shape, lengths = chunk_feeds(k)
            inputs += [helper.make_tensor_value_info(source, onnx.TensorProto.INT64, [None]),
                       helper.make_tensor_value_info(shape, onnx.TensorProto.INT64, [3]),
                       helper.make_tensor_value_info(lengths, onnx.TensorProto.INT32, [None])]
        inputs.append(helper.make_tensor_value_info(TARGETS, onnx.TensorProto.INT64, [ROWS]))
    outputs = [_info(name, _output_type(plan, name), axis) for name, axis in plan.outputs.items()]
    graph = helper.make_graph(nodes, "instance_axis", inputs, outputs,
                              [numpy_helper.from_array(np.asarray(a), n) for n, a in initializers.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", plan.opset)])
    model.ir_version = choose_ir_version(model, None)
    return model


def _recurrent(record: Any, chunk_count: int, constant: Any) -> list[onnx.NodeProto]:
    """A recurrent layer over ``X [rows, 1, d]`` as chunk calls whose ``Y [T, dirs, size, h]``
    are put back as ``[rows, dirs, 1, h]`` (initial states that are shared zeros are left out:
    the layer starts from zeros without them)."""
    x, y = record.inputs[0], record.outputs[0]
    width = record.entries[0].shape[2]
    dirs = 2 if record_attribute(record, "direction", "forward") == "bidirectional" else 1
    hidden = record_attribute(record, "hidden_size", None)
    given = list(record.inputs) + [""] * (PEEPHOLE + 1 - len(record.inputs))
    weights = given[1:SEQUENCE_LENS]  # W, R and B; the peephole P comes after the initial states
    peephole = ["", ""] + given[PEEPHOLE:PEEPHOLE + 1] if given[PEEPHOLE] else []
    attributes = [a for name, a in record.attributes.items() if name != "layout"]
    rows = f"{y}/x_rows"
    nodes = [helper.make_node("Reshape", [x, constant(f"{y}/width", np.array([-1, width], np.int64))], [rows + "0"]),
             helper.make_node("Concat", [rows + "0", constant(f"{y}/zero", np.zeros((1, width), _dtype(record)))],
                              [rows], axis=0)]
    flat = []
    for k in range(chunk_count):
        source, shape, lengths = chunk_feeds(k)
        padded, out = f"{y}/chunk{k}/x", f"{y}/chunk{k}/y"
        nodes += [helper.make_node("Gather", [rows, source], [padded + "0"]),
                  helper.make_node("Reshape", [padded + "0", shape], [padded]),
                  helper.make_node(record.op_type, [padded, *weights, lengths, *peephole], [out]),
                  helper.make_node("Transpose", [out], [out + "t"], perm=[0, 2, 1, 3]),
                  helper.make_node("Reshape", [out + "t", constant(f"{y}/flat", np.array([-1, dirs * hidden], np.int64))],
                                   [out + "f"])]
        nodes[-3].attribute.extend(attributes)
        flat.append(out + "f")
    nodes += [helper.make_node("Concat", flat, [f"{y}/chunks"], axis=0),
              helper.make_node("Gather", [f"{y}/chunks", TARGETS], [f"{y}/rows"]),
              helper.make_node("Reshape", [f"{y}/rows", constant(f"{y}/shape", np.array([-1, dirs, 1, hidden], np.int64))],
                               [y])]
    return nodes


def mix_feeds(plan: InstanceAxisPlan, feeds_list: Sequence[Mapping[str, np.ndarray]], lengths: Sequence[int],
              recurrent: bool) -> tuple[dict[str, np.ndarray], int]:
    """The lowered graph's feeds for this mix (instances of these ``lengths``), and its chunks."""
    feeds = {name: np.concatenate([f[name] for f in feeds_list], axis=axis) for name, axis in plan.inputs.items()}
    if not recurrent:
        return feeds, 0
    parts: list[Chunk] = chunks(lengths, CHUNK)
    targets = np.empty(sum(lengths), np.int64)
    offset = 0
    for k, part in enumerate(parts):
        source, shape, sizes = chunk_feeds(k)
        size = len(part.members)
        feeds[source], feeds[shape], feeds[sizes] = part.source, np.array([len(part.source) // size, size, -1]), part.lengths
        targets[part.targets] = offset + part.time * size + part.column
        offset += len(part.source)
    feeds[TARGETS] = targets
    return feeds, len(parts)


class InstanceAxisRunner:
    """Runs a node-level plan on onnxruntime (``settings``) or the NumPy interpreter (None): one
    lowered graph, and its session, per number of chunks."""

    def __init__(self, plan: InstanceAxisPlan, settings: OrtSettings | None) -> None:
        self.plan = plan
        self.settings = settings
        self.recurrent = any(signature[0] == "sequences" for signature in plan.signatures)
        self._runs: dict[int, Any] = {}  # chunks -> run(output names, feeds)

    def run(self, names: Sequence[str], feeds_list: Sequence[Mapping[str, np.ndarray]],
            lengths: Sequence[int]) -> tuple[list[list[np.ndarray]], int]:
        """Outputs ``names`` of every instance (``lengths``: its rows), and the chunks it ran in."""
        feeds, count = mix_feeds(self.plan, feeds_list, lengths, self.recurrent)
        values = run_session(self._run(count), list(names), feeds)
        cuts = np.cumsum(lengths)[:-1]
        split = [np.split(value, cuts, axis=self.plan.outputs[name]) for name, value in zip(names, values)]
        return [list(outputs) for outputs in zip(*split)], count

    def launches(self, chunk_count: int) -> dict[str, int]:
        """The lowered graph's launches by op type of the model (a recurrent layer's: its chunks)."""
        counts: dict[str, int] = {}
        for record, signature in zip(self.plan.records, self.plan.signatures):
            counts[record.op_type] = counts.get(record.op_type, 0) + (chunk_count if signature[0] == "sequences" else 1)
        return counts

    def _run(self, count: int) -> Any:
        run = self._runs.get(count)
        if run is None:
            model = lower(self.plan, count)
            if self.settings is None:
                interpreter = Interpreter(from_onnx(model))
                run = self._runs[count] = lambda names, feeds, *_: interpreter.run(feeds, names)
            else:
                run = self._runs[count] = new_session(model, self.settings.options, self.settings.providers).run
        return run


def _info(name: str, vtype: ValueType, axis: int) -> onnx.ValueInfoProto:
    shape = [ROWS if k == axis else size for k, size in enumerate(vtype.shape)]
    return helper.make_tensor_value_info(name, vtype.elem_type, shape)


def _input_type(plan: InstanceAxisPlan, name: str) -> ValueType:
    return next(entry for record in plan.records for entry, read in zip(record.entries, record.inputs) if read == name)


def _output_type(plan: InstanceAxisPlan, name: str) -> ValueType:
    record = next(r for r in plan.records if name in r.outputs)
    return record.types[record.outputs.index(name)]


def _dtype(record: Any) -> np.dtype:
    return helper.tensor_dtype_to_np_dtype(record.entries[0].elem_type)

