"""Lockstep async programs: batching survives values needed mid-way.

``run_in_lockstep(fn, inputs, batch)`` runs ``fn(x)`` (an ``async def`` over traced tensors)
for every input (``autobatch.run_programs`` in a batch of its own). Each program runs until it awaits a tensor or finishes; when all are waiting, the
pending graph of all of them is batched and run once, and each resumes with its value. A
parser choosing its next transition, beam search and early exit all batch this way, where
DyNet's ``.value()`` ends batching.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from autobatch.frontends.tensors import Tensor
from autobatch.frontends.tracing import Tracer


@dataclass
class ProgramFailure:
    """Stands in the results for a program that raised (or never finished)."""

    index: int
    error: BaseException
    traceback: str

    def __str__(self) -> str:
        return f"program {self.index} failed: {type(self.error).__name__}: {self.error}\n{self.traceback}"


class ProgramsDidNotFinish(RuntimeError):
    """A program was still waiting after the round limit."""


def run_in_lockstep(fn: Callable[[Any], Coroutine[Any, Any, Any]], inputs: Sequence[Any], batch: Tracer,
                    max_rounds: int = 10_000) -> list[Any]:
    """Results of ``fn(x)`` for each input, in order, traced into ``batch`` (whose
    ``run_pending`` runs a round). A program that raises gets a ``ProgramFailure`` in its
    place; the others complete."""
    results: list[Any] = [None] * len(inputs)
    programs = {k: fn(x) for k, x in enumerate(inputs)}
    awaited: dict[int, Tensor | None] = dict.fromkeys(programs)
    for round_ in range(max_rounds + 1):
        for k in list(awaited):
            outcome = _advance(programs[k], awaited[k], k)
            if isinstance(outcome, Tensor):
                awaited[k] = outcome
            else:
                results[k] = outcome.value if isinstance(outcome, _Done) else outcome
                del awaited[k]
        if not awaited:
            break
        if round_ == max_rounds:
            for k in awaited:
                programs[k].close()
                error = ProgramsDidNotFinish(f"program {k} still waiting after {max_rounds} rounds")
                results[k] = ProgramFailure(k, error, "")
            break
        batch.run_pending()
    return results


@dataclass
class _Done:
    value: Any


def _advance(program: Coroutine[Any, Any, Any], awaited: Tensor | None, index: int) -> Tensor | _Done | ProgramFailure:
    """Run one program to its next await; what it awaits, or how it ended."""
    try:
        request = program.send(None if awaited is None else awaited.value)
    except StopIteration as stop:
        return _Done(stop.value)
    except Exception as error:  # that program fails; the others go on
        return ProgramFailure(index, error, traceback.format_exc())
    if not isinstance(request, Tensor):
        program.close()
        error = TypeError(f"program {index} awaited {request!r}; only autobatch tensors can be awaited")
        return ProgramFailure(index, error, "")
    return request
