"""``InferenceSession``: run one ONNX model for one instance or for many, batched."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from onnx import ModelProto

from autobatch.backends import FeedError, Interpreter
from autobatch.batcher import BatchingPass, BatchReport
from autobatch.batcher.fold import constants_to_initializers
from autobatch.ir import Graph, ValueType, from_onnx

BACKENDS = ("numpy", "onnxruntime")


@dataclass
class SessionStats:
    """The last ``run_batch``: its batching report and the seconds spent in each phase."""

    instances: int
    report: BatchReport
    seconds: dict[str, float] = field(default_factory=dict)

    def __str__(self) -> str:
        timing = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in self.seconds.items())
        return f"{self.instances} instances: {self.report}; {timing}"


class InferenceSession:
    """Like ``onnxruntime.InferenceSession``, plus ``run_batch`` for many instances at once.

    Instances may differ in input shapes where the model allows it; then only nodes whose
    signatures agree are batched together.
    """

    def __init__(self, model: ModelProto | Graph | bytes | str, backend: str = "numpy", scheduler: str = "level") -> None:
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}; choose one of {BACKENDS}")
        if backend == "onnxruntime":
            raise NotImplementedError("backend='onnxruntime' arrives with the onnxruntime backend; use 'numpy'")
        self.graph = model if isinstance(model, Graph) else from_onnx(model)
        self.backend = backend
        self.batching = BatchingPass(scheduler)
        self.stats: SessionStats | None = None
        self._single = Interpreter(self.graph)
        self._typed: dict[tuple, Graph] = {}

    def get_inputs(self) -> list[str]:
        return list(self.graph.inputs)

    def get_outputs(self) -> list[str]:
        return list(self.graph.outputs)

    def run(self, output_names: Sequence[str] | None, feeds: Mapping[str, Any]) -> list[np.ndarray]:
        """One instance, unbatched."""
        return self._single.run(feeds, output_names)

    def run_batch(self, output_names: Sequence[str] | None,
                  feeds_list: Sequence[Mapping[str, Any]]) -> list[list[np.ndarray]]:
        """Many instances, batched; result ``[i][j]`` is output j of instance i."""
        if not feeds_list:
            return []
        names = list(output_names) if output_names is not None else self.graph.outputs
        unknown = [n for n in names if n not in self.graph.outputs]
        if unknown:
            raise FeedError(f"unknown output(s) {unknown}; the model's outputs are {self.graph.outputs}")
        seconds: dict[str, float] = {}
        start = time.perf_counter()
        instances = []
        for k, feeds in enumerate(feeds_list):
            try:
                instances.append(self._typed_graph(self._single.check_feeds(feeds)))
            except FeedError as error:
                raise FeedError(f"instance {k}: {error}") from None
        union = Graph.union(instances)
        seconds["build"] = time.perf_counter() - start

        result = self.batching(union)
        seconds.update(result.report.seconds)

        start = time.perf_counter()
        interpreter = Interpreter(result.graph)
        seconds["prepare"] = time.perf_counter() - start
        start = time.perf_counter()
        union_feeds = {f"i{k}/{name}": value for k, feeds in enumerate(feeds_list) for name, value in feeds.items()}
        wanted = [f"i{k}/{name}" for k in range(len(feeds_list)) for name in names]
        flat = interpreter.run(union_feeds, wanted)
        seconds["execute"] = time.perf_counter() - start
        self.stats = SessionStats(len(feeds_list), result.report, seconds)
        width = len(names)
        return [flat[k * width:(k + 1) * width] for k in range(len(feeds_list))]

    def _typed_graph(self, feeds: Mapping[str, Any]) -> Graph:
        """The model with its inputs' concrete types and every value's shape inferred, cached
        per distinct input signature."""
        key = tuple((name, np.asarray(v).dtype.str, np.shape(v)) for name, v in sorted(feeds.items()))
        graph = self._typed.get(key)
        if graph is None:
            graph = Graph.union([self.graph], rename=lambda _k, name: name)
            constants_to_initializers(graph)
            for name, value in feeds.items():
                graph.values[name].type = ValueType.tensor(np.asarray(value).dtype, np.shape(value))
            graph.infer_shapes()
            self._typed[key] = graph
        return graph
