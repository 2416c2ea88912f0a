"""onnx-autobatch: on-the-fly operation batching for dynamic computation graphs over ONNX.

Subpackages: ``autobatch.ir`` (the IR and ONNX import/export), ``autobatch.batcher``
(signatures, schedulers, batching rules, rewrite), ``autobatch.backends`` (executors).
See DESIGN.md for the data flow.
"""

from autobatch.backends import NumpyBackend
from autobatch.batcher import BatchingPass
from autobatch.ir import Graph, from_onnx, to_onnx
from autobatch.session import InferenceSession

__version__ = "0.1.0"

__all__ = ["BatchingPass", "Graph", "InferenceSession", "NumpyBackend", "from_onnx", "to_onnx", "__version__"]
