"""The batcher: signatures, schedulers against a lower bound, batching rules, the plan."""

from autobatch.batcher.plan import BatchReport
from autobatch.batcher.problem import Problem, build_problem
from autobatch.batcher.rules import RULES
from autobatch.batcher.schedulers import SCHEDULERS, get_scheduler
from autobatch.batcher.signature import node_signature

__all__ = [
    "BatchReport", "Problem", "RULES", "SCHEDULERS", "build_problem",
    "get_scheduler", "node_signature",
]
