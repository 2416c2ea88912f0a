"""A dict bounded to its most recently used entries, for caches that meet ever new keys
(input shapes in a long-running server, cell signatures, onnxruntime sessions)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any


class Recent(OrderedDict):
    """A dict that keeps its ``size`` most recently used entries (``get`` and setting use one).
    Threads sharing one may race on it: an entry gone meanwhile reads as missing."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def get(self, key: Any, default: Any = None) -> Any:
        try:
            self.move_to_end(key)
            return self[key]
        except KeyError:
            return default

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, value)
        self.move_to_end(key)
        while self._over():
            try:
                _, gone = self.popitem(last=False)
            except KeyError:  # emptied by another thread
                break
            self._gone(gone)

    def _over(self) -> bool:
        return len(self) > self.size

    def _gone(self, value: Any) -> None:
        """An entry let go to make room."""


class Budgeted(Recent):
    """A ``Recent`` that also keeps its entries' ``cost`` (a plan's records, a graph's nodes)
    within ``budget``: the oldest go first, the newest stays whatever it costs. What one big
    model's entries hold is bounded by what they cost, not by how many there are."""

    def __init__(self, size: int, budget: int, cost: Callable[[Any], int]) -> None:
        super().__init__(size)
        self.budget = budget
        self.cost = cost
        self.total = 0

    def __setitem__(self, key: Any, value: Any) -> None:
        old = OrderedDict.get(self, key)  # (``Recent.get`` would count as a use)
        self.total += self.cost(value) - (self.cost(old) if old is not None else 0)
        super().__setitem__(key, value)

    def _over(self) -> bool:
        return super()._over() or (len(self) > 1 and self.total > self.budget)

    def _gone(self, value: Any) -> None:
        self.total -= self.cost(value)
