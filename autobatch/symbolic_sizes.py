"""A batched graph that holds for every size of its inputs' symbolic dimensions (``autobatch
rewrite`` of branches that share one symbolic length ``L``).

The planner needs every shape, so the graph is batched once for each of a few trial sizes of its
symbols (``TRIAL_SIZES``: 1 and 2, where a dimension of 1 broadcasts or squeezes, then larger
ones). Where the lowered graphs are the same but for int64/int32 constants whose differing
entries are, in every trial, ``a * size + b`` of one symbol (a stacked ``[8, L, d]``, a reshape's
``[L, -1, d]``, a flattened ``[3L]``), those entries are computed from the inputs' shapes at run
time (``Shape -> Gather [-> Mul -> Add] -> Concat``). Anything else that differs (an entry
``L * L``, a node, an attribute, a constant's length: rows of different lengths laid out by index
arrays) means the batched graph is
specific to its sizes, and nothing is rewritten, unless only the trial of size 1 differs (K cells
over ``N`` rows read a row of one as a whole value): then the model is ``If(a size < 2)`` the
graph as written, else the batched one. Nor is a graph that computes values from shapes
(``Shape``, ``Size``): the trials fold those values, and a value that is the same in every trial
(``min(L, 128)``, ``L == 1``) could not be told from a constant. Inputs that share a symbol must
agree at run time: the rewritten graph checks that they do (a Gather out of range where not),
where the original would have run each branch at its own length.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from autobatch.ir import Graph, to_onnx
from autobatch.ir.nodes import subgraphs_of
from autobatch.ir.types import ValueType

# A symbol: a dim_param's name, or (input, axis) for a dimension without one (its own symbol).
Symbol = str | tuple[str, int]
# An entry that follows a symbol: ``(symbol, a, b)`` is a times its size, plus b.
Term = tuple[Symbol, int, int]

# Sizes a symbol takes in each trial (a row a trial, a column a symbol): 1 and 2 for every
# symbol, then sizes distinct across symbols and trials, so that a constant's entry that follows
# one symbol's column through every trial is that symbol.
TRIAL_SIZES = ((1,) * 8, (2,) * 8, (3, 5, 7, 11, 13, 17, 19, 23), (29, 31, 37, 41, 43, 47, 53, 59),
               (97, 101, 103, 107, 109, 113, 127, 131))
AS_WRITTEN_BELOW_TWO = "autobatch/as_written_below_two"  # the If that runs the model as written where a size is 0 or 1
SHAPE_READERS = frozenset({"Shape", "Size"})  # ops whose value comes from their input's shape
SIZE_DTYPES = (onnx.TensorProto.INT64, onnx.TensorProto.INT32)


def symbol_sources(graph: Graph) -> dict[Symbol, list[tuple[str, int]]] | str:
    """Each symbol of the graph's input shapes and every input and axis that carry it, or why
    the graph cannot be batched for trial sizes."""
    sources: dict[Symbol, list[tuple[str, int]]] = {}
    for name in graph.inputs:
        vtype = graph.values[name].type
        if vtype is None or not vtype.is_tensor or vtype.shape is None:
            return f"input {name!r} is not a tensor of known rank"
        for axis, dim in enumerate(vtype.shape):
            if not isinstance(dim, int):
                sources.setdefault((name, axis) if dim is None else dim, []).append((name, axis))
    if len(sources) > len(TRIAL_SIZES[-1]):
        return f"its inputs have {len(sources)} symbolic dimensions (at most {len(TRIAL_SIZES[-1])} are tried)"
    reader = _shape_reader(to_onnx(graph, check=False).graph)
    if reader is not None:
        return (f"it computes values from shapes ({reader}): batched for trial sizes, such values would "
                "keep those sizes")
    return sources


def _shape_reader(graph: onnx.GraphProto) -> str | None:
    """A node (in the graph or a subgraph) that reads a value's shape, other than a constant's."""
    constants = {tensor.name for tensor in graph.initializer}
    for node in graph.node:
        if node.op_type in SHAPE_READERS and not node.domain and node.input[0] not in constants:
            return f"{node.op_type} of {node.input[0]!r}"
        for subgraph in subgraphs_of(node):
            found = _shape_reader(subgraph)
            if found is not None:
                return found
    return None


def trial_types(graph: Graph, sources: Mapping[Symbol, list[tuple[str, int]]], trial: int) -> dict[str, ValueType]:
    """The input types with each symbol bound to its size in this trial."""
    sizes = dict(zip(sources, TRIAL_SIZES[trial]))  # (an input's own symbol: its first place)
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
    every = _generalised(graph, models, sizes, sources)
    if not isinstance(every, str):
        return every
    # Sizes of 1 may batch another way (rows of one are read as whole values): the graph of the
    # larger trials then runs only where every symbol is 2 or more, the model as written elsewhere.
    larger = _generalised(graph, models[1:], sizes[1:], sources)
    return every if isinstance(larger, str) else _as_written_below_two(graph, larger, sources)


def _generalised(graph: Graph, models: Sequence[onnx.ModelProto], sizes: Sequence[Mapping[Symbol, int]],
                 sources: Mapping[Symbol, list[tuple[str, int]]]) -> onnx.ModelProto | str:
    first = models[0]
    nodes, initializers = [n.SerializeToString() for n in first.graph.node], [i.name for i in first.graph.initializer]
    for model in models[1:]:
        if [n.SerializeToString() for n in model.graph.node] != nodes or [i.name for i in model.graph.initializer] != initializers:
            return "its batched graph differs with the sizes of its symbolic dimensions (not only in shape constants)"
    follow: dict[str, list[Term | None]] = {}  # a varying constant: each entry's term (None: fixed)
    for position, tensor in enumerate(first.graph.initializer):
        if all(model.graph.initializer[position].SerializeToString() == tensor.SerializeToString() for model in models):
            continue  # (compared as bytes: a NaN equals itself)
        values = [numpy_helper.to_array(model.graph.initializer[position]) for model in models]
        entries = _symbols_of_entries(tensor, values, sizes)
        if isinstance(entries, str):
            return entries
        follow[tensor.name] = entries
    result = onnx.ModelProto()
    result.CopyFrom(first)
    _read_sizes_at_run_time(result.graph, follow, sources, graph)
    _declare_as_given(result.graph, graph)
    return result


def _as_written_below_two(graph: Graph, batched: onnx.ModelProto,
                          sources: Mapping[Symbol, list[tuple[str, int]]]) -> onnx.ModelProto | str:
    """One model: ``If(some symbol < 2)`` the graph as written, else ``batched``. Each branch's
    own values are renamed apart (``alone/``, ``batched/``); the weights stay in the outer graph,
    one copy of each tensor that both read alike."""
    original = to_onnx(graph, check=False)
    if original.opset_import and min(o.version for o in original.opset_import if o.domain in ("", "ai.onnx")) < 9:
        return "its batched graph differs for sizes of 1, and before opset 9 no integer Less picks the graph as written"
    result = onnx.ModelProto()
    result.CopyFrom(batched)
    outer = result.graph
    names = {tensor.name: tensor for tensor in outer.initializer}
    renamed: dict[str, str] = {}  # an initializer of the original whose name the batched graph gives another tensor
    for tensor in original.graph.initializer:
        if tensor.name not in names:
            outer.initializer.append(tensor)
        elif names[tensor.name].SerializeToString() != tensor.SerializeToString():
            renamed[tensor.name] = f"alone/{tensor.name}"
            outer.initializer.append(tensor)
            outer.initializer[-1].name = renamed[tensor.name]
    outputs = [info.name for info in outer.output]
    alone = _branch("alone", original.graph.node, outputs, renamed, outer.output)
    lowered = _branch("batched", outer.node, outputs, {}, outer.output)
    sizes = _SizeReader(sources, "autobatch/below_two")
    small = [sizes.node("Less", [sizes.read(symbol, scalar=True), sizes.constant(np.array(2), f"{sizes.prefix}/two/{k}")],
                        f"{sizes.prefix}/{k}/small") for k, symbol in enumerate(sources)]
    condition = small[0]
    for k, other in enumerate(small[1:]):
        condition = sizes.node("Or", [condition, other], f"{sizes.prefix}/any/{k}")
    sizes.nodes.append(helper.make_node("If", [condition], outputs, name=AS_WRITTEN_BELOW_TWO,
                                        then_branch=alone, else_branch=lowered))
    del outer.node[:]
    outer.node.extend(sizes.nodes)
    outer.initializer.extend(sizes.constants)
    known = {(o.domain, o.version) for o in result.opset_import}
    result.opset_import.extend(o for o in original.opset_import if (o.domain, o.version) not in known)
    result.functions.extend(f for f in original.functions if all(f.name != g.name for g in result.functions))
    return result


def _branch(prefix: str, nodes: Sequence[onnx.NodeProto], outputs: list[str], renamed: Mapping[str, str],
            infos: Sequence[onnx.ValueInfoProto]) -> onnx.GraphProto:
    """``nodes`` as an If branch giving ``outputs``: the values they make renamed ``prefix/...``
    (a branch may not make a name the outer graph has), reads of renamed weights followed."""
    made = {name for node in nodes for name in node.output if name}
    new = {**renamed, **{name: f"{prefix}/{name}" for name in made}}
    branch = onnx.GraphProto(name=prefix)
    for node in nodes:
        copy = branch.node.add()
        copy.CopyFrom(node)
        copy.input[:] = [new.get(name, name) for name in node.input]
        copy.output[:] = [new.get(name, name) for name in node.output]
    for name, info in zip(outputs, infos):
        result = f"{prefix}/{name}"
        if name not in made:  # an input or a weight given back as it is
            branch.node.append(helper.make_node("Identity", [new.get(name, name)], [result]))
        branch.output.append(helper.make_value_info(result, info.type))
    return branch


def _symbols_of_entries(tensor: onnx.TensorProto, values: Sequence[np.ndarray],
                        sizes: Sequence[Mapping[Symbol, int]]) -> list[Term | None] | str:
    """For a constant that differs between trials, each entry as ``a * size + b`` of one symbol
    (a flattened ``[3L]``), fitted to two trials and holding in every other (None: fixed)."""
    what = f"constant {tensor.name!r} of its batched graph changes with the sizes of its symbolic dimensions"
    if tensor.data_type not in SIZE_DTYPES:
        return f"{what}, and it is of {onnx.TensorProto.DataType.Name(tensor.data_type)}, not a size"
    shapes = sorted({v.shape for v in values})
    if len(shapes) != 1:
        return f"{what} in its shape too ({', '.join(map(str, shapes))} in the trials)"
    if values[0].ndim > 1:
        return f"{what}, and it is of rank {values[0].ndim}, not a list of sizes"
    columns = np.stack([v.reshape(-1) for v in values])  # trial x entry
    entries: list[Term | None] = []
    for column in columns.T:
        if (column == column[0]).all():
            entries.append(None)
            continue
        term = next((term for term in map(functools.partial(_affine, column, sizes), sizes[0]) if term), None)
        if term is None:
            return (f"constant {tensor.name!r} of its batched graph holds an entry that follows its symbolic "
                    f"dimensions but is no a * size + b of one of them ({', '.join(map(str, column))} in the trials)")
        entries.append(term)
    return entries


def _affine(column: np.ndarray, sizes: Sequence[Mapping[Symbol, int]], symbol: Symbol) -> Term | None:
    """``(symbol, a, b)`` where the entries are ``a * size + b`` of the symbol in every trial."""
    xs, ys = [trial[symbol] for trial in sizes], [int(c) for c in column]
    if xs[-1] == xs[-2] or (ys[-1] - ys[-2]) % (xs[-1] - xs[-2]):
        return None
    a = (ys[-1] - ys[-2]) // (xs[-1] - xs[-2])
    b = ys[-1] - a * xs[-1]
    return (symbol, a, b) if a and all(y == a * x + b for x, y in zip(xs, ys)) else None


def _read_sizes_at_run_time(graph: onnx.GraphProto, follow: Mapping[str, list[Term | None]],
                            sources: Mapping[Symbol, list[tuple[str, int]]], original: Graph) -> None:
    """Each varying constant made at the graph's start from the fixed entries and the input dims;
    the inputs that share a symbol checked to agree."""
    sizes = _SizeReader(sources)
    for symbol, places in sources.items():
        if len(places) > 1:
            sizes.check_agreement(symbol, graph, original)
    kept = []
    for tensor in graph.initializer:
        entries = follow.get(tensor.name)
        if entries is None:
            kept.append(tensor)
            continue
        array = numpy_helper.to_array(tensor)
        target = tensor.name if tensor.data_type == onnx.TensorProto.INT64 else f"{tensor.name}/int64"
        if array.ndim == 0:
            sizes.node("Identity", [sizes.term(entries[0], scalar=True)], target)
        else:
            pieces = []
            for start, entry in enumerate(entries):
                if entry is not None:
                    pieces.append(sizes.term(entry, scalar=False))
                elif start == 0 or entries[start - 1] is not None:  # a run of fixed entries: one constant
                    end = next((k for k in range(start, len(entries)) if entries[k] is not None), len(entries))
                    pieces.append(sizes.constant(array[start:end].astype(np.int64), f"{tensor.name}/{start}"))
            sizes.node("Concat", pieces, target, axis=0)
        if target != tensor.name:
            sizes.node("Cast", [target], tensor.name, to=tensor.data_type)
    del graph.initializer[:]
    graph.initializer.extend(kept + sizes.constants)
    nodes = sizes.nodes + list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes)


class _SizeReader:
    """The nodes that read each symbol's size from the inputs' shapes (from the first input that
    carries it), each once."""

    def __init__(self, sources: Mapping[Symbol, list[tuple[str, int]]], prefix: str = "autobatch/sizes") -> None:
        self.sources = sources
        self.prefix = prefix  # of the values made here
        self.nodes: list[onnx.NodeProto] = []
        self.constants: list[onnx.TensorProto] = []
        self.read_as: dict[tuple[Symbol, bool], str] = {}  # a symbol, as a scalar or a row of one: its value
        self.shapes: dict[str, str] = {}  # an input: its Shape
        self.terms: dict[tuple[Term, bool], str] = {}  # a term, as a scalar or a row of one: its value

    def read(self, symbol: Symbol, scalar: bool) -> str:
        if (symbol, scalar) not in self.read_as:
            name, axis = self.sources[symbol][0]
            key = f"{self.prefix}/{len(self.read_as)}"
            at = self.constant(np.array(axis if scalar else [axis]), f"{key}/at")
            self.read_as[symbol, scalar] = self.node("Gather", [self.shape(name), at], key)
        return self.read_as[symbol, scalar]

    def term(self, term: Term, scalar: bool) -> str:
        """``a * size + b`` of the symbol, as a scalar or a row of one."""
        if (term, scalar) not in self.terms:
            symbol, a, b = term
            value = self.read(symbol, scalar)
            key = f"{value}/times/{a}/plus/{b}"
            if a != 1:
                value = self.node("Mul", [value, self.constant(np.array(a), f"{key}/a")], f"{key}/ax")
            if b:
                value = self.node("Add", [value, self.constant(np.array(b), f"{key}/b")], key)
            self.terms[term, scalar] = value
        return self.terms[term, scalar]

    def check_agreement(self, symbol: Symbol, graph: onnx.GraphProto, original: Graph) -> None:
        """Every input that carries ``symbol`` of the same size at run time, else the run fails in
        a node whose name says so: their sizes less the first's index a constant of one entry. The
        check is added (as 0) to an input that the graph reads, so that no optimizer drops it
        (onnxruntime's folds a reshape's target built from the first input's shape, check and all)."""
        places = self.sources[symbol]
        key = f"{self.prefix}/agree/{len(self.shapes)}-{len(self.nodes)}"
        sizes = [self.node("Gather", [self.shape(name), self.constant(np.array([axis]), f"{key}/{k}/at")], f"{key}/{k}")
                 for k, (name, axis) in enumerate(places)]
        every = self.node("Concat", sizes, f"{key}/every", axis=0)
        apart = self.node("Abs", [self.node("Sub", [every, sizes[0]], f"{key}/apart")], f"{key}/distance")
        named = "_".join(dict.fromkeys(name for name, _ in places))
        check = self.node("Gather", [self.constant(np.array([0]), f"{key}/zero"), apart],
                          f"{key}/these_inputs_must_agree_in_size:{named}")
        zero = self.node("ReduceMax", [check], f"{key}/zero_once_agreed", keepdims=1)
        read = {name for node in graph.node for name in node.input}
        carrier = next((name for name, _ in places if name in read and original.values[name].type.dtype.kind in "fiu"),
                       None)
        if carrier is None:
            return  # (no numeric input that the graph reads carries it: its inputs stay unchecked)
        dtype = original.values[carrier].type.elem_type
        checked = self.node("Add", [carrier, self.node("Cast", [zero], f"{key}/as_input", to=dtype)], f"{key}/{carrier}")
        for node in graph.node:
            node.input[:] = [checked if name == carrier else name for name in node.input]

    def shape(self, name: str) -> str:
        if name not in self.shapes:
            self.shapes[name] = self.node("Shape", [name], f"{self.prefix}/shape/{len(self.shapes)}")
        return self.shapes[name]

    def node(self, op_type: str, inputs: list[str], output: str, **attributes: object) -> str:
        self.nodes.append(helper.make_node(op_type, inputs, [output], name=output, **attributes))
        return output

    def constant(self, array: np.ndarray, name: str) -> str:
        self.constants.append(numpy_helper.from_array(array.astype(np.int64), name))
        return name


def _declare_as_given(graph: onnx.GraphProto, original: Graph) -> None:
    """Inputs and outputs typed as the original declares them (symbolic dims, not a trial's sizes);
    the trial's inner shapes dropped."""
    for infos in (graph.input, graph.output):
        for info in infos:
            value = original.values.get(info.name)
            if value is not None and value.type is not None:
                info.type.CopyFrom(value.type.proto)
    del graph.value_info[:]
