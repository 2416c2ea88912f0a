"""Matrix products: MatMul and Gemm."""

from __future__ import annotations

import numpy as np

from autobatch.backends.kernels.registry import NodeContext, as_array, kernel


@kernel("MatMul", 1, 9, 13)
def matmul(ctx: NodeContext, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    # numpy.matmul has exactly ONNX's rules for 1-D operands and batch broadcasting; ml_dtypes
    # multiplies bfloat16 matrices in float32.
    return as_array(np.matmul(a, b)).astype(a.dtype, copy=False)


def _scaled(x: np.ndarray, factor: float) -> np.ndarray:
    """``factor * x`` in x's dtype (integer Gemm must not turn into float64)."""
    if factor == 1.0:
        return x
    return as_array(x * factor).astype(x.dtype, copy=False)


# Opsets 1 and 6 carry a `broadcast` flag for C; numpy broadcasting of C onto (M, N) covers
# both of its settings. From opset 11 on C is optional.
@kernel("Gemm", 1, 6, 7, 9, 11, 13)
def gemm(ctx: NodeContext, a: np.ndarray, b: np.ndarray, c: np.ndarray | None = None) -> np.ndarray:
    if ctx.get("transA", 0):
        a = a.T
    if ctx.get("transB", 0):
        b = b.T
    y = _scaled(np.matmul(a, b), ctx.get("alpha", 1.0))
    if c is not None:
        y = y + _scaled(c, ctx.get("beta", 1.0))
    return as_array(y).astype(a.dtype, copy=False)
