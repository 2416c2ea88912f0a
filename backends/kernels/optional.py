"""Optional values: an optional holds its value (a tensor or a sequence), or None when empty.
``onnx.reference``'s Optional wraps its value in a list, which OptionalHasElement and
OptionalGetElement then take for the value itself (an empty optional ``[None]`` has an
element)."""

from __future__ import annotations

from typing import Any

import numpy as np

from autobatch.backends.kernels.registry import NodeContext, kernel


@kernel("Optional", 15)
def optional(ctx: NodeContext, value: Any = None) -> Any:
    return value


@kernel("OptionalHasElement", 15, 18)
def optional_has_element(ctx: NodeContext, value: Any = None) -> np.ndarray:
    return np.array(value is not None)


@kernel("OptionalGetElement", 15, 18)
def optional_get_element(ctx: NodeContext, value: Any) -> Any:
    if value is None:
        raise ValueError("OptionalGetElement of an empty optional")
    return value
