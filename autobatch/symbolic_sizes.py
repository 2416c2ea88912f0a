"""A batched graph that holds for every size of its inputs' symbolic dimensions (``autobatch
rewrite`` of branches that share one symbolic length ``L``).

The planner needs every shape, so the graph is batched once for each of a few trial sizes of its
symbols (``TRIAL_SIZES``). Where the lowered graphs are the same but for int64/int32 constants
whose differing entries are, in every trial, the size of one symbol (a stacked ``[8, L, d]``, a
reshape's ``[L, -1, d]``), those entries are read from an input's shape at run time
(``Shape -> Gather -> Concat``). Anything else that differs (an entry ``2L`` or ``L - 1``, a
node, an attribute, a constant's length: rows of different lengths laid out by index arrays)
means the batched graph is specific to its sizes, and nothing is rewritten.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from autobatch.ir import Graph
from autobatch.ir.types import ValueType

# A symbol: a dim_param's name, or (input, axis) for a dimension without one (its own symbol).
Symbol = str | tuple[str, int]

# Sizes a symbol takes in each trial: small and large, distinct across symbols within a trial and
# across trials, so a constant's entry that follows one symbol through every trial is that symbol.
TRIAL_SIZES = ((3, 5, 7, 11, 13, 17, 19, 23), (29, 31, 37, 41, 43, 47, 53, 59), (97, 101, 103, 107, 109, 113, 127, 131))
SIZE_DTYPES = (onnx.TensorProto.INT64, onnx.TensorProto.INT32)


def symbol_sources(graph: Graph) -> dict[Symbol, tuple[str, int]] | str:
    """Each symbol of the graph's input shapes and the first input and axis that carry it, or
    why the inputs cannot be bound to trial sizes."""
    sources: dict[Symbol, tuple[str, int]] = {}
    for name in graph.inputs:
        vtype = graph.values[name].type
        if vtype is None or not vtype.is_tensor or vtype.shape is None:
            return f"input {name!r} is not a tensor of known rank"
        for axis, dim in enumerate(vtype.shape):
            if not isinstance(dim, int):
                sources.setdefault((name, axis) if dim is None else dim, (name, axis))
    if len(sources) > len(TRIAL_SIZES[0]):
        return f"its inputs have {len(sources)} symbolic dimensions (at most {len(TRIAL_SIZES[0])} are tried)"
    return sources


def trial_types(graph: Graph, sources: Mapping[Symbol, tuple[str, int]], trial: int) -> dict[str, ValueType]:
    """The input types with each symbol bound to its size in this trial."""
    sizes = dict(zip(sources, TRIAL_SIZES[trial]))
    types = {}
    for name in graph.inputs:
        vtype = graph.values[name].type
        shape = [d if isinstance(d, int) else sizes[(name, axis) if d is None else d] for axis, d in enumerate(vtype.shape)]
        types[name] = ValueType.tensor(vtype.elem_type, shape)
    return types


def batched_for_every_size(graph: Graph, batch: Callable[[Mapping[str, ValueType]], onnx.ModelProto | str]
                           ) -> onnx.ModelProto | str:
    """``batch(input types)`` for each trial, made one model that reads its sizes from its inputs;
    or why not (``batch``'s own reason, or what differs between the trials)."""
    sources = symbol_sources(graph)
    if isinstance(sources, str):
        return sources
    models = []
    for trial in range(len(TRIAL_SIZES)):
        model = batch(trial_types(graph, sources, trial))
        if isinstance(model, str):
            return model
        models.append(model)
    sizes = [dict(zip(sources, trial)) for trial in TRIAL_SIZES]
    return _generalised(graph, models, sizes, sources)


def _generalised(graph: Graph, models: Sequence[onnx.ModelProto], sizes: Sequence[Mapping[Symbol, int]],
                 sources: Mapping[Symbol, tuple[str, int]]) -> onnx.ModelProto | str:
    first = models[0]
    for model in models[1:]:
        if ([n.SerializeToString() for n in model.graph.node] != [n.SerializeToString() for n in first.graph.node]
                or [i.name for i in model.graph.initializer] != [i.name for i in first.graph.initializer]):
            return "its batched graph differs with the sizes of its symbolic dimensions (not only in shape constants)"
    follow: dict[str, list[Symbol | None]] = {}  # a varying constant: each entry's symbol (None: fixed)
    for position, tensor in enumerate(first.graph.initializer):
        values = [numpy_helper.to_array(model.graph.initializer[position]) for model in models]
        if all(v.dtype == values[0].dtype and v.shape == values[0].shape and np.array_equal(v, values[0]) for v in values):
            continue
        entries = _symbols_of_entries(tensor, values, sizes)
        if isinstance(entries, str):
            return entries
        follow[tensor.name] = entries
    result = onnx.ModelProto()
    result.CopyFrom(first)
    _read_sizes_at_run_time(result.graph, follow, sources)
    _declare_as_given(result.graph, graph)
    return result


def _symbols_of_entries(tensor: onnx.TensorProto, values: Sequence[np.ndarray],
                        sizes: Sequence[Mapping[Symbol, int]]) -> list[Symbol | None] | str:
    """For a constant that differs between trials, each entry's symbol (None where it is fixed)."""
    shapes = {v.shape for v in values}
    if tensor.data_type not in SIZE_DTYPES or len(shapes) != 1 or values[0].ndim > 1:
        return (f"constant {tensor.name!r} of its batched graph changes with the sizes of its symbolic dimensions "
                f"in more than its entries (shapes {sorted(shapes)})")
    columns = np.stack([v.reshape(-1) for v in values])  # trial x entry
    entries: list[Symbol | None] = []
    for column in columns.T:
        if (column == column[0]).all():
            entries.append(None)
            continue
        symbol = next((s for s in sizes[0] if all(int(c) == trial[s] for c, trial in zip(column, sizes))), None)
        if symbol is None:
            return (f"constant {tensor.name!r} of its batched graph holds an entry that follows its symbolic "
                    f"dimensions but is none of them ({', '.join(map(str, column))} in the trials)")
        entries.append(symbol)
    return entries


def _read_sizes_at_run_time(graph: onnx.GraphProto, follow: Mapping[str, list[Symbol | None]],
                            sources: Mapping[Symbol, tuple[str, int]]) -> None:
    """Each varying constant made at the graph's start from the fixed entries and the input dims."""
    made: list[onnx.NodeProto] = []
    fixed: list[onnx.TensorProto] = []
    shapes: dict[str, str] = {}  # an input: its Shape, read once
    dims: dict[tuple[Symbol, bool], str] = {}  # a symbol, as a scalar or a row of one: where it is read

    def dim(symbol: Symbol, scalar: bool) -> str:
        if (symbol, scalar) not in dims:
            name, axis = sources[symbol]
            if name not in shapes:
                shapes[name] = f"autobatch/sizes/{len(shapes)}"
                made.append(helper.make_node("Shape", [name], [shapes[name]]))
            dims[symbol, scalar] = f"{shapes[name]}/{axis}{'' if scalar else '/row'}"
            fixed.append(numpy_helper.from_array(np.array(axis if scalar else [axis], np.int64), f"{dims[symbol, scalar]}/at"))
            made.append(helper.make_node("Gather", [shapes[name], fixed[-1].name], [dims[symbol, scalar]]))
        return dims[symbol, scalar]

    kept = []
    for tensor in graph.initializer:
        entries = follow.get(tensor.name)
        if entries is None:
            kept.append(tensor)
            continue
        array = numpy_helper.to_array(tensor)
        target = tensor.name if tensor.data_type == onnx.TensorProto.INT64 else f"{tensor.name}/int64"
        if array.ndim == 0:
            made.append(helper.make_node("Identity", [dim(entries[0], scalar=True)], [target]))
        else:
            pieces = []
            for start, entry in enumerate(entries):
                if entry is not None:
                    pieces.append(dim(entry, scalar=False))
                elif start == 0 or entries[start - 1] is not None:  # a run of fixed entries: one constant
                    end = next((k for k in range(start, len(entries)) if entries[k] is not None), len(entries))
                    fixed.append(numpy_helper.from_array(array[start:end].astype(np.int64), f"{tensor.name}/{start}"))
                    pieces.append(fixed[-1].name)
            made.append(helper.make_node("Concat", pieces, [target], axis=0))
        if target != tensor.name:
            made.append(helper.make_node("Cast", [target], [tensor.name], to=tensor.data_type))
    del graph.initializer[:]
    graph.initializer.extend(kept + fixed)
    nodes = made + list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes)


def _declare_as_given(graph: onnx.GraphProto, original: Graph) -> None:
    """Inputs and outputs typed as the original declares them (symbolic dims, not a trial's sizes);
    the trial's inner shapes dropped."""
    for infos in (graph.input, graph.output):
        for info in infos:
            value = original.values.get(info.name)
            if value is not None and value.type is not None:
                info.type.CopyFrom(value.type.proto)
    del graph.value_info[:]
