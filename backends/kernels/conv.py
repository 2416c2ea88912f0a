"""Convolution, pooling and the per-channel normalizations of CNNs.

Every sliding-window op goes through one description of its windows (`_Windows`): output
size and padding follow the ONNX spec (explicit pads, ceil_mode, auto_pad SAME_UPPER /
SAME_LOWER / VALID, dilations). The ops then loop over the kernel taps only: for each tap,
the input values it sees in every window are one strided slice of the padded input, so a
pool is a running max/sum of prod(kernel_shape) slices and a convolution fills its im2col
matrix with one slice copy per tap, then does one batched matrix product.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from autobatch.backends.kernels._util import accumulator_dtype, int_list
from autobatch.backends.kernels.registry import NodeContext, as_array, kernel

# Upper bound on the elements of one im2col block: big batches are convolved in pieces.
_IM2COL_BLOCK = 1 << 23


@dataclass(frozen=True)
class _Windows:
    """Where the windows of a pooling/convolution lie along the spatial axes."""

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads_begin: tuple[int, ...]
    pads_end: tuple[int, ...]  # the declared (or auto) padding, used for count_include_pad
    out_shape: tuple[int, ...]

    @property
    def extents(self) -> tuple[int, ...]:
        """Span of a dilated window."""
        return tuple((k - 1) * d + 1 for k, d in zip(self.kernel, self.dilations))

    def positions(self, axis: int) -> np.ndarray:
        """Input coordinate of every (output index, kernel tap) along one axis: (out, k)."""
        starts = np.arange(self.out_shape[axis]) * self.strides[axis] - self.pads_begin[axis]
        return starts[:, None] + np.arange(self.kernel[axis]) * self.dilations[axis]

    def taps(self, padded: np.ndarray, rows: range | None = None) -> Iterator[np.ndarray]:
        """For each kernel tap (C order), the (N, C, *out) slice of `padded` it reads.

        `rows` restricts the first output axis (convolution blocks)."""
        rows = rows if rows is not None else range(self.out_shape[0])
        out_ranges = [rows, *(range(o) for o in self.out_shape[1:])]
        for tap in itertools.product(*(range(k) for k in self.kernel)):
            index = [slice(None), slice(None)]
            for j, d, s, out in zip(tap, self.dilations, self.strides, out_ranges):
                start = j * d + out.start * s
                index.append(slice(start, start + (len(out) - 1) * s + 1, s))
            yield padded[tuple(index)]

    def pad(self, x: np.ndarray, fill: object) -> np.ndarray:
        """x padded with `fill` to exactly what the windows read (ceil_mode may read past the
        declared end padding, a stride may leave part of it unread)."""
        needed = [(o - 1) * s + e for o, s, e in zip(self.out_shape, self.strides, self.extents)]
        ends = [need - n - b for need, n, b in zip(needed, x.shape[2:], self.pads_begin)]
        if any(self.pads_begin) or any(e > 0 for e in ends):
            pad_width = [(0, 0), (0, 0), *((b, max(e, 0)) for b, e in zip(self.pads_begin, ends))]
            x = np.pad(x, pad_width, constant_values=fill)
        return x


def _windows(ctx: NodeContext, spatial: tuple[int, ...], kernel_shape: list[int], ceil_mode: bool = False) -> _Windows:
    rank = len(spatial)
    strides = tuple(int_list(ctx.get("strides")) or [1] * rank)
    dilations = tuple(int_list(ctx.get("dilations")) or [1] * rank)
    extents = [(k - 1) * d + 1 for k, d in zip(kernel_shape, dilations)]
    auto_pad = ctx.get("auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out = [-(-n // s) for n, s in zip(spatial, strides)]
        totals = [max(0, (o - 1) * s + e - n) for o, s, e, n in zip(out, strides, extents, spatial)]
        # The odd pixel goes at the end for SAME_UPPER, at the beginning for SAME_LOWER.
        begin = [t // 2 if auto_pad == "SAME_UPPER" else t - t // 2 for t in totals]
        end = [t - b for t, b in zip(totals, begin)]
    elif auto_pad == "VALID":
        out = [(n - e) // s + 1 for n, e, s in zip(spatial, extents, strides)]
        begin = end = [0] * rank
    else:
        pads = int_list(ctx.get("pads")) or [0] * (2 * rank)
        begin, end = pads[:rank], pads[rank:]
        out = [_explicit_out(n, b + e, ext, s, b, ceil_mode) for n, b, e, ext, s in zip(spatial, begin, end, extents, strides)]
    return _Windows(tuple(kernel_shape), strides, dilations, tuple(begin), tuple(end), tuple(out))


def _explicit_out(size: int, pad_total: int, extent: int, stride: int, pad_begin: int, ceil_mode: bool) -> int:
    span = size + pad_total - extent
    if not ceil_mode:
        return span // stride + 1
    out = -(-span // stride) + 1
    # A window that would start in the end padding is dropped (as in PyTorch).
    return out - 1 if (out - 1) * stride >= size + pad_begin else out


def _kernel_shape(ctx: NodeContext) -> list[int]:
    return int_list(ctx.get("kernel_shape"))


# --------------------------------------------------------------------------- Conv


def _is_pointwise(w: _Windows) -> bool:
    return all(k == 1 for k in w.kernel) and all(s == 1 for s in w.strides) and not any(w.pads_begin + w.pads_end)


def _grouped_matmul(filters: np.ndarray, cols: np.ndarray, groups: int) -> np.ndarray:
    """(M, Cg * K) filters times (n, C * K, L) columns, group by group -> (n, M, L)."""
    n, rows, length = cols.shape
    filters = filters.reshape(groups, filters.shape[0] // groups, -1)  # (G, Mg, Cg * K)
    y = np.matmul(filters, cols.reshape(n, groups, rows // groups, length))  # (n, G, Mg, L)
    return y.reshape(n, y.shape[1] * y.shape[2], length)  # (sizes given: a length of 0 leaves -1 undecided)


def _conv_block(padded: np.ndarray, weight: np.ndarray, w: _Windows, groups: int, rows: range) -> np.ndarray:
    """im2col of the output rows `rows` (one slice copy per tap), then one matmul."""
    n, channels = padded.shape[:2]
    out_shape = (len(rows), *w.out_shape[1:])
    taps = math.prod(w.kernel)
    # Channel-major, tap-minor rows: the layout of weight.reshape(M, Cg * K) within a group.
    cols = np.empty((n, channels, taps, *out_shape), dtype=padded.dtype)
    for k, tap in enumerate(w.taps(padded, rows)):
        cols[:, :, k] = tap
    y = _grouped_matmul(weight.reshape(weight.shape[0], -1), cols.reshape(n, channels * taps, math.prod(out_shape)),
                        groups)
    return y.reshape(n, weight.shape[0], *out_shape)


def _conv(x: np.ndarray, weight: np.ndarray, w: _Windows, groups: int) -> np.ndarray:
    if _is_pointwise(w):  # a 1x1 convolution needs no im2col
        n, channels = x.shape[:2]
        y = _grouped_matmul(weight.reshape(weight.shape[0], -1), x.reshape(n, channels, math.prod(x.shape[2:])), groups)
        return y.reshape(n, weight.shape[0], *x.shape[2:])
    padded = w.pad(x, 0)
    n = x.shape[0]
    y = np.empty((n, weight.shape[0], *w.out_shape), dtype=np.result_type(x, weight))
    # Block over samples, then over the first output axis, to bound the im2col copy.
    row_size = max(1, math.prod(w.out_shape[1:]) * x.shape[1] * math.prod(w.kernel))
    rows_per_block = max(1, min(_IM2COL_BLOCK // row_size, w.out_shape[0]))
    samples_per_block = max(1, _IM2COL_BLOCK // (row_size * w.out_shape[0])) if rows_per_block == w.out_shape[0] else 1
    for s in range(0, n, samples_per_block):
        for r in range(0, w.out_shape[0], rows_per_block):
            rows = range(r, min(r + rows_per_block, w.out_shape[0]))
            block = _conv_block(padded[s : s + samples_per_block], weight, w, groups, rows)
            y[s : s + samples_per_block, :, rows.start : rows.stop] = block
    return y


@kernel("Conv", 1, 11, 22)
def conv(ctx: NodeContext, x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    kernel_shape = _kernel_shape(ctx) or list(weight.shape[2:])
    w = _windows(ctx, x.shape[2:], kernel_shape)
    y = _conv(x, weight, w, ctx.get("group", 1))
    if bias is not None:
        y = y + bias.reshape(-1, *([1] * (x.ndim - 2)))
    return as_array(y).astype(x.dtype, copy=False)


# --------------------------------------------------------------------------- pooling


def _lowest(dtype: np.dtype) -> object:
    return np.iinfo(dtype).min if dtype.kind in "iu" else -np.inf


def _max_and_tap(x: np.ndarray, w: _Windows) -> tuple[np.ndarray, np.ndarray]:
    """Window maxima and, for each, the (first) kernel tap holding it."""
    taps = w.taps(w.pad(x, _lowest(x.dtype)))  # padding never wins a max
    best = next(taps).copy()
    best_tap = np.zeros(best.shape, dtype=np.int64)
    for k, tap in enumerate(taps, start=1):
        better = tap > best
        np.copyto(best, tap, where=better)
        best_tap[better] = k
    return best, best_tap


def _max_pool_indices(x: np.ndarray, best_tap: np.ndarray, w: _Windows, column_major: bool) -> np.ndarray:
    """Flat index into X of each window's maximum, C or Fortran order within an (n, c) plane."""
    spatial = x.shape[2:]
    offsets = np.unravel_index(best_tap, w.kernel)
    coords = []
    for axis, offset in enumerate(offsets):
        start = np.arange(w.out_shape[axis]) * w.strides[axis] - w.pads_begin[axis]
        start = start.reshape((-1,) + (1,) * (len(spatial) - 1 - axis))
        coords.append(start + offset * w.dilations[axis])
    within = np.ravel_multi_index(tuple(coords), spatial, order="F" if column_major else "C", mode="clip")
    plane = np.arange(x.shape[0] * x.shape[1]).reshape(x.shape[0], x.shape[1], *([1] * len(spatial)))
    return (plane * math.prod(spatial) + within).astype(np.int64)


