"""Signing: each record's signature class and its template (the rule's, a ragged or padded
class merged across lengths, or the op for one member at a time), a part of ``batcher.flat``'s
planner."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np
from onnx import AttributeProto, TensorProto, helper

from autobatch.batcher.folds import Fold
from autobatch.batcher.layout import PER_SIZE, ROW_BITS, as_text, node_of, reshape_template, stackable, stacked_row
from autobatch.batcher.node_rules import MIN_STACKING_OPSET, RANDOM
from autobatch.batcher.padding import padding
from autobatch.batcher.plan import Kind, RowReduction, Template
from autobatch.batcher.problem import SCHEDULING, UNBATCHABLE, Problem, problem_from
from autobatch.batcher.ragged import ROW_LOSS, one_row_signatures, ragged_signature, segment_keepdims
from autobatch.batcher.rule_tables import Refusal
from autobatch.batcher.sequences import SEQUENCE_LENS, own_states, zero_states
from autobatch.batcher.signature import attributes_key
from autobatch.batcher.templates import as_rows, build_solo, build_template
from autobatch.ir import Node, ValueType, attribute_value, is_nondeterministic
from autobatch.ir.records import Record

# A shared value this small (an axes list, a shape, a slice bound) is baked into a template,
# where rules may read it; larger ones (weights) are template inputs, fed at run time.
BAKED_SIZE = 64
SUM_OF_TERMS = "sum of terms"
_MERGED_OR_NOT = "merged or not"  # a row-wise class's template, until ragged classes are merged
STACKED_ROWS = "stacked rows"  # in the signature of ``ops.stack``'s Concats, for their number of rows


class _NotARound(Exception):
    """``round_classes``' refusal: the round is signed."""


def classes_of(records: Sequence[Record], class_of: dict[Hashable, int], make: Callable[[Record], int],
               out: list[int]) -> None:
    """``_scheduling.classes``' twin: each record's class appended to ``out``, ``class_of[key]``,
    or ``make(record)`` stored there for a key new to it."""
    for record in records:
        cls = class_of.get(record.key)
        if cls is None:
            cls = class_of[record.key] = make(record)
        out.append(cls)


