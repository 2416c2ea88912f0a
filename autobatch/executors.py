"""What runs plans on a backend (``flat_executor``), and onnxruntime's settings shared by
every traced batch of a process."""

from __future__ import annotations

import functools
from collections.abc import Sequence

from autobatch.backends.baked_weights import WeightSnapshots
from autobatch.backends.flat_executor import FlatExecutor, onnxruntime_template
from autobatch.backends.interpreter import Interpreter
from autobatch.backends.ort_runtime import OrtSettings

BACKENDS = ("numpy", "onnxruntime")


def shared_ort_settings(threads: int = 0, providers: Sequence[str] | None = None) -> OrtSettings:
    """onnxruntime's settings (per thread count and providers), one for every traced batch in
    this process."""
    return _ort_settings(threads, tuple(providers) if providers is not None else None)


@functools.cache
def _ort_settings(threads: int, providers: tuple[str, ...] | None) -> OrtSettings:
    return OrtSettings(providers, threads=threads)


def flat_executor(backend: str, threads: int = 0, providers: Sequence[str] | None = None, *,
                  snapshots: WeightSnapshots) -> FlatExecutor:
    """What runs flat plans on ``backend``. On onnxruntime its templates bake the weights that
    ``snapshots`` (the caller's: a session's own, or the one traced batches share) know to be
    stable; on CUDA each step's values go to the device and back (a session's kept plans run
    as one session instead: ``InferenceSession.whole_plan_after``)."""
    if backend == "numpy":
        # One padded call a layer: the NumPy layers skip finished sequences' rows, and their
        # cost is a Python step per time step (``backends/kernels/rnn.py``).
        return FlatExecutor(lambda template: Interpreter(template.graph).run_trusted, (backend,), sequence_chunk=None)
    if backend == "onnxruntime":
        settings = shared_ort_settings(threads, providers)
        return FlatExecutor(lambda template: onnxruntime_template(template, settings),
                            (backend, threads, settings.providers), snapshots)
    raise ValueError(f"unknown backend {backend!r}; choose one of {BACKENDS}")
