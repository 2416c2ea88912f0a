"""Cells: a Python function over tensors, traced once per input signature into an ONNX
function; each call is one IR node, batched as a unit (one batched LSTM step, one batched
Tree-LSTM node), which keeps the traced graph small.

Parameters a cell uses become extra inputs of its function (shared by every call); constants
inside it become Constant nodes of its body.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import FunctionProto, helper

from autobatch.frontends.recorder import COMPILED, CellBase
from autobatch.ir import Recent, ValueType, is_nondeterministic
from autobatch.frontends.tensors import Parameter, PreparedCall, Tensor, TraceError, _current, batch_of
from autobatch.frontends.tracing import OPSET, Tracer

CELL_DOMAIN = "autobatch.cells"
_cell_ids = itertools.count()
SIGNATURES_KEPT = 256  # traced functions a cell keeps, most recently used first (shapes may keep changing)
PREPARED_KEPT = 256  # prepared calls a cell keeps for the batches to come (``Cell._prepare``)


@dataclass
class TracedCell:
    """One cell traced for one input signature."""

    function: FunctionProto
    parameters: list[Parameter]
    shapes: list[tuple[int, ...]]
    dtypes: list[np.dtype]
    nested: dict[tuple[str, str], FunctionProto]

    def __post_init__(self) -> None:
        self.types = [ValueType.tensor(d, s) for s, d in zip(self.shapes, self.dtypes)]


class Cell(CellBase):  # type: ignore[misc,valid-type]
    """A function over tensors that runs as one node. Use as ``@autobatch.cell``. A call is
    ``_traced_call``, or its common case in C (``recorder.CellBase``) where that is built."""

    def __init__(self, fn: Callable[..., Any] | None, name: str | None = None) -> None:
        if fn is not None:
            functools.update_wrapper(self, fn)
        self.fn = fn
        self.name = f"{name or fn.__name__}_{next(_cell_ids)}"
        self._traced: Recent = Recent(SIGNATURES_KEPT)  # (shape, dtype) of each argument -> TracedCell
        self._trace_ids = itertools.count()  # never reused: a function's name stays its own after an eviction
        # Its prepared calls by function and entries, shared by batches: a prepared call is its
        # calls' record key, by identity, so what plans learnt of it serves the next batch over
        # the same weights (``Batch._known_keys``) rather than piling up an entry a batch.
        self._prepared: Recent = Recent(PREPARED_KEPT)
        self._returns_tuple: bool | None = None

    def _traced_call(self, *args: Any) -> Tensor | tuple[Tensor, ...]:
        """The call, recorded as one node of the batch its tensors belong to."""
        batch = batch_of(*args)
        tensors = []
        # Keyed by the entries' ids, which hash in C (a type's hash is Python code): the call
        # holds its entries, so no other object takes their ids while it is kept.
        key = [self]
        for a in args:  # one loop: this runs for every cell call
            if type(a) is not Tensor or a.batch is not batch:
                a = batch.as_tensor(a)
            tensors.append(a)
            key.append(id(a.entry))
        key = tuple(key)
        call = batch.cell_calls.get(key)
        if call is None:  # the first call in this batch with these kinds of operands
            call = batch.cell_calls[key] = self._prepare(batch, tensors, tuple([t.entry for t in tensors]))
        outputs = batch.record_call(call, tensors)
        return tuple(outputs) if self._returns_tuple else outputs[0]

    if not COMPILED:
        __call__ = _traced_call

    def _prepare(self, batch: Tracer, tensors: list[Tensor], entries: tuple) -> PreparedCall:
        """The cell traced for the operands' shapes and dtypes (once per cell), made known to
        ``batch`` with its parameters (once per batch)."""
        key = tuple([(t.shape, t.dtype) for t in tensors])
        traced = self._traced.get(key)
        if traced is None:
            traced = self._traced[key] = self._trace(tensors, next(self._trace_ids))
        name = traced.function.name
        parameters = batch.cell_parameters.get(name)
        if parameters is None:  # the first call in this batch
            batch.functions.update(traced.nested)
            batch.functions[(CELL_DOMAIN, name)] = traced.function
            parameters = batch.cell_parameters[name] = [batch.parameter(p).name for p in traced.parameters]
        key = (name, entries + tuple(parameters))  # the rest follows from the function (its name is its own)
        call = self._prepared.get(key)
        if call is None:
            repeatable = not is_nondeterministic(name, CELL_DOMAIN, batch.functions)
            call = self._prepared[key] = PreparedCall(name, CELL_DOMAIN, parameters, key[1], traced.shapes,
                                                      traced.dtypes, traced.types, repeatable)
        return call

    def traced_signatures(self) -> int:
        return len(self._traced)

    def _trace(self, args: list[Tensor], index: int) -> TracedCell:
        inner = Tracer()
        inner.in_cell_body = True
        token = _current.set(inner)
        try:
            formal = [Tensor(inner, f"arg{i}", t.shape, t.dtype) for i, t in enumerate(args)]
            result = self.fn(*formal)
        finally:
            _current.reset(token)
        self._returns_tuple = isinstance(result, (tuple, list))
        outputs = list(result) if self._returns_tuple else [result]
        if not outputs or not all(isinstance(o, Tensor) and o.batch is inner for o in outputs):
            raise TraceError(f"cell {self.fn.__name__} must return tensors computed from its arguments")
        return _function(f"{self.name}_{index}", inner, formal, outputs)


def _function(name: str, inner: Tracer, formal: list[Tensor], outputs: list[Tensor]) -> TracedCell:
    records, needed = inner.records_for([o.name for o in outputs])
    parameters = [(value, p) for value, p in inner.parameters_used.items() if value in needed]
    rename = {value: f"param{j}" for j, (value, _) in enumerate(parameters)}
    produced = {o for record in records for o in record.outputs}
    identities = []  # outputs that are not a fresh value of the body (an argument, a repeat)
    for k, tensor in enumerate(outputs):
        if tensor.name in produced and tensor.name not in rename:
            rename[tensor.name] = f"out{k}"
        else:
            identities.append(helper.make_node("Identity", [rename.get(tensor.name, tensor.name)], [f"out{k}"]))
    nodes = []
    for value in sorted(needed - {t.name for t in formal} - produced - {v for v, _ in parameters}):
        array = inner._weights.get(value, inner._literals.get(value))
        if array is not None:  # a constant of the body
            nodes.append(helper.make_node("Constant", [], [value], value=onnx.numpy_helper.from_array(np.asarray(array))))
    value_info = []
    for record in records:
        node = helper.make_node(record.op_type, [rename.get(v, v) for v in record.inputs],
                                [rename.get(v, v) for v in record.outputs], domain=record.domain or None)
        node.attribute.extend(record.attributes.values())
        nodes.append(node)
        value_info += [helper.make_value_info(rename.get(o, o), t.proto) for o, t in zip(record.outputs, record.types)]
    nodes += identities
    result_names = [f"out{k}" for k in range(len(outputs))]
    opsets = [helper.make_opsetid(d, v) for d, v in OPSET.items()]
    opsets += [helper.make_opsetid(d, 1) for d in sorted({d for d, _ in inner.functions})]
    function = helper.make_function(
        CELL_DOMAIN, name, [t.name for t in formal] + [rename[v] for v, _ in parameters], result_names, nodes, opsets)
    function.value_info.extend(value_info)
    return TracedCell(function, [p for _, p in parameters], [t.shape for t in outputs],
                      [t.dtype for t in outputs], dict(inner.functions))


def cell(fn: Callable[..., Any]) -> Cell:
    """Decorator: ``@autobatch.cell`` makes ``fn`` a cell."""
    return Cell(fn)


class OnnxCell(Cell):
    """A cell made from an ONNX model of one step: its initializers are the parameters."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        self.parameters = [Parameter(onnx.numpy_helper.to_array(t), t.name) for t in model.graph.initializer]
        super().__init__(None, model.graph.name or "onnx_cell")
        self._returns_tuple = len(model.graph.output) > 1

    def _trace(self, args: list[Tensor], index: int) -> TracedCell:
        model = onnx.ModelProto()
        model.CopyFrom(self.model)
        inputs = [i for i in model.graph.input if i.name not in {p.name for p in self.parameters}]
        if len(inputs) != len(args):
            raise TraceError(f"cell {self.name} takes {len(inputs)} inputs ({[i.name for i in inputs]}), got {len(args)}")
        for info, tensor in zip(inputs, args):
            info.type.CopyFrom(helper.make_tensor_type_proto(helper.np_dtype_to_tensor_dtype(tensor.dtype), list(tensor.shape)))
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
        graph = inferred.graph
        names = [i.name for i in inputs] + [p.name for p in self.parameters]
        outputs = [o.name for o in graph.output]
        function = helper.make_function(CELL_DOMAIN, f"{self.name}_{index}", names, outputs, list(graph.node),
                                        list(model.opset_import))
        function.value_info.extend(list(graph.value_info) + list(graph.output))
        types = [_shape_and_dtype(o.type) for o in graph.output]
        return TracedCell(function, self.parameters, [t[0] for t in types], [t[1] for t in types],
                          {(f.domain, f.name): f for f in model.functions})


def _shape_and_dtype(type_proto: onnx.TypeProto) -> tuple[tuple[int, ...], np.dtype]:
    tensor = type_proto.tensor_type
    shape = tuple(d.dim_value for d in tensor.shape.dim)
    return shape, helper.tensor_dtype_to_np_dtype(tensor.elem_type)


def cell_from_onnx(source: onnx.ModelProto | str | bytes) -> OnnxCell:
    """``autobatch.cell.from_onnx(path_or_model)``: a cell from an ONNX model of one step."""
    from autobatch.ir import load_model

    return OnnxCell(load_model(source))


cell.from_onnx = cell_from_onnx  # type: ignore[attr-defined]
