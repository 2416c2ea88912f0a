"""The planner: records (traced ops, or an ONNX model's nodes per instance) straight to a plan.

No batched IR graph is built (that cost several Python objects and steps a traced op, most of
a traced batch's time, on the older path this replaced). Each record arrives with a signature key and its predecessors (made while tracing), is scheduled by the
same schedulers, and each signature class is batched by its rule ONCE into a small *template*
graph over a symbolic batch size ``N``, kept across batches. The plan is a list of steps: the
arena rows each stacked operand reads (a view when contiguous, else one gather), the template
to run, and the rows its outputs fill.

Arenas: every per-instance value of one (dtype, shape) lives in one array, a row a value.
Gathering the children of Tree-LSTM nodes made by many earlier steps is then one ``take``,
not a gather per source batch plus a concat.

Classes of a row-wise op that differ only in their length along axis 0 merge into one
*ragged* class (``batcher.ragged``): its template is the op itself over the members' rows
concatenated, and its result is a *block*, an arena of its own with each member's rows after
the last's, which a later ragged step over the same members reads as a view. Recurrent layers
over sequences of different lengths run packed (``batcher.sequences``), tree folds level by
level (``batcher.folds``).

An op no rule batches, or a nondeterministic one, runs once per instance (a *solo* template:
the op itself). So does an op over values no arena holds (*loose* values: sequences,
optionals, types whose shape is known only once computed, float8 and bfloat16 arrays) or with
a subgraph: those values are kept one by one, as they are (``LOOSE``), and a step reads them by
name. Every model takes this path; only a tree fold whose children are not known when traced
raises ``NotFlat``.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Callable, Hashable, Mapping, Sequence

import numpy as np
from onnx import AttributeProto, TensorProto, helper

from autobatch.batcher.folds import Fold, Level, state_types, tree_levels
from autobatch.batcher.functions import Functions
from autobatch.batcher.padding import Padding, padded_chunks, padding
from autobatch.batcher.plan import (ARENA_DTYPES, ARENA_TYPES, LITERALS, LOOSE, BatchReport, Block, FlatPlan, Kind,
                                    NotFlat, Padded, Pieces, RowReduction, Rows, Runs, Shaped, Step, Template,
                                    TemplateCache, Unpadded)
from autobatch.batcher.problem import UNBATCHABLE, Problem, problem_from
from autobatch.batcher.ragged import ROW_LOSS, one_row_signatures, ragged_signature, segment_keepdims
from autobatch.batcher.node_rules import MIN_STACKING_OPSET, RANDOM
from autobatch.batcher.rules import Refusal
from autobatch.batcher.schedulers import depth_schedule, get_scheduler
from autobatch.batcher.sequences import SEQUENCE_LENS, zero_states
from autobatch.batcher.signature import attributes_key
from autobatch.batcher.templates import as_rows, build_solo, build_template
from autobatch.ir import Graph, Node, ValueType, attribute_value, is_nondeterministic
from autobatch.ir.records import LEAF, Record
from autobatch.ir.types import type_of_value

# A shared value this small (an axes list, a shape, a slice bound) is baked into a template,
# where rules may read it; larger ones (weights) are template inputs, fed at run time.
BAKED_SIZE = 64
# Where the planner keeps a value: ``arena << ROW_BITS | row``, one int (cheap to store, and a
# run of rows is a range of ints).
ROW_BITS = 40
ROW_MASK = (1 << ROW_BITS) - 1
SUM_OF_TERMS = "sum of terms"
_PER_SIZE = "per size"  # the rule read N: templates are kept per (key, N)
_MERGED_OR_NOT = "merged or not"  # a row-wise class's template, until ragged classes are merged


def plan_records(records: Sequence[Record], wanted: Sequence[str], producers: Sequence[int],
                 weights: Mapping[str, np.ndarray], literals: Mapping[str, np.ndarray], functions: Functions,
                 opsets: Mapping[str, int], scheduler: str, known: dict[Hashable, tuple] | None = None,
                 apart: bool = False, padded: bool = True, *, cache: TemplateCache) -> FlatPlan:
    """The plan computing ``wanted`` (made by the records at ``producers``) from ``records``
    (in trace order; those that lead to no wanted value are left out). ``weights`` are shared
    by every instance; ``literals`` are data of one instance. ``known``: what earlier plans
    learnt of record keys, for a caller whose keys (and weights) stay the same across plans.
    ``apart``: no record reads a value of another instance (``mix_records``' records), which
    makes the schedulers' levels cheap to work out, and (with ``padded``) lets the classes of
    one node of the model over instances of different shapes run padded (``batcher.padding``)."""
    cache.make_room()  # between plans, never during one
    start = time.perf_counter()
    planner = _Planner(cache, weights, literals, functions, opsets, known)
    records, preds = _live(records, producers)
    problem = planner.sign(records, preds, apart, padded)
    analysed = time.perf_counter()
    # No dependencies (a lockstep round over known values): every scheduler launches each class
    # once, and grouping by class is the cheapest way there.
    schedule = depth_schedule(problem) if not problem.depth.any() else get_scheduler(scheduler)(problem)
    scheduled = time.perf_counter()
    steps: list[Step] = []
    launches_by_op: Counter[str] = Counter()
    for group in schedule:
        made = planner.steps([records[i] for i in group], planner.record_class[group[0]])
        steps += made
        launches_by_op[records[group[0]].op_type] += len(made)
    locations = {name: planner.where(name) for name in wanted}
    done = time.perf_counter()
    reads = [rows for step in steps for read in step.reads for _, rows in (read if isinstance(read, list) else [read])]
    reads = [_row_indices(rows) for rows in reads]
    gathers = sum(isinstance(rows, (np.ndarray, list)) for rows in reads)  # a list: literals stacked, or pieces
    views = sum(isinstance(rows, slice) for rows in reads)
    merged = sum(step.size - 1 for step in steps if step.template is not None and step.template.once
                 and not step.template.solo)
    reasons = Counter(f"{record.op_type}: {planner.templates[cls].reason}" for record, cls
                      in zip(records, planner.record_class) if getattr(planner.templates[cls], "solo", False))
    report = BatchReport(scheduler, problem.size, len(schedule), problem.deferred_lower_bound(), sum(reasons.values()),
                         gathers, views, merged,
                         {"analyse": analysed - start, "schedule": scheduled - analysed, "plan": done - scheduled},
                         alone=dict(reasons), launches_by_op=dict(launches_by_op))
    return FlatPlan(planner.arena_kinds, planner.rows, planner.blocks, planner.literal_runs, steps, locations, report)


class _Planner:
    def __init__(self, cache: TemplateCache, weights: Mapping[str, np.ndarray], literals: Mapping[str, np.ndarray],
                 functions: Functions, opsets: Mapping[str, int], known: dict[Hashable, tuple] | None = None) -> None:
        self.cache = cache  # templates by key, kept across plans
        self.weights = weights
        self.literals = literals
        self.functions = functions
        self.opsets = opsets
        self.kinds: dict[Kind, int] = {}  # the arena of each kind, shared by the values of that kind
        self.arena_kinds: list[Kind] = []
        self.rows: list[int] = []
        self.blocks: set[int] = set()  # arenas of their own: a ragged step's result (``Block``)
        self.runs: dict[str, int] = {}  # value -> its rows, for a value kept in a block
        self.shaped: dict[str, tuple[int, ...]] = {}  # the shape of a value in a block that is not [rows, *row]
        self.loose: set[str] = set()  # values loose steps give as they are (``LOOSE``)
        self.literal_runs: list[tuple[int, int, list[str]]] = []
        # per-instance value -> arena << ROW_BITS | row; a literal gets its row when first asked for
        self.location = _Locations(self._place_literal)
        self.classes: list[tuple] = []
        self.class_of: dict[tuple, int] = {}  # a signature -> its class
        self.record_class: list[int] = []  # per record (live ones, in order): its class
        self.templates: list[Template | RowReduction | str | None] = []  # per class; None for sums of terms
        self.first_records: list[Record] = []  # per class: its first record
        self.ragged: list[tuple | None] = []  # per class: its signature without the length of its rows
        self.one_row: list[list[tuple]] = []  # per class: its signatures as one row (``_kind``)
        self._attributes_keys: dict[int, tuple] = {}
        # record key -> what ``_kind`` says of it: given by the caller when its keys stay valid
        # across plans (``InferenceSession``: records kept per input signature), else per plan.
        self.known: dict[Hashable, tuple] = known if known is not None else {}

    # ------------------------------------------------------------------ signing
    def sign(self, records: Sequence[Record], preds: list[list[int]], apart: bool = False, padded: bool = True) -> Problem:
        """Signature classes (with their templates) of the records, and the problem (its parts
        the records' instances when they are ``apart``)."""
        class_of: dict[Hashable, int] = {}  # a record key -> its class
        record_class = self.record_class
        for record in records:
            cls = class_of.get(record.key)
            if cls is None:
                cls = class_of[record.key] = self._class(record)
            record_class.append(cls)
        sig = self._merge_ragged()[np.array(record_class, dtype=np.int64)]
        if apart and padded:
            sig = self._merge_padded(sig, records)
        self.record_class = sig.tolist()
        solo = np.array([isinstance(t, Template) and t.solo for t in self.templates], dtype=bool)
        sig[solo[sig]] = UNBATCHABLE  # the schedulers run these one by one, and the bound counts them so
        parts = np.fromiter((record.instance for record in records), dtype=np.int64, count=len(records)) \
            if apart else None
        return problem_from(list(range(len(records))), sig, preds, self.classes, parts)

    def _class(self, record: Record) -> int:
        """The class of a record's signature, made (with its template) when new."""
        known = self.known.get(record.key)
        if known is None:
            known = self.known[record.key] = self._kind(record)
        signature, template, ragged, one_row = known
        cls = self.class_of.get(signature)
        if cls is None:
            cls = self.class_of[signature] = len(self.classes)
            self.classes.append(signature)
            self.templates.append(template)
            self.first_records.append(record)
            self.ragged.append(ragged)
            self.one_row.append(one_row)
        return cls

    def _attributes_key(self, attributes: dict[str, AttributeProto]) -> tuple:
        """``attributes_key``, once per attributes object of the plan (records share them, and
        they live as long as the plan's records)."""
        key = self._attributes_keys.get(id(attributes))
        if key is None:
            key = self._attributes_keys[id(attributes)] = attributes_key(attributes)
        return key

    def _kind(self, record: Record) -> tuple[tuple, Template | str | None, tuple | None, list[tuple]]:
        """A record's signature, its class's template, its signature without the length of its
        rows where the op is row-wise (``batcher.ragged``), and, for a record whose values may
        have one row (``[1, d]``, ``[1, 1, d]``), its signatures as such, which other classes may
        share (``one_row_signatures``). The template of a row-wise
        record is ``_MERGED_OR_NOT`` until its class is known to be merged or not."""
        signature = self._sum_key(record)
        attributes = self._attributes_key(record.attributes)
        if signature is None:
            signature = (record.domain, record.op_type, attributes, record.entries, tuple(map(bool, record.outputs)))
            loose = _loose_reason(record)
            if loose is not None:  # one member at a time, its values as they are
                captured = tuple((inside, vtype) for inside, _, vtype in record.captured)
                return (*signature, captured), self._template(record, None, solo=loose), None, []
        if signature[2] == SUM_OF_TERMS:
            # No template, and no ragged signature: the class takes any number of terms, so one
            # member's (its terms counted) would not hold for the others.
            return signature, None, None, []
        opset = self.opsets.get("", 1)
        ragged = ragged_signature(record, self.weights, opset, attributes)
        one_row = []
        if ragged is None or ragged[0] in ("ragged", "reshape"):
            one_row = [other for other in one_row_signatures(record, self.weights, opset, attributes) if other != ragged]
        template = _MERGED_OR_NOT if ragged is not None or one_row else self._own_template(record)
        return signature, template, ragged, one_row

    def _own_template(self, record: Record) -> Template | str:
        """The template of a record's own class: its rule's, else the op for one member at a time."""
        if is_nondeterministic(record.op_type, record.domain, self.functions, record.inputs):  # every run draws anew
            return self._template(record, None, solo=RANDOM)  # type: ignore[return-value]
        opset = self.opsets.get("", 1)
        if opset < MIN_STACKING_OPSET:  # the rules stack and split with Reshape's shape input
            return self._template(record, None, solo=f"opset {opset} has no Reshape with a shape input")  # type: ignore
        built = self._template(record, None)
        return self._template(record, None, solo=built.reason) if isinstance(built, Refusal) else built  # type: ignore

    def _merge_ragged(self) -> np.ndarray:
        """Classes that differ only in the length of their rows, of a row-wise op, become one
        ragged class (``batcher.ragged``); the new class of every class. Those left as they are
        get their own templates."""
        alike: dict[tuple, list[int]] = {}
        for cls, signature in enumerate(self.ragged):
            if signature is not None:
                alike.setdefault(signature, []).append(cls)
        # A class that may be of one row joins the classes its rows may be of: those of its node
        # of the model (other instances' records of it), else of its op, the most of them that are
        # not of one row (any choice is right; this one launches least).
        def fit(group: list[int], cls: int) -> tuple[bool, bool, int]:
            record, others = self.first_records[cls], [c for c in group if c != cls]
            firsts = [self.first_records[c] for c in others]
            return (any(_node_of(first) == _node_of(record) for first in firsts),
                    any(first.op_type == record.op_type for first in firsts), sum(not self.one_row[c] for c in others))

        for cls, one_row in enumerate(self.one_row):
            own = self.ragged[cls]
            joins = max((other for other in one_row if other in alike), key=lambda other: fit(alike[other], cls),
                        default=None)
            if joins is not None and (own is None or fit(alike[joins], cls) >= fit(alike[own], cls)):
                if own is not None:
                    alike[own].remove(cls)
                alike[joins].append(cls)
            elif own is None and one_row:
                self.templates[cls] = self._own_template(self.first_records[cls])
        merged = list(range(len(self.classes)))
        for signature, classes in alike.items():
            if not classes:
                continue
            # A fold or a loss over rows is a ragged step whatever its members' sizes: no rule
            # batches the op itself.
            merge = len(classes) > 1 or signature[0] in ("fold", "loss")
            template = self._ragged_template(self.first_records[classes[0]], signature) if merge else None
            if template is None:  # one length, or no ragged template: each class batches as it is
                for cls in classes:
                    self.templates[cls] = self._own_template(self.first_records[cls])
                continue
            for cls in classes:
                merged[cls] = len(self.classes)
            self.classes.append(signature)
            self.templates.append(template)
            self.first_records.append(self.first_records[classes[0]])
            self.ragged.append(signature)
        return np.array(merged, dtype=np.int64)

    def _merge_padded(self, sig: np.ndarray, records: Sequence[Record]) -> np.ndarray:
        """The records of one node of the model (over instances apart) in classes that no ragged
        class took and that differ in their shapes become one padded class, where padding is
        exact (``batcher.padding``); every record's class. By node, not by class: a class may
        hold records of two nodes of one signature (a length's two products of one shape), at
        different depths."""
        keys: list[tuple | None] = []
        by_node: dict[tuple, dict[int, Record]] = {}  # node -> its classes, a record of the node in each
        for cls, record in zip(sig.tolist(), records):
            template = self.templates[cls]
            plain = template == _PER_SIZE or isinstance(template, Template) and not (
                template.solo or template.once or template.ragged)
            key = (_node_of(record), record.op_type, self._attributes_key(record.attributes)) if plain else None
            keys.append(key)
            if key is not None:
                by_node.setdefault(key, {}).setdefault(cls, record)
        padded: dict[tuple, int] = {}
        for key, classes in by_node.items():
            found = padding(list(classes.values()), self.opsets.get("", 1)) if len(classes) > 1 else None
            if found is not None:
                padded[key] = len(self.classes)
                self.classes.append(("padded", *key))
                self.templates.append(found)
                self.first_records.append(next(iter(classes.values())))
                self.ragged.append(None)
                self.one_row.append([])
        if not padded:
            return sig
        return np.array([padded.get(key, cls) if key is not None else cls for cls, key in zip(sig.tolist(), keys)],
                        dtype=np.int64)

    def _ragged_template(self, record: Record, signature: tuple) -> Template | RowReduction | Fold | None:
        """The op itself over rows of any number (``R``), cached as templates are."""
        kind = signature[0]
        if kind == "fold":  # its step is worked out from its members
            return Fold()
        if kind == "segment":
            keepdims = segment_keepdims(record, self.weights, self.opsets.get("", 1))
            return RowReduction(record.op_type == "ReduceMean", bool(keepdims))
        if kind == "reshape":
            return _reshape_template(self.cache, *signature[1:], self.opsets)
        specs, baked = self._operand_specs(record)
        if kind == "sequences":
            return self._sequences_template(record, specs, baked)
        axis = next(entry[2] for entry in signature[3] if isinstance(entry, tuple)) if kind == "ragged" else 0
        out_axes = tuple(out[0] if out is not None else 0 for out in signature[4]) if kind == "ragged" else ()
        rows = tuple(("x", spec[1], (*spec[2][:axis], "R", *spec[2][axis + 1:])) if spec is not None and spec[0] == "x"
                     else spec for spec in specs)
        key = ("ragged", record.op_type, self.opsets.get("", 1), self._attributes_key(record.attributes), rows,
               tuple(map(bool, record.outputs)), out_axes)
        cached = self.cache.templates
        if key not in cached:
            attrs, segment = record.attributes, None
            if record.op_type == ROW_LOSS:  # a loss a row, then each member's sum or mean
                mean = "reduction" not in attrs or _text(attribute_value(attrs["reduction"])) == "mean"
                segment = RowReduction(mean, keepdims=False)
                attrs = {**attrs, "reduction": helper.make_attribute("reduction", "none")}
            node = Node(-1, record.op_type, "", self.opsets.get("", 1), attrs, list(record.inputs),
                        list(record.outputs), 0, "")
            solo = build_solo(node, rows, baked, self.functions, self.opsets)
            outs = [out for out in signature[4] if out is not None] if kind == "ragged" else []
            graph = as_rows(solo.graph, axis, outs) if axis or any(out_axes) else solo.graph
            cached[key] = Template(graph, solo.stacked, solo.fed, once=False, ragged=True, segment=segment,
                                   length_axis=axis, out_axes=out_axes)
        template = cached[key]
        return template if isinstance(template, Template) else None

    def _sequences_template(self, record: Record, specs: tuple, baked: dict[int, np.ndarray]) -> Template:
        """The layer over ``x0 [T, B, d]`` (a chunk of padded sequences) and ``x4``, their
        lengths (``batcher.sequences``)."""
        _, elem_type, (_, _, width) = specs[0]
        padded = list(specs) + [None] * max(0, SEQUENCE_LENS + 1 - len(specs))
        padded[0] = ("x", elem_type, ("T", "B", width))
        padded[SEQUENCE_LENS] = ("x", TensorProto.INT32, ("B",))
        zero = zero_states(record, self.weights)  # left out: the layer starts from zeros without them
        for k in zero:
            padded[k] = None
        key = ("sequences", record.op_type, self.opsets.get("", 1), self._attributes_key(record.attributes),
               tuple(padded), tuple(map(bool, record.outputs)))
        cached = self.cache.templates
        if key not in cached:
            inputs = [*record.inputs] + [""] * (len(padded) - len(record.inputs))
            inputs[SEQUENCE_LENS] = "lengths"
            for k in zero:
                inputs[k] = ""
            node = Node(-1, record.op_type, "", self.opsets.get("", 1), record.attributes, inputs,
                        list(record.outputs), 0, "")
            solo = build_solo(node, tuple(padded), baked, self.functions, self.opsets)
            outputs = tuple(k for k, name in enumerate(record.outputs) if name)
            cached[key] = Template(solo.graph, [0], solo.fed, once=False, ragged=True, sequences=outputs)
        return cached[key]  # type: ignore[return-value]

    def _place_literal(self, name: str) -> int:
        """A row for a literal read beside computed values (or wanted as it is), after the rows
        its arena has now; literals placed one after the other make one run, stacked at once."""
        array = self.literals[name]
        arena = self.arena((ValueType.tensor(array.dtype, array.shape).elem_type, array.shape))
        row = self.rows[arena]
        self.rows[arena] += 1
        runs = self.literal_runs
        if runs and runs[-1][0] == arena and runs[-1][1] + len(runs[-1][2]) == row:
            runs[-1][2].append(name)
        else:
            runs.append((arena, row, [name]))
        return arena << ROW_BITS | row

    @staticmethod
    def _sum_key(record: Record) -> tuple | None:
        """Sums of per-instance float terms of one type batch whatever their number of terms."""
        if record.op_type != "Sum" or record.domain or len(record.entries) < 2:
            return None
        out = record.types[0]
        if not _stackable(out) or out.dtype.kind != "f" or not all(e == out for e in record.entries):
            return None
        return ("", "Sum", SUM_OF_TERMS, out)

    def arena(self, kind: Kind) -> int:
        index = self.kinds.get(kind)
        if index is None:
            index = self.kinds[kind] = len(self.rows)
            self.arena_kinds.append(kind)
            self.rows.append(0)
        return index

    # ------------------------------------------------------------------ templates
    def _template(self, record: Record, size: int | None, solo: str | None = None) -> Template | Refusal | str:
        """The class's template from the cache, built on a miss; a ``Refusal`` when no rule
        batches it (then a ``solo`` template, given the refusal's reason, runs the op for one
        member at a time). ``size`` is asked for only once a rule has shown that it reads N."""
        specs, baked = self._operand_specs(record)
        function = self.functions.get((record.domain, record.op_type)) if record.domain else None
        if function is not None:
            self.cache.functions[id(function)] = function
        version = self.opsets.get(record.domain, 1)
        captured = tuple((inside, vtype) for inside, _, vtype in record.captured)
        base = (record.domain, record.op_type, version, self._attributes_key(record.attributes), id(function), specs,
                tuple(map(bool, record.outputs)), solo is not None, captured)
        cached = self.cache.templates
        per_size = cached.get(base) == _PER_SIZE
        if per_size and size is None:
            return _PER_SIZE  # resolved per step
        key = base + (size,) if per_size else base
        if key in cached:
            return cached[key]
        node = Node(-1, record.op_type, record.domain, version, record.attributes, list(record.inputs),
                    list(record.outputs), 0, "")
        if solo is not None:
            built = build_solo(node, specs, baked, self.functions, self.opsets, solo, captured, record.types)
            reads_size = False
        else:
            built, reads_size = build_template(node, specs, baked, [t.shape if t else () for t in record.types],
                                                self.functions, self.opsets, size or 2)
        if reads_size and not per_size:  # from now on kept per N
            cached[base] = _PER_SIZE
            if size is None:
                return _PER_SIZE
            key = base + (size,)
        cached[key] = built
        return built

    def _operand_specs(self, record: Record) -> tuple[tuple, dict[int, np.ndarray]]:
        specs: list[tuple | None] = []
        baked: dict[int, np.ndarray] = {}
        for i, (name, entry) in enumerate(zip(record.inputs, record.entries)):
            if not name:
                specs.append(None)
                continue
            if entry is None or isinstance(entry, ValueType):
                # A loose value's spec is its type itself (None: not known); only a solo template reads one.
                specs.append(("x", entry.elem_type, entry.shape) if _stackable(entry) else ("v", entry))
                continue
            array = np.asarray(self.weights[name])
            dtype = array.dtype  # the dtype itself: ml_dtypes types (int4, int2) share a dtype.str
            if array.size <= BAKED_SIZE:
                specs.append(("k", dtype, array.shape, array.tobytes()))
                baked[i] = array
            else:
                specs.append(("w", dtype, array.shape))
        return tuple(specs), baked

    # ------------------------------------------------------------------ steps
    def steps(self, members: list[Record], cls: int) -> list[Step]:
        """The launches of a class's members scheduled together: one, or one a member where the
        rule refuses their number."""
        template = self.templates[cls]
        if isinstance(template, Fold):
            return [self._fold_step(members)]
        if isinstance(template, Padding):
            return [step for chunk in padded_chunks(members) for step in self._padded_steps(chunk, template)]
        if isinstance(template, RowReduction) or isinstance(template, Template) and template.ragged:
            return [self._ragged_step(members, template)]
        if isinstance(template, str):  # _PER_SIZE
            template = self._template(members[0], len(members))
            if isinstance(template, Refusal):
                solo = self._template(members[0], None, solo=template.reason)
                return [self._step([member], solo) for member in members]  # type: ignore[arg-type]
        return [self._step(members, template)]

    def _step(self, members: list[Record], template: Template | None) -> Step:
        first = members[0]
        outputs = list(zip(*[member.outputs for member in members]))  # per output, its name in each member
        if template is None:  # a sum of terms
            terms = [name for member in members for name in member.inputs]
            offsets = np.cumsum([0] + [len(m.inputs) for m in members[:-1]], dtype=np.intp)
            return Step(None, len(members), [self._rows(terms)], [], [self._write(first, 0, outputs[0], False)],
                        offsets)
        if template.solo:  # one member: its own value (all of its rows where it is kept in a block)
            reads = [self.where(first.inputs[i]) for i in template.stacked]
            reads += [self.where(outside) for _, outside, _ in first.captured]
            writes = [self._write(first, k, names, True) if _stackable(first.types[k]) else self._loose(names[0])
                      for k, names in enumerate(outputs) if names[0]]
            return Step(template, 1, reads, [first.inputs[i] for i in template.fed], writes)
        inputs = list(zip(*[member.inputs for member in members]))  # per input, its name in each member
        reads = [self._rows(inputs[i]) for i in template.stacked]
        writes = [self._write(first, k, names, template.once) for k, names in enumerate(outputs) if names[0]]
        return Step(template, len(members), reads, [first.inputs[i] for i in template.fed], writes)

    def _padded_steps(self, chunk: list[Record], padded: Padding) -> list[Step]:
        """A chunk's launch: its last (longest) member's template over every member's operands
        padded to that member's shapes (``batcher.padding``); a plain step where their shapes
        agree, one a member where the rule refuses their number."""
        top = chunk[-1]
        template = self._template(top, None)
        if template == _PER_SIZE:
            template = self._template(top, len(chunk))
        if isinstance(template, Refusal):
            return [self._step([member], self._template(member, None, solo=template.reason)) for member in chunk]  # type: ignore[arg-type]
        assert isinstance(template, Template)
        if all(member.key == top.key for member in chunk):
            return [self._step(chunk, template)]
        fills = dict(padded.fills)
        reads = [(LITERALS, Padded(Pieces(self.where(member.inputs[i]) for member in chunk), tuple(top.entries[i].shape),
                                   fills.get(i), tuple(tuple(member.entries[i].shape) for member in chunk)))
                 for i in template.stacked]
        writes = [Unpadded([self._write(member, k, [member.outputs[k]], False) for member in chunk],
                           tuple(tuple(member.types[k].shape) for member in chunk))
                  for k, name in enumerate(top.outputs) if name]
        return [Step(template, len(chunk), reads, [top.inputs[i] for i in template.fed], writes)]

    def _loose(self, name: str) -> tuple[int, str]:
        self.loose.add(name)
        return LOOSE, name

    def _ragged_step(self, members: list[Record], template: Template | RowReduction) -> Step:
        """Members ordered by length (stable: the order of an earlier ragged step over the same
        instances, whose blocks are then read as views)."""
        data = next(i for i, entry in enumerate(members[0].entries) if isinstance(entry, ValueType))
        axis, out_axes = (template.length_axis, template.out_axes) if isinstance(template, Template) else (0, ())
        members, lengths, groups, bounds = _by_length(members, data, axis)
        inputs = list(zip(*[member.inputs for member in members]))
        sequences = isinstance(template, Template) and template.sequences
        stacked = [data] if isinstance(template, RowReduction) or sequences else template.stacked
        reads = [self._ragged_read(inputs[i], bounds, members[0].entries[i], axis) for i in stacked]
        outputs = list(zip(*[member.outputs for member in members]))
        # A reduction of each member's rows (a ReduceSum or ReduceMean itself, or a loss a row
        # reduced): one output, of one shape, K rows of one arena.
        segment = template if isinstance(template, RowReduction) else template.segment
        if segment is not None:
            offsets = np.cumsum([0] + lengths[:-1], dtype=np.intp)
            run = template if isinstance(template, Template) else None
            fed = [members[0].inputs[i] for i in run.fed] if run is not None else []
            return Step(run, len(members), reads, fed, [self._write(members[0], 0, outputs[0], False)], offsets,
                        groups, segment)
        # Every output a block, but a recurrent layer's final states: one row a member.
        writes = [self._block(members[0], k, names, lengths, out_axes[k] if out_axes else 0) if k == 0 or not sequences
                  else self._write(members[0], k, names, False) for k, names in enumerate(outputs) if names[0]]
        return Step(template, len(members), reads, [members[0].inputs[i] for i in template.fed], writes,
                    groups=groups)

    def _fold_step(self, members: list[Record]) -> Step:
        """Every member's tree at once (``batcher.folds``): ordered by their numbers of leaves,
        their leaf inputs read as one run of rows, their states written as blocks."""
        members, _, groups, bounds = _by_length(members, 0, 0)
        leaves = self._ragged_read([member.inputs[0] for member in members], bounds, members[0].entries[0], 0)
        matrices = [self.literals.get(member.inputs[1]) for member in members]
        if any(matrix is None for matrix in matrices):
            raise NotFlat("a tree fold's children must be known when traced")
        leaf_rows, levels = tree_levels(matrices)  # type: ignore[arg-type]
        leaf_cell, node_cell = self._fold_cells(members[0])
        states = len(members[0].outputs)
        inputs = [self.literals.get(member.inputs[0]) for member in members]
        if all(value is not None and value.ndim == 1 and value.dtype.kind in "iu" for value in inputs):
            # Leaves read known ids (words): the leaf cell runs once an id, its states repeated.
            _, first, repeat = np.unique(np.concatenate(inputs), return_index=True, return_inverse=True)  # type: ignore[arg-type]
            leaf = self._fold_level(leaf_cell, len(first), [(LEAF, first)], leaf_rows)
            leaf.repeat = repeat
        else:
            leaf = self._fold_level(leaf_cell, len(leaf_rows), [(LEAF, slice(None))], leaf_rows)
        launches = [leaf]
        for nodes, left, right in levels:
            operands = [(k, left) for k in range(states)] + [(k, right) for k in range(states)]
            launches.append(self._fold_level(node_cell, len(nodes), operands, nodes))
        sizes = [len(matrix) for matrix in matrices]  # type: ignore[arg-type]
        outputs = list(zip(*[member.outputs for member in members]))
        writes = [self._block(members[0], k, names, sizes) for k, names in enumerate(outputs)]
        return Step(None, len(members), [leaves], [], writes, groups=groups, fold=launches)

    def _fold_cells(self, first: Record) -> tuple[Record, Record]:
        """A fold's leaf and node cell calls as records, for their templates."""
        leaf, node, leaf_parameters, domain = (attribute_value(first.attributes[name])
                                               for name in ("leaf", "node", "leaf_parameters", "cells"))
        shared = list(first.inputs[2:])
        states = state_types(first)
        row = ValueType.tensor(first.entries[0].dtype, first.entries[0].shape[1:])
        names = [f"s{k}" for k in range(len(states))]
        calls = []
        for function, operands, parameters in ((leaf, [row], shared[:leaf_parameters]),
                                               (node, states + states, shared[leaf_parameters:])):
            inputs = [f"x{i}" for i in range(len(operands))] + parameters
            calls.append(Record(_text(function), _text(domain), inputs, names, {}, states, (*operands, *parameters),
                                     None, []))
        return calls[0], calls[1]

    def _fold_level(self, call: Record, size: int, operands: list, nodes: np.ndarray) -> Level:
        """One launch of a fold: ``call``'s cell batched for ``size`` members."""
        template = self._template(call, None)
        if template == _PER_SIZE:
            template = self._template(call, size)
        if not isinstance(template, Template):
            raise NotFlat(f"no batching rule takes cell {call.op_type} (a tree fold batches its cells)")
        return Level(template, [call.inputs[i] for i in template.fed], [operands[i] for i in template.stacked], nodes)

    def _ragged_read(self, names: Sequence[str], bounds: list[int], vtype: ValueType, axis: int
                     ) -> tuple[int, Rows] | list[tuple[int, Rows]]:
        """Every member's rows (along ``axis`` of values of the type ``vtype`` has but for its
        length), one after the other: those of one block that keeps them as such rows, else group
        by group."""
        row = (-1, *vtype.shape[axis + 1:])
        block = self._one_block(names)
        if block is not None and self.arena_kinds[block[0]][1] == row[1:]:
            arena, starts = block
            return arena, _rows_of_runs(starts, np.array([self.runs[name] for name in names], dtype=np.int64))
        return [(arena, Shaped(rows, row)) for arena, rows in (self._rows(names[lo:hi]) for lo, hi in zip(bounds, bounds[1:]))]

    def _one_block(self, names: Sequence[str]) -> tuple[int, np.ndarray] | None:
        """(the block, where each value's rows start) when every value is in one block; else None."""
        if not all(name in self.runs for name in names):
            return None
        places = [self.location[name] for name in names]
        arena = places[0] >> ROW_BITS
        if any(place >> ROW_BITS != arena for place in places):
            return None
        return arena, np.array(places, dtype=np.int64) & ROW_MASK

    def _rows(self, names: Sequence[str]) -> tuple[int, Rows]:
        """The arena holding these values (one: they have one type) and their rows in it; for
        literals only, ``LITERALS`` and their names: stacked straight from their values."""
        literals = self.literals
        if names[0] in literals and literals[names[0]].dtype in ARENA_DTYPES and all(name in literals for name in names):
            return LITERALS, list(names)
        if any(name in self.runs for name in names):
            return self._rows_in_blocks(names)
        places = list(map(self.location.__getitem__, names))
        first = places[0]
        arena, row = _place(first)
        if places == list(range(first, first + len(places))):
            return arena, slice(row, row + len(places))
        return arena, np.array(places, dtype=np.int64) & ROW_MASK

    def _rows_in_blocks(self, names: Sequence[str]) -> tuple[int, Rows]:
        """Values of one shape ``[length, ...]``, some or all kept in blocks: ``Runs`` of one
        block, else ``Pieces``."""
        block = self._one_block(names)
        if block is not None:
            arena, starts = block
            length = self.runs[names[0]]
            shape = self.shaped.get(names[0]) or (length, *self.arena_kinds[arena][1])
            return arena, Runs(_rows_of_runs(starts, np.full(len(names), length)), length, shape)
        return LITERALS, Pieces(self.where(name) for name in names)

    def where(self, name: str) -> tuple[int, int | slice | str]:
        """(arena, row) of a value, or (arena, its rows) for one kept in a block, or (``LOOSE``,
        its name) for a loose value (a weight read by a subgraph, too)."""
        if name in self.loose or name in self.weights or name not in self.location and name in self.literals \
                and not _stackable(type_of_value(self.literals[name])):
            return LOOSE, name
        arena, row = _place(self.location[name])
        length = self.runs.get(name)
        if length is None:
            return arena, row
        shape = self.shaped.get(name)
        return (arena, slice(row, row + length)) if shape is None else (arena, Shaped(slice(row, row + length), shape))

    def _block(self, first: Record, k: int, names: Sequence[str], lengths: list[int], axis: int = 0) -> Block:
        """An arena of its own for output ``k`` of a ragged step: each member's rows (as many as
        its length, along ``axis``) after the previous member's."""
        vtype = first.types[k]
        arena = len(self.rows)
        row = tuple(vtype.shape[axis + 1:])
        if axis:
            self.shaped.update((name, (*vtype.shape[:axis], length, *row)) for name, length in zip(names, lengths))
        self.arena_kinds.append((vtype.elem_type, row))
        self.rows.append(sum(lengths))
        self.blocks.add(arena)
        starts = itertools.accumulate(lengths, initial=arena << ROW_BITS)
        self.location.update(zip(names, starts))
        self.runs.update(zip(names, lengths))
        return Block(arena)

    def _write(self, first: Record, k: int, names: Sequence[str], once: bool) -> tuple[int, int]:
        """Rows for output ``k`` (``names``: its name in each member; one row for all when
        ``once``): (arena, first row)."""
        vtype = first.types[k]
        arena = self.arena((vtype.elem_type, vtype.shape))
        start = self.rows[arena]
        self.rows[arena] += 1 if once else len(names)
        base = arena << ROW_BITS | start
        self.location.update(zip(names, itertools.repeat(base) if once else range(base, base + len(names))))
        return arena, start


class _Locations(dict):
    """Planner locations by value name; a missing one is a literal's, placed by ``place``."""

    def __init__(self, place: Callable[[str], int]) -> None:
        super().__init__()
        self.place = place

    def __missing__(self, name: str) -> int:
        location = self[name] = self.place(name)
        return location


def _place(location: int) -> tuple[int, int]:
    """(arena, row) of a planner location."""
    return location >> ROW_BITS, location & ROW_MASK


def _by_length(members: list[Record], data: int, axis: int) -> tuple[list[Record], list[int], list[tuple[int, int]],
                                                                           list[int]]:
    """Members ordered by the length of operand ``data`` along ``axis`` (stably), their
    lengths, the groups of one length (length, count) and where each group starts and ends."""
    members = sorted(members, key=lambda member: member.entries[data].shape[axis])
    lengths = [member.entries[data].shape[axis] for member in members]
    groups = [(length, len(list(same))) for length, same in itertools.groupby(lengths)]
    bounds = list(itertools.accumulate([count for _, count in groups], initial=0))
    return members, lengths, groups, bounds


def _row_indices(rows: Rows) -> Rows:
    """The rows a read takes from its arena, without the ``Runs`` and ``Shaped`` around them."""
    while isinstance(rows, (Runs, Shaped)):
        rows = rows.rows
    return rows


def _node_of(record: Record) -> str:
    """The name of a record's first output in its instance's graph (``mix_records`` prefixes it)."""
    name = record.outputs[0] if record.outputs else ""
    prefix = f"i{record.instance}/"
    return name[len(prefix):] if name.startswith(prefix) else name


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _rows_of_runs(starts: np.ndarray, lengths: np.ndarray) -> slice | np.ndarray:
    """The rows of runs (``lengths[j]`` rows from ``starts[j]``) one after the other: a slice
    when each run follows the last."""
    ends = starts + lengths
    if np.array_equal(starts[1:], ends[:-1]):
        return slice(int(starts[0]), int(ends[-1]))
    return np.repeat(starts - np.cumsum(lengths) + lengths, lengths) + np.arange(int(lengths.sum()))


def _stackable(vtype: ValueType | None) -> bool:
    """Whether values of this type live in an arena: tensors of a static shape and an element
    type NumPy holds (the others are loose)."""
    return vtype is not None and vtype.is_static and vtype.elem_type in ARENA_TYPES


def _loose_reason(record: Record) -> str | None:
    """Why a record runs one member at a time with loose values (its subgraphs, or a value no
    arena holds), or None."""
    if any(proto.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) for proto in record.attributes.values()):
        return "an op with a subgraph runs alone"
    read = (entry for entry in record.entries if entry is None or isinstance(entry, ValueType))
    given = (vtype for name, vtype in zip(record.outputs, record.types) if name)
    for vtype in (*read, *given):
        if not _stackable(vtype):
            return f"{vtype!r} values are not stacked" if vtype is not None else "values of unknown type are not stacked"
    return None


def _live(records: Sequence[Record], producers: Sequence[int]) -> tuple[Sequence[Record], list[list[int]]]:
    """The records that lead to a wanted value (usually all), and their predecessors
    renumbered among them."""
    alive = bytearray(len(records))
    for i in producers:
        alive[i] = 1
    for i in range(len(records) - 1, -1, -1):  # predecessors come first: one backward pass
        if alive[i]:
            for p in records[i].preds:
                alive[p] = 1
    if alive.count(1) == len(records):
        return records, [record.preds for record in records]
    kept = [i for i, flag in enumerate(alive) if flag]
    index = {old: new for new, old in enumerate(kept)}
    return [records[i] for i in kept], [[index[p] for p in records[i].preds] for i in kept]


def _reshape_template(cache: TemplateCache, elem_type: int, axis: int, row: tuple[int, ...],
                      out: tuple[int, tuple[int, ...]], opsets: Mapping[str, int]) -> Template:
    """A row reshape (``batcher.ragged``): each of ``R`` rows of ``row`` becomes a row of
    ``out``'s; run as a reshape of the rows (a view) on every backend."""
    key = ("reshape", elem_type, axis, row, out, opsets.get("", 1))
    template = cache.templates.get(key)
    if template is None:
        graph = Graph("reshape_rows", {"": opsets.get("", 1)})
        graph.add_input("x0", ValueType.tensor(elem_type, ["R", *row]))
        graph.add_initializer("k1", np.array([-1, *out[1]], np.int64))
        graph.add_node("Reshape", ["x0", "k1"], ["y0"])
        graph.add_output("y0")
        template = cache.templates[key] = Template(graph, [0], [], once=False, ragged=True, row_shape=out[1],
                                                   length_axis=axis, out_axes=(out[0],))
    return template  # type: ignore[return-value]
