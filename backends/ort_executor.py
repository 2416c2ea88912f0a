"""Run an IR graph (usually a batched one) on onnxruntime, as fused segments.

The graph is cut into steps. Compute ops are fused into *segments*: connected runs of ops
between the data-movement ops that the batcher's rewrite adds (gathers of rows, stacking
concats; see ``is_data_movement``), so a batched cell's whole body is one session call. Each segment
becomes one ONNX model whose inputs have no fixed shapes, compiled once into a session and
cached by its structure (ops, attributes, wiring, input dtypes and ranks; never the batch
size), so the same segment at another tree level or in the next minibatch reuses it.

On the CPU, data-movement ops run in NumPy (a reshape is a view, a gather one ``take``), and
values stay NumPy arrays. On CUDA everything runs in onnxruntime and values stay on the device
as ``OrtValue``s between steps; only graph outputs are copied back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import networkx as nx
import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from autobatch.backends.interpreter import FeedError, Interpreter, NodeExecutionError, describe
from autobatch.backends.ort_runtime import LENGTH_READ, SessionCache, might_abort_onnxruntime, run_session
from autobatch.batcher.rewrite import is_data_movement
from autobatch.ir import Graph, Node, captured_names
from autobatch.ir.limits import DeadlineExceeded, check_deadline
from autobatch.ir.onnx_io import choose_ir_version



@dataclass
class Segment:
    """Nodes run as one session: ``inputs`` are read from outside, ``outputs`` read outside."""

    nodes: list[Node]
    inputs: list[str]
    outputs: list[str]
    structure: tuple = ()
    # Constants onnxruntime cannot be fed from NumPy (float8, int4, bfloat16 ...): inside the model.
    embedded: dict[str, np.ndarray] = field(default_factory=dict)
    pinned: frozenset[str] = frozenset()  # inputs whose length the session declares (``LENGTH_READ``)


@dataclass
class ExecutorStats:
    """The plan's shape, and what the last ``run`` launched."""

    segments: int = 0
    numpy_steps: int = 0
    launches: int = 0
    session_calls: int = 0


