"""Tracing's hot path: what every traced op and cell call runs (issue 19's "a recorder near
Python's floor").

Two implementations of the same three base classes: ``_recorder.c``, compiled by ``pip install``
where a C compiler is (about twice as fast a traced op), and the Python below, used where it did
not build or when ``AUTOBATCH_PURE_PYTHON`` is set in the environment. ``COMPILED`` says which
runs. Both are tested (``tests/test_recorder.py`` runs the tracing tests under each).

``TensorBase``: a traced value's fields (``tensors.Tensor`` adds its methods and operators).
``RecorderBase``: the records a ``tracing.Tracer`` appends to (``_records``, ``_pending``,
``_literals``, ``_calls``, ``_names``, ``_instance``, ``reuse_calls``, ``reused_calls``, set by
its ``__init__``) and ``record_one``, ``record_outputs``, ``record_call``, ``_append`` and
``_outputs_again``, which need its ``_reads``. ``CellBase``: a cell's call
(``cells.Cell._traced_call``). The C module
also has the common cases of ``ops._elementwise``, ``ops._tensors``, ``ops.matmul``,
``ops.pick``, ``ops.lookup``, ``ops.split``, ``ops.concat`` and ``ops._recurrent``.

What the compiled classes do not do that Python classes would: call a subclass's override of
these methods from each other (``elementwise`` records through C's ``record_one``), or of the
tracer's ``constant`` and ``shared_constant`` where their memos hold the value asked for
(a pick and a recurrent layer look there first), or of its ``as_tensor`` for a parameter given
to a cell (looked up in its memo of parameters, as ``parameter`` does), take other
than integers in ``producer`` and ``_instance`` or other than a bool in ``reuse_calls``, take
arguments by keyword but ``attrs``, pickle a tensor, or check a row looked up again against a
parameter whose array was assigned fewer rows within the block (the Python's memo of rows
does not either, for rows still in range).
"""

from __future__ import annotations

import weakref
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np
from onnx import AttributeProto

from autobatch.ir import ValueType
from autobatch.ir.compiled import compiled as compiled_module
from autobatch.ir.records import Record, new_record

_new_object = object.__new__
# What records are made of, set by ``configure_records`` (``tensors`` imports this module)
_tensor_class: type = object
_no_attributes: dict[str, AttributeProto] = {}
_tensor_type: Any = None


class PyTensorBase:
    """A traced value's fields; ``Tensor`` documents them."""

    __slots__ = ("batch", "name", "shape", "dtype", "value", "entry", "producer", "__weakref__")


class PyCellBase:
    """A cell's call is ``Cell._traced_call`` itself (``Cell.__call__``)."""