@kernel("MaxPool", 1, 8, 10, 11, 12, 22)
def max_pool(ctx: NodeContext, x: np.ndarray) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    w = _windows(ctx, x.shape[2:], _kernel_shape(ctx), bool(ctx.get("ceil_mode", 0)))
    if ctx.num_outputs < 2:
        taps = w.taps(w.pad(x, _lowest(x.dtype)))
        y = next(taps).copy()
        for tap in taps:
            np.maximum(y, tap, out=y)
        return y
    y, best_tap = _max_and_tap(x, w)
    return y, _max_pool_indices(x, best_tap, w, bool(ctx.get("storage_order", 0)))


def _window_counts(w: _Windows, spatial: tuple[int, ...], include_pad: bool) -> np.ndarray:
    """How many taps of each window count for the average (a product over axes)."""
    counts = np.ones((), dtype=np.int64)
    for axis, size in enumerate(spatial):
        low, high = (-w.pads_begin[axis], size + w.pads_end[axis]) if include_pad else (0, size)
        positions = w.positions(axis)
        per_axis = ((positions >= low) & (positions < high)).sum(axis=1)
        counts = np.multiply.outer(counts, per_axis)
    return counts


@kernel("AveragePool", 1, 7, 10, 11, 19, 22)
def average_pool(ctx: NodeContext, x: np.ndarray) -> np.ndarray:
    w = _windows(ctx, x.shape[2:], _kernel_shape(ctx), bool(ctx.get("ceil_mode", 0)))
    acc = accumulator_dtype(x.dtype)
    sums = np.zeros((*x.shape[:2], *w.out_shape), dtype=acc)
    for tap in w.taps(w.pad(x, 0)):
        sums += tap
    counts = _window_counts(w, x.shape[2:], bool(ctx.get("count_include_pad", 0)))
    return (sums / counts.astype(acc)).astype(x.dtype, copy=False)


