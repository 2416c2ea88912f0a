"""Element-wise indexing: GatherElements and ScatterElements (and Scatter, its deprecated
name). Vectorised: ``onnx.reference`` loops over every element in Python, and its
GatherElements fails (``np.choose``) for axes longer than 64, as BERT exports have."""

from __future__ import annotations

import numpy as np

from autobatch.backends.kernels._util import normalize_axis
from autobatch.backends.kernels.registry import NodeContext, kernel

# How each reduction combines an update with what is there; NumPy's ``ufunc.at`` applies
# repeated indices one after the other, as the spec's loop does.
_REDUCTIONS = {"add": np.add, "mul": np.multiply, "min": np.minimum, "max": np.maximum}


def _index(indices: np.ndarray, axis: int, dim: int) -> tuple[np.ndarray, ...]:
    """Full indices of the elements ``indices`` names along ``axis`` (negative ones from the
    end; out of range raises, naming the bound)."""
    indices = indices.astype(np.int64, copy=False)
    if indices.size and (indices.min() < -dim or indices.max() >= dim):
        raise IndexError(f"an index along axis {axis} is outside [{-dim}, {dim - 1}]")
    grid = list(np.indices(indices.shape, sparse=True))
    grid[axis] = np.where(indices < 0, indices + dim, indices)
    return tuple(grid)


@kernel("GatherElements", 11, 13)
def gather_elements(ctx: NodeContext, data: np.ndarray, indices: np.ndarray) -> np.ndarray:
    axis = normalize_axis(ctx.get("axis", 0), data.ndim)
    return data[_index(indices, axis, data.shape[axis])]


@kernel("ScatterElements", 11, 13, 16, 18)
@kernel("Scatter", 9)
def scatter_elements(ctx: NodeContext, data: np.ndarray, indices: np.ndarray, updates: np.ndarray) -> np.ndarray:
    axis = normalize_axis(ctx.get("axis", 0), data.ndim)
    reduction = ctx.get("reduction", "none")
    reduction = reduction.decode() if isinstance(reduction, bytes) else reduction
    result = data.copy()
    index = _index(indices, axis, data.shape[axis])
    if reduction == "none":
        result[index] = updates
    else:
        _REDUCTIONS[reduction].at(result, index, updates)
    return result
