"""Runs a flat plan (``autobatch.batcher.flat``): arenas of rows, one template call a step.

Each template is prepared once per backend (a NumPy ``Interpreter``, or one onnxruntime
session on the CPU) and kept on the template, which the batcher caches across batches: a later
batch of the same model prepares nothing. Template runs skip the feed checks of a user-facing
run: the planner made every feed, and each step costs microseconds that add up over hundreds of
steps a minibatch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Mapping
from typing import Any

import numpy as np
import onnxruntime as ort
from onnx import helper

from autobatch.backends.interpreter import NodeExecutionError, describe
from autobatch.backends.ort_runtime import SessionCache
from autobatch.batcher.flat import FlatPlan, Rows, Step, Template
from autobatch.ir import Graph, to_onnx

TemplateRun = Callable[[dict[str, Any]], list[Any]]  # feeds by input name -> the graph's outputs


class OrtTemplate:
    """A template graph as one onnxruntime session, its batch size left symbolic."""

    def __init__(self, graph: Graph, cache: SessionCache) -> None:
        self.name = graph.name
        self.outputs = list(graph.outputs)
        # onnxruntime validates the model itself; onnx.checker would refuse a model-local function
        # imported at another opset than the model (a cell made from an older ONNX model).
        self.session = ort.InferenceSession(to_onnx(graph, check=False).SerializeToString(), cache.options,
                                            providers=list(cache.providers))

    def __call__(self, feeds: dict[str, Any]) -> list[Any]:
        try:
            return self.session.run(self.outputs, feeds)
        except Exception as error:  # onnxruntime raises its own exception types
            raise NodeExecutionError(f"{self.name} failed on inputs {describe(list(feeds.values()))}: {error}") from error


class FlatExecutor:
    """``prepare(graph)`` makes a template graph runnable on the backend; ``backend_key`` names
    that backend's configuration (templates keep one prepared run per key)."""

    def __init__(self, prepare: Callable[[Graph], TemplateRun], backend_key: Hashable) -> None:
        self.prepare = prepare
        self.backend_key = backend_key

    def runner(self, template: Template) -> TemplateRun:
        runner = template.runners.get(self.backend_key)
        if runner is None:
            runner = template.runners[self.backend_key] = self.prepare(template.graph)
        return runner

    def run(self, plan: FlatPlan, weights: Mapping[str, np.ndarray], literals: Mapping[str, Any],
            seconds: dict[str, float] | None = None) -> list[np.ndarray]:
        """The arenas once every step has run; ``plan.locations`` says where each value is.
        ``literals``: the value of every literal the plan names (a plan may serve many runs).
        ``seconds`` receives the time spent in gathers (literals placed, operands stacked),
        template runs (kernels, with the backend's own call overhead) and arena writes."""
        clock = time.perf_counter
        start = clock()
        arenas = []
        for (elem_type, shape), rows, names in zip(plan.kinds, plan.rows, plan.literals):
            arena = np.empty((rows, *shape), dtype=helper.tensor_dtype_to_np_dtype(elem_type))
            if names:
                np.stack([literals[name] for name in names], out=arena[:len(names)])
            arenas.append(arena)
        gather = clock() - start
        kernels = scatter = 0.0
        for step in plan.steps:
            begin = clock()
            if step.groups:  # ragged: every member's rows, one after the other
                stacked = [_concatenated(arenas, parts) for parts in step.reads]
            else:
                stacked = [_read(arenas, a, rows) for a, rows in step.reads]
            template = step.template
            gathered = clock()
            if template is None:  # a sum of terms or a segment reduction: each member's run of rows
                outputs = [_reduced(stacked[0], step)]
            else:
                feeds = {f"x{i}": value for i, value in zip(template.stacked, stacked)}
                feeds.update((f"w{i}", weights[name]) for i, name in zip(template.fed, step.weights))
                outputs = self.runner(template)(feeds)
            ran = clock()
            for write, value in zip(step.writes, outputs):
                if template is not None and template.ragged:
                    _split(arenas, write, step.groups, value)
                elif template is not None and template.once:
                    arenas[write[0]][write[1]] = value
                else:
                    arenas[write[0]][write[1]:write[1] + step.size] = value
            gather += gathered - begin
            kernels += ran - gathered
            scatter += clock() - ran
        if seconds is not None:
            seconds.update(gather=gather, kernels=kernels, scatter=scatter)
        return arenas


def _read(arenas: list[np.ndarray], arena: int, rows: Rows) -> np.ndarray:
    """A slice is a view; an index array one gather; an int one member's row (0-d views too)."""
    return arenas[arena].take(rows, axis=0) if isinstance(rows, np.ndarray) else arenas[arena][rows, ...]


def _concatenated(arenas: list[np.ndarray], parts: list[tuple[int, Rows]]) -> np.ndarray:
    """The rows of every member, read group by group (``[members, length, ...]`` each)."""
    blocks = [_read(arenas, a, rows) for a, rows in parts]
    rows = [block.reshape(-1, *block.shape[2:]) for block in blocks]
    return rows[0] if len(rows) == 1 else np.concatenate(rows)


def _split(arenas: list[np.ndarray], writes: list[tuple[int, int]], groups: list[tuple[int, int]],
           value: np.ndarray) -> None:
    """A ragged result back into its members' arenas, group by group."""
    offset = 0
    for (a, first), (length, count) in zip(writes, groups):
        arenas[a][first:first + count] = value[offset:offset + count * length].reshape(count, length, *value.shape[1:])
        offset += count * length


# np.add.reduceat along axis 0 walks rows this wide (in elements) or wider column by column, and
# ran 2-13x slower here than one contiguous reduce a member (rows of 256 to 512 floats).
WIDE_ROW = 256


def _reduced(rows: np.ndarray, step: Step) -> np.ndarray:
    """Each member's run of rows (starting at ``step.offsets``) added up, or averaged."""
    if rows[:1].size >= WIDE_ROW:
        ends = [*step.offsets[1:].tolist(), len(rows)]
        total = np.stack([np.add.reduce(rows[start:end], axis=0) for start, end in zip(step.offsets.tolist(), ends)])
    else:
        total = np.add.reduceat(rows, step.offsets, axis=0)
    segment = step.segment
    if segment is None:
        return total
    if segment.mean:
        lengths = np.repeat([length for length, _ in step.groups], [count for _, count in step.groups])
        total = total / lengths.reshape(-1, *([1] * (total.ndim - 1))).astype(total.dtype)
    return total[:, None] if segment.keepdims else total
