"""Upsample (deprecated in opset 10 for Resize): output sizes ``floor(size * scale)``, each
output position read from ``position / scale`` (nearest: rounded down; linear: between the
two neighbours), axis by axis. ``onnx.reference`` takes integer nearest scales only."""

from __future__ import annotations

import numpy as np

from autobatch.backends.kernels.registry import NodeContext, kernel


def _nearest(x: np.ndarray, axis: int, size: int, scale: float) -> np.ndarray:
    source = np.minimum((np.arange(size) / scale).astype(np.int64), x.shape[axis] - 1)
    return np.take(x, source, axis=axis)


def _linear(x: np.ndarray, axis: int, size: int, scale: float) -> np.ndarray:
    position = np.arange(size) / scale
    low = np.minimum(np.floor(position).astype(np.int64), x.shape[axis] - 1)
    high = np.minimum(low + 1, x.shape[axis] - 1)
    weight = (position - low).reshape((-1,) + (1,) * (x.ndim - axis - 1)).astype(x.dtype)
    lo, hi = np.take(x, low, axis=axis), np.take(x, high, axis=axis)
    return lo + (hi - lo) * weight


def _upsample(ctx: NodeContext, x: np.ndarray, scales: np.ndarray) -> np.ndarray:
    mode = ctx.get("mode", "nearest")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if mode not in ("nearest", "linear", "bilinear"):
        raise ValueError(f"Upsample mode {mode!r} is not one of nearest, linear, bilinear")
    scales = np.asarray(scales, np.float32).reshape(-1)
    if len(scales) != x.ndim or (scales < 1).any():
        raise ValueError(f"Upsample needs a scale >= 1 for each of the {x.ndim} axes, got {scales.tolist()}")
    step = _nearest if mode == "nearest" else _linear
    for axis, scale in enumerate(scales.tolist()):
        size = int(np.floor(x.shape[axis] * scale))
        if size != x.shape[axis] or scale != 1:
            x = step(x, axis, size, scale)
    return x


@kernel("Upsample", 9)
def upsample(ctx: NodeContext, x: np.ndarray, scales: np.ndarray) -> np.ndarray:
    return _upsample(ctx, x, scales)


@kernel("Upsample", 7)
def upsample_attribute(ctx: NodeContext, x: np.ndarray) -> np.ndarray:
    return _upsample(ctx, x, np.asarray(ctx.get("scales")))
