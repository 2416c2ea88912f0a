"""Shape and data-movement kernels.

Results may be views of the inputs (reshape, transpose, slices, broadcasts): kernels never
write into arrays, so sharing memory is safe and saves the copies.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from autobatch.backends.kernels._util import int_list, normalize_axes, normalize_axis
from autobatch.backends.kernels.registry import NodeContext, as_array, kernel

# Versions from 13 on that only widen the accepted types.
_LATER_TYPE_ONLY = (21, 23, 24, 25)


@kernel("Concat", 1, 4, 11, 13)
def concat(ctx: NodeContext, *xs: np.ndarray) -> np.ndarray:
    # Opset 1 defaulted the axis to 1; later opsets require it.
    return np.concatenate(xs, axis=ctx.get("axis", 1))


# --------------------------------------------------------------------------- Split


def _split_sizes(dim: int, count: int, uneven: bool) -> list[int]:
    """Equal parts; from opset 18 (num_outputs) the last part may be smaller."""
    size = -(-dim // count) if uneven else dim // count
    return [min(size, max(dim - i * size, 0)) for i in range(count)]


def _split(x: np.ndarray, axis: int, sizes: list[int]) -> tuple[np.ndarray, ...]:
    bounds = np.cumsum(sizes)[:-1]
    return tuple(np.split(x, bounds, axis=axis))


@kernel("Split", 1, 2, 11)
def split_attr(ctx: NodeContext, x: np.ndarray, split: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
    # Opset 1 took the sizes from an optional second input or the attribute.
    axis = normalize_axis(ctx.get("axis", 0), x.ndim)
    sizes = int_list(split) or int_list(ctx.get("split"))
    return _split(x, axis, sizes or _split_sizes(x.shape[axis], ctx.num_outputs, uneven=False))


@kernel("Split", 13, 18)
def split(ctx: NodeContext, x: np.ndarray, split: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
    axis = normalize_axis(ctx.get("axis", 0), x.ndim)
    sizes = int_list(split)
    if not sizes:
        count = ctx.get("num_outputs", ctx.num_outputs)
        sizes = _split_sizes(x.shape[axis], count, uneven=ctx.get("num_outputs") is not None)
    return _split(x, axis, sizes)


# --------------------------------------------------------------------------- Slice


def _clamped_slice(start: int, end: int, step: int, dim: int) -> slice:
    """ONNX's clamping of one axis' start/end, as a Python slice."""
    if step == 0:
        raise ValueError("Slice step cannot be 0")
    start = start + dim if start < 0 else start
    end = end + dim if end < 0 else end
    if step > 0:
        return slice(min(max(start, 0), dim), min(max(end, 0), dim), step)
    start = min(max(start, 0), dim - 1)
    end = min(max(end, -1), dim - 1)
    # end == -1 means "before index 0", which a Python slice can only say with None.
    return slice(start, None if end < 0 else end, step)


def _slice(x: np.ndarray, starts: Any, ends: Any, axes: Any, steps: Any) -> np.ndarray:
    starts, ends = int_list(starts), int_list(ends)
    axes_list = normalize_axes(int_list(axes), x.ndim) if axes is not None else tuple(range(len(starts)))
    steps_list = int_list(steps) if steps is not None else [1] * len(starts)
    index = [slice(None)] * x.ndim
    for start, end, axis, step in zip(starts, ends, axes_list, steps_list):
        index[axis] = _clamped_slice(start, end, step, x.shape[axis])
    return x[tuple(index)]


@kernel("Slice", 1)
def slice_attrs(ctx: NodeContext, x: np.ndarray) -> np.ndarray:
    return _slice(x, ctx.get("starts"), ctx.get("ends"), ctx.get("axes"), None)


@kernel("Slice", 10, 11, 13)
def slice_(
    ctx: NodeContext,
    x: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    axes: np.ndarray | None = None,
    steps: np.ndarray | None = None,
) -> np.ndarray:
    return _slice(x, starts, ends, axes, steps)


# --------------------------------------------------------------------------- indexing, layout


@kernel("Gather", 1, 11, 13)
def gather(ctx: NodeContext, x: np.ndarray, indices: np.ndarray) -> np.ndarray:
    # np.take wraps negative indices (opset 11) and raises on out-of-range ones.
    return as_array(np.take(x, indices, axis=normalize_axis(ctx.get("axis", 0), x.ndim)))


def _reshape(x: np.ndarray, shape: Any, allowzero: bool) -> np.ndarray:
    dims = int_list(shape)
    if not allowzero:  # 0 copies the input's dimension at the same index
        dims = [x.shape[i] if d == 0 else d for i, d in enumerate(dims)]
    return x.reshape(dims)


@kernel("Reshape", 1)
def reshape_attr(ctx: NodeContext, x: np.ndarray) -> np.ndarray:
    return _reshape(x, ctx.get("shape"), allowzero=False)


@kernel("Reshape", 5, 13, 14, 19, *_LATER_TYPE_ONLY)
def reshape(ctx: NodeContext, x: np.ndarray, shape: np.ndarray) -> np.ndarray:
    return _reshape(x, shape, allowzero=bool(ctx.get("allowzero", 0)))


@kernel("Transpose", 1, 13, *_LATER_TYPE_ONLY)
def transpose(ctx: NodeContext, x: np.ndarray) -> np.ndarray:
    perm = ctx.get("perm")
    return np.transpose(x, None if perm is None else normalize_axes(perm, x.ndim))


def _squeeze(x: np.ndarray, axes: Any) -> np.ndarray:
    if axes is None or len(int_list(axes)) == 0:
        return np.squeeze(x)
    return np.squeeze(x, axis=normalize_axes(int_list(axes), x.ndim))


@kernel("Squeeze", 1, 11)
def squeeze_attr(ctx: NodeContext, x: np.ndarray) -> np.ndarray:
    return _squeeze(x, ctx.get("axes"))


@kernel("Squeeze", 13, *_LATER_TYPE_ONLY)
def squeeze(ctx: NodeContext, x: np.ndarray, axes: np.ndarray | None = None) -> np.ndarray:
    return _squeeze(x, axes)


def _unsqueeze(x: np.ndarray, axes: Any) -> np.ndarray:
    # Negative axes count from the back of the *output*, which is numpy's convention too.
    return np.expand_dims(x, axis=tuple(int_list(axes)))


@kernel("Unsqueeze", 1, 11)
def unsqueeze_attr(ctx: NodeContext, x: np.ndarray) -> np.ndarray:
    return _unsqueeze(x, ctx.get("axes"))


@kernel("Unsqueeze", 13, *_LATER_TYPE_ONLY)
def unsqueeze(ctx: NodeContext, x: np.ndarray, axes: np.ndarray) -> np.ndarray:
    return _unsqueeze(x, axes)


@kernel("Flatten", 1, 9, 11, 13, *_LATER_TYPE_ONLY)
def flatten(ctx: NodeContext, x: np.ndarray) -> np.ndarray:
    axis = normalize_axis(ctx.get("axis", 1), x.ndim)
    # Explicit sizes: reshape(-1) cannot infer a dimension of an empty tensor.
    return x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))


@kernel("Shape", 1, 13, 15, 19, *_LATER_TYPE_ONLY)
def shape(ctx: NodeContext, x: np.ndarray) -> np.ndarray:
    # Opset 15 adds start/end, clamped to [0, rank]; their absence means the whole shape.
    rank = x.ndim
    start = min(max(normalize_axis(ctx.get("start", 0), rank), 0), rank)
    end = min(max(normalize_axis(ctx.get("end", rank), rank), 0), rank)
    return np.array(x.shape[start:end], dtype=np.int64)


@kernel("Expand", 8, 13)
def expand(ctx: NodeContext, x: np.ndarray, shape: np.ndarray) -> np.ndarray:
    # Bidirectional broadcast: a 1 in `shape` keeps the input's dimension. A read-only view.
    return np.broadcast_to(x, np.broadcast_shapes(x.shape, tuple(int_list(shape))))


@kernel("Tile", 6, 13)
def tile(ctx: NodeContext, x: np.ndarray, repeats: np.ndarray) -> np.ndarray:
    return np.tile(x, int_list(repeats))


# --------------------------------------------------------------------------- constants


def _dense(sparse: onnx.SparseTensorProto) -> np.ndarray:
    values = numpy_helper.to_array(sparse.values)
    dense = np.zeros(tuple(sparse.dims), dtype=values.dtype)
    indices = numpy_helper.to_array(sparse.indices)
    if indices.ndim == 2:  # [NNZ, rank] coordinates rather than linear positions
        indices = np.ravel_multi_index(tuple(indices.T), dense.shape)
    dense.reshape(-1)[indices.reshape(-1)] = values
    return dense


_VALUE_ATTRS: dict[str, Any] = {
    "value_float": np.float32,
    "value_floats": np.float32,
    "value_int": np.int64,
    "value_ints": np.int64,
    "value_string": np.str_,
    "value_strings": np.str_,
}


def _constant(ctx: NodeContext) -> np.ndarray:
    value = ctx.get("value")
    if value is not None:
        return as_array(value)
    sparse = ctx.get("sparse_value")
    if sparse is not None:
        return _dense(sparse) if isinstance(sparse, onnx.SparseTensorProto) else as_array(sparse)
    for name, dtype in _VALUE_ATTRS.items():
        if name in ctx.attrs:
            return np.array(ctx.attrs[name], dtype=dtype)
    raise ValueError("Constant node has no value attribute")


# Opsets 1 and 9 only have `value`; 11 adds sparse_value; 12 adds value_float(s), value_int(s)
# and value_string(s); later versions only widen the types.
@kernel("Constant", 1, 9, 11, 12, 13, 19, 21, 23, 24, 25)
def constant(ctx: NodeContext) -> np.ndarray:
    return _constant(ctx)


@kernel("ConstantOfShape", 9, 20, 21, 23, 24, 25)
def constant_of_shape(ctx: NodeContext, shape: np.ndarray) -> np.ndarray:
    value = ctx.get("value")
    fill = np.zeros(1, dtype=np.float32) if value is None else np.asarray(value).reshape(-1)
    return np.full(tuple(int_list(shape)), fill[0], dtype=fill.dtype)


@kernel("Range", 11)
def range_(ctx: NodeContext, start: np.ndarray, limit: np.ndarray, delta: np.ndarray) -> np.ndarray:
    # ONNX: max(ceil((limit - start) / delta), 0) elements, in the inputs' type. The inputs are
    # scalars; models in the wild also pass one-element vectors, which onnx.reference accepts.
    first, end, step = (np.asarray(v).reshape(-1)[0] for v in (start, limit, delta))
    return np.arange(first, end, step, dtype=np.asarray(start).dtype)
