"""Small helpers shared by the kernel modules."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from autobatch.backends.kernels.registry import NodeContext


def int_list(values: Any) -> list[int]:
    """An ONNX int-list attribute or a 1-D int tensor input as a plain list of ints."""
    if values is None:
        return []
    return [int(v) for v in np.asarray(values).reshape(-1)]


def normalize_axis(axis: int, rank: int) -> int:
    """Negative axes count from the back, as everywhere in ONNX."""
    axis = int(axis)
    return axis + rank if axis < 0 else axis


def normalize_axes(axes: Iterable[int], rank: int) -> tuple[int, ...]:
    return tuple(normalize_axis(a, rank) for a in axes)


def legacy_broadcast(ctx: NodeContext, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Opset < 7 binary ops align B with A starting at ``axis`` when ``broadcast=1``.

    Without ``axis`` the alignment is a suffix match, which is what numpy does anyway;
    with ``axis`` B gets trailing 1-dims so numpy broadcasting lines it up at ``axis``.
    """
    axis = ctx.get("axis")
    if not ctx.get("broadcast", 0) or axis is None or b.ndim == 0 or b.ndim == a.ndim:
        return b
    axis = normalize_axis(axis, a.ndim)
    return b.reshape(b.shape + (1,) * (a.ndim - axis - b.ndim))


def is_low_precision_float(dtype: np.dtype) -> bool:
    """float16 and the ml_dtypes floats (bfloat16 has kind 'V') need a float32 accumulator."""
    return dtype.kind in "fV" and dtype.itemsize < 4


def accumulator_dtype(dtype: np.dtype) -> np.dtype:
    return np.dtype(np.float32) if is_low_precision_float(dtype) else dtype


def sigmoid(x: np.ndarray) -> np.ndarray:
    """Logistic function in x's dtype. float32/64: 1 / (1 + exp(-x)) in place in one buffer
    (exp(-x) may overflow to inf, giving the right limit 0); other types from exp(-|x|) <= 1."""
    if x.dtype in (np.float32, np.float64) and x.ndim:
        y = np.negative(x)
        with np.errstate(over="ignore"):
            np.exp(y, out=y)
        y += 1
        return np.reciprocal(y, out=y)
    e = np.exp(-np.abs(x))
    r = 1 / (1 + e)
    return np.where(x >= 0, r, e * r)
