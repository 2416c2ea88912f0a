"""Runs a flat plan (``autobatch.batcher.flat``): arenas of rows, one template call a step.

Each template is prepared once per backend (a NumPy ``Interpreter``, or onnxruntime sessions on
the CPU: one that feeds the weights, and ones with the stable weights baked in) and kept on the
template, which the batcher caches across batches: a later batch of the same model prepares
nothing. Template runs skip the feed checks of a user-facing run: the planner made every feed,
and each step costs microseconds that add up over hundreds of steps a minibatch.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any

import numpy as np
import onnxruntime as ort
from onnx import ModelProto, helper, numpy_helper

from autobatch.backends.arena_pool import MIN_POOLED_BYTES, ArenaPool
from autobatch.backends.baked_weights import BAKE_MIN_BYTES, BAKE_MIN_LAUNCHES, Snapshot, WeightSnapshots, is_frozen
from autobatch.backends.interpreter import Interpreter, NodeExecutionError, describe
from autobatch.backends.ort_runtime import NUMPY_LESS_TYPES, OrtSettings, declare_ranks_only, new_session, run_session
from autobatch.ir.records import LEAF
from autobatch.batcher.plan import (LITERALS, LOOSE, Block, Copied, FlatPlan, Padded, Pieces, Rows, Runs, Shaped, Step,
                                    Template, Unpadded)
from autobatch.batcher.joined_operands import joined_step
from autobatch.batcher.sequences import COST, RECURRENT, run_chunks
from autobatch.ir import Graph, Recent, to_onnx
from autobatch.ir.limits import DeadlineExceeded, check_deadline

TemplateRun = Callable[[dict[str, Any]], list[Any]]  # feeds by input name -> the graph's outputs
# onnxruntime packs these inputs (by index) of these ops when constant
PACKED_INPUTS = {"MatMul": (1,), "Gemm": (1,), **{op: (1, 2) for op in RECURRENT}}
BAKED_SESSIONS_KEPT = 8  # a template's sessions with weights baked in (say, one per LSTM direction)


class OrtTemplate:
    """A template graph as onnxruntime sessions, its batch size left symbolic: one that feeds
    every weight, and ones that bake in the stable weights that onnxruntime packs when they are
    constants (``bakeable``: ``PACKED_INPUTS``), so that it packs them once
    (``backends.baked_weights``)."""

    def __init__(self, graph: Graph, settings: OrtSettings, ranks_only: bool = False) -> None:
        """``ranks_only``: declare the inputs' ranks, not their dimensions (a solo template's
        inputs have one member's inferred shapes: ``declare_ranks_only``)."""
        self.graph = graph
        self.ranks_only = ranks_only
        self.name = graph.name
        self.outputs = list(graph.outputs)
        self.settings = settings
        fed = {name for name in graph.inputs if name.startswith("w")}
        self.bakeable = frozenset(node.inputs[i] for node in graph.nodes.values() if not node.domain
                                  for i in PACKED_INPUTS.get(node.op_type, ()) if node.inputs[i] in fed)
        self._fed: ort.InferenceSession | None = None  # made when first needed: a template may only ever run baked
        self._baked: Recent = Recent(BAKED_SESSIONS_KEPT)
        # onnxruntime aborts the process on a recurrent layer over no steps or no sequences:
        # a template with one runs empty feeds on the NumPy interpreter.
        recurrent = any(node.op_type in RECURRENT and not node.domain for node in graph.nodes.values())
        self._numpy = Interpreter(graph) if recurrent else None

    @property
    def baked_sessions(self) -> int:
        return len(self._baked)

    def _session(self, model: ModelProto) -> ort.InferenceSession:
        # onnxruntime validates the model itself; onnx.checker would refuse a model-local function
        # imported at another opset than the model (a cell made from an older ONNX model).
        return new_session(model, self.settings.template_options, self.settings.providers)

    def _model(self) -> ModelProto:
        model = to_onnx(self.graph, check=False)
        return declare_ranks_only(model) if self.ranks_only else model

    def __call__(self, feeds: dict[str, Any], baked: Mapping[str, Snapshot] | None = None) -> list[Any]:
        """``baked``: the stable weights among the feeds, by input name (only those in ``bakeable``)."""
        if self._numpy is not None and any(value.size == 0 for value in feeds.values()):
            return self._numpy.run_trusted(feeds)
        if baked:
            key = tuple(baked.items())
            session = self._baked.get(key)
            if session is None:
                session = self._baked[key] = self._baked_session(baked)
            feeds = {name: value for name, value in feeds.items() if name not in baked}
        else:
            session = self._fed
            if session is None:
                session = self._fed = self._session(self._model())
        try:
            return run_session(session.run, self.outputs, feeds)
        except DeadlineExceeded:
            raise
        except Exception as error:  # onnxruntime raises its own exception types
            raise NodeExecutionError(f"{self.name} failed on inputs {describe(list(feeds.values()))}: {error}") from error

    def _baked_session(self, baked: Mapping[str, Snapshot]) -> ort.InferenceSession:
        """The template with these inputs turned into initializers of their snapshots' values."""
        model = self._model()
        inputs = [value for value in model.graph.input if value.name not in baked]
        del model.graph.input[:]
        model.graph.input.extend(inputs)
        model.graph.initializer.extend(numpy_helper.from_array(snapshot.copy, name) for name, snapshot in baked.items())
        return self._session(model)


