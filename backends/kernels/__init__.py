"""Hand-written NumPy kernels for the hot ONNX ops, keyed by (domain, op_type, since_version).

A kernel is registered for the exact schema versions whose semantics it implements
(`since_version` of the operator schema, as in `onnx.defs`). A node whose resolved schema
version has no kernel here runs on the op classes of `onnx.reference` instead, so a missing
registration costs speed, never correctness.

Kernel signature: ``fn(ctx: NodeContext, *inputs) -> ndarray | tuple[ndarray, ...]`` where a
missing optional input is ``None``.
"""

from __future__ import annotations

from autobatch.backends.kernels.registry import NodeContext, kernel, lookup, registered_kernels

# Importing the kernel modules fills the registry.
from autobatch.backends.kernels import conv, elementwise, indexing, linalg, optional, reduce, resize, rnn, shape_ops  # noqa: E402,F401

__all__ = ["NodeContext", "kernel", "lookup", "registered_kernels"]
