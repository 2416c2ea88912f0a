"""Backends that execute IR graphs: the NumPy reference interpreter (and, later, onnxruntime)."""

from autobatch.backends.interpreter import FeedError, Interpreter, NodeExecutionError
from autobatch.backends.numpy_backend import NumpyBackend, NumpyBackendRep

__all__ = ["FeedError", "Interpreter", "NodeExecutionError", "NumpyBackend", "NumpyBackendRep"]
