"""What an engine runs: an ONNX model (through ``InferenceSession``) or a lockstep program.

A runner checks one instance's feeds, runs many instances batched and one alone. Results are
``{output name: array}`` per instance; a batched run may put an exception in place of one
instance's result (programs fail one by one), or raise (then the engine re-runs each alone).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from autobatch.backends import FeedError
from autobatch.batch import run_programs
from autobatch.frontends import ProgramFailure
from autobatch.frontends.onnx_control_flow import MAX_UNROLLED_NODES
from autobatch.serving.protocol import datatype_of
from autobatch.session import InferenceSession

Feeds = dict[str, np.ndarray]
Outputs = dict[str, np.ndarray]


@dataclass(frozen=True)
class TensorSpec:
    """One input or output as the v2 metadata describes it; -1 marks a dimension that varies."""

    name: str
    datatype: str
    shape: list[int] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": self.shape}


class Runner(Protocol):
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    ran_alone: int  # instances of the last ``run_batch`` that it ran each alone, by choice

    def check(self, feeds: Mapping[str, np.ndarray]) -> Feeds:
        """The feeds, or FeedError saying why they do not fit."""

    def run_batch(self, feeds_list: Sequence[Feeds]) -> list[Outputs | BaseException]:
        ...

    def run(self, feeds: Feeds) -> Outputs:
        ...


class SessionRunner:
    """An ONNX model: ``InferenceSession.run_batch`` batches instances of different shapes."""

    def __init__(self, session: InferenceSession) -> None:
        self.session = session
        self.ran_alone = 0  # instances of the last batch run each alone, measured faster (``autobatch.ways``)
        graph = session.graph
        self.inputs = [_spec(graph, name) for name in graph.inputs]
        self.outputs = [_spec(graph, name) for name in graph.outputs]

    def check(self, feeds: Mapping[str, np.ndarray]) -> Feeds:
        return self.session.check(feeds)

    def run_batch(self, feeds_list: Sequence[Feeds]) -> list[Outputs | BaseException]:
        names = self.session.graph.outputs
        results = self.session.run_batch(None, feeds_list)
        self.ran_alone = self.session.stats.alone if self.session.stats is not None else 0
        return [dict(zip(names, outputs)) for outputs in results]

    def run(self, feeds: Feeds) -> Outputs:
        return dict(zip(self.session.graph.outputs, self.session.run(None, feeds)))


ProgramFn = Callable[[Feeds], Coroutine[Any, Any, Any]]


class ProgramRunner:
    """An ``async def program(feeds)`` over autobatch tensors (see ``run_programs``): it awaits
    the tensors it needs mid-way and returns ``{name: array}`` (or one array, named
    ``output``). Optional attributes ``inputs`` / ``outputs`` on the function (lists of
    ``TensorSpec``) describe it in the metadata and let requests be checked up front."""

    def __init__(self, fn: ProgramFn, backend: str = "numpy") -> None:
        self.fn = fn
        self.ran_alone = 0  # programs always run batched
        self.backend = backend
        self.inputs: list[TensorSpec] = list(getattr(fn, "inputs", []))
        self.outputs: list[TensorSpec] = list(getattr(fn, "outputs", []))

    def check(self, feeds: Mapping[str, np.ndarray]) -> Feeds:
        if self.inputs:
            names = {spec.name for spec in self.inputs}
            if set(feeds) != names:
                raise FeedError(f"inputs {sorted(feeds)} where the program takes {sorted(names)}")
        return dict(feeds)

    def run_batch(self, feeds_list: Sequence[Feeds]) -> list[Outputs | BaseException]:
        results = run_programs(self.fn, list(feeds_list), backend=self.backend)
        return [_program_error(r) if isinstance(r, ProgramFailure) else _as_outputs(r) for r in results]

    def run(self, feeds: Feeds) -> Outputs:
        result = self.run_batch([feeds])[0]
        if isinstance(result, BaseException):
            raise result
        return result


def load_runner(spec: str, backend: str = "numpy", max_unrolled_nodes: int = MAX_UNROLLED_NODES,
                alone_when_faster: bool | float = True, threads: int | None = None) -> tuple[str, Runner]:
    """``model.onnx`` (served under its stem; ``threads``: its onnxruntime's intra-op threads,
    None: onnxruntime's choice) or ``module:function`` / ``file.py:function`` (a program,
    served under the function's name)."""
    path = Path(spec)
    if path.suffix == ".onnx" or (path.is_file() and ":" not in spec):
        if not path.is_file():
            raise FileNotFoundError(f"{spec}: no such model file")
        return path.stem, SessionRunner(InferenceSession(str(path), backend=backend, max_unrolled_nodes=max_unrolled_nodes,
                                                         alone_when_faster=alone_when_faster, threads=threads))
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{spec}: expected a .onnx file or module:function (a program)")
    fn = getattr(_import(module_name), attr, None)
    if fn is None or not callable(fn):
        raise ValueError(f"{spec}: {module_name} has no function {attr!r}")
    return attr, ProgramRunner(fn, backend)


def _import(name: str) -> Any:
    if name.endswith(".py"):
        module_spec = importlib.util.spec_from_file_location(Path(name).stem, name)
        if module_spec is None or module_spec.loader is None:
            raise ValueError(f"{name}: cannot import")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[module_spec.name] = module
        module_spec.loader.exec_module(module)
        return module
    return importlib.import_module(name)


def _spec(graph: Any, name: str) -> TensorSpec:
    vtype = graph.values[name].type
    if vtype is None or vtype.dtype is None:
        return TensorSpec(name, "BYTES", [-1])
    shape = [-1] if vtype.shape is None else [d if isinstance(d, int) else -1 for d in vtype.shape]
    return TensorSpec(name, datatype_of(vtype.dtype), shape)


def _as_outputs(result: Any) -> Outputs:
    if isinstance(result, Mapping):
        return {name: _array(value) for name, value in result.items()}
    return {"output": _array(result)}


def _array(value: Any) -> np.ndarray:
    return value.numpy() if hasattr(value, "numpy") else np.asarray(value)


def _program_error(failure: ProgramFailure) -> BaseException:
    return failure.error if isinstance(failure.error, Exception) else RuntimeError(str(failure))
