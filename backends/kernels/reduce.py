"""Reductions (Reduce*, ArgMax/ArgMin) and the normalizations along an axis (Softmax family)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from autobatch.backends.kernels._util import accumulator_dtype, int_list, normalize_axes, normalize_axis
from autobatch.backends.kernels.registry import NodeContext, as_array, kernel

Axes = tuple[int, ...] | None  # None: every axis; (): no axis (noop_with_empty_axes)
Reducer = Callable[[np.ndarray, Axes, bool], np.ndarray]


# --------------------------------------------------------------------------- reducers


def _sum(x: np.ndarray, axes: Axes, keepdims: bool) -> np.ndarray:
    # dtype=: numpy would widen int32 sums to int64; float16 sums in float32 and rounds once.
    acc = accumulator_dtype(x.dtype)
    return np.sum(x, axis=axes, keepdims=keepdims, dtype=acc).astype(x.dtype, copy=False)


def _mean(x: np.ndarray, axes: Axes, keepdims: bool) -> np.ndarray:
    acc = accumulator_dtype(x.dtype)
    return np.mean(x, axis=axes, keepdims=keepdims, dtype=acc).astype(x.dtype, copy=False)


def _prod(x: np.ndarray, axes: Axes, keepdims: bool) -> np.ndarray:
    acc = accumulator_dtype(x.dtype)
    return np.prod(x, axis=axes, keepdims=keepdims, dtype=acc).astype(x.dtype, copy=False)


def _extreme(dtype: np.dtype, largest: bool) -> Any:
    """The identity of max (largest=False) or min (largest=True) for an empty reduction."""
    if dtype == np.bool_:
        return largest
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return info.max if largest else info.min
    return np.inf if largest else -np.inf


def _empty_safe(reduce: Callable[..., np.ndarray], identity: Any) -> Reducer:
    """numpy refuses an empty max/min; ONNX gives -inf/+inf (or the extreme int) there."""

    def run(x: np.ndarray, axes: Axes, keepdims: bool) -> np.ndarray:
        extra = {"initial": identity(x.dtype)} if x.size == 0 else {}
        return reduce(x, axis=axes, keepdims=keepdims, **extra)

    return run


_max = _empty_safe(np.max, lambda dtype: _extreme(dtype, largest=False))
_min = _empty_safe(np.min, lambda dtype: _extreme(dtype, largest=True))


def _sum_square(x: np.ndarray, axes: Axes, keepdims: bool) -> np.ndarray:
    return _sum(np.square(x), axes, keepdims)


def _l1(x: np.ndarray, axes: Axes, keepdims: bool) -> np.ndarray:
    return _sum(np.abs(x), axes, keepdims)


def _l2(x: np.ndarray, axes: Axes, keepdims: bool) -> np.ndarray:
    acc = accumulator_dtype(x.dtype)
    squares = np.sum(np.square(x, dtype=acc), axis=axes, keepdims=keepdims)
    return np.sqrt(squares).astype(x.dtype, copy=False)


def _log_sum(x: np.ndarray, axes: Axes, keepdims: bool) -> np.ndarray:
    with np.errstate(divide="ignore"):  # log(0) = -inf is the ONNX answer
        return np.log(_sum(x, axes, keepdims)).astype(x.dtype, copy=False)


def _log_sum_exp(x: np.ndarray, axes: Axes, keepdims: bool) -> np.ndarray:
    # Shift by the (finite) max so exp cannot overflow.
    shift = _max(x, axes, keepdims=True)
    shift = np.where(np.isfinite(shift), shift, 0).astype(x.dtype, copy=False)
    with np.errstate(divide="ignore", over="ignore"):
        total = np.sum(np.exp(x - shift), axis=axes, keepdims=True)
        result = np.log(total) + shift
    if not keepdims:
        result = np.squeeze(result, axis=axes)
    return result.astype(x.dtype, copy=False)


def _reduce(fn: Reducer, x: np.ndarray, axes: Axes, keepdims: bool) -> np.ndarray:
    return as_array(fn(x, axes, keepdims))


def _attr_axes(ctx: NodeContext, x: np.ndarray) -> Axes:
    axes = int_list(ctx.get("axes"))
    return normalize_axes(axes, x.ndim) if axes else None


def _input_axes(ctx: NodeContext, x: np.ndarray, axes: np.ndarray | None) -> Axes:
    """From opset 13/18 axes is an input; empty means all axes, or none with noop_with_empty_axes."""
    axes_list = int_list(axes)
    if axes_list:
        return normalize_axes(axes_list, x.ndim)
    return () if ctx.get("noop_with_empty_axes", 0) else None


def _register_reduce(op_type: str, fn: Reducer, attr_versions: tuple[int, ...], input_versions: tuple[int, ...]) -> None:
    def with_attr_axes(ctx: NodeContext, x: np.ndarray) -> np.ndarray:
        return _reduce(fn, x, _attr_axes(ctx, x), bool(ctx.get("keepdims", 1)))

    def with_input_axes(ctx: NodeContext, x: np.ndarray, axes: np.ndarray | None = None) -> np.ndarray:
        return _reduce(fn, x, _input_axes(ctx, x, axes), bool(ctx.get("keepdims", 1)))

    with_attr_axes.__name__ = with_attr_axes.__qualname__ = f"{op_type.lower()}_attr_axes"
    with_input_axes.__name__ = with_input_axes.__qualname__ = op_type.lower()
    kernel(op_type, *attr_versions)(with_attr_axes)
    kernel(op_type, *input_versions)(with_input_axes)


# op -> (reducer, versions with the `axes` attribute, versions with the `axes` input)
_REDUCE: dict[str, tuple[Reducer, tuple[int, ...], tuple[int, ...]]] = {
    "ReduceSum": (_sum, (1, 11), (13,)),
    "ReduceMean": (_mean, (1, 11, 13), (18,)),
    "ReduceProd": (_prod, (1, 11, 13), (18,)),
    "ReduceMax": (_max, (1, 11, 12, 13), (18, 20)),
    "ReduceMin": (_min, (1, 11, 12, 13), (18, 20)),
    "ReduceSumSquare": (_sum_square, (1, 11, 13), (18,)),
    "ReduceL1": (_l1, (1, 11, 13), (18,)),
    "ReduceL2": (_l2, (1, 11, 13), (18,)),
    "ReduceLogSum": (_log_sum, (1, 11, 13), (18, 28)),
    "ReduceLogSumExp": (_log_sum_exp, (1, 11, 13), (18, 28)),
}

for _op, (_fn, _attr_versions, _input_versions) in _REDUCE.items():
    _register_reduce(_op, _fn, _attr_versions, _input_versions)


# --------------------------------------------------------------------------- ArgMax / ArgMin


def _arg_reduce(fn: Callable[..., np.ndarray], ctx: NodeContext, x: np.ndarray) -> np.ndarray:
    axis = normalize_axis(ctx.get("axis", 0), x.ndim)
    if x.shape[axis] == 0:
        raise ValueError(f"{ctx.op_type} over axis {axis} of length 0: there is no index to give")
    if ctx.get("select_last_index", 0):
        index = x.shape[axis] - 1 - fn(np.flip(x, axis), axis=axis)
    else:
        index = fn(x, axis=axis)
    if ctx.get("keepdims", 1):
        index = np.expand_dims(index, axis)
    return as_array(index).astype(np.int64, copy=False)


@kernel("ArgMax", 1, 11, 12, 13)
def argmax(ctx: NodeContext, x: np.ndarray) -> np.ndarray:
    return _arg_reduce(np.argmax, ctx, x)


@kernel("ArgMin", 1, 11, 12, 13)
def argmin(ctx: NodeContext, x: np.ndarray) -> np.ndarray:
    return _arg_reduce(np.argmin, ctx, x)


# --------------------------------------------------------------------------- Softmax family

AxisFn = Callable[[np.ndarray, int], np.ndarray]


def _softmax(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def _log_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    shifted = x - np.max(x, axis=axis, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))


def _hardmax(x: np.ndarray, axis: int) -> np.ndarray:
    y = np.zeros_like(x)
    np.put_along_axis(y, np.argmax(x, axis=axis, keepdims=True), 1, axis=axis)
    return y


def _coerced_2d(fn: AxisFn, x: np.ndarray, axis: int) -> np.ndarray:
    """Opsets 1 and 11 flatten the input to 2-D at `axis` and normalize each row."""
    axis = normalize_axis(axis, x.ndim)
    rows = math.prod(x.shape[:axis])
    return fn(x.reshape(rows, math.prod(x.shape[axis:])), 1).reshape(x.shape)


def _register_axis_op(op_type: str, fn: AxisFn) -> None:
    # A row of -inf gives NaN (inf - inf), as in every ONNX runtime: no warning for it.
    # Over no values (an axis of length 0, or no rows) the result is as empty as the input.
    def coerced(ctx: NodeContext, x: np.ndarray) -> np.ndarray:
        if x.size == 0:
            return x.copy()
        with np.errstate(invalid="ignore"):
            return as_array(_coerced_2d(fn, x, ctx.get("axis", 1)))

    def per_axis(ctx: NodeContext, x: np.ndarray) -> np.ndarray:
        if x.size == 0:
            return x.copy()
        with np.errstate(invalid="ignore"):
            return as_array(fn(x, normalize_axis(ctx.get("axis", -1), x.ndim)))

    coerced.__name__ = coerced.__qualname__ = f"{op_type.lower()}_2d"
    per_axis.__name__ = per_axis.__qualname__ = op_type.lower()
    kernel(op_type, 1, 11)(coerced)
    kernel(op_type, 13)(per_axis)


for _op, _fn in {"Softmax": _softmax, "LogSoftmax": _log_softmax, "Hardmax": _hardmax}.items():
    _register_axis_op(_op, _fn)
