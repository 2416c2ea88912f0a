"""One ONNX model's instances as records: each instance's typed graph walked once into records
over its own value names (``instance_records``), and a batch's instances put together without
building their union graph (``mix_records``), for the flat planner."""

from __future__ import annotations

import hashlib
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from autobatch.batcher.constants import FOLD_LIMIT
from autobatch.batcher.signature import attributes_key
from autobatch.ir import Graph, captured_names
from autobatch.ir.records import Record
from autobatch.ir.types import MISSING, same_bits


@dataclass
class InstanceRecords:
    """One instance's graph as records over its own value names. ``InferenceSession`` keeps
    them per input signature, and ``mix_records`` puts those of a batch's instances together
    (renamed per instance) without building the union graph: a new mix of shapes costs a
    plan, not a graph. ``weights`` are the graph's constants, shared by every instance."""

    records: list[Record]
    own: set[str]  # the instance's own values (renamed per instance)
    producer: dict[str, int]
    weights: dict[str, np.ndarray]
    named: dict[str, str] = field(default_factory=dict)  # a constant's name by its value (``own_name``), once worked out
    # A constant's record key without its name (``_constant_key``: dtype, shape, digest; () for a
    # large one), once worked out: hashing BERT's position-embedding slices of up to 15,000
    # elements again for every instance of every mix cost about an eighth of its ``mix_records``.
    tails: dict[str, tuple] = field(default_factory=dict)
    _reading: dict[tuple[str, ...], frozenset[int]] = field(default_factory=dict)  # ``reading_own``

    def reading_own(self, own: tuple[str, ...]) -> frozenset[int]:
        """The records that read one of the constants ``own`` (of this instance alone in a mix)."""
        found = self._reading.get(own)
        if found is None:
            mine = set(own)
            found = self._reading[own] = frozenset(i for i, r in enumerate(self.records) if not mine.isdisjoint(r.entries))
        return found

    def own_name(self, instance: int, name: str) -> str:
        """An own constant named by its value where small (instances with the same value share
        it, and a record's key, by which what plans learn is kept, does not depend on where the
        instance is in its mix), else by its instance."""
        named = self.named.get(name)
        if named is None:
            tail = self._tail(name)
            value = hashlib.blake2b(repr(tail[:2]).encode() + tail[2], digest_size=16).hexdigest() if tail else ""
            named = self.named[name] = f"{name}#{value}" if value else ""
        return named or f"i{instance}/{name}"

    def signed(self, entries: tuple, signed: tuple, names: Mapping[str, str]) -> tuple:
        """A record's ``signed`` entries (its key's, in this instance's names) with those that
        read the instance's own constants under their ``names`` in a mix, as ``_signed`` would
        sign them there."""
        return tuple(_renamed_key(names[entry], self._tail(entry)) if type(entry) is str and entry in names else key
                     for entry, key in zip(entries, signed))

    def _tail(self, name: str) -> tuple:
        tail = self.tails.get(name)
        if tail is None:
            key = _constant_key(name, self.weights[name])
            tail = self.tails[name] = key[1:] if isinstance(key, tuple) else ()
        return tail


def instance_records(graph: Graph) -> InstanceRecords:
    """The nodes of ``graph`` (one instance, its values typed) in topological order as records."""
    weights = graph.initializers()
    producer: dict[str, int] = {}
    records = []
    for i, node in enumerate(graph.topological_order()):
        entries = tuple(MISSING if not name else name if name in weights else graph.values[name].type
                        for name in node.inputs)
        types = [graph.values[name].type if name else None for name in node.outputs]
        captured = tuple((name, name, graph.values[name].type) for name in sorted(captured_names(node))
                         if name in graph.values)
        preds = sorted({producer[name] for name in (*node.inputs, *(c[0] for c in captured)) if name in producer})
        # The key holds the attributes by content: callers keep what plans learn of keys longer
        # than these records live, and an id could come back for other attributes. So it holds
        # small constants by content too: one folded from an input's shape has the same name in
        # the graph of every input signature, but not the same value.
        # ... and which optional outputs the node wants: a class's template makes those of its first
        key = (node.domain, node.op_type, attributes_key(node.attributes), _signed(entries, weights), captured,
               tuple(map(bool, node.outputs)))
        records.append(Record(node.op_type, node.domain, node.inputs, node.outputs, node.attributes, types,
                              entries, key, preds, captured=captured))
        producer.update((name, i) for name in node.outputs if name)
    return InstanceRecords(records, set(graph.values) - weights.keys(), producer, weights)


