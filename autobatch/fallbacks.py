"""A batch that raises, run again instance by instance so that only the guilty instance fails:
logged and said, never silent (a silent fallback once hid a batching bug that gave wrong rows)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from autobatch.ir.limits import DeadlineExceeded

log = logging.getLogger("autobatch")

Result = TypeVar("Result")


def batched_else_alone(run_batch: Callable[[Sequence[Any]], list[Result]], run_alone: Callable[[Any], Result],
                       instances: Sequence[Any], what: str = "batch") -> tuple[list[Result | Exception], bool]:
    """Every instance's result, batched; if the batched run raises, each instance runs alone so
    that only the guilty one fails (its exception in place of its result). Says whether it fell
    back, which it logs at WARNING with the cause: a fallback must never be silent (it hid a
    batching bug that gave wrong rows). Past the caller's deadline it gives up at once."""
    try:
        return list(run_batch(instances)), False
    except DeadlineExceeded:
        raise
    except Exception as error:  # noqa: BLE001 - isolated below, instance by instance
        log.warning("%s of %d instances failed batched (%s: %s); running each alone", what, len(instances),
                    type(error).__name__, error)
    return each_alone(run_alone, instances), True


def each_alone(run: Callable[[Any], Result], instances: Sequence[Any]) -> list[Result | Exception]:
    """``run`` of each instance, its exception in place of its result where it fails (past the
    caller's deadline, everything stops)."""
    results: list[Result | Exception] = []
    for instance in instances:
        try:
            results.append(run(instance))
        except DeadlineExceeded:
            raise
        except Exception as error:  # noqa: BLE001 - this instance's own failure, returned in its place
            results.append(error)
    return results