class OrtExecutor:
    """Prepared once per graph; ``run`` may be called many times."""

    def __init__(self, graph: Graph, cache: SessionCache, whole: bool | None = None,
                 device_values: bool | None = None) -> None:
        """``whole``: data movement runs inside the sessions too (one segment for a graph
        without subgraph ops: the whole-plan mode); the default on CUDA. ``device_values``:
        keep values as ``OrtValue``s between steps; the default on CUDA."""
        graph.validate()
        self.graph = graph
        self.cache = cache
        self.whole = cache.on_cuda if whole is None else whole
        self.device_values = cache.on_cuda if device_values is None else device_values
        self.numpy = Interpreter(graph)  # kernels for the NumPy steps, and the liveness
        order = graph.topological_order()
        # Subgraph bodies name outer values, which segments rename, and segments take and give
        # tensors only: such nodes run in NumPy, as do sequences and optionals (lists, None), and
        # recurrent layers over no steps or no sequences (onnxruntime aborts on those).
        in_numpy = {n.id for n in order
                    if any(True for _ in n.subgraphs()) or not _tensors_only(graph, n) or might_abort_onnxruntime(graph, n)
                    or (not self.whole and is_data_movement(n))}
        self.steps: list[Segment | Node] = self._steps(order, in_numpy)
        self.stats = ExecutorStats(
            segments=sum(isinstance(s, Segment) for s in self.steps),
            numpy_steps=sum(not isinstance(s, Segment) for s in self.steps),
        )
        self._impls = {node.id: impl for node, impl in zip(self.numpy.order, self.numpy.impls)}
        self._device_constants: dict[str, Any] = {}
        self._borrowed: dict[int, tuple[ort.OrtValue, np.ndarray]] = {}

    # ------------------------------------------------------------------ planning
    def _steps(self, order: list[Node], in_numpy: set[int]) -> list[Segment | Node]:
        graph = self.graph
        # stage: NumPy steps on the longest path before a node. Segments never span stages,
        # which keeps the graph of steps acyclic.
        stage: dict[int, int] = {}
        for node in order:
            preds = list(graph.nx.predecessors(node.id))
            stage[node.id] = max((stage[p] + (p in in_numpy) for p in preds), default=0)
        fused = nx.Graph()
        fused.add_nodes_from(n.id for n in order if n.id not in in_numpy)
        fused.add_edges_from(
            (u, v) for u, v in graph.nx.edges()
            if u not in in_numpy and v not in in_numpy and stage[u] == stage[v]
        )
        if self.whole:  # one session per stage, connected or not: fewest calls
            by_stage: dict[int, int] = {}
            for node_id in fused.nodes:
                first = by_stage.setdefault(stage[node_id], node_id)
                fused.add_edge(first, node_id)
        position = {node.id: i for i, node in enumerate(order)}
        steps: list[Segment | Node] = [graph.nodes[n] for n in in_numpy]
        for component in nx.connected_components(fused):
            segment = self._segment(sorted(component, key=position.__getitem__))
            if segment.outputs:  # a segment nobody reads from is dead code: skip it
                steps.append(segment)
        step_of = {}
        for index, step in enumerate(steps):
            for node in (step.nodes if isinstance(step, Segment) else [step]):
                step_of[node.id] = index
        dag = nx.DiGraph()
        dag.add_nodes_from(range(len(steps)))
        dag.add_edges_from((step_of[u], step_of[v]) for u, v in graph.nx.edges()
                           if u in step_of and v in step_of and step_of[u] != step_of[v])
        first = {i: min(position[n.id] for n in (s.nodes if isinstance(s, Segment) else [s])) for i, s in enumerate(steps)}
        return [steps[i] for i in nx.lexicographical_topological_sort(dag, key=first.__getitem__)]

    def _segment(self, node_ids: list[int]) -> Segment:
        graph = self.graph
        nodes = [graph.nodes[n] for n in node_ids]
        produced = {o for n in nodes for o in n.outputs if o}
        inputs: list[str] = []
        for node in nodes:
            for name in [*node.inputs, *sorted(captured_names(node))]:
                if name and name not in produced and name not in inputs:
                    inputs.append(name)
        inside = set(node_ids)
        outputs = [
            o for n in nodes for o in n.outputs
            if o and (o in graph.outputs or any(c.id not in inside for c, _ in graph.consumers(o)))
        ]
        constants = graph.initializers()
        embedded = {n: constants[n] for n in inputs if n in constants and not _feedable(constants[n])}
        inputs = [n for n in inputs if n not in embedded]
        structure = (_structure(nodes, [*inputs, *embedded], outputs),
                     tuple((a.dtype.str, a.shape, a.tobytes()) for a in embedded.values()))
        pinned = frozenset(node.inputs[i] for node in nodes if not node.domain
                           for i in LENGTH_READ.get(node.op_type, ()) if i < len(node.inputs))
        return Segment(nodes, inputs, outputs, structure, embedded, pinned)

    # ------------------------------------------------------------------ running
    def run(self, feeds: Mapping[str, Any], output_names: Sequence[str] | None = None) -> list[np.ndarray]:
        graph = self.graph
        env: dict[str, Any] = dict(self.numpy.check_feeds(feeds))
        constants = graph.initializers()
        if self.device_values:
            env = {k: self._to_device(v) for k, v in env.items()}
        remaining = self._remaining_reads()
        self.stats.launches = self.stats.session_calls = 0
        for step in self.steps:
            check_deadline()
            if isinstance(step, Segment):
                values = [env[n] if n in env else self._constant(n, constants[n]) for n in step.inputs]
                outputs = self._run_segment(step, values)
                env.update(zip(step.outputs, outputs))
                reads = step.inputs
                self.stats.session_calls += 1
            else:
                inputs = [self._to_host(env[n] if n in env else constants[n]) if n else None for n in step.inputs]
                # If/Loop/Scan bodies look up the values they capture in this context.
                context = {**constants, **{k: self._to_host(v) for k, v in env.items()}} if step.attributes else {}
                outputs = self.numpy.run_node(step, self._impls[step.id], inputs, context)
                if self.device_values:
                    outputs = [self._to_device(o) for o in outputs]
                env.update((name, value) for name, value in zip(step.outputs, outputs) if name)
                reads = [n for n in step.inputs if n]
            self.stats.launches += 1
            for name in reads:  # free what no later step reads
                remaining[name] -= 1
                if remaining[name] == 0 and name not in graph.outputs:
                    env.pop(name, None)
        wanted = graph.outputs if output_names is None else list(output_names)
        missing = [n for n in wanted if n not in env and n not in constants]
        if missing:
            raise FeedError(f"unknown output(s) {missing}; the graph's outputs are {graph.outputs}")
        results = [self._to_host(env[n]) if n in env else constants[n].copy() for n in wanted]
        constant_ids = {id(v) for v in self._device_constants.values()}
        self._borrowed = {k: v for k, v in self._borrowed.items() if k in constant_ids}
        return results

    def _remaining_reads(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for step in self.steps:
            reads = step.inputs if isinstance(step, Segment) else [n for n in step.inputs if n]
            for name in reads:
                counts[name] = counts.get(name, 0) + 1
        return counts

    def _run_segment(self, segment: Segment, values: list[Any]) -> list[Any]:
        key = (segment.structure, tuple(_input_spec(v, name in segment.pinned) for name, v in zip(segment.inputs, values)))
        session = self.cache.get(key, lambda: self._segment_model(segment, values))
        names = [f"in{i}" for i in range(len(values))]
        outputs = [f"out{i}" for i in range(len(segment.outputs))]
        try:
            if self.device_values:
                return list(run_session(session.run_with_ort_values, outputs, dict(zip(names, values))))
            return run_session(session.run, outputs, dict(zip(names, values)))
        except DeadlineExceeded:
            raise
        except Exception as error:  # onnxruntime raises its own exception types
            first = segment.nodes[0]
            raise NodeExecutionError(
                f"segment of {len(segment.nodes)} ops starting at {first} failed on inputs "
                f"{describe([self._to_host(v) for v in values])}: {error}"
            ) from error

    def _segment_model(self, segment: Segment, values: list[Any]) -> onnx.ModelProto:
        """The segment as a model with canonical value names and shape-free inputs."""
        rename = {name: f"in{i}" for i, name in enumerate(segment.inputs)}
        rename.update({name: f"const{i}" for i, name in enumerate(segment.embedded)})
        rename.update({name: f"out{i}" for i, name in enumerate(segment.outputs)})
        count = 0
        for node in segment.nodes:
            for name in node.outputs:
                if name and name not in rename:
                    rename[name] = f"t{count}"
                    count += 1
        nodes = []
        for node in segment.nodes:
            proto = helper.make_node(node.op_type, [rename.get(n, n) if n else "" for n in node.inputs],
                                     [rename[n] if n else "" for n in node.outputs], domain=node.domain or None)
            proto.attribute.extend(node.attributes.values())
            nodes.append(proto)
        specs = [_input_spec(v, name in segment.pinned) for name, v in zip(segment.inputs, values)]
        inputs = [helper.make_tensor_value_info(f"in{i}", _elem_type(v), [f"in{i}_{j}" if d is None else d
                                                                          for j, d in enumerate(spec[1])])
                  for i, (v, spec) in enumerate(zip(values, specs))]
        outputs = [helper.make_empty_tensor_value_info(f"out{i}") for i in range(len(segment.outputs))]
        constants = [onnx.numpy_helper.from_array(a, rename[n]) for n, a in segment.embedded.items()]
        graph = helper.make_graph(nodes, "segment", inputs, outputs, initializer=constants)
        opsets = [helper.make_opsetid(d, v) for d, v in sorted(self.graph.opset_imports.items())]
        model = helper.make_model(graph, opset_imports=opsets, functions=list(self.graph.functions.values()))
        model.ir_version = choose_ir_version(model, None)
        inferred = onnx.shape_inference.infer_shapes(model)
        for output, typed in zip(model.graph.output, inferred.graph.output):
            output.type.CopyFrom(typed.type)
        return model

    def _constant(self, name: str, array: np.ndarray) -> Any:
        if not self.device_values:
            return array
        value = self._device_constants.get(name)
        if value is None:  # weights go to the device once
            value = self._device_constants[name] = self._to_device(array)
        return value

    def _to_device(self, value: Any) -> Any:
        if isinstance(value, ort.OrtValue):
            return value
        device = "cuda" if self.cache.on_cuda else "cpu"
        array = np.asarray(value)
        if not array.flags.c_contiguous:  # (np.ascontiguousarray would turn a scalar into [1])
            array = array.copy(order="C")
        ort_value = ort.OrtValue.ortvalue_from_numpy(array, device)
        if device == "cpu":  # the OrtValue borrows the array's memory: keep the array alive
            self._borrowed[id(ort_value)] = (ort_value, array)
        return ort_value

    @staticmethod
    def _to_host(value: Any) -> Any:
        # A copy: on the CPU, .numpy() may view memory that dies with the OrtValue.
        return np.array(value.numpy(), copy=True) if isinstance(value, ort.OrtValue) else value


def _feedable(array: np.ndarray) -> bool:
    """Whether onnxruntime's Python API takes this array as an input (plain NumPy dtypes)."""
    return array.dtype.type.__module__ == "numpy" and array.dtype.kind in "biufcUSO"


def _tensors_only(graph: Graph, node: Node) -> bool:
    types = (graph.values[name].type for name in [*node.inputs, *node.outputs] if name)
    return all(vtype is None or vtype.is_tensor for vtype in types)




def _input_spec(value: Any, pinned: bool) -> tuple[str, tuple[int | None, ...]]:
    """A segment input's dtype and dimensions: none known, but the length of one that
    ``LENGTH_READ`` says onnxruntime reads (``pinned``)."""
    if isinstance(value, ort.OrtValue):
        dtype, shape = value.data_type(), tuple(value.shape())
    else:
        array = np.asarray(value)
        dtype, shape = array.dtype.str, array.shape
    return dtype, shape if pinned and len(shape) == 1 else (None,) * len(shape)


def _elem_type(value: Any) -> int:
    if isinstance(value, ort.OrtValue):
        return value.element_type()
    return helper.np_dtype_to_tensor_dtype(np.asarray(value).dtype)


def _structure(nodes: list[Node], inputs: list[str], outputs: list[str]) -> tuple:
    """A hashable description of a segment that ignores value names: the cache key."""
    index = {name: ("in", i) for i, name in enumerate(inputs)}
    entries = []
    for k, node in enumerate(nodes):
        for j, name in enumerate(node.outputs):
            if name:
                index[name] = ("node", k, j)
        attributes = tuple(sorted((n, a.SerializeToString(deterministic=True)) for n, a in node.attributes.items()))
        entries.append((node.domain, node.op_type, node.version, attributes,
                        tuple(index.get(n, n) if n else None for n in node.inputs)))
    return tuple(entries), tuple(index[o] for o in outputs)
