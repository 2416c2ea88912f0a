"""Recurrent layers over sequences of different lengths, batched as packed sequences.

One instance's LSTM, GRU or RNN reads its sequence as ``X [n, 1, d]`` (time-major, a batch of
one). Calls of one layer over sequences of different lengths become one step: the members are
sorted by length and cut into chunks; each chunk is padded to its longest member and runs as
one call of the layer with ``sequence_lens``. The ONNX layers give a
sequence past its length its last state and zero outputs, so padding changes no member's
result (a reverse layer reads each sequence from its own end). An empty sequence is in no chunk: its
final states are zeros, as ONNX defines them (onnxruntime, run on it alone, leaves them
uninitialized).

Chunks bound the padding: onnxruntime computes every row of a padded step. But a call, and each
of its steps, also costs a fixed time, and a step's product runs slower a row over few rows, so
how many sequences a chunk should hold depends on the layer and the lengths: over 64 WikiNER
sentences (lengths 7..58, an LSTM of 256 on 256) chunks of 8 ran about twice as fast as one
padded call of all 64 and faster than chunks of 4, 16 or 32 (``python -m benchmarks.
sequence_chunks``), while the char tagger's 481 words (lengths 4..16, 128 on 64) ran fastest in
chunks of 32 or more. The executor cuts chunks by a model of a call's cost (``CallCost``); a
fixed ``CHUNK`` remains for callers that ask for one.

Only the plain case is taken: ``layout`` 0, shared weights, no ``sequence_lens``, and initial
states not given, shared zeros (as exporters write them) or each instance's own ``[dirs, 1, h]``
(stacked a column a sequence in each chunk); a call with others batches by ``batcher.rules``
when the lengths agree.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from autobatch.batcher.rule_tables import Refusal, refuse
from autobatch.ir import ValueType, attribute_value

RECURRENT = frozenset({"LSTM", "GRU", "RNN"})
CHUNK = 8  # sequences a padded call of a fixed size (see the module)
COST = "by cost"  # asked for instead of a chunk size: the chunks ``CALL_COST`` models as fastest
SEQUENCE_LENS = 4  # the input index of ``sequence_lens``
PEEPHOLE = 7  # LSTM's ``P``: shared like the weights; the inputs between are initial states


def zero_states(record: Any, weights: Mapping[str, np.ndarray]) -> frozenset[int]:
    """The input indices of a recurrent record's initial states that are shared zeros: what the
    layer starts from when they are not given, as exporters write them."""
    return frozenset(k for k in (SEQUENCE_LENS + 1, SEQUENCE_LENS + 2)
                     if k < len(record.inputs) and record.inputs[k] in weights and not np.any(weights[record.inputs[k]]))


def own_states(record: Any) -> frozenset[int]:
    """The input indices of a recurrent record's initial states that are the instance's own
    (``[dirs, 1, h]`` each): stacked per chunk, a column a sequence."""
    return frozenset(k for k in (SEQUENCE_LENS + 1, SEQUENCE_LENS + 2)
                     if k < len(record.entries) and isinstance(record.entries[k], ValueType))


def sequence_signature(record: Any, attributes: tuple, weights: Mapping[str, np.ndarray]) -> tuple | Refusal | None:
    """The signature of a recurrent record without the length of its sequence, a refusal when it
    is not the plain case (see the module), None when it is not a recurrent layer. ``record`` is
    an ``ir.records.Record``, ``attributes`` its ``attributes_key``."""
    if record.op_type not in RECURRENT or record.domain:
        return None
    x, *shared = record.entries
    if not isinstance(x, ValueType) or len(x.shape) != 3 or x.shape[1] != 1:
        return refuse("a recurrent layer over other than one sequence [T, 1, d]")
    states = own_states(record)
    if any(isinstance(entry, ValueType) for k, entry in enumerate(shared, 1) if k not in states):
        return refuse("a recurrent layer with per-instance weights or lengths")
    if states and (x.shape[0] == 0 or any(len(record.entries[k].shape) != 3 or record.entries[k].shape[1] != 1
                                          for k in states)):
        return refuse("a recurrent layer with initial states of its own over no steps, or not [dirs, 1, h]")
    zero = zero_states(record, weights)
    if any(name for k, name in enumerate(record.inputs) if SEQUENCE_LENS <= k < PEEPHOLE and k not in zero | states):
        return refuse("a recurrent layer with sequence lengths, or initial states shared but not zeros")
    layout = record.attributes.get("layout")
    if layout is not None and attribute_value(layout) != 0:
        return refuse("a recurrent layer of batch-first layout")
    entries = (("rows", x.elem_type, x.shape[1:]), *(None if k in zero else entry for k, entry in enumerate(shared, 1)))
    return ("sequences", record.op_type, attributes, entries, tuple(map(bool, record.outputs)))


@dataclass(frozen=True)
class Chunk:
    """Sequences padded into one call. ``source`` ``[T * size]`` holds, time-major, the row of
    the step's concatenated input each (time, sequence) reads (``rows``, one past the last, for
    padding); the real (not padding) positions are at ``time``, ``column`` of the call's
    output, and ``targets`` are their rows."""

    source: np.ndarray
    lengths: np.ndarray  # int32, as ``sequence_lens``
    members: np.ndarray  # the step's members in this chunk, in its order
    time: np.ndarray
    column: np.ndarray
    targets: np.ndarray


@dataclass(frozen=True)
class CallCost:
    """What a padded call of a recurrent layer costs, by parts: the call (with the gathers and
    writes around it), each of its time steps, and the arithmetic of each padded row of a step.
    Measured on onnxruntime's CPU LSTM here, 2 threads (a sweep of one LSTM call over T and N
    from 1 to 256, 128 on 64 and 256 on 256, a throwaway script; benchmarks/README.md): about
    20 us a call and 6-12 us a step inside onnxruntime, 250-300 GFLOP/s on a step's rows from 8
    of them, and the executor's own gathers and writes about 80 us more a call. Fitted to the
    CPU executor: a lowered graph pays less a call, a GPU more."""

    call: float = 1e-4  # seconds
    step: float = 8e-6  # seconds
    flops: float = 2.5e11  # a second
    most: int = 256  # sequences a call at most
    rows: int = 16384  # padded (step, sequence) rows a call at most: its padded input and outputs stay bounded

    def chunks(self, lengths: np.ndarray, row_flops: float) -> list[np.ndarray]:
        """The members of each call (longest first; an empty sequence in none) for the least
        modelled time, for a layer of ``row_flops`` a sequence's step. A call costs ``call +
        T * (step + n * row)`` for its n sequences padded to the longest, T: larger calls launch
        less often and make larger products, but pad the shorter sequences to the longest.
        In some fastest cut the calls hold runs of the sorted lengths (moving a sequence to a
        call of shorter ones never pads it more), and a call starts where a run of one length
        does (moving the end of a run into the call that holds the rest of it pads nothing
        more), or a most-sized call before a call that starts so (the call holding the rest is
        full), so only those starts are tried."""
        order = _longest_first(lengths)
        ordered = lengths[order]
        n = len(ordered)
        if n == 0:
            return []
        most = max(1, min(self.most, self.rows // int(ordered[0])))
        runs = np.r_[np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]]), n]
        starts = np.unique(np.concatenate([np.arange(end, -1, -most) for end in runs]))
        row = row_flops / self.flops
        best = np.zeros(len(starts))  # the least time of the members before each start
        came = np.zeros(len(starts), dtype=np.int64)  # where the last call of that best begins
        longest = ordered[starts[:-1]].astype(np.float64)
        for k in range(1, len(starts)):
            first = int(np.searchsorted(starts, starts[k] - most))  # calls of at most ``most``
            members = starts[k] - starts[first:k]
            total = best[first:k] + self.call + longest[first:k] * (self.step + members * row)
            j = int(np.argmin(total))
            best[k], came[k] = total[j], first + j
        cuts, k = [], len(starts) - 1
        while k:
            cuts.append((starts[came[k]], starts[k]))
            k = came[k]
        return [order[a:b] for a, b in reversed(cuts)]


CALL_COST = CallCost()


def row_flops(dirs: int, gated: int, inputs: int, hidden: int) -> float:
    """The arithmetic of one sequence's step of a layer: its input and recurrent products, each
    direction (W ``[dirs, gated, inputs]``, R ``[dirs, gated, hidden]``, ``gated`` = gates * h)."""
    return 2.0 * dirs * gated * (inputs + hidden)


def row_step_flops(template: Any) -> float | None:
    """``row_flops`` of a recurrent layer's template, from its W and R; None where their shapes
    are not known (a template made by hand: the rules refuse weights that are not arrays)."""
    graph = template.graph
    node = next(node for node in graph.nodes.values() if node.op_type in RECURRENT)
    w, r = (graph.values[name].type if name in graph.values else None for name in node.inputs[1:3])
    shapes = [vtype.shape if vtype is not None and vtype.is_static and len(vtype.shape) == 3 else None for vtype in (w, r)]
    if shapes[0] is None or shapes[1] is None:
        return None
    return row_flops(*shapes[0], shapes[1][2])


def _longest_first(lengths: np.ndarray) -> np.ndarray:
    """The members, longest first (stably), but the empty sequences: they need no call, their
    states stay zero."""
    order = np.argsort(-lengths, kind="stable")
    return order[lengths[order] > 0]


def chunk_members(lengths: np.ndarray, size: int = CHUNK) -> list[np.ndarray]:
    """The members of each chunk of ``size`` (``chunks``' order: longest first; an empty
    sequence in none)."""
    order = _longest_first(lengths)
    return [order[first:first + size] for first in range(0, len(order), size)]


def chunks(lengths: Sequence[int], size: int = CHUNK, row_flops: float | None = None) -> list[Chunk]:
    """The chunks of ``size`` members of these lengths (in the step's order, their rows one
    after the other), longest first; with ``row_flops`` (a step of one sequence), the chunks
    ``CALL_COST`` models as fastest."""
    lengths = np.asarray(lengths, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    rows = int(lengths.sum())
    result = []
    for members in CALL_COST.chunks(lengths, row_flops) if row_flops is not None else chunk_members(lengths, size):
        steps = np.arange(lengths[members[0]])[:, None]
        inside = steps < lengths[members][None, :]
        source = np.where(inside, starts[members][None, :] + steps, rows)
        time, column = np.nonzero(inside)
        result.append(Chunk(source.ravel(), lengths[members].astype(np.int32), members, time, column,
                            source[time, column]))
    return result


def run_chunks(run: Any, feeds: Mapping[str, Any], x: np.ndarray, parts: list[Chunk], outputs: Sequence[int],
               results: list[np.ndarray], states: Mapping[int, np.ndarray]) -> list[np.ndarray]:
    """The layer's ``outputs`` (ONNX output indices: 0 is ``Y``, the others final states) for
    every member, from ``x`` (the members' rows concatenated, ``[rows, 1, d]``) and ``states``
    (by input index, the members' own initial states ``[members, dirs, 1, h]``), written into
    ``results``: ``Y`` as the members' rows concatenated ``[rows, dirs, 1, h]``, a state per
    member ``[members, dirs, 1, h]`` (zeros for an empty sequence, which no chunk holds).
    ``run(feeds)`` runs the layer's template (inputs ``x0``, ``x4`` and the states', see ``flat``)."""
    width = int(np.prod(x.shape[1:]))
    padded = np.concatenate([x.reshape(len(x), width), np.zeros((1, width), dtype=x.dtype)])
    feeds = dict(feeds)
    for part in parts:
        size = len(part.members)
        feeds["x0"] = padded.take(part.source, axis=0).reshape(-1, size, width)
        feeds["x4"] = part.lengths
        for k, state in states.items():  # [size, dirs, 1, h] -> [dirs, size, h]
            feeds[f"x{k}"] = np.ascontiguousarray(state[part.members][:, :, 0].transpose(1, 0, 2))
        for index, value, result in zip(outputs, run(feeds), results):
            if index == 0:  # [T, dirs, size, h]: time-major, as the source rows
                result[part.targets, :, 0] = value[part.time, :, part.column]
            else:  # [dirs, size, h]
                result[part.members] = value.transpose(1, 0, 2)[:, :, None, :]
    return results