def runs_on_onnxruntime(template: Template) -> bool:
    """False for a solo template onnxruntime's Python API cannot take (a loose sequence,
    optional, bfloat16 or float8 value, a value of unknown type) or with a subgraph (whose body
    names the template does not own): the NumPy interpreter runs it."""
    graph = template.graph
    inputs = (graph.values[name].type for name in graph.inputs)
    outputs = (graph.values[name].type for name in graph.outputs)
    takes = all(vtype is not None and vtype.is_tensor and vtype.elem_type not in NUMPY_LESS_TYPES for vtype in inputs) \
        and all(vtype is None or vtype.is_tensor and vtype.elem_type not in NUMPY_LESS_TYPES for vtype in outputs)
    return takes and not any(True for node in graph.nodes.values() for _ in node.subgraphs())


def onnxruntime_template(template: Template, settings: OrtSettings) -> TemplateRun:
    """A template's runner on onnxruntime: its sessions, or the NumPy interpreter where
    ``runs_on_onnxruntime`` says no."""
    if runs_on_onnxruntime(template):
        return OrtTemplate(template.graph, settings, ranks_only=template.solo)
    return Interpreter(template.graph).run_trusted


class FlatExecutor:
    """``prepare(template)`` makes a template runnable on the backend; ``backend_key`` names
    that backend's configuration (templates keep one prepared run per key)."""

    def __init__(self, prepare: Callable[[Template], TemplateRun], backend_key: Hashable,
                 snapshots: WeightSnapshots | None = None, sequence_chunk: int | str | None = COST) -> None:
        self.prepare = prepare
        self.backend_key = backend_key
        self.snapshots = snapshots  # given: runners with ``bakeable`` inputs may bake stable weights
        # Sequences a padded call of a recurrent layer (``COST``: as ``batcher.sequences.CALL_COST``
        # models fastest; None: all in one call, for a backend whose layer skips the rows of
        # finished sequences).
        self.sequence_chunk = sequence_chunk

    def runner(self, template: Template) -> TemplateRun:
        runner = template.runners.get(self.backend_key)
        if runner is None:
            runner = template.runners[self.backend_key] = self.prepare(template)
        return runner

    def run(self, plan: FlatPlan, weights: Mapping[str, np.ndarray], literals: Mapping[str, Any],
            seconds: dict[str, float] | None = None, pool: ArenaPool | None = None) -> Values:
        """Every value once every step has run, by its location (``plan.locations`` says where each is).
        ``literals``: the value of every literal the plan names (a plan may serve many runs).
        ``seconds`` receives the time spent in gathers (literals placed, weights checked for
        baking, operands stacked), template runs (kernels, with the backend's own call
        overhead) and arena writes. ``pool``: where the arenas' memory comes from, for a caller
        that gives it back (``Values.release``) once it knows which values it keeps."""
        clock = time.perf_counter
        start = clock()
        arenas, buffers = _arenas(plan, pool)
        loose = Loose(literals, weights)
        for arena, first, names in plan.literal_runs:
            np.stack([literals[name] for name in names], out=arenas[arena][first:first + len(names)])
        baked_by_step = self._baked_by_step(plan, weights) if self.snapshots is not None else None
        gather = clock() - start
        kernels = scatter = 0.0
        for k, step in enumerate(plan.steps):
            check_deadline()
            begin = clock()
            template, reads = step.template, step.reads
            if step.groups:  # ragged: every member's rows, one after the other
                stacked = [_concatenated(arenas, loose, parts) if isinstance(parts, list)
                           else _read(arenas, loose, *parts) for parts in reads]
            else:
                joined = joined_step(step) if template is not None and step.fold is None else None
                if joined is not None:  # the operands a Concat joins, read joined
                    template, reads = joined
                stacked = [_read(arenas, loose, a, rows) for a, rows in reads]
            gathered = clock()
            if step.fold is not None:  # a tree fold: the leaves, then a level at a time
                outputs = self._fold(plan, step, stacked[0], weights, baked_by_step[k] if baked_by_step else None)
            elif template is None:  # a sum of terms or a segment reduction: each member's run of rows
                outputs = [_reduced(stacked[0], step)]
            elif template.row_shape is not None:
                outputs = [stacked[0].reshape(len(stacked[0]), *template.row_shape)]
            else:
                feeds = {f"w{i}": weights[name] for i, name in zip(template.fed, step.weights)}
                runner = self.runner(template)
                baked = baked_by_step[k][0] if baked_by_step is not None else None
                run = functools.partial(runner, baked=baked) if baked else runner
                if template.sequences:  # a recurrent layer, chunk by chunk
                    results = [_sequence_result(plan, write, step.size) for write in step.writes]
                    parts = step.chunked(self.sequence_chunk)
                    outputs = run_chunks(run, feeds, stacked[0], parts, template.sequences, results,
                                         dict(zip(template.stacked[1:], stacked[1:])))
                else:
                    feeds.update((f"x{i}", value) for i, value in zip(template.stacked, stacked))
                    feeds.update(zip(template.captured, stacked[len(template.stacked):]))
                    outputs = run(feeds)
                    if template.segment is not None:  # a loss a row: each member's sum or mean
                        outputs = [_reduced(outputs[0], step)]
            ran = clock()
            for write, value in zip(step.writes, outputs):
                if type(write) is Block:
                    elem_type, shape = plan.kinds[write.arena]
                    _fits(value, (plan.rows[write.arena], *shape), helper.tensor_dtype_to_np_dtype(elem_type), step)
                    arenas[write.arena] = value
                elif type(write) is Unpadded:  # each member's value, cut from its padded slot
                    for m, ((arena, row), shape) in enumerate(zip(write.places, write.shapes)):
                        slot = arenas[arena][row, ...]
                        part = value[(m, *map(slice, shape))]
                        _fits(part, slot.shape, slot.dtype, step)
                        slot[...] = part
                elif write[0] == LOOSE:  # kept as it is
                    loose[write[1]] = value
                else:
                    slot = arenas[write[0]][write[1], ...] if template is not None and template.once else \
                        arenas[write[0]][write[1]:write[1] + step.size]  # views, 0-d ones too
                    _fits(value, slot.shape, slot.dtype, step)
                    slot[...] = value
            gather += gathered - begin
            kernels += ran - gathered
            scatter += clock() - ran
        if seconds is not None:
            seconds.update(gather=gather, kernels=kernels, scatter=scatter)
        return Values(arenas, loose, pool, buffers)

    def _fold(self, plan: FlatPlan, step: Step, leaves: np.ndarray, weights: Mapping[str, np.ndarray],
              baked: list[dict[str, Snapshot]] | None) -> list[np.ndarray]:
        """Every state of every node of a fold step's trees (``batcher.folds``); ``baked``: per
        launch, the weights baked in."""
        states = [_block_array(plan, write) for write in step.writes]
        for j, level in enumerate(step.fold):  # type: ignore[arg-type]
            feeds = {f"w{i}": weights[name] for i, name in zip(level.template.fed, level.weights)}
            feeds.update((f"x{i}", leaves[rows] if k == LEAF else states[k][rows])
                         for i, (k, rows) in zip(level.template.stacked, level.operands))
            runner = self.runner(level.template)
            outputs = runner(feeds, baked[j]) if baked and baked[j] else runner(feeds)
            for state, value in zip(states, outputs):
                state[level.nodes] = value if level.repeat is None else value[level.repeat]
        return states

    def _launches(self, step: Step) -> list[tuple[Template, list[str], int]]:
        """A step's templates: (template, the weight each fed input reads, times it runs)."""
        if step.fold is not None:
            return [(level.template, level.weights, 1) for level in step.fold]
        if step.template is None:
            return []
        runs = len(step.chunked(self.sequence_chunk)) if step.template.sequences else 1
        return [(step.template, step.weights, runs)]

    def _baked_by_step(self, plan: FlatPlan, weights: Mapping[str, np.ndarray]) -> list[list[dict[str, Snapshot]]]:
        """Per step, per template it runs (``_launches``), the weights its runner reads baked
        this run, by input name: those it may bake (``bakeable``) that are big enough, launched
        often enough (or frozen, or a recurrent layer's), and unchanged since their snapshot
        (checked once a run)."""
        bakeable_by_step: list[list[list[tuple[str, str]]]] = []  # per step, per template: (input, weight)
        launches: dict[str, int] = {}
        recurrent: set[str] = set()  # read by a recurrent layer, which packs them whole a call
        for step in plan.steps:
            per_template = []
            for template, names, runs in self._launches(step):
                bakeable = getattr(self.runner(template), "bakeable", ())
                pairs = [(f"w{i}", name) for i, name in zip(template.fed, names) if f"w{i}" in bakeable]
                for _, name in pairs:
                    launches[name] = launches.get(name, 0) + runs
                    if template.sequences:
                        recurrent.add(name)
                per_template.append(pairs)
            bakeable_by_step.append(per_template)
        stable: dict[str, Snapshot] = {}
        for name, count in launches.items():
            array = weights[name]
            if (isinstance(array, np.ndarray) and array.nbytes >= BAKE_MIN_BYTES
                    and (count >= BAKE_MIN_LAUNCHES or name in recurrent or is_frozen(array))):  # a frozen one costs no compare
                snapshot = self.snapshots.stable(array)  # type: ignore[union-attr]
                if snapshot is not None:
                    stable[name] = snapshot
        return [[{feed: stable[name] for feed, name in pairs if name in stable} for pairs in per_template]
                for per_template in bakeable_by_step]


