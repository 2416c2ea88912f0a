"""The plan's contract: what the flat planner (``batcher.flat``) makes, and what the executor
(``backends.flat_executor``) and the lowering to one ONNX graph (``backends.lowering``) read.

A plan is arenas and steps. Every per-instance value of one (dtype, shape) lives in one arena
array, a row a value; a ragged step's result is a *block*, an arena of its own with each
member's rows after the last's. A step is one launch: the rows each stacked operand reads, the
template to run, and the rows its outputs fill.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from onnx import TensorProto, helper

from autobatch.batcher.folds import Level
from autobatch.batcher.sequences import COST, Chunk, chunks, row_step_flops
from autobatch.ir import Graph

# Element types an arena holds as a plain NumPy array (the others need ml_dtypes conversions).
ARENA_TYPES = frozenset({
    TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BOOL, TensorProto.INT8,
    TensorProto.INT16, TensorProto.INT32, TensorProto.INT64, TensorProto.UINT8, TensorProto.UINT16,
    TensorProto.UINT32, TensorProto.UINT64,
})

ARENA_DTYPES = frozenset(np.dtype(helper.tensor_dtype_to_np_dtype(t)) for t in ARENA_TYPES)


class NotFlat(Exception):
    """A batch this path cannot plan (a tree fold's children not known when traced); the
    message says why."""


Kind = tuple[int, tuple[int, ...]]  # an arena's rows: (ONNX element type, per-instance shape)


@dataclass
class BatchReport:
    """What one batching run did. ``launches`` counts batched ops plus nodes run alone;
    ``lower_bound`` is ED-Batch's bound for the same graph (``bound``: it, or how to work it
    out when first asked for, which costs a pass over the graph that planning did not need).
    The bound counts every class; rows picked where they lie (``Layout._picked_rows``) cost no
    launch, so ``launches`` may fall below it."""

    scheduler: str
    nodes: int
    launches: int
    bound: int | Callable[[], int]
    fallback_nodes: int
    gathers: int
    gathers_avoided: int
    merged_duplicates: int
    seconds: dict[str, float] = field(default_factory=dict)  # batching: analyse, schedule, plan/rewrite
    execution: dict[str, float] = field(default_factory=dict)  # flat path: gather, kernels, scatter
    alone: dict[str, int] = field(default_factory=dict)  # "op: why" -> nodes run one at a time
    launches_by_op: dict[str, int] = field(default_factory=dict)  # flat path: op type -> its steps
    # "op: why" -> nodes of a model whose instances ran in a class per shape (neither ragged nor
    # padded batching took them; a mix of instances apart only)
    by_shape: dict[str, int] = field(default_factory=dict)

    @property
    def lower_bound(self) -> int:
        if callable(self.bound):
            self.bound = self.bound()
        return self.bound

    @property
    def ratio(self) -> float:
        return self.launches / self.lower_bound if self.lower_bound else 1.0

    def __str__(self) -> str:
        timing = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in {**self.seconds, **self.execution}.items())
        why, shapes = _most(self.alone), _most(self.by_shape)
        return (
            f"{self.nodes} nodes -> {self.launches} launches ({self.scheduler}); lower bound "
            f"{self.lower_bound} (ratio {self.ratio:.2f}); {self.fallback_nodes} nodes ran one at a time"
            f"{f' ({why})' if why else ''}; {self.gathers} gathers, {self.gathers_avoided} avoided; "
            f"{self.merged_duplicates} duplicates merged"
            + (f"; {sum(self.by_shape.values())} nodes of the model ran a class per shape ({shapes})" if shapes else "")
            + (f"; {timing}" if timing else "")
        )


def _most(reasons: dict[str, int], kept: int = 3) -> str:
    """The ``kept`` commonest reasons, with their counts."""
    return ", ".join(f"{n} x {reason}" for reason, n in sorted(reasons.items(), key=lambda item: -item[1])[:kept])


@dataclass(eq=False)
class Template:
    """One signature class batched by its rule. Inputs: ``x{i}`` for stacked operand i
    (``[N, *shape]``), ``w{i}`` for a shared operand fed as it is. Outputs ``[N, *shape]``,
    or a single value when ``once`` (every operand shared: the members are duplicates). A
    ``solo`` template is the op itself, run for one member at a time (also ``once``)."""

    graph: Graph
    stacked: list[int]
    fed: list[int]
    once: bool
    solo: bool = False  # the op itself on one member's values (no rule batches it): reads rows, not [N] stacks
    reason: str = ""  # why a solo template's class runs one member at a time
    ragged: bool = False  # the op itself on every member's rows concatenated (``batcher.ragged``)
    # A recurrent layer over chunks of padded sequences (``batcher.sequences``): the ONNX index
    # of each output the template gives.
    sequences: tuple[int, ...] | None = None
    # A ragged op that only reshapes each row (``ROW_RESHAPES``): the row shape it makes, run as
    # a NumPy reshape of the rows (a view), whatever the backend.
    row_shape: tuple[int, ...] | None = None
    # A loss over rows (``batcher.ragged.ROW_LOSS``): the template gives one value a row, and
    # this reduces each member's run of them.
    segment: RowReduction | None = None
    # A ragged template's rows run along this axis of its per-instance operands, and along
    # ``out_axes`` of its outputs (leading axes of 1 before it: ``[1, L, d]``); it reads and
    # writes them as ``[rows, *row]`` all the same.
    length_axis: int = 0
    out_axes: tuple[int, ...] = ()
    # The inputs (named as its subgraphs read them) that a solo template's op reads from
    # outside through its subgraphs, fed after the stacked operands.
    captured: tuple[str, ...] = ()
    runners: dict[Any, Any] = field(default_factory=dict)  # backend key -> prepared runner
    # Templates made from this one, by what they change (``batcher.joined_operands``): made once,
    # so that their runners are prepared once.
    variants: dict[str, Any] = field(default_factory=dict)

    @property
    def stacks_members(self) -> bool:
        """Whether it maps each member's stacked operands to its rows of the outputs, and no
        more: not solo, once, ragged, a recurrent layer's, a row reshape, a loss over rows, nor
        reading values its subgraphs capture."""
        return not (self.solo or self.once or self.ragged or self.sequences or self.row_shape is not None
                    or self.segment is not None or self.captured)


# What plans learnt of record keys (``flat.plan_records``' ``known``), as many as a caller that
# keeps it across plans keeps (``InferenceSession`` across mixes, a traced block across runs).
KEYS_KEPT = 65536


class TemplateCache:
    """The templates that plans were made of, by key (an op, its attributes, its operands'
    specs), and the cell functions whose ids are part of those keys (kept alive with them: a new
    function given a dead one's id would otherwise find their entries). Owned by whoever runs
    the plans (each ``InferenceSession``; ``autobatch.batch.TRACED_TEMPLATES`` for traced
    batches), since templates keep the runs their executors prepared. ``make_room``, between
    plans, keeps the ``size // 2`` most recently used once it holds ``size`` keys (emptying it
    would make a server prepare every template of its next batches again at once), and empties
    it once ``size`` functions were seen (a function's id may be reused once it is gone)."""

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self.templates: _UsedLast = _UsedLast()
        self.functions: dict[int, Any] = {}

    def make_room(self) -> None:
        if len(self.functions) >= self.size:
            self.templates.clear()
            self.functions.clear()
        if len(self.templates) >= self.size:
            while len(self.templates) > self.size // 2:
                self.templates.popitem(last=False)


class _UsedLast(OrderedDict):
    """Templates by key, the most recently read or written last; entries go only in
    ``TemplateCache.make_room``, so none goes between a plan's lookups."""

    def __getitem__(self, key: Any) -> Any:
        value = super().__getitem__(key)
        self.move_to_end(key)
        return value

    def get(self, key: Any, default: Any = None) -> Any:
        return self[key] if key in self else default


@dataclass(frozen=True)
class RowReduction:
    """A ReduceSum or ReduceMean over axis 0 of members of different lengths: each member's run
    of rows reduced in NumPy on every backend, as a sum of terms is."""

    mean: bool
    keepdims: bool


@dataclass(frozen=True)
class Runs:
    """Rows of values kept in a block (``Block``), ``length`` rows each, each value of ``shape``:
    read as ``[values, *shape]``."""

    rows: slice | np.ndarray
    length: int
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Shaped:
    """Rows read as ``shape``: one value kept in a block whose rows are not its leading axis
    (``[1, L, d]`` kept as ``L`` rows of ``[d]``), or values read as rows for a ragged step."""

    rows: Any  # Rows
    shape: tuple[int, ...]


class Pieces(list):
    """(arena, row or run of rows) per value, for values kept in several ways: read one by one."""


@dataclass(frozen=True)
class Copied:
    """Rows read as a copy of their own, not a view: a wanted row picked from a block that holds
    another wanted value, or the rows a stack reads into its block (results share no memory)."""

    rows: Any  # Rows


@dataclass(frozen=True)
class Padded:
    """Values of different shapes (``shapes``) read as one stack ``[values, *shape]``, each at
    the start of its slot, the rest zeros; but, with ``fill`` ``(axis, value)``, ``value`` past
    each value's end along that axis of its own (``batcher.padding``)."""

    pieces: Pieces
    shape: tuple[int, ...]
    fill: tuple[int, float] | None
    shapes: tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class Unpadded:
    """A padded step's result ``[values, ...]`` written a value at a time: value ``m`` is the
    start of slot ``m`` (``shapes[m]``), put at ``places[m]`` (arena, row)."""

    places: list[tuple[int, int]]
    shapes: tuple[tuple[int, ...], ...]


Rows = slice | np.ndarray | int | str | list[str] | Runs | Pieces | Shaped | Padded | Copied  # a list: the names of literals (arena ``LITERALS``)
LITERALS = -1  # the "arena" of reads stacked straight from literal values
# The "arena" of loose values, kept one by one as they are (a sequence, a bfloat16 array, a
# tensor whose shape is known once computed); the "row" is the value's name: a loose step's
# result of this run, else a literal, else a weight.
LOOSE = -2


@dataclass(frozen=True)
class Block:
    """A write of a ragged step's whole result as the arena itself: its members' rows one after
    the other, no copy (the arena is not allocated; the step's result becomes it)."""

    arena: int


@dataclass
class Step:
    """One launch. ``template`` None: a sum of terms or a ``segment`` reduction, ``offsets``
    where each member's rows start. A ragged step (``groups`` set: the members' lengths and how
    many have each) reads per operand every member's rows one after the other: one (arena, rows),
    or a list of them, one per group (``[members, length, ...]`` each); it writes a ``Block`` per
    output, or a plain (arena, first row) for an output of one row a member. A recurrent layer's
    step (its template's ``sequences`` set) runs in padded calls: ``chunked(size)``."""

    template: Template | None
    size: int
    reads: list[Any]  # per stacked operand: (arena, rows) (a solo step: one row), or a list of them per group
    weights: list[str]  # per fed operand: the shared value's name
    writes: list[Any]  # per output: (arena, first row), a Block, or Unpadded
    offsets: np.ndarray | None = None
    groups: list[tuple[int, int]] | None = None  # (length, members) in the order the members' rows are read
    segment: RowReduction | None = None
    fold: list[Level] | None = None  # a fold's launches: the leaves', then a level's each (``batcher.folds``)
    _chunks: dict[int | str | None, list[Chunk]] = field(default_factory=dict)

    def chunked(self, size: int | str | None) -> list[Chunk]:
        """A recurrent layer's members in padded calls of ``size`` (None: one call; ``COST``:
        as many as ``batcher.sequences.CALL_COST`` models as fastest), longest first; worked out
        once a size, as a plan may serve many runs."""
        parts = self._chunks.get(size)
        if parts is None:
            assert self.groups is not None
            lengths = [length for length, count in self.groups for _ in range(count)]
            # (by cost where the layer's arithmetic is known, else chunks of the fixed size)
            parts = self._chunks[size] = chunks(lengths, row_flops=row_step_flops(self.template)) if size == COST \
                else chunks(lengths, size or len(lengths))
        return parts


@dataclass
class FlatPlan:
    kinds: list[Kind]  # of each arena
    rows: list[int]  # rows of each arena
    blocks: set[int]  # arenas that are a ragged step's result (``Block``), not allocated
    literal_runs: list[tuple[int, int, list[str]]]  # (arena, first row, literals): values given at run time
    steps: list[Step]
    locations: dict[str, tuple[int, int | slice]]  # wanted value -> (arena, row), or its rows in a block
    report: BatchReport
