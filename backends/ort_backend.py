"""``OrtBackend``: plain (unbatched) models on onnxruntime behind ``onnx.backend.base.Backend``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from onnx import ModelProto
from onnx.backend.base import Backend, BackendRep

from autobatch.backends.interpreter import check_feeds
from autobatch.backends.numpy_backend import feeds_by_name
from autobatch.backends.ort_runtime import (
    CPU, CUDA, NUMPY_LESS_TYPES, UnsupportedByOnnxruntime, default_providers, new_session, run_session,
    session_options,
)
from autobatch.ir import Graph, from_onnx, to_onnx


class OrtBackendRep(BackendRep):
    """One session for the whole model, exported from the IR (so the export is what runs)."""

    def __init__(self, graph: Graph, providers: Sequence[str], threads: int = 0) -> None:
        self.graph = graph
        for name in [*graph.inputs, *graph.outputs]:
            vtype = graph.values[name].type
            if vtype is not None and vtype.is_tensor and vtype.elem_type in NUMPY_LESS_TYPES:
                raise UnsupportedByOnnxruntime(
                    f"{name!r} is {vtype!r}: onnxruntime's Python API takes and gives no bfloat16, float8 or "
                    "4-bit arrays; run it on the numpy backend")
        # The whole model, run for instance after instance (``InferenceSession.run``, a batch
        # run alone in turn): its threads spin between runs, as onnxruntime's own session's do.
        self.session = new_session(_shapes_as_hints(to_onnx(graph)), session_options(threads, stop_spinning=False), providers)

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        feeds = check_feeds(self.graph, feeds_by_name(self.graph.inputs, inputs))
        return tuple(run_session(self.session.run, None, feeds))


def _shapes_as_hints(model: ModelProto) -> ModelProto:
    """The model with its outputs' dimensions unnamed (their ranks kept) and no shapes declared
    for the values between: a model may declare shapes that do not hold (two outputs of [R, C]
    whose first axes differ, 1 and N), and onnxruntime's planner, taking them as facts, reuses a
    buffer of another shape ("Shape mismatch attempting to re-use buffer", fuzz seed 163532,
    where onnxruntime's own session got by only because it ran no node after the shorter
    output). onnxruntime infers what holds from the inputs."""
    del model.graph.value_info[:]
    for value in model.graph.output:
        if value.type.HasField("tensor_type"):
            for dim in value.type.tensor_type.shape.dim:
                dim.Clear()
    return model


class OrtBackend(Backend):
    @classmethod
    def prepare(cls, model: ModelProto | Graph | bytes | str, device: str = "CPU",
                providers: Sequence[str] | None = None, threads: int = 0, **kwargs: Any) -> OrtBackendRep:
        if not cls.supports_device(device):
            raise ValueError(f"onnxruntime here has no {device!r} device; it runs on {default_providers()[0]}")
        if providers is None:
            providers = default_providers() if device.upper() == "CUDA" else (CPU,)
        graph = model if isinstance(model, Graph) else from_onnx(model)
        return OrtBackendRep(graph, providers, threads)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        device = device.upper()
        return device == "CPU" or (device == "CUDA" and default_providers()[0] == CUDA)
