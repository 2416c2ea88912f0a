"""Define-by-run tracing: ``Tensor`` values record ONNX ops into the pending graph of a
``Tracer``; nothing runs until a value is needed, and then everything pending is batched and
run at once (DyNet's lazy evaluation, with our batcher).

Tracing appends one compact record a op; the IR graph is built in bulk only when the batch
runs, and only from the records that lead to a value someone still holds.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
from onnx import AttributeProto

from autobatch.ir import Graph, Node, is_nondeterministic
from autobatch.ir.random_ops import MAYBE_NONDETERMINISTIC
from autobatch.ir.types import MISSING
from autobatch.ir.gc_pause import gc_paused
from autobatch.ir.records import FOLD_DOMAIN, Record
from autobatch.frontends.recorder import RecorderBase
from autobatch.frontends.tensors import NO_ATTRIBUTES, Parameter, PreparedCall, Tensor, TraceError, _current, tensor_type

OPSET = {"": 18}


DISCARDED = -2  # the producer of a pending tensor whose record was discarded


class Tracer(RecorderBase):  # type: ignore[misc,valid-type]
    """Traces many instances into records; what runs them is its subclass's (``autobatch.Batch``:
    planned, batched and run on a backend). Nothing runs until a value is needed, and then
    everything pending runs at once (``run_pending``).

    >>> with autobatch.Batch() as batch:
    ...     losses = [model(example) for example in examples]   # traced, not run
    ...     values = batch.run(losses)                           # batched and run once

    A value is also computed when asked for (``tensor.numpy()``), and what is still pending
    runs at the end of the block. A bare ``Tracer`` only records (a cell's body is traced by one).
    """

    def __init__(self, reuse_calls: bool = True) -> None:
        """``reuse_calls``: a deterministic op (or cell) called again on the same tensors returns
        the outputs of its first call, traced and run once (common subexpressions, such as the
        first steps of character LSTMs over words that share a prefix, or a leaf's cell on a
        word and label seen before); ``reused_calls`` counts them."""
        self._records: list[Record] = []
        self._pending: list[weakref.ref[Tensor]] = []  # outputs of records, alive while someone holds them
        self._literals: dict[str, np.ndarray] = {}  # data read by pending records
        self._parameters: dict[int, Tensor] = {}  # id(Parameter) -> its tensor in this batch
        self.parameters_used: dict[str, Parameter] = {}  # value name -> Parameter
        self._weights: dict[str, np.ndarray] = {}  # value name -> a parameter's or shared constant's array
        self._shared: dict[tuple, Tensor] = {}  # (dtype, shape, bytes) -> a shared constant
        self._shared_tensors: dict[tuple, Tensor] = {}  # (dtype asked, *ints) -> the same, found faster
        # Literals made once a batch: (type, value, dtype asked) of a Python scalar, or ("zeros", shape, dtype)
        self._scalars: dict[tuple, Tensor] = {}
        # (id(parameter), index) -> (the parameter, kept alive so that its id stays its own; its row)
        self._rows: dict[tuple[int, int], tuple[Parameter, Tensor]] = {}
        # True while tracing a cell's body: it reads parameters, never copies of them (lookups do
        # not fold), and records ops of several ops as their ops (``ops.affine``)
        self.in_cell_body = False
        self._names = itertools.count()
        self._instance = 0
        self.functions: dict[tuple[str, str], Any] = {}  # cells used by this batch
        self.cell_parameters: dict[str, list[str]] = {}  # cell function -> its parameters' values here
        self.cell_calls: dict[tuple, PreparedCall] = {}  # (cell, operand entries) -> what its calls record
        self.reuse_calls = bool(reuse_calls)
        self.reused_calls = 0
        self._calls: dict[tuple, int] = {}  # a pending deterministic call (its op and operands) -> its record

    # ------------------------------------------------------------------ context
    def __enter__(self) -> Tracer:
        """Trace into this batch. Python's cyclic garbage collector is paused inside the block
        (reference counting still frees what tracing drops): tracing allocates many small
        long-lived objects, and collections over the heap they build made tracing up to five
        times slower, at random."""
        self._token = _current.set(self)
        self._gc = gc_paused()
        self._gc.__enter__()
        return self

    def __exit__(self, kind: type | None, *_: Any) -> None:
        try:
            _current.reset(self._token)
            if kind is None:
                self.run_pending()
        finally:
            # The memos' tensors refer back to this batch: a cycle that kept it, and its plan,
            # alive for the collector. They only save records: a batch entered again makes new ones.
            # Its cell calls go too: they name this block's parameters' values, and a block
            # entered again names them anew (a parameter's array may have been assigned since).
            for memo in (self._parameters, self._scalars, self._rows, self.cell_calls, self.cell_parameters):
                memo.clear()
            if not self._records:  # its cells' functions: a block entered again adds those it calls
                self.functions.clear()
            self._gc.__exit__(None, None, None)

    @contextmanager
    def instance(self) -> Iterator[int]:
        """Mark the ops traced inside as one instance's (for reports; batching does not need it)."""
        self._instance += 1
        yield self._instance

    # ------------------------------------------------------------------ values
    def constant(self, value: Any, dtype: Any = None) -> Tensor:
        """A literal of one instance (a word index, a label). Equal Python scalars share one
        tensor: it is data all the same (stacked per reader), made once."""
        kind = type(value)
        key = None
        if kind is int or kind is bool or kind is float:  # -0.0 == 0.0, but its literal is not the same
            key = (kind, value.hex() if kind is float else value, dtype)
        tensor = self._scalars.get(key) if key is not None else None
        if tensor is None:
            array = np.asarray(value, dtype=dtype)
            if array.dtype == np.float64 and dtype is None:
                array = array.astype(np.float32)  # Python floats are float32 here, as in DyNet
            tensor = Tensor(self, f"c{next(self._names)}", array.shape, array.dtype, array)
            if key is not None:
                self._scalars[key] = tensor
        return tensor

    def indices(self, values: np.ndarray) -> Tensor:
        """An int64 literal of one instance ``[n]`` (rows to look up); equal ones share a tensor,
        so that equal lookups are traced once (``reuse_calls``). ``values``: an array the batch
        may keep as it is (the caller's copy)."""
        array = values.astype(np.int64, copy=False)
        key = ("indices", array.tobytes())
        tensor = self._scalars.get(key)
        if tensor is None:
            tensor = self._scalars[key] = self.constant(array)
        return tensor

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype) -> Tensor:
        """Zeros of one instance (an initial state), one tensor for equal requests."""
        key = ("zeros", shape, dtype.str)
        tensor = self._scalars.get(key)
        if tensor is None:
            tensor = self._scalars[key] = self.constant(np.zeros(shape, dtype))
        return tensor

    def known_row(self, tensor: Tensor) -> Tensor:
        """A known value of one instance as a row ``[1, *shape]``: known too, a view, where a
        traced Unsqueeze would be a record to plan and a step to run (``ops.stack`` of a
        sentence's word rows); one tensor a value."""
        key = ("row of", tensor.name)
        row = self._scalars.get(key)
        if row is None:
            row = self._scalars[key] = self.constant(tensor.value[None], tensor.dtype)
        return row

    def shared_constant(self, value: Any, dtype: Any = np.int64) -> Tensor:
        """A constant every instance reads as the same value (axes, shapes, slice bounds):
        one value, so that nodes using it keep equal signatures; one tensor."""
        # The common call, a short list of Python ints (an axis, a shape), is found by those
        # ints, without an array made first (a float of an equal value is not an int: -0.0).
        quick = (dtype, *value) if type(value) is list and all(type(v) is int for v in value) else None
        tensor = self._shared_tensors.get(quick) if quick is not None else None
        if tensor is not None:
            return tensor
        array = np.asarray(value, dtype=dtype)
        key = (array.dtype, array.shape, array.tobytes())  # the dtype whole: float8 kinds share a ``str``
        tensor = self._shared.get(key)
        if tensor is None:
            name = f"k{len(self._shared)}"
            array = self._weights[name] = array.copy()  # its own, read-only: it is named by these values
            array.flags.writeable = False
            tensor = self._shared[key] = Tensor(self, name, array.shape, array.dtype, array, entry=name)
        if quick is not None:
            self._shared_tensors[quick] = tensor
        return tensor

    def parameter(self, parameter: Parameter) -> Tensor:
        tensor = self._parameters.get(id(parameter))
        if tensor is None:  # one tensor per parameter and batch: a cell call reuses it
            name = f"{parameter.name}#{len(self._parameters)}"
            tensor = self._parameters[id(parameter)] = Tensor(self, name, parameter.array.shape,
                                                              parameter.array.dtype, parameter.array, entry=name)
            self._weights[name] = parameter.array
            self.parameters_used[name] = parameter
        return tensor

    def weights_binding(self) -> tuple[tuple, list[np.ndarray]]:
        """A key for what this batch's weight names denote, equal in a batch whose names denote
        the same weights: each parameter's array by identity, each shared constant by value;
        and the parameters' arrays, whose identities hold only while they live."""
        arrays = [self._weights[name] for name in self.parameters_used]
        names = tuple(zip(self.parameters_used, map(id, arrays)))
        return (names, tuple(self._shared)), arrays

    def row(self, parameter: Parameter, index: int) -> Tensor:
        """Row ``index`` of a parameter, known now (an embedding lookup by a Python int, in
        range: ``ops.pick`` checks it): a view of the parameter read as data, so it costs the
        batch no traced op, no planning and no launch. Equal lookups share one tensor."""
        known = self._rows.get((id(parameter), index))
        if known is None:
            value = parameter.array[index]
            known = self._rows[id(parameter), index] = (
                parameter, Tensor(self, f"c{next(self._names)}", value.shape, value.dtype, value))
        return known[1]

    def as_tensor(self, value: Any) -> Tensor:
        if isinstance(value, Tensor):
            if value.batch is not self:
                raise TraceError(f"{value!r} belongs to another batch; values cannot cross batches")
            return value
        if isinstance(value, Parameter):
            return self.parameter(value)
        return self.constant(value)

    def record(self, op_type: str, inputs: Sequence[Tensor | None], shapes: Sequence[tuple[int, ...]],
               dtypes: Sequence[np.dtype], attrs: dict[str, AttributeProto] | None = None,
               domain: str = "") -> list[Tensor]:
        """Append one op; returns its output tensors (pending)."""
        names = [tensor.name if tensor is not None else "" for tensor in inputs]
        types = [tensor_type(dtype, shape) for shape, dtype in zip(shapes, dtypes)]
        attributes = attrs or NO_ATTRIBUTES
        attributes_id = id(attributes)  # alive while the record is: no other attributes take it
        seen = None
        if self.reuse_calls and (not domain and op_type not in MAYBE_NONDETERMINISTIC  # most ops: no call to ask
                                 or not is_nondeterministic(op_type, domain, self.functions, names)):
            # The op, its attributes and its operands fix its outputs.
            seen = (op_type, domain, attributes_id, *names)
            if seen in self._calls:
                return self._outputs_again(seen, shapes, dtypes, types)
        entries = tuple([tensor.entry if tensor is not None else MISSING for tensor in inputs])
        return self._append(op_type, domain, self._reads(inputs), names, attributes, shapes, dtypes, types, entries,
                            (domain, op_type, attributes_id, entries), seen)

    def _reads(self, inputs: Sequence[Tensor | None]) -> list[int]:
        """The records that a new record reads (one read twice is listed twice: the planner
        counts edges, not records); known values it reads become data of the graph to run."""
        preds = []
        for tensor in inputs:
            if tensor is None:
                continue
            if tensor.value is None:
                if tensor.producer >= 0:  # else an input of the graph traced (a cell's argument)
                    preds.append(tensor.producer)
                elif tensor.producer == DISCARDED:
                    raise TraceError(f"{tensor!r} was discarded before it ran: it has no value to read")
            elif type(tensor.entry) is not str:  # per-instance data (a shared value's entry is its name)
                self._literals[tensor.name] = tensor.value
        return preds

    # ------------------------------------------------------------------ running
    def run(self, tensors: Sequence[Tensor]) -> list[np.ndarray]:
        """Values of these tensors, running everything pending once (batched)."""
        if any(t.value is None for t in tensors):
            self.run_pending()
        return [t.numpy() for t in tensors]

    def graph_of(self, tensors: Sequence[Tensor]) -> Graph:
        """The IR graph that computing these pending tensors would batch (nothing runs)."""
        names = [t.name for t in tensors]
        return self._graph(*self.records_for(names), names)

    def discard(self) -> None:
        """Forget everything pending without running it."""
        for tensor in self.waiting():
            tensor.producer = DISCARDED  # its record is gone: reading it again is an error
        self._forget()

    def _forget(self) -> None:
        self._records.clear()
        self._literals.clear()
        self._calls.clear()
        self._pending = []

    def run_pending(self) -> None:
        """Batch and run every pending op that leads to a value still held, then forget the
        records: later ops read those values as data. When the run fails, everything pending
        is discarded (reading it later says so) and the batch stays usable."""
        wanted = self.waiting()
        if not wanted:
            self._forget()
            return
        try:
            with gc_paused():
                values = self._execute(wanted)
        except Exception:
            self.discard()
            raise
        for tensor, value in zip(wanted, values):
            tensor.value = value
        self._forget()  # every pending tensor still held now has its value

    def _execute(self, wanted: list[Tensor]) -> list[np.ndarray]:
        """The values of the pending tensors ``wanted``: what a subclass that runs provides."""
        raise TraceError("this tracer only records; trace inside `with autobatch.Batch() as batch:` to run")

    def _opsets(self) -> dict[str, int]:
        return {**OPSET, **{domain: 1 for domain, _ in self.functions}}

    def records_for(self, wanted: Sequence[str]) -> tuple[list[Record], set[str]]:
        """The records that lead to ``wanted`` (in trace order), and every value they read."""
        needed = set(wanted)
        records = []
        disjoint, update = needed.isdisjoint, needed.update
        for record in reversed(self._records):
            if not disjoint(record.outputs):
                records.append(record)
                update(record.inputs)
        records.reverse()
        return records, needed

    def _graph(self, records: list[Record], needed: set[str], wanted: list[str]) -> Graph:
        """The IR graph of ``records`` (those that lead to ``wanted``), built in bulk."""
        if any(record.domain == FOLD_DOMAIN for record in records):
            raise TraceError("a tree fold (fold_tree) has no IR graph: it runs only batched, by the plan")
        graph = Graph("batch", self._opsets())
        graph.functions = dict(self.functions)
        for name in sorted(needed & self._weights.keys()):
            graph.add_initializer(name, self._weights[name])
        for name in sorted(needed & self._literals.keys()):
            graph.add_initializer(name, self._literals[name], literal=True)
        graph._insert(
            [Node(-1, r.op_type, r.domain, graph.opset_imports.get(r.domain, 1), r.attributes, list(r.inputs),
                  list(r.outputs), r.instance, "") for r in records],
            [r.types for r in records],
        )
        for name in dict.fromkeys(wanted):  # a value asked for twice (a reused call's, say) is one output
            graph.add_output(name)
        return graph
