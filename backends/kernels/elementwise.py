"""Element-wise kernels: unary math, activations, binary/variadic arithmetic, logic, casts."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np
import onnx
from onnx.reference.ops.op_cast import cast_to as _reference_cast

from autobatch.backends.kernels._util import legacy_broadcast, sigmoid
from autobatch.backends.kernels.registry import NodeContext, as_array, kernel

Unary = Callable[[np.ndarray], np.ndarray]
Binary = Callable[[np.ndarray, np.ndarray], np.ndarray]

# Versions whose only change is the list of accepted types (or the `consumed_inputs` hint of
# opset 1, which has no effect on the result).
_V_1_6_13 = (1, 6, 13)


# --------------------------------------------------------------------------- unary ops


# math.erf is exact; numpy has no erf and scipy is not a dependency.
_erf = np.frompyfunc(math.erf, 1, 1)


_UNARY: dict[str, tuple[Unary, tuple[int, ...]]] = {
    "Abs": (np.abs, _V_1_6_13),
    "Neg": (np.negative, _V_1_6_13),
    "Exp": (np.exp, _V_1_6_13),
    "Log": (np.log, _V_1_6_13),
    "Sqrt": (np.sqrt, _V_1_6_13),
    "Reciprocal": (np.reciprocal, _V_1_6_13),
    "Floor": (np.floor, _V_1_6_13),
    "Ceil": (np.ceil, _V_1_6_13),
    "Tanh": (np.tanh, _V_1_6_13),
    "Sigmoid": (sigmoid, _V_1_6_13),
    "Relu": (lambda x: np.maximum(x, 0), (1, 6, 13, 14)),
    "Sin": (np.sin, (7, 22)),
    "Cos": (np.cos, (7, 22)),
    "Softplus": (lambda x: np.logaddexp(0, x), (1, 22)),
    "Softsign": (lambda x: x / (1 + np.abs(x)), (1, 22)),
    "Sign": (np.sign, (9, 13)),
    "Erf": (_erf, (9, 13)),
    "Not": (np.logical_not, (1,)),
}


def _like(y: object, x: np.ndarray) -> np.ndarray:
    """y in x's dtype: ml_dtypes' bfloat16 is promoted to float32 by Python-float operands."""
    return as_array(y).astype(x.dtype, copy=False)


def _register_unary(op_type: str, fn: Unary, versions: tuple[int, ...]) -> None:
    @kernel(op_type, *versions)
    def run(ctx: NodeContext, x: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):  # log(0), sqrt(-1), 1/0 follow IEEE like ONNX
            return _like(fn(x), x)

    run.__name__ = run.__qualname__ = op_type.lower()


for _op, (_fn, _versions) in _UNARY.items():
    _register_unary(_op, _fn, _versions)


@kernel("Gelu", 20)
def gelu(ctx: NodeContext, x: np.ndarray) -> np.ndarray:
    """ONNX's function, in float64: ``0.5 x (1 + erf(x / sqrt 2))``; with ``approximate="tanh"``,
    ``0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))``. (``onnx.reference`` cannot run it
    without the node's input types.)"""
    approximate = ctx.get("approximate", "none")
    approximate = approximate.decode() if isinstance(approximate, bytes) else approximate
    if approximate not in ("none", "tanh"):
        raise ValueError(f"Gelu approximate {approximate!r} is not one of none, tanh")
    wide = x.astype(np.float64)
    with np.errstate(all="ignore"):  # inf and NaN follow IEEE, as ONNX's
        if approximate == "tanh":
            inner = np.tanh(math.sqrt(2 / math.pi) * (wide + 0.044715 * wide ** 3))
        else:
            inner = _erf(wide / math.sqrt(2)).astype(np.float64)
        return _like(0.5 * wide * (1 + inner), x)


@kernel("LeakyRelu", 1, 6, 16)
def leaky_relu(ctx: NodeContext, x: np.ndarray) -> np.ndarray:
    return _like(np.where(x >= 0, x, x * ctx.get("alpha", 0.01)), x)


def _elu(x: np.ndarray, alpha: float) -> np.ndarray:
    return np.where(x > 0, x, alpha * np.expm1(x))


@kernel("Elu", 1, 6, 22)
def elu(ctx: NodeContext, x: np.ndarray) -> np.ndarray:
    return _like(_elu(x, ctx.get("alpha", 1.0)), x)


def _selu(ctx: NodeContext, x: np.ndarray, alpha: float, gamma: float) -> np.ndarray:
    return _like(ctx.get("gamma", gamma) * _elu(x, ctx.get("alpha", alpha)), x)


@kernel("Selu", 1)
def selu_v1(ctx: NodeContext, x: np.ndarray) -> np.ndarray:
    return _selu(ctx, x, 1.6732, 1.0507)  # opset 1 had shorter defaults


@kernel("Selu", 6, 22)
def selu(ctx: NodeContext, x: np.ndarray) -> np.ndarray:
    return _selu(ctx, x, 1.67326319217681884765625, 1.05070102214813232421875)


@kernel("HardSigmoid", 1, 6, 22)
def hard_sigmoid(ctx: NodeContext, x: np.ndarray) -> np.ndarray:
    y = x * ctx.get("alpha", 0.2) + ctx.get("beta", 0.5)
    return _like(np.clip(y, 0, 1), x)


def _clip(x: np.ndarray, low: object, high: object) -> np.ndarray:
    # maximum-then-minimum: when min > max every value becomes max, as the spec says.
    if low is not None:
        x = np.maximum(x, low)
    if high is not None:
        x = np.minimum(x, high)
    return as_array(x)


@kernel("Clip", 1, 6)
def clip_attrs(ctx: NodeContext, x: np.ndarray) -> np.ndarray:
    # The defaults are the type's lowest/highest values (so +-inf are clamped to them).
    info = np.finfo(x.dtype)
    return _clip(x, ctx.get("min", info.min), ctx.get("max", info.max))


@kernel("Clip", 11, 12, 13)
def clip(ctx: NodeContext, x: np.ndarray, low: np.ndarray | None = None, high: np.ndarray | None = None) -> np.ndarray:
    return _clip(x, low, high)


# --------------------------------------------------------------------------- binary ops


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind not in "iu":
        return np.divide(a, b)
    # ONNX integer division truncates toward zero (C semantics); numpy floors.
    q = np.floor_divide(a, b)
    inexact = (np.remainder(a, b) != 0) & ((a < 0) ^ (b < 0))
    return q + inexact.astype(q.dtype)


def _pow(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    # The result has the base's type whatever the exponent's type is.
    return np.power(a, b).astype(a.dtype, copy=False)


# op -> (function, versions with numpy broadcasting, opset-1/6 versions with `broadcast`/`axis`)
_BINARY: dict[str, tuple[Binary, tuple[int, ...], tuple[int, ...]]] = {
    "Add": (np.add, (7, 13, 14), (1, 6)),
    "Sub": (np.subtract, (7, 13, 14), (1, 6)),
    "Mul": (np.multiply, (7, 13, 14), (1, 6)),
    "Div": (_div, (7, 13, 14), (1, 6)),
    "Pow": (_pow, (7, 12, 13, 15), (1,)),
    "Equal": (np.equal, (7, 11, 13, 19), (1,)),
    "Less": (np.less, (7, 9, 13), (1,)),
    "Greater": (np.greater, (7, 9, 13), (1,)),
    "LessOrEqual": (np.less_equal, (12, 16), ()),
    "GreaterOrEqual": (np.greater_equal, (12, 16), ()),
    "And": (np.logical_and, (7,), (1,)),
    "Or": (np.logical_or, (7,), (1,)),
    "Xor": (np.logical_xor, (7,), (1,)),
}


def _register_binary(op_type: str, fn: Binary, versions: tuple[int, ...], legacy: tuple[int, ...]) -> None:
    def run(ctx: NodeContext, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):  # x/0 gives inf/nan (floats) or 0 (ints) silently
            return as_array(fn(a, b))

    def run_legacy(ctx: NodeContext, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return run(ctx, a, legacy_broadcast(ctx, a, b))

    run.__name__ = run.__qualname__ = op_type.lower()
    run_legacy.__name__ = run_legacy.__qualname__ = f"{op_type.lower()}_legacy"
    kernel(op_type, *versions)(run)
    if legacy:
        kernel(op_type, *legacy)(run_legacy)


for _op, (_fn, _versions, _legacy) in _BINARY.items():
    _register_binary(_op, _fn, _versions, _legacy)


# --------------------------------------------------------------------------- variadic ops


def _mean(*xs: np.ndarray) -> np.ndarray:
    return functools.reduce(np.add, xs) / len(xs)


_VARIADIC: dict[str, tuple[Callable[..., np.ndarray], tuple[int, ...]]] = {
    # Opsets 1 and 6 require equal shapes, a special case of the later broadcasting.
    "Max": (lambda *xs: functools.reduce(np.maximum, xs), (1, 6, 8, 12, 13)),
    "Min": (lambda *xs: functools.reduce(np.minimum, xs), (1, 6, 8, 12, 13)),
    "Sum": (lambda *xs: functools.reduce(np.add, xs), (1, 6, 8, 13)),
    "Mean": (_mean, (1, 6, 8, 13)),
}


def _register_variadic(op_type: str, fn: Callable[..., np.ndarray], versions: tuple[int, ...]) -> None:
    @kernel(op_type, *versions)
    def run(ctx: NodeContext, *xs: np.ndarray) -> np.ndarray:
        return as_array(fn(*xs))

    run.__name__ = run.__qualname__ = op_type.lower()


for _op, (_fn, _versions) in _VARIADIC.items():
    _register_variadic(_op, _fn, _versions)


@kernel("Where", 9, 16)
def where(ctx: NodeContext, condition: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return as_array(np.where(condition, x, y))


# --------------------------------------------------------------------------- casts and copies

# Element types numpy's astype converts exactly as ONNX does; the rest (string, float8,
# float4, int4, ...) go through the reference implementation, which is what the fallback runs.
_PLAIN_TYPES = {
    onnx.TensorProto.FLOAT,
    onnx.TensorProto.DOUBLE,
    onnx.TensorProto.FLOAT16,
    onnx.TensorProto.INT8,
    onnx.TensorProto.INT16,
    onnx.TensorProto.INT32,
    onnx.TensorProto.INT64,
    onnx.TensorProto.UINT8,
    onnx.TensorProto.UINT16,
    onnx.TensorProto.UINT32,
    onnx.TensorProto.UINT64,
    onnx.TensorProto.BOOL,
}
_PLAIN_KINDS = "biuf"  # bool, signed, unsigned, IEEE float; not strings, objects or ml_dtypes


def _cast(x: np.ndarray, to: int, saturate: bool, round_mode: str) -> np.ndarray:
    if to in _PLAIN_TYPES and x.dtype.kind in _PLAIN_KINDS:
        return x.astype(onnx.helper.tensor_dtype_to_np_dtype(to), copy=False)
    return as_array(_reference_cast(x, to, saturate, round_mode))


@kernel("Cast", 1)
def cast_v1(ctx: NodeContext, x: np.ndarray) -> np.ndarray:
    # Opset 1 names the target type ("FLOAT"), later opsets use the enum value.
    return _cast(x, onnx.TensorProto.DataType.Value(ctx.get("to")), True, "up")


@kernel("Cast", 6, 9, 13, 19, 21, 23, 24, 25, 28)
def cast(ctx: NodeContext, x: np.ndarray) -> np.ndarray:
    return _cast(x, ctx.get("to"), bool(ctx.get("saturate", 1)), ctx.get("round_mode", "up"))


@kernel("Identity", 1, 13, 14, 16, 19, 21, 23, 24, 25)
def identity(ctx: NodeContext, x: object) -> object:
    # Kernels never write into their inputs, so sharing the array is safe.
    return x


def _dropout(ctx: NodeContext, x: np.ndarray, ratio: float, training: bool, mask_dtype: type) -> tuple[np.ndarray, ...]:
    if training and ratio > 0:
        # Same generator as onnx.reference so a fixed `seed` gives the same mask.
        keep = np.random.RandomState(ctx.get("seed")).uniform(0, 1.0, x.shape) >= ratio
        y = as_array(keep * x * (1.0 / (1.0 - ratio))).astype(x.dtype, copy=False)
    else:
        keep, y = np.ones(x.shape, dtype=bool), x
    return (y, keep.astype(mask_dtype)) if ctx.num_outputs > 1 else (y,)


@kernel("Dropout", 7)
def dropout_v7(ctx: NodeContext, x: np.ndarray) -> tuple[np.ndarray, ...]:
    # Opset 7 only runs in inference mode and its mask has the data's type.
    return _dropout(ctx, x, ctx.get("ratio", 0.5), False, x.dtype)


@kernel("Dropout", 10)
def dropout_v10(ctx: NodeContext, x: np.ndarray) -> tuple[np.ndarray, ...]:
    return _dropout(ctx, x, ctx.get("ratio", 0.5), False, np.bool_)


@kernel("Dropout", 12, 13, 22)
def dropout(
    ctx: NodeContext, x: np.ndarray, ratio: np.ndarray | None = None, training_mode: np.ndarray | None = None
) -> tuple[np.ndarray, ...]:
    ratio_value = 0.5 if ratio is None else float(ratio)
    training = training_mode is not None and bool(training_mode)
    return _dropout(ctx, x, ratio_value, training, np.bool_)
