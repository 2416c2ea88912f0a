"""``NumpyBackend``: the reference interpreter behind the ``onnx.backend.base.Backend`` protocol."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from onnx import ModelProto
from onnx.backend.base import Backend, BackendRep

from autobatch.backends.interpreter import FeedError, Interpreter
from autobatch.ir import Graph, from_onnx


def feeds_by_name(input_names: Sequence[str], inputs: Any) -> dict[str, Any]:
    """Backend-protocol inputs (a list in graph-input order, a dict, or one array) as a dict."""
    if isinstance(inputs, Mapping):
        return dict(inputs)
    if isinstance(inputs, np.ndarray):
        inputs = [inputs]
    inputs = list(inputs)
    if len(inputs) != len(input_names):
        raise FeedError(f"{len(inputs)} inputs given; the graph takes {len(input_names)}: {list(input_names)}")
    return dict(zip(input_names, inputs))


class NumpyBackendRep(BackendRep):
    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.interpreter = Interpreter(graph)

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        return tuple(self.interpreter.run(feeds_by_name(self.graph.inputs, inputs)))


class NumpyBackend(Backend):
    """Runs ONNX models (or IR graphs) on the CPU with NumPy."""

    @classmethod
    def prepare(cls, model: ModelProto | Graph | bytes | str, device: str = "CPU", **kwargs: Any) -> NumpyBackendRep:
        if not cls.supports_device(device):
            raise ValueError(f"NumpyBackend runs on CPU only, not {device!r}")
        graph = model if isinstance(model, Graph) else from_onnx(model)
        return NumpyBackendRep(graph)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device.upper() == "CPU"
