"""The values a trace holds: ``Tensor`` (a value of a batch, pending until it has run),
``Parameter`` (a weight shared by every instance), what a cell's calls record once
(``PreparedCall``), and the batch being traced into (``current_batch``)."""

from __future__ import annotations

import contextvars
import functools
import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from onnx import AttributeProto, helper

from autobatch.ir import ValueType
from autobatch.frontends.recorder import TensorBase, configure_records

if TYPE_CHECKING:
    from autobatch.frontends.tracing import Tracer


class TraceError(ValueError):
    """A traced op got inputs it cannot take (shapes, dtypes, a tensor of another batch)."""


_current: contextvars.ContextVar[Tracer] = contextvars.ContextVar("autobatch_batch")


def current_batch() -> Tracer:
    """The batch of the innermost ``with Batch()`` block (any ``Tracer``)."""
    try:
        return _current.get()
    except LookupError:
        raise TraceError("no batch to trace into: trace inside `with autobatch.Batch() as batch:`") from None


def batch_of(*values: Any) -> Tracer:
    """The batch the operands belong to, which must be the one being traced into, if any."""
    for value in values:
        if isinstance(value, Tensor):
            batch = value.batch
            break
    else:
        return current_batch()
    active = _current.get(None)
    if active is not None and active is not batch:
        raise TraceError(f"{next(v for v in values if isinstance(v, Tensor))!r} belongs to another batch; "
                         "values cannot cross batches")
    return batch


@functools.lru_cache(maxsize=4096, typed=True)  # typed: alpha=1 is an INT attribute, alpha=1.0 a FLOAT one
def attributes(**values: Any) -> dict[str, AttributeProto]:
    """Attribute protos for hashable Python values, made once and shared by every record."""
    return {name: helper.make_attribute(name, list(v) if isinstance(v, tuple) else v) for name, v in values.items()}


class Tensor(TensorBase):  # type: ignore[misc,valid-type]
    """A value in a batch: its shape and dtype are known when it is traced, its contents
    when the batch has run.

    ``entry`` is what the value contributes to the signature of an op reading it: its name
    when every instance shares it (a parameter), else its type. ``producer`` is the index of
    the record computing it while it is pending (-1 for none: an argument of a traced cell).
    Its fields are ``recorder.TensorBase``'s (the hot paths there make tensors without
    ``__init__``): a field added here is added there, in Python and in C."""

    __slots__ = ()

    def __init__(self, batch: Tracer, name: str, shape: tuple[int, ...], dtype: np.dtype,
                 value: np.ndarray | None = None, entry: str | ValueType | None = None, producer: int = -1) -> None:
        self.batch = batch
        self.name = name
        self.shape = shape
        self.dtype = dtype
        self.value = value
        self.entry = entry if entry is not None else tensor_type(dtype, shape)
        self.producer = producer

    def numpy(self) -> np.ndarray:
        """The value: runs the batch's pending graph (batched) if it is not known yet."""
        if self.value is None:
            self.batch.run_pending()
        assert self.value is not None
        return self.value

    def __await__(self):  # type: ignore[no-untyped-def]
        """``await t`` inside a program run by ``run_programs``: all programs are resumed
        together once everything pending has run."""
        if self.value is None:
            yield self
        return self.value

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __repr__(self) -> str:
        state = "known" if self.value is not None else "pending"
        return f"Tensor({self.name}, shape={self.shape}, dtype={self.dtype}, {state})"

    # numpy-like operators (``+ - * / @``, unary ``-``, ``[]``): installed by
    # ``autobatch.frontends.ops``, which defines the ops and imports this module.


_parameter_ids = itertools.count()


@dataclass
class Parameter:
    """A weight shared by every instance (DyNet's Parameter). Usable in any batch."""

    array: np.ndarray
    name: str = ""

    def __post_init__(self) -> None:
        self.array = np.asarray(self.array)
        if not self.name:
            self.name = f"param{next(_parameter_ids)}"

    @property
    def shape(self) -> tuple[int, ...]:
        return self.array.shape

    def freeze(self) -> Parameter:
        """Make the values read-only, for inference: onnxruntime templates then bake this weight
        in from its second run on, even where a run reads it once, and never compare it with a
        copy (``backends.baked_weights``), and a traced block plans each run with what its
        earlier runs learnt (``Batch.plan``). The values become a copy of their own, so that no
        view made before can write to them. Writing to it raises; assign ``array`` to change it
        (setting it writeable again breaks this promise: what was learnt of it may be stale)."""
        self.array = self.array.copy()
        self.array.flags.writeable = False
        return self


NO_ATTRIBUTES: dict[str, AttributeProto] = {}


@dataclass(slots=True, eq=False)
class PreparedCall:
    """What every call of one op with the same kinds of operands records in one batch (a
    cell's calls): worked out at the first call, so that the others only append. It is its
    calls' record key: hashed by identity, which is cheaper than hashing their entries."""

    op_type: str
    domain: str
    shared: list[str]  # this batch's shared values read after the operands (a cell's parameters)
    entries: tuple  # the operands' entries, then the shared values'
    shapes: list[tuple[int, ...]]
    dtypes: list[np.dtype]
    types: list[ValueType]
    repeatable: bool  # deterministic: a call on the same values may return an earlier call's outputs


@functools.lru_cache(maxsize=65536)
def tensor_type(dtype: np.dtype, shape: tuple[int, ...]) -> ValueType:
    return ValueType.tensor(dtype, shape)


configure_records(Tensor, NO_ATTRIBUTES, tensor_type)
