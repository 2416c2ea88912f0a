"""Frontends: how per-instance dynamic graphs reach the IR (tracing, cells, lockstep
programs, ONNX models with control flow)."""

from autobatch.frontends import ops
from autobatch.frontends.cells import Cell, cell
from autobatch.frontends.folds import fold_tree
from autobatch.frontends.onnx_control_flow import unroll_instance
from autobatch.frontends.programs import ProgramFailure, ProgramsDidNotFinish, run_in_lockstep
from autobatch.frontends.tensors import Parameter, Tensor, TraceError, current_batch
from autobatch.frontends.tracing import Tracer

__all__ = [
    "Cell", "Parameter", "ProgramFailure", "ProgramsDidNotFinish", "Tensor", "TraceError", "Tracer", "cell", "fold_tree",
    "current_batch", "ops", "run_in_lockstep", "unroll_instance",
]