class PyRecorderBase:
    """What a ``Tracer`` records into; ``Tracer`` documents the fields its ``__init__`` sets."""

    def record_one(self, op_type: str, inputs: Sequence[Any], shape: tuple[int, ...], dtype: np.dtype,
                   attrs: dict[str, AttributeProto] | None = None) -> Any:
        """``Tracer.record`` of the common op, with the least work a traced op can cost: ONNX's
        own domain, deterministic (not in ``MAYBE_NONDETERMINISTIC``), every input given, one output."""
        attributes = attrs or _no_attributes
        attributes_id = id(attributes)
        names = []
        preds = []
        entries = []
        for tensor in inputs:  # ``_operands``, inlined: a call of it costs every traced op 0.1-0.2 us
            names.append(tensor.name)
            entries.append(tensor.entry)
            if tensor.value is None:
                if tensor.producer >= 0:
                    preds.append(tensor.producer)
                else:
                    self._reads((tensor,))
            elif type(tensor.entry) is not str:
                self._literals[tensor.name] = tensor.value
        vtype = _tensor_type(dtype, shape)
        seen = None
        if self.reuse_calls:
            seen = (op_type, "", attributes_id, *names)  # as ``Tracer.record`` makes it: either may reuse the other's
            if seen in self._calls:
                return self._outputs_again(seen, (shape,), (dtype,), [vtype])[0]
        entries = tuple(entries)
        index = len(self._records)
        tensor = self._new_output(shape, dtype, vtype, index)
        self._records.append(new_record(Record, (op_type, "", names, [tensor.name], attributes, [vtype], entries,
                                                 ("", op_type, attributes_id, entries), preds, self._instance, ())))
        if seen is not None:  # known to reuse_calls once recorded
            self._calls[seen] = index
        return tensor

    def record_outputs(self, op_type: str, inputs: Sequence[Any], shapes: Sequence[tuple[int, ...]],
                       dtypes: Sequence[np.dtype], attrs: dict[str, AttributeProto] | None = None) -> list[Any]:
        """``record_one`` of an op with any number of outputs; a list of them."""
        attributes = attrs or _no_attributes
        attributes_id = id(attributes)
        inputs = tuple(inputs)  # read twice
        names, preds = self._operands(inputs)
        entries = tuple([tensor.entry for tensor in inputs])
        types = [_tensor_type(dtype, shape) for shape, dtype in zip(shapes, dtypes)]
        seen = None
        if self.reuse_calls:
            seen = (op_type, "", attributes_id, *names)
            if seen in self._calls:
                return self._outputs_again(seen, shapes, dtypes, types)
        return self._append(op_type, "", preds, names, attributes, shapes, dtypes, types, entries,
                            ("", op_type, attributes_id, entries), seen)

    def record_call(self, call: Any, inputs: Sequence[Any]) -> list[Any]:
        """Append a call whose signature was worked out once (a cell's ``PreparedCall``, for these
        kinds of operands in this batch); its shared values are read after ``inputs``."""
        names, preds = self._operands(inputs)
        seen = None
        if call.repeatable and self.reuse_calls:
            seen = (call, *names)
            if seen in self._calls:
                return self._outputs_again(seen, call.shapes, call.dtypes, call.types)
        names += call.shared
        return self._append(call.op_type, call.domain, preds, names, _no_attributes, call.shapes, call.dtypes,
                            call.types, call.entries, call, seen)

    def _append(self, op_type: str, domain: str, preds: list[int], names: list[str],
                attributes: dict[str, AttributeProto], shapes: Sequence[tuple[int, ...]], dtypes: Sequence[np.dtype],
                types: list[ValueType], entries: tuple, key: Hashable, seen: tuple | None) -> list[Any]:
        """An op of any kind, reading the records ``preds`` (``Tracer._reads``); ``seen``: the
        call as ``reuse_calls`` knows it (None: not reused)."""
        index = len(self._records)
        tensors, outputs = [], []
        pending = self._pending
        for shape, dtype, vtype in zip(shapes, dtypes, types):  # ``_pending_tensor``, inlined: every cell call runs this
            tensor = _new_object(_tensor_class)
            tensor.batch, tensor.name, tensor.shape, tensor.dtype = self, f"t{next(self._names)}", shape, dtype
            tensor.value, tensor.entry, tensor.producer = None, vtype, index
            pending.append(weakref.ref(tensor))
            tensors.append(tensor)
            outputs.append(tensor.name)
        self._records.append(new_record(Record, (op_type, domain, names, outputs, attributes, types, entries, key,
                                                 preds, self._instance, ())))
        if seen is not None:  # known to reuse_calls once recorded
            self._calls[seen] = index
        return tensors

    def _outputs_again(self, seen: tuple, shapes: Sequence[tuple[int, ...]], dtypes: Sequence[np.dtype],
                       types: Sequence[ValueType | None]) -> list[Any]:
        """New tensors for the outputs of a call seen before (still pending): reading them reads
        its record's outputs."""
        self.reused_calls += 1
        index = self._calls[seen]
        return [self._pending_tensor(name, shape, dtype, vtype if vtype is not None else _tensor_type(dtype, shape), index)
                for name, shape, dtype, vtype in zip(self._records[index].outputs, shapes, dtypes, types)]

    def waiting(self) -> list[Any]:
        """The pending tensors still held whose values are not known yet, in tracing order."""
        return [t for t in (ref() for ref in self._pending) if t is not None and t.value is None]

    def _new_output(self, shape: tuple[int, ...], dtype: np.dtype, vtype: ValueType, index: int) -> Any:
        """A new pending output of record ``index``."""
        return self._pending_tensor(f"t{next(self._names)}", shape, dtype, vtype, index)

    def _pending_tensor(self, name: str, shape: tuple[int, ...], dtype: np.dtype, vtype: ValueType, index: int) -> Any:
        """A pending output of record ``index``, its slots set here (a call of ``Tensor.__init__``
        costs more than they do); ``run_pending`` runs it while someone holds it."""
        tensor = _new_object(_tensor_class)
        tensor.batch, tensor.name, tensor.shape, tensor.dtype = self, name, shape, dtype
        tensor.value, tensor.entry, tensor.producer = None, vtype, index
        self._pending.append(weakref.ref(tensor))
        return tensor

    def _operands(self, inputs: Sequence[Any]) -> tuple[list[str], list[int]]:
        """The names of a record's operands (every one given) and the records it reads (as
        ``_reads``), in one loop. A reused call's literals are known already: registering them
        again does no harm."""
        names = []
        preds = []
        for tensor in inputs:
            names.append(tensor.name)
            if tensor.value is None:
                if tensor.producer >= 0:
                    preds.append(tensor.producer)
                else:
                    self._reads((tensor,))  # an argument of a traced cell, or discarded (which raises)
            elif type(tensor.entry) is not str:
                self._literals[tensor.name] = tensor.value
        return names, preds


compiled = compiled_module("autobatch.frontends._recorder")
COMPILED = compiled is not None
TensorBase: type = compiled.TensorBase if compiled else PyTensorBase
RecorderBase: type = compiled.RecorderBase if compiled else PyRecorderBase
CellBase: type = compiled.CellBase if compiled else PyCellBase


def configure_records(tensor: type, attributes: dict[str, AttributeProto], tensor_type: Any) -> None:
    """What records are made of: the ``Tensor`` class, ``NO_ATTRIBUTES``, ``tensor_type``."""
    global _tensor_class, _no_attributes, _tensor_type
    if compiled:
        compiled.configure_records(tensor, Record, attributes, tensor_type, ValueType)
    _tensor_class, _no_attributes, _tensor_type = tensor, attributes, tensor_type