class Classing:
    """Signature classes and their templates (a part of ``flat._Planner``)."""

    # ------------------------------------------------------------------ signing
    def sign(self, records: Sequence[Record], preds: list[list[int]], apart: bool = False, padded: bool = True) -> Problem:
        """Signature classes (with their templates) of the records, and the problem (its parts
        the records' instances when they are ``apart``)."""
        class_of: dict[Hashable, int] = {}  # a record key -> its class
        (SCHEDULING.classes if SCHEDULING is not None else classes_of)(records, class_of, self._class, self.record_class)
        sig = self._merge_ragged()[np.array(self.record_class, dtype=np.int64)]
        if apart and padded:
            sig = self._merge_padded(sig, records)
        self.record_class = sig.tolist()
        solo = np.array([isinstance(t, Template) and t.solo for t in self.templates], dtype=bool)
        sig[solo[sig]] = UNBATCHABLE  # the schedulers run these one by one, and the bound counts them so
        parts = np.fromiter((record.instance for record in records), dtype=np.int64, count=len(records)) \
            if apart else None
        return problem_from(list(range(len(records))), sig, preds, self.classes, parts)

    def round_classes(self, records: Sequence[Record], preds: list[list[int]]) -> list[list[int]] | None:
        """A lockstep round's launches without signing it as a problem, where no record reads
        another's value (each reads values known before the round, and weights) and each
        record's key was met by an earlier plan (``known``) with a class whose template batches
        its members (not a sum of terms, not per size, not one at a time) and that ``sign``
        merges with no other class (not ragged, not of one row; keys of one signature share
        their class). Then each class is one launch of its members in trace order, the classes
        in the order they first appear: what ``depth_schedule`` gives at one depth, for a
        fraction of signing's cost (the planner's fixed cost a round: a parser's round of 55
        calls planned in 81 us, not 104). ``record_class`` is set as ``sign`` sets it. None
        where that does not hold: ``sign`` plans the round."""
        if not records or any(preds):
            return None

        def plain_class(record: Record) -> int:  # ``_class``, for a key learnt with a class that batches on its own
            if record.key not in self.known:  # new: signing learns it
                raise _NotARound
            cls = self._class(record)  # learnt again where its attributes changed since
            template = self.templates[cls]  # a ragged or one-row class's is ``_MERGED_OR_NOT`` until signed
            if type(template) is not Template or template.solo:
                raise _NotARound
            return cls

        record_class: list[int] = []
        try:  # ``sign``'s loop over the records, keys to classes
            (SCHEDULING.classes if SCHEDULING is not None else classes_of)(records, {}, plain_class, record_class)
        except _NotARound:
            return None
        self.record_class = record_class
        if record_class.count(record_class[0]) == len(record_class):  # one class (a parser's scoring round)
            return [list(range(len(records)))]
        launches: dict[int, list[int]] = {}  # classes are numbered as they first appear
        for i, cls in enumerate(record_class):
            launches.setdefault(cls, []).append(i)
        return list(launches.values())

    def _class(self, record: Record) -> int:
        """The class of a record's signature, made (with its template) when new."""
        known = self.known.get(record.key)
        attributes = self._attributes_key(record.attributes)
        if known is None or known[6] != attributes:
            # The record's attributes too, and what they said: a traced record's key holds them
            # by id, and what is learnt may outlive the record (``known``). Kept alive, no
            # attributes made later take that id; a caller may still change them in place.
            known = self.known[record.key] = (*self._kind(record), record.attributes, attributes)
        signature, template, ragged, one_row, _, _, _ = known
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

    def _kind(self, record: Record) -> tuple[tuple, Template | str | None, tuple | None, list[tuple], str]:
        """A record's signature, its class's template, its signature without the length of its
        rows where the op is row-wise (``batcher.ragged``), for a record whose values may
        have one row (``[1, d]``, ``[1, 1, d]``), its signatures as such, which other classes may
        share (``one_row_signatures``), and why it is not row-wise ("" where it is, or where
        that is not asked: a record run alone, a sum of terms). The template of a row-wise
        record is ``_MERGED_OR_NOT`` until its class is known to be merged or not."""
        signature = self._sum_key(record)
        if signature is not None:
            # No template, and no ragged signature: the class takes any number of terms, so one
            # member's (its terms counted) would not hold for the others.
            return signature, None, None, [], ""
        attributes = self._attributes_key(record.attributes)
        row = stacked_row(record)
        if row is not None:  # ``ops.stack``'s: one class whatever the number of rows (``Layout._stacked_rows``)
            return (record.domain, record.op_type, attributes, STACKED_ROWS, row), self._own_template(record), None, [], ""
        signature = (record.domain, record.op_type, attributes, record.entries, tuple(map(bool, record.outputs)))
        length_free = _length_free_key(record, attributes)
        rows = self.rows_of_kinds.get(length_free) if length_free is not None else None
        if rows is None:
            rows = self._rows_of(record, attributes)
            # Row-wise answers only: a refusal's or a loose value's words may name the sizes that differ.
            if length_free is not None and rows[1] is not None:
                self.rows_of_kinds[length_free] = rows
        loose, ragged, not_row_wise, one_row = rows
        if loose is not None:  # one member at a time, its values as they are
            captured = tuple((inside, vtype) for inside, _, vtype in record.captured)
            return (*signature, captured), self._template(record, None, solo=loose), None, [], ""
        template = _MERGED_OR_NOT if ragged is not None or one_row else self._own_template(record)
        return signature, template, ragged, one_row, not_row_wise

    def _rows_of(self, record: Record, attributes: tuple) -> tuple[str | None, tuple | None, str, list[tuple]]:
        """What ``_kind`` asks of a record's values: why they are loose (None: they are not),
        and else its signature without the length of its rows where its op is row-wise, why
        not, and its signatures as values of one row."""
        loose = _loose_reason(record)
        if loose is not None:
            return loose, None, "", []
        opset = self.opsets.get("", 1)
        found = ragged_signature(record, self.weights, opset, attributes)
        ragged, not_row_wise = (None, found.reason) if isinstance(found, Refusal) else (found, "")
        one_row = []
        if ragged is None or ragged[0] in ("ragged", "reshape"):
            one_row = [other for other in one_row_signatures(record, self.weights, opset, attributes) if other != ragged]
        return None, ragged, not_row_wise, one_row

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
            return (any(node_of(first) == node_of(record) for first in firsts),
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
        different depths. A node left in several classes is counted in ``by_shape``, with why
        neither merge took it."""
        keys: list[tuple | None] = []
        by_node: dict[tuple, dict[int, Record]] = {}  # node -> its classes, a record of the node in each
        for cls, record in zip(sig.tolist(), records):
            template = self.templates[cls]
            plain = template == PER_SIZE or isinstance(template, Template) and not (
                template.solo or template.once or template.ragged)
            key = (node_of(record), record.op_type, self._attributes_key(record.attributes)) if plain else None
            keys.append(key)
            if key is not None:
                by_node.setdefault(key, {}).setdefault(cls, record)
        padded: dict[tuple, int] = {}
        for key, classes in by_node.items():
            if len(classes) == 1:
                continue
            found = padding(list(classes.values()), self.opsets.get("", 1), self.weights)
            if isinstance(found, Refusal):
                record = next(iter(classes.values()))
                known = self.known.get(record.key)  # gone where the plan met more keys than are kept
                rows = (known[4] if known is not None else "") or "rows of different shapes"
                self.by_shape[f"{record.op_type}: not ragged ({rows}); not padded ({found.reason})"] += 1
            else:
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
            return reshape_template(self.cache, *signature[1:], self.opsets)
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
                mean = "reduction" not in attrs or as_text(attribute_value(attrs["reduction"])) == "mean"
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
        """The layer over ``x0 [T, B, d]`` (a chunk of padded sequences), ``x4``, their lengths,
        and the members' own initial states, if any (``batcher.sequences``)."""
        _, elem_type, (_, _, width) = specs[0]
        padded = list(specs) + [None] * max(0, SEQUENCE_LENS + 1 - len(specs))
        padded[0] = ("x", elem_type, ("T", "B", width))
        padded[SEQUENCE_LENS] = ("x", TensorProto.INT32, ("B",))
        zero = zero_states(record, self.weights)  # left out: the layer starts from zeros without them
        for k in zero:
            padded[k] = None
        states = sorted(own_states(record))  # [dirs, B, h]: a chunk's members' own, a column each
        for k in states:
            dirs, _, hidden = padded[k][2]  # type: ignore[index]
            padded[k] = ("x", padded[k][1], (dirs, "B", hidden))  # type: ignore[index]
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
            cached[key] = Template(solo.graph, [0, *states], solo.fed, once=False, ragged=True, sequences=outputs)
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
        if not stackable(out) or out.dtype.kind != "f" or not all(e == out for e in record.entries):
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
        per_size = cached.get(base) == PER_SIZE
        if per_size and size is None:
            return PER_SIZE  # resolved per step
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
            cached[base] = PER_SIZE
            if size is None:
                return PER_SIZE
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
                specs.append(("x", entry.elem_type, entry.shape) if stackable(entry) else ("v", entry))
                continue
            array = np.asarray(self.weights[name])
            dtype = array.dtype  # the dtype itself: ml_dtypes types (int4, int2) share a dtype.str
            if array.size <= BAKED_SIZE:
                specs.append(("k", dtype, array.shape, array.tobytes()))
                baked[i] = array
            else:
                specs.append(("w", dtype, array.shape))
        return tuple(specs), baked



def _length_free_key(record: Record, attributes: tuple) -> tuple | None:
    """Whether ``_rows_of`` finds a record row-wise, and its signatures then, depend on its values'
    leading sizes only through which are 0, which 1 and which equal one another (``batcher.ragged``:
    rows run along the first axis that is not 1, and a row-wise op keeps their number): a key with
    each leading size of 2 or more replaced by the order it first appears in, so that the records
    of every length of a sentence's op share one answer. None for a record that reads values of
    subgraphs."""
    if record.captured:
        return None
    labels: dict[int, int] = {}

    def free(vtype: Any) -> Any:
        if type(vtype) is not ValueType or not vtype.shape or type(vtype.shape[0]) is not int or vtype.shape[0] < 2:
            return vtype
        return vtype.elem_type, labels.setdefault(vtype.shape[0], len(labels)), vtype.shape[1:]

    return (record.domain, record.op_type, attributes, tuple(map(free, record.entries)), tuple(map(free, record.types)),
            tuple(map(bool, record.outputs)))


def _loose_reason(record: Record) -> str | None:
    """Why a record runs one member at a time with loose values (its subgraphs, or a value no
    arena holds), or None."""
    if any(proto.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) for proto in record.attributes.values()):
        return "an op with a subgraph runs alone"
    read = (entry for entry in record.entries if entry is None or isinstance(entry, ValueType))
    given = (vtype for name, vtype in zip(record.outputs, record.types) if name)
    for vtype in (*read, *given):
        if not stackable(vtype):
            return f"{vtype!r} values are not stacked" if vtype is not None else "values of unknown type are not stacked"
    return None
