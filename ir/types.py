"""Value types: ONNX TypeProto kept as-is, with fast dtype/shape views for tensors."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import numpy as np
import onnx
from onnx import TypeProto, helper

# A dimension is a known size, a symbolic name, or unknown.
Dim = int | str | None
Shape = tuple[Dim, ...]


MISSING = ("missing",)  # the signature entry of an optional input that is left out

class ValueType:
    """The type of one IR value.

    Invariant: ``proto`` is the authoritative ONNX type; ``elem_type``, ``dtype`` and
    ``shape`` are derived from it once (``shape`` is None when the rank is unknown or the
    value is not a tensor).
    """

    __slots__ = ("proto", "elem_type", "shape", "is_tensor", "is_static", "_hash")

    def __init__(self, proto: TypeProto) -> None:
        self.proto = proto
        self.elem_type: int | None = None
        self.shape: Shape | None = None
        self.is_tensor = proto.HasField("tensor_type")
        if self.is_tensor:
            tensor = proto.tensor_type
            self.elem_type = tensor.elem_type or None
            if tensor.HasField("shape"):
                self.shape = tuple(_dim(d) for d in tensor.shape.dim)
        self.is_static = self.shape is not None and all(isinstance(d, int) for d in self.shape)
        self._hash = hash((self.elem_type, self.shape))  # types key signatures: hashed very often

    @classmethod
    def tensor(cls, elem_type: int | np.dtype | type, shape: Sequence[Dim] | None) -> ValueType:
        """A tensor type; equal requests share one (immutable) object."""
        if not isinstance(elem_type, int):
            elem_type = helper.np_dtype_to_tensor_dtype(np.dtype(elem_type))
        return _tensor_type(elem_type, None if shape is None else tuple(shape))

    @property
    def dtype(self) -> np.dtype | None:
        if self.elem_type is None:
            return None
        return helper.tensor_dtype_to_np_dtype(self.elem_type)

    def __eq__(self, other: object) -> bool:
        return self is other or (isinstance(other, ValueType) and self.proto == other.proto)

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return type_text(self.proto)


def type_text(proto: TypeProto, tensor: Callable[[str, TypeProto.Tensor], str] | None = None, key_separator: str = ", ") -> str:
    """A type in words: by default ``FLOAT[2,?]``, ``seq(FLOAT[5])``, ``optional(seq(INT64[...]))``,
    ``map(INT64, FLOAT[3])``; ``tensor(kind, tensor_type)`` words a tensor type another way (its
    kind is ``tensor_type`` or ``sparse_tensor_type``)."""
    kind = proto.WhichOneof("value")
    if kind in ("tensor_type", "sparse_tensor_type"):
        return (tensor or _tensor_text)(kind, getattr(proto, kind))
    inner = functools.partial(type_text, tensor=tensor, key_separator=key_separator)
    if kind == "sequence_type":
        return f"seq({inner(proto.sequence_type.elem_type)})"
    if kind == "optional_type":
        return f"optional({inner(proto.optional_type.elem_type)})"
    if kind == "map_type":
        key = onnx.TensorProto.DataType.Name(proto.map_type.key_type)
        key = key.lower() if tensor is not None else key
        return f"map({key}{key_separator}{inner(proto.map_type.value_type)})"
    return "?"


def _tensor_text(kind: str, tensor: TypeProto.Tensor) -> str:
    name = onnx.TensorProto.DataType.Name(tensor.elem_type) if tensor.elem_type else "?"
    if not tensor.HasField("shape"):
        return f"{name}[...]"
    dims = ("?" if d is None else str(d) for d in map(_dim, tensor.shape.dim))
    return f"{'sparse ' if kind == 'sparse_tensor_type' else ''}{name}[{','.join(dims)}]"


@functools.lru_cache(maxsize=65536)
def _tensor_type(elem_type: int, shape: tuple[Dim, ...] | None) -> ValueType:
    return ValueType(helper.make_tensor_type_proto(elem_type, None if shape is None else list(shape)))


def _dim(d: onnx.TensorShapeProto.Dimension) -> Dim:
    if d.HasField("dim_value"):
        return d.dim_value
    if d.HasField("dim_param"):
        return d.dim_param
    return None


def type_of_array(array: np.ndarray) -> ValueType:
    return ValueType.tensor(array.dtype, array.shape)


def type_of_value(value: object) -> ValueType | None:
    """The type of a value as a backend holds it: an array's tensor type, a list's sequence
    type (of its elements' type; dimensions where they agree), None for an empty optional."""
    if isinstance(value, list):
        arrays = [np.asarray(v) for v in value]
        if not arrays:
            return None
        shapes = {a.shape for a in arrays}
        shape = next(iter(shapes)) if len(shapes) == 1 else None
        element = helper.make_tensor_type_proto(helper.np_dtype_to_tensor_dtype(arrays[0].dtype), shape)
        return ValueType(helper.make_sequence_type_proto(element))
    if value is None:
        return None
    return type_of_array(np.asarray(value))


def accepts(declared: ValueType, array: np.ndarray) -> str | None:
    """Why ``array`` does not fit ``declared``, or None when it does."""
    if declared.elem_type is not None and declared.dtype != array.dtype:
        return f"dtype {array.dtype} where {declared.dtype} is declared"
    if declared.shape is None:
        return None
    if len(declared.shape) != array.ndim:
        return f"shape {array.shape} where rank {len(declared.shape)} {declared!r} is declared"
    for want, got in zip(declared.shape, array.shape):
        if isinstance(want, int) and want != got:
            return f"shape {array.shape} where {declared!r} is declared"
    return None


_UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}  # by item size


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Arrays of one dtype and shape equal bit for bit (0.0 differs from -0.0; a NaN equals
    itself), read as unsigned ints (other item sizes, complex128, as bytes)."""
    unsigned = _UNSIGNED.get(a.dtype.itemsize)
    if unsigned is None:
        a, b, unsigned = np.ascontiguousarray(a), np.ascontiguousarray(b), np.uint8
    return bool(np.array_equal(a.view(unsigned), b.view(unsigned)))