class Loose(dict):
    """A run's loose values by name (``batcher.plan.LOOSE``): loose steps' results, else the
    literals, else the weights (a subgraph may read one)."""

    def __init__(self, literals: Mapping[str, Any], weights: Mapping[str, Any]) -> None:
        super().__init__()
        self.literals = literals
        self.weights = weights

    def __missing__(self, name: str) -> Any:
        return self.literals[name] if name in self.literals else self.weights[name]


class Values:
    """What a plan's run computed: ``values[location]`` is the value at a plan location (a view
    of an arena's row or rows, or a loose value)."""

    def __init__(self, arenas: list[np.ndarray], loose: Loose, pool: ArenaPool | None = None,
                 buffers: list[np.ndarray] | None = None) -> None:
        self.arenas = arenas
        self.loose = loose
        self._pool, self._buffers = pool, buffers or []

    @property
    def pooled(self) -> bool:
        """Whether any arena's memory came from a pool (``release`` gives it back)."""
        return bool(self._buffers)

    def release(self, kept: Iterable[Any] = ()) -> None:
        """The memory of the arenas back to the pool it came from, but of those any of ``kept``
        (the values the caller holds) is a view of, whichever arena it was read from: a block
        may be a view of another arena (a row reshape's, an interpreter's Identity). Reading a
        value of the plan now raises."""
        held, unsure = set(), {}
        for value in kept:
            if isinstance(value, np.ndarray):
                owner = _memory_of(value)
                held.add(id(owner))
                if owner.base is not None:  # its memory's owner is no array (``as_strided``'s): compare addresses
                    unsure[id(owner)] = owner  # (once an owner: a block's rows share one)
        if self._pool is not None:
            self._pool.give([buffer for buffer in self._buffers if id(buffer) not in held
                             and not any(np.may_share_memory(owner, buffer) for owner in unsure.values())])
        self.arenas, self._buffers = [], []

    def __getitem__(self, location: tuple[int, Any]) -> Any:
        arena, rows = location
        if type(rows) is int and arena >= 0:  # one value's row, a view (0-d too): the common case, kept cheap
            return self.arenas[arena][rows, ...]
        return _read(self.arenas, self.loose, arena, rows)


