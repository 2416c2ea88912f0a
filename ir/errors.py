"""Errors raised by the IR layer. Each message names what is wrong and where."""


class IRError(ValueError):
    """Base class for IR errors."""


class ValidationError(IRError):
    """A graph breaks an invariant: dangling input, cycle, type mismatch, unknown op."""


class OnnxImportError(IRError):
    """An ONNX model could not be read: bad bytes, unsafe external data, inconsistent tensors."""
