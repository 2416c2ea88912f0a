"""What every table of batching rules shares: the operands a stacked rule reads (``Operand``),
what it emits through (``Emitter``), what a rule of any table returns when it cannot batch a
case (``Refusal``, in the style of onnxscript's ``MatchResult.fail``), and how a table is filled,
a row an op (``install_in``). The tables: ``rules.RULES`` (members of one shape),
``ragged.ROW_WISE`` (across lengths), ``padding.PADDED`` (padded chunks); ``capabilities``
reads them all.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import numpy as np

Shape = tuple[int, ...]


@dataclass(frozen=True)
class Operand:
    """One input of a batched op: ``stacked`` values carry a leading batch axis in front of
    the per-instance ``shape``; shared ones are read as they are (``const`` holds the data of
    a shared constant, for axes and shapes)."""

    name: str
    stacked: bool
    shape: Shape
    const: np.ndarray | None = None

    @property
    def rank(self) -> int:
        return len(self.shape)


class Emitter(Protocol):
    batch_size: int  # N, the number of instances in the group

    def const(self, array: np.ndarray) -> str: ...

    def op(self, op_type: str, inputs: Sequence[str], attributes: dict[str, Any] | None = None,
           n_outputs: int = 1, domain: str = "") -> list[str]: ...


@dataclass(frozen=True)
class Refusal:
    """Why a rule does not batch a class (its nodes then run one member at a time): a rule
    returns one, before emitting anything, in the style of onnxscript's ``MatchResult.fail``."""

    reason: str

    def __bool__(self) -> bool:  # a refusal is no result
        return False


def refuse(reason: str) -> Refusal:
    return Refusal(reason)


F = TypeVar("F")


def install_in(table: dict[str, Any], op_types: Sequence[str], row: Callable[[F], Any]) -> Callable[[F], F]:
    """A decorator that puts ``row(the function)`` in ``table`` for each of ``op_types``: how every
    table of rules is filled, a row an op (JAX's installers)."""
    def install(fn: F) -> F:
        for op_type in op_types:
            table[op_type] = row(fn)
        return fn

    return install