def _memory_of(array: np.ndarray) -> np.ndarray:
    """The last array down a view's chain of bases: the one owning its memory, unless that
    array's own base is no array (onnxruntime's outputs, ``as_strided`` views)."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array


class SlotMismatch(NodeExecutionError):
    """A step's result does not fit the rows the plan gave it: the plan's shapes (from shape
    inference) are wrong for these values. Never broadcast into the slot: that hides it."""


def _fits(value: Any, shape: tuple[int, ...], dtype: np.dtype, step: Step) -> None:
    if not isinstance(value, np.ndarray) or value.shape != shape or value.dtype != dtype:
        name = step.template.graph.name if step.template is not None else "a reduction"
        raise SlotMismatch(f"{name} returned {describe([value])[1:-1]} where the plan has room for "
                           f"{np.dtype(dtype)}{list(shape)}")


class ArenaTooLarge(NodeExecutionError):
    """The rows a plan needs do not fit in memory."""


def _arenas(plan: FlatPlan, pool: ArenaPool | None) -> tuple[list[np.ndarray | None], list[np.ndarray]]:
    """Every arena of the plan, allocated (a block stays None until its step gives it), and the
    buffers taken from ``pool`` for them."""
    arenas: list[np.ndarray | None] = []
    buffers: list[np.ndarray] = []
    for k, ((elem_type, shape), rows) in enumerate(zip(plan.kinds, plan.rows)):
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
        if k in plan.blocks:
            arenas.append(None)
            continue
        size = rows * math.prod(shape) * dtype.itemsize  # Python ints: no wrap-around
        try:
            if pool is None or size < MIN_POOLED_BYTES:
                arenas.append(np.empty((rows, *shape), dtype=dtype))
                continue
            buffers.append(pool.take(size))
            arenas.append(buffers[-1][:size].view(dtype).reshape(rows, *shape))
        except (MemoryError, ValueError) as error:  # ValueError: a size past what NumPy can index
            if pool is not None:
                pool.give(buffers)
            raise ArenaTooLarge(f"the plan needs {rows} rows of {dtype}{list(shape)} ({size / 2**30:.3g} GiB): "
                                f"{type(error).__name__}") from None
    return arenas, buffers


def _block_array(plan: FlatPlan, write: Block) -> np.ndarray:
    elem_type, shape = plan.kinds[write.arena]
    return np.empty((plan.rows[write.arena], *shape), helper.tensor_dtype_to_np_dtype(elem_type))


def _sequence_result(plan: FlatPlan, write: Any, members: int) -> np.ndarray:
    """Where a recurrent layer's step puts an output: ``Y``'s block (every row written), or a
    final state a member (zeros: an empty sequence keeps its initial state)."""
    if type(write) is Block:
        return _block_array(plan, write)
    elem_type, shape = plan.kinds[write[0]]
    return np.zeros((members, *shape), helper.tensor_dtype_to_np_dtype(elem_type))


def _read(arenas: list[np.ndarray], loose: Loose, arena: int, rows: Rows) -> Any:
    """A slice is a view; an index array one gather; an int one member's row (0-d views too);
    ``Runs`` rows of a block, a value a run; ``Shaped`` rows reshaped (a view); ``Pieces``
    values kept in several ways, one by one (``Padded``: of several shapes, each padded);
    a list of literals' names (arena ``LITERALS``) their values stacked; a name (arena
    ``LOOSE``) a loose value as it is."""
    if type(rows) is Runs:
        return _read(arenas, loose, arena, rows.rows).reshape(-1, *rows.shape)
    if type(rows) is Copied:
        return _read(arenas, loose, arena, rows.rows).copy()
    if type(rows) is Shaped:
        return _read(arenas, loose, arena, rows.rows).reshape(rows.shape)
    if type(rows) is Pieces:
        return np.stack([_read(arenas, loose, a, r) for a, r in rows])
    if type(rows) is Padded:
        values = [_read(arenas, loose, a, r) for a, r in rows.pieces]
        stacked = np.zeros((len(values), *rows.shape), values[0].dtype)
        for m, value in enumerate(values):
            if rows.fill is not None:  # past the value's end along that axis, within its extent along the others
                axis, fill = rows.fill
                beyond = [slice(0, size) for size in value.shape]
                beyond[axis] = slice(value.shape[axis], None)
                stacked[(m, *beyond)] = fill
            stacked[(m, *map(slice, value.shape))] = value
        return stacked
    if arena == LOOSE:
        return loose[rows]
    if arena == LITERALS:
        literals = loose.literals
        return np.array([literals[name] for name in rows])  # one dtype and shape: 2x faster than np.stack
    return arenas[arena].take(rows, axis=0) if isinstance(rows, np.ndarray) else arenas[arena][rows, ...]


def _concatenated(arenas: list[np.ndarray], loose: Loose, parts: list[tuple[int, Rows]]) -> np.ndarray:
    """The rows of every member, read group by group (each ``Shaped`` as rows)."""
    rows = [_read(arenas, loose, a, rows) for a, rows in parts]
    return rows[0] if len(rows) == 1 else np.concatenate(rows)


# np.add.reduceat along axis 0 walks rows this wide (in elements) or wider column by column, and
# ran 2-13x slower here than one contiguous reduce a member (rows of 256 to 512 floats).
WIDE_ROW = 256


def _reduced(rows: np.ndarray, step: Step) -> np.ndarray:
    """Each member's run of rows (starting at ``step.offsets``) added up, or averaged."""
    if rows[:1].size >= WIDE_ROW:
        ends = [*step.offsets[1:].tolist(), len(rows)]
        total = np.stack([np.add.reduce(rows[start:end], axis=0) for start, end in zip(step.offsets.tolist(), ends)])
    else:
        total = np.add.reduceat(rows, step.offsets, axis=0)
    segment = step.segment
    if segment is None:
        return total
    if segment.mean:
        lengths = np.repeat([length for length, _ in step.groups], [count for _, count in step.groups])
        total = total / lengths.reshape(-1, *([1] * (total.ndim - 1))).astype(total.dtype)
    return total[:, None] if segment.keepdims else total
