"""Frontends: how per-instance dynamic graphs reach the IR (tracing, cells, programs)."""

from autobatch.frontends import ops
from autobatch.frontends.tracing import Batch, Parameter, Tensor, TraceError, current_batch

__all__ = ["Batch", "Parameter", "Tensor", "TraceError", "current_batch", "ops"]
