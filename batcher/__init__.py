"""The batcher: signatures, schedulers against a lower bound, batching rules, rewrite."""

from autobatch.batcher.batching_pass import BatchingPass, BatchReport, PassResult
from autobatch.batcher.problem import Problem, build_problem
from autobatch.batcher.rules import RULES
from autobatch.batcher.schedulers import SCHEDULERS, get_scheduler
from autobatch.batcher.signature import node_signature

__all__ = [
    "BatchReport", "BatchingPass", "PassResult", "Problem", "RULES", "SCHEDULERS", "build_problem",
    "get_scheduler", "node_signature",
]
