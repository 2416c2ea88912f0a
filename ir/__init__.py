"""The IR: graphs of ONNX-style nodes held in networkx, with ONNX import and export."""

from autobatch.ir.errors import IRError, OnnxImportError, ValidationError
from autobatch.ir.graph import CAPTURED, Graph
from autobatch.ir.nodes import Node, Value, attribute_value, captured_names
from autobatch.ir.onnx_io import from_onnx, load_model, to_onnx
from autobatch.ir.random_ops import is_nondeterministic
from autobatch.ir.recent import Recent
from autobatch.ir.types import ValueType, accepts, type_of_array

__all__ = [
    "CAPTURED", "Graph", "IRError", "Node", "OnnxImportError", "Recent", "ValidationError", "Value", "ValueType",
    "accepts", "attribute_value", "captured_names", "from_onnx", "is_nondeterministic", "load_model", "to_onnx",
    "type_of_array",
]
