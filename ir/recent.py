"""A dict bounded to its most recently used entries, for caches that meet ever new keys
(input shapes in a long-running server, cell signatures, onnxruntime sessions)."""

from __future__ import annotations

from collections import OrderedDict
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
        while len(self) > self.size:
            try:
                self.popitem(last=False)
            except KeyError:  # emptied by another thread
                break
