"""Runs a flat plan (``autobatch.batcher.flat``): arenas of rows, one template call a step.

Each template is prepared once per backend (a NumPy ``Interpreter`` or an onnxruntime
session through ``OrtExecutor``) and kept on the template, which the batcher caches across
batches: a later batch of the same model prepares nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from typing import Any

import numpy as np
from onnx import helper

from autobatch.batcher.flat import FlatPlan, Template
from autobatch.ir import Graph


class FlatExecutor:
    """``make_runner(graph)`` prepares a graph for the backend; ``backend_key`` names that
    backend's configuration (templates keep one runner per key)."""

    def __init__(self, make_runner: Callable[[Graph], Any], backend_key: Hashable) -> None:
        self.make_runner = make_runner
        self.backend_key = backend_key

    def runner(self, template: Template) -> Any:
        runner = template.runners.get(self.backend_key)
        if runner is None:
            runner = template.runners[self.backend_key] = self.make_runner(template.graph)
        return runner

    def run(self, plan: FlatPlan, weights: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """The arenas once every step has run; ``plan.locations`` says where each value is."""
        arenas = []
        for (elem_type, shape), rows, literals in zip(plan.kinds, plan.rows, plan.literals):
            arena = np.empty((rows, *shape), dtype=helper.tensor_dtype_to_np_dtype(elem_type))
            if literals:
                arena[:len(literals)] = np.stack(literals)
            arenas.append(arena)
        for step in plan.steps:
            stacked = [arenas[a][rows] if isinstance(rows, slice) else arenas[a].take(rows, axis=0)
                       for a, rows in step.reads]
            template = step.template
            if template is None:  # a sum of terms: each member's run of rows, added in order
                outputs = [np.add.reduceat(stacked[0], step.offsets, axis=0)]
            else:
                feeds = {f"x{i}": value for i, value in zip(template.stacked, stacked)}
                feeds.update((f"w{i}", weights[name]) for i, name in zip(template.fed, step.weights))
                outputs = self.runner(template).run(feeds, template.outputs)
            for (a, start), value in zip(step.writes, outputs):
                if template is not None and template.once:
                    arenas[a][start] = value
                else:
                    arenas[a][start:start + step.size] = value
        return arenas
