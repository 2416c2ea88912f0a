"""Backends that execute IR graphs and plans: the NumPy reference interpreter and onnxruntime."""

from autobatch.backends.interpreter import FeedError, Interpreter, NodeExecutionError, evaluate
from autobatch.backends.numpy_backend import NumpyBackend, NumpyBackendRep
from autobatch.backends.ort_backend import OrtBackend, OrtBackendRep
from autobatch.backends.ort_runtime import OrtSettings, default_providers

__all__ = [
    "FeedError", "Interpreter", "evaluate", "NodeExecutionError", "NumpyBackend", "NumpyBackendRep", "OrtBackend",
    "OrtBackendRep", "OrtSettings", "default_providers",
]
