"""Arrays from JSON (nested lists of numbers), as ``autobatch run`` and the server read them:
in the dtype an input declares, and never with a value changed on the way."""

from __future__ import annotations

from typing import Any

import numpy as np


def array_from_json(value: Any, dtype: np.dtype | None = None) -> np.ndarray:
    """The array of nested lists ``value``, in ``dtype`` (as it comes without one). Refused with
    a ValueError naming the value: a float given for an integer type (1.9 is no int32), an
    integer its type cannot hold (3e9 in int32, -1 in uint8), a finite number that would become
    infinite (1e6 in float16), ragged lists, strings, integers past 64 bits."""
    try:
        given = np.asarray(value)
    except ValueError:  # NumPy's words for ragged lists are long
        given = np.asarray(None)
    if given.dtype.kind not in "biuf" and given.size:
        raise ValueError("not a rectangular array of numbers (ragged lists, strings, or integers past 64 bits)")
    if dtype is None:
        return given
    with np.errstate(all="ignore"):
        array = given.astype(dtype)
    if not given.size:
        return array
    if dtype.kind in "biu":
        changed = np.flatnonzero(array.ravel() != given.ravel())
    else:
        changed = np.flatnonzero(np.isinf(array.ravel()) & np.isfinite(given.ravel().astype(np.float64)))
    if len(changed):
        raise ValueError(f"{given.ravel()[changed[0]].item()!r} does not fit {dtype}")
    return array