@kernel("GlobalAveragePool", 1, 22)
def global_average_pool(ctx: NodeContext, x: np.ndarray) -> np.ndarray:
    means = x.mean(axis=tuple(range(2, x.ndim)), keepdims=True, dtype=accumulator_dtype(x.dtype))
    return means.astype(x.dtype, copy=False)


@kernel("GlobalMaxPool", 1, 22)
def global_max_pool(ctx: NodeContext, x: np.ndarray) -> np.ndarray:
    return x.max(axis=tuple(range(2, x.ndim)), keepdims=True)


# --------------------------------------------------------------------------- normalization


def _per_channel(p: np.ndarray, x: np.ndarray) -> np.ndarray:
    """(C,) -> (C, 1, ..., 1); opset 7's spatial=0 parameters (C, D1, ...) broadcast as they are."""
    return p.reshape(p.shape + (1,) * (x.ndim - 1 - p.ndim))


def _normalize(x: np.ndarray, scale: np.ndarray, bias: np.ndarray, mean: np.ndarray, var: np.ndarray, eps: float) -> np.ndarray:
    factor = scale / np.sqrt(var + eps)
    y = x * _per_channel(factor, x) + _per_channel(bias - mean * factor, x)
    return y.astype(x.dtype, copy=False)


def _batch_statistics(x: np.ndarray, spatial: bool) -> tuple[np.ndarray, np.ndarray]:
    axes = tuple(a for a in range(x.ndim) if a != 1) if spatial else (0,)
    return x.mean(axis=axes), x.var(axis=axes)


