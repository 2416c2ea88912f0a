"""Frontends: how per-instance dynamic graphs reach the IR (tracing, cells, lockstep
programs, ONNX models with control flow)."""

from autobatch.frontends import ops
from autobatch.frontends.cells import Cell, cell
from autobatch.frontends.folds import fold_tree
from autobatch.frontends.onnx_control_flow import unroll_instance
from autobatch.frontends.programs import ProgramFailure, ProgramsDidNotFinish, run_programs
from autobatch.frontends.tracing import Batch, Parameter, Tensor, TraceError, current_batch

__all__ = [
    "Batch", "Cell", "Parameter", "ProgramFailure", "ProgramsDidNotFinish", "Tensor", "TraceError", "cell", "fold_tree",
    "current_batch", "ops", "run_programs", "unroll_instance",
]
