"""What an ``InferenceSession`` tells of itself, as onnxruntime's does (``NodeArg``,
``ModelMetadata``), and of its last batch (``SessionStats``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import onnx

from autobatch.batcher import BatchReport
from autobatch.ir import Graph
from autobatch.ir.types import type_text


@dataclass
class SessionStats:
    """The last ``run_batch``: its batching report, what ran, and seconds per phase."""

    instances: int
    report: BatchReport | None  # None: every instance ran alone
    plan_cached: bool = False
    launches: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    whole_plan: bool = False  # the plan ran as one onnxruntime session (``backends.whole_plan``)
    alone: int = 0  # instances run each alone, as measured faster than batching them (``autobatch.ways``)
    why_alone: str = ""
    at_once: int = 1  # instances run alone at once, each on its thread (``backends.parallel_runs``)
    # A plan run step by step: seconds of ``execute`` in gathers, template runs (kernels, with
    # the backend's call overhead) and writes (``FlatExecutor.run``); the rest is Python between.
    execution: dict[str, float] = field(default_factory=dict)

    @property
    def copies_avoided(self) -> int:
        return self.report.gathers_avoided if self.report is not None else 0

    def __str__(self) -> str:
        timing = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in self.seconds.items())
        if self.execution:
            timing += " (" + ", ".join(f"{k} {v * 1e3:.1f}" for k, v in self.execution.items()) + ")"
        if self.report is None:
            at_once = f", {self.at_once} at once" if self.at_once > 1 else ""
            return f"{self.instances} instances, each run alone{at_once} ({self.why_alone}); {timing}"
        cached = " (cached plan" + (", one onnxruntime session)" if self.whole_plan else ")") if self.plan_cached else ""
        return f"{self.instances} instances{cached}: {self.report}; {self.launches} launches executed; {timing}"


@dataclass(frozen=True)
class NodeArg:
    """An input or output as onnxruntime's ``NodeArg`` describes it: a dimension is its size,
    its symbolic name, or None; the type reads like ``tensor(float)`` or ``seq(tensor(int64))``."""

    name: str
    shape: list[int | str | None] | None
    type: str

    @classmethod
    def of(cls, graph: Graph, name: str) -> NodeArg:
        vtype = graph.values[name].type
        if vtype is None:
            return cls(name, None, "unknown")
        return cls(name, list(vtype.shape) if vtype.shape is not None else None, _type_name(vtype.proto))


@dataclass(frozen=True)
class ModelMetadata:
    """What onnxruntime's ``get_modelmeta()`` gives."""

    producer_name: str
    graph_name: str
    domain: str
    description: str
    graph_description: str
    version: int
    custom_metadata_map: dict[str, str]


def _type_name(proto: Any) -> str:
    """onnxruntime's words for a type: ``tensor(float)``, ``seq(tensor(int64))``, ``map(int64,tensor(float))``."""
    return type_text(proto, lambda _kind, tensor: f"tensor({onnx.TensorProto.DataType.Name(tensor.elem_type).lower()})",
                     key_separator=",")