def _batch_norm_training(
    ctx: NodeContext, x: np.ndarray, scale: np.ndarray, bias: np.ndarray, mean: np.ndarray, var: np.ndarray
) -> tuple[np.ndarray, ...]:
    """Y from the batch statistics, running statistics, then the batch statistics themselves."""
    momentum = ctx.get("momentum", 0.9)
    batch_mean, batch_var = _batch_statistics(x, bool(ctx.get("spatial", 1)))
    y = _normalize(x, scale, bias, batch_mean, batch_var, ctx.get("epsilon", 1e-5))
    running_mean = mean * momentum + batch_mean * (1 - momentum)
    running_var = var * momentum + batch_var * (1 - momentum)
    stats = (running_mean, running_var, batch_mean, batch_var)
    return (y, *(s.astype(x.dtype, copy=False) for s in stats))


@kernel("BatchNormalization", 7, 9)
def batch_norm_v7(
    ctx: NodeContext, x: np.ndarray, scale: np.ndarray, bias: np.ndarray, mean: np.ndarray, var: np.ndarray
) -> np.ndarray | tuple[np.ndarray, ...]:
    # No mode attribute: asking for mean/var/saved_mean/saved_var means training.
    if ctx.num_outputs > 1:
        return _batch_norm_training(ctx, x, scale, bias, mean, var)[: ctx.num_outputs]
    return _normalize(x, scale, bias, mean, var, ctx.get("epsilon", 1e-5))


@kernel("BatchNormalization", 14, 15)
def batch_norm(
    ctx: NodeContext, x: np.ndarray, scale: np.ndarray, bias: np.ndarray, mean: np.ndarray, var: np.ndarray
) -> np.ndarray | tuple[np.ndarray, ...]:
    if ctx.get("training_mode", 0):
        return _batch_norm_training(ctx, x, scale, bias, mean, var)[:3]
    return _normalize(x, scale, bias, mean, var, ctx.get("epsilon", 1e-5))


@kernel("LRN", 1, 13)
def lrn(ctx: NodeContext, x: np.ndarray) -> np.ndarray:
    size = ctx.get("size")
    alpha, beta, bias = ctx.get("alpha", 1e-4), ctx.get("beta", 0.75), ctx.get("bias", 1.0)
    # Sum of squares over channels [c - floor((size-1)/2), c + ceil((size-1)/2)].
    before = (size - 1) // 2
    pad_width = [(0, 0), (before, size - 1 - before)] + [(0, 0)] * (x.ndim - 2)
    squares = np.pad(np.square(x), pad_width)
    sums = sliding_window_view(squares, size, axis=1).sum(axis=-1)
    return as_array(x / (bias + (alpha / size) * sums) ** beta).astype(x.dtype, copy=False)
