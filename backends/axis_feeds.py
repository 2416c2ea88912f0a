"""What a mix gives the lowered node-level graph (``backends.instance_axis``): its inputs
concatenated along their length axis, the constants fed per mix (each instance's own,
concatenated or padded), and the index arrays of its lengths: a recurrent layer's chunks
(``batcher.sequences``), the padded layout's chunks of 8 sorted by length, the rows a pick reads.
Index arrays are checked here: a position past its instance is an error of this mix, never
another instance's row.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from autobatch.batcher.axis_steps import aligned, pattern_at
from autobatch.batcher.instance_axis import InstanceAxisPlan
from autobatch.batcher.sequences import CHUNK, chunk_members, chunks

TARGETS = "instance_axis/targets"  # where each row of a recurrent layer's output is in its chunks' outputs
BACK = "padded/targets"  # where each row of a padded value is in its chunks' values, flattened and concatenated
INSTANCES = "padded/instances"  # where each instance is among the chunks' members, in order
STARTS, LENGTHS = "instance_axis/starts", "instance_axis/lengths"  # each instance's first row and its length
POSITIONS_OK = "instance_axis/positions_ok"  # 1 where every position a ``PICKED`` step read was inside its instance


class PositionOutOfRange(IndexError):
    """A position the graph computed is past its instance's length: the batch is not run by the
    node-level plan (run alone, that instance fails; the others do not)."""


def chunk_feeds(k: int) -> tuple[str, str, str]:
    """The feeds of chunk ``k``: its source rows, its ``[T, size, -1]`` shape and its lengths."""
    return f"instance_axis/chunk{k}/source", f"instance_axis/chunk{k}/shape", f"instance_axis/chunk{k}/lengths"


def padded_feeds(k: int) -> tuple[str, str, str, str]:
    """The feeds of chunk ``k`` of the padded layout: the row each (instance, position) reads
    from the rows and a zero row past them, and which are real, both ``[size, Lmax]``; its size
    and its longest."""
    return (f"padded/chunk{k}/source", f"padded/chunk{k}/valid", f"padded/chunk{k}/size",
            f"padded/chunk{k}/longest")


def mix_feeds(plan: InstanceAxisPlan, feeds_list: Sequence[Mapping[str, np.ndarray]], lengths: Sequence[int],
              constants: Sequence[Mapping[str, np.ndarray]]) -> tuple[dict[str, np.ndarray], int]:
    """The lowered graph's feeds for this mix (instances of these ``lengths``, whose own
    ``constants`` give those fed per mix), and its chunks."""
    lengths = np.asarray(lengths, np.int64)
    feeds = {name: np.concatenate([f[name] for f in feeds_list], axis=plan.axis(name)) for name in plan.inputs}
    members = chunk_members(lengths, CHUNK)  # (a padded layout needs no more of the chunks than who is in each)
    starts = np.cumsum(lengths) - lengths  # each instance's first row
    for name, size in plan.bounded.items():  # (a padded position reads index 0: past the axis, an error for all)
        if any(np.any((c[name] < -size) | (c[name] >= size)) for c in constants):
            raise PositionOutOfRange(f"GatherElements indices {name!r} reach past an axis of {size}")
    for name, layouts in plan.fed.items():
        for padded, pattern in layouts.items():
            arrays = [aligned(c[name], pattern) for c in constants]
            if name in plan.indices:  # positions along each instance's length: to the rows of all
                arrays = [_positions(array, plan.indices[name], int(length), int(start), name)
                          for array, length, start in zip(arrays, lengths, starts)]
            if padded:
                for k, chunk in enumerate(members):
                    feeds[f"{name}/chunk{k}"] = _padded([arrays[m] for m in chunk], pattern, int(lengths[chunk[0]]))
            else:
                feeds[name] = np.concatenate(arrays, axis=pattern.index(None))
    if plan.picked:
        feeds[STARTS], feeds[LENGTHS] = starts, lengths
    for record, step in plan.picks:  # each instance's row at the position, counted from its own end where negative
        if np.any(step.position < -lengths) or np.any(step.position >= lengths):  # (``takes`` sends such batches away)
            raise IndexError(f"position {step.position} of {record.outputs[0]!r} is past an instance's length")
        feeds[picked_rows(record)] = starts + step.position % lengths
    if plan.padded:
        feeds.update(_padded_chunks(members, lengths, starts))
    if not plan.recurrent:
        return feeds, len(members)
    targets = np.empty(int(lengths.sum()), np.int64)
    offset = 0
    for k, part in enumerate(chunks(lengths, CHUNK)):
        source, shape, sizes = chunk_feeds(k)
        size = len(part.members)
        feeds[source], feeds[shape], feeds[sizes] = part.source, np.array([len(part.source) // size, size, -1]), part.lengths
        targets[part.targets] = offset + part.time * size + part.column
        offset += len(part.source)
    feeds[TARGETS] = targets
    return feeds, len(members)


def picked_rows(record: Any) -> str:
    """The feed of a ``PICK``'s rows: each instance's row at its position."""
    return f"{record.outputs[0]}/picked"


def _positions(indices: np.ndarray, component: int | None, length: int, start: int, name: str) -> np.ndarray:
    """An instance's Gather indices along its length (a GatherND's: that ``component`` of its
    index tuples, those before it indexing axes of size 1), as rows of the whole mix. Past the
    length, the instance alone would fail: an IndexError here, never another instance's row."""
    if component is not None:
        ones, positions = indices[..., :component], indices[..., component]
        if ones.size and (ones.min() < -1 or ones.max() > 0):
            raise IndexError(f"GatherND indices {name!r} reach past an axis of size 1")
        result = np.zeros_like(indices)
        result[..., component] = _positions(positions, None, length, start, name)
        result[..., component + 1:] = indices[..., component + 1:]
        return result
    if indices.size and (indices.min() < -length or indices.max() >= length):
        raise IndexError(f"Gather indices {name!r} reach past an instance's length {length}")
    return indices % length + start if length else indices


def _padded_chunks(members: Sequence[np.ndarray], lengths: np.ndarray, starts: np.ndarray) -> dict[str, np.ndarray]:
    """The padded layout's feeds: each chunk's (``padded_feeds``), and where each row is."""
    total = int(lengths.sum())
    feeds, back, offset = {}, np.empty(total, np.int64), 0
    for k, chunk in enumerate(members):
        source, valid, size, longest = padded_feeds(k)
        count, most = len(chunk), int(lengths[chunk[0]])
        positions = np.arange(most)[None, :]
        real = positions < lengths[chunk][:, None]
        feeds[valid], feeds[size], feeds[longest] = real, np.array([count]), np.array([most])
        rows = starts[chunk][:, None] + positions
        feeds[source] = np.where(real, rows, total)
        back[rows[real]] = offset + np.flatnonzero(real)
        offset += count * most
    feeds[BACK] = back
    feeds[INSTANCES] = np.argsort(np.concatenate(members)) if members else np.zeros(0, np.int64)
    return feeds


def _padded(arrays: Sequence[np.ndarray], pattern: tuple, longest: int) -> np.ndarray:
    """Each instance's constant in a batch padded to ``longest`` (zeros past its length)."""
    result = np.zeros((len(arrays), *pattern_at(pattern, longest)), arrays[0].dtype)
    for b, array in enumerate(arrays):
        result[(b, *(slice(0, n) for n in array.shape))] = array
    return result
