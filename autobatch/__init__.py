"""onnx-autobatch: on-the-fly operation batching for dynamic computation graphs over ONNX.

Subpackages: ``autobatch.ir`` (the IR and ONNX import/export), ``autobatch.frontends``
(tracing, cells, lockstep programs), ``autobatch.batcher`` (signatures, schedulers, batching
rules, the plan), ``autobatch.backends`` (NumPy and onnxruntime executors, the plan's lowering).
See ARCHITECTURE.md for the data flow.
"""

from autobatch.backends import NumpyBackend, OrtBackend
from autobatch.batch import Batch, run_programs
from autobatch.frontends import Parameter, ProgramFailure, Tensor, TraceError, cell, fold_tree, ops
from autobatch.ir import Graph, from_onnx, to_onnx
from autobatch.session import InferenceSession

__version__ = "0.1.0"

__all__ = [
    "Batch", "Graph", "InferenceSession", "NumpyBackend", "OrtBackend", "Parameter",
    "ProgramFailure", "Tensor", "TraceError", "__version__", "cell", "fold_tree", "from_onnx", "ops", "run_programs",
    "to_onnx",
]