def mix_records(pieces: Sequence[InstanceRecords]) -> tuple[list[Record], dict[str, int], dict[str, np.ndarray]]:
    """The records of a batch: those of instance k after those of instances 0..k-1, its own
    values named ``i{k}/name``; the record producing each value; and the constants they read.
    A constant every instance has alike is shared; one that differs (an unrolled loop's trip
    values, a value folded for a length) is the instance's own, and so are the entries that name
    it: named by its value where small (``InstanceRecords.own_name``)."""
    weights = _common_weights([piece.weights for piece in pieces])
    records: list[Record] = []
    producer: dict[str, int] = {}
    for k, piece in enumerate(pieces):
        offset = len(records)
        own = tuple(name for name in piece.weights if name not in weights) if weights is not piece.weights else ()
        names = {name: f"i{k}/{name}" for name in piece.own}
        names.update((name, piece.own_name(k, name)) for name in own)
        weights.update((names[name], piece.weights[name]) for name in own)
        rename = names.get
        reading = piece.reading_own(own)
        for i, r in enumerate(piece.records):
            entries, key = r.entries, r.key
            if i in reading:
                key = (*key[:3], piece.signed(entries, key[3], names), *key[4:])
                entries = tuple(rename(entry, entry) if type(entry) is str else entry for entry in entries)
            records.append(Record(r.op_type, r.domain, list(map(rename, r.inputs, r.inputs)),
                                  list(map(rename, r.outputs, r.outputs)), r.attributes, r.types, entries, key,
                                  [p + offset for p in r.preds], k,
                                  tuple((inside, rename(outside, outside), vtype) for inside, outside, vtype in r.captured)
                                  if r.captured else ()))
        producer.update((names[name], index + offset) for name, index in piece.producer.items())
    return records, producer, weights


def _common_weights(weights: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The constants of every instance's graph that all have alike (the first's dict itself,
    when every instance has it: one model's typed graphs share theirs)."""
    first = weights[0]
    if all(other is first for other in weights[1:]):
        return first
    return {name: array for name, array in first.items()
            if all(name in other and alike(array, other[name]) for other in weights[1:])}


def _signed(entries: tuple, weights: Mapping[str, np.ndarray]) -> tuple:
    """Entries as a record key holds them: a constant by its name, and a small one (up to
    ``FOLD_LIMIT`` elements) by its value too."""
    return tuple(_constant_key(entry, weights[entry]) if type(entry) is str and entry in weights else entry
                 for entry in entries)


def _renamed_key(name: str, tail: tuple) -> Hashable:
    return (name, *tail) if tail else name


def _constant_key(name: str, array: np.ndarray) -> Hashable:
    if array.size > FOLD_LIMIT:
        return name
    data = repr(array.tolist()).encode() if array.dtype.kind == "O" else np.ascontiguousarray(array).tobytes()
    return name, array.dtype.str, array.shape, hashlib.blake2b(data, digest_size=16).digest()


def alike(a: np.ndarray, b: np.ndarray) -> bool:
    """The same array, or ones of one dtype and shape equal bit for bit where they are
    floating: a constant 0.0 of one instance is not the -0.0 of another (``1 / c`` tells them
    apart), nor is one NaN another's."""
    if a is b:
        return True
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return same_bits(a, b) if a.dtype.kind in "fc" else bool(np.array_equal(a, b))
