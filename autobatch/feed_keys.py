"""Keys of a run's feeds: what a plan depends on (dtypes and shapes), or, for a model that
unrolls control flow by its values, the values too."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import numpy as np


def input_signature(feeds: Mapping[str, Any]) -> tuple:
    return tuple((name, value_key(value)) for name, value in sorted(feeds.items()))


def values_key(feeds: Mapping[str, Any]) -> tuple:
    """The feeds by value (a control-flow instance unrolls by its values, not only its shapes)."""
    return tuple((name, value_key(value), digest(value)) for name, value in sorted(feeds.items()))


def digest(value: Any) -> bytes:
    if isinstance(value, list):
        return hashlib.sha1(b"".join(map(digest, value))).digest()
    return b"none" if value is None else hashlib.sha1(np.ascontiguousarray(value).tobytes()).digest()


def value_key(value: Any) -> tuple:
    """What a plan depends on in a value: a tensor's dtype and shape, a sequence's elements'."""
    if isinstance(value, list):
        return ("sequence", *map(value_key, value))
    if value is None:
        return ("none",)
    return value.dtype.str, value.shape
