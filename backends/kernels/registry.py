"""The kernel registry and the per-node context handed to kernels."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

KernelFn = Callable[..., Any]

_KERNELS: dict[tuple[str, str, int], KernelFn] = {}


class NodeContext:
    """What a kernel may know about its node besides the input arrays.

    Attributes are plain Python values (ints, floats, str, lists, numpy arrays for tensors).
    Built once per node when a graph is prepared, not per call.
    """

    __slots__ = ("attrs", "num_outputs", "op_type", "name")

    def __init__(self, attrs: Mapping[str, Any], num_outputs: int, op_type: str = "", name: str = "") -> None:
        self.attrs = dict(attrs)
        self.num_outputs = num_outputs
        self.op_type = op_type
        self.name = name

    def get(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)


def kernel(op_type: str, *since_versions: int, domain: str = "") -> Callable[[KernelFn], KernelFn]:
    """Register ``fn`` for each listed schema version of ``domain::op_type``."""
    if not since_versions:
        raise ValueError(f"kernel for {op_type!r} must name at least one since_version")

    def register(fn: KernelFn) -> KernelFn:
        for version in since_versions:
            key = (domain, op_type, version)
            if key in _KERNELS:
                raise ValueError(f"kernel for {key} registered twice")
            _KERNELS[key] = fn
        return fn

    return register


def lookup(domain: str, op_type: str, since_version: int) -> KernelFn | None:
    return _KERNELS.get((domain, op_type, since_version))


def registered_kernels() -> list[tuple[str, str, int]]:
    return sorted(_KERNELS)


def as_array(x: Any, dtype: np.dtype | None = None) -> np.ndarray:
    """numpy ufuncs turn 0-d results into scalars; ONNX values are always arrays."""
    return np.asarray(x, dtype=dtype)
