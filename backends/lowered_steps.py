"""The lowering of the plan's steps that are more than a template's call (a part of
``lowering._Lowering``): a segment reduction of each member's rows, the levels of a tree fold,
and a recurrent layer's packed chunks, each as the executor runs it."""

from __future__ import annotations

from typing import Any

import numpy as np
from onnx import helper

from autobatch.batcher.plan import Block, Step
from autobatch.batcher.sequences import COST
from autobatch.ir.records import LEAF

Entry = tuple[str, int]  # where a row lives: row ``index`` of ``tensor`` (``lowering.WHOLE``: the tensor itself)


def pick(entries: list[Any], rows: Any) -> list[Any]:
    """The entries of ``rows`` (a slice, or indices)."""
    if isinstance(rows, slice):
        return entries[rows]
    return [entries[int(r)] for r in np.asarray(rows).reshape(-1)]


class StepKinds:
    """Step kinds of ``lowering._Lowering``, written with its node builders."""

    def reduced(self, rows: str, step: Step) -> str:
        """Each member's run of rows summed (or averaged): one ReduceSum a run of members of one
        length (``flat_executor._reduced``)."""
        assert step.offsets is not None
        total = self.lengths[rows]
        shape, dtype = self.kind(step.writes[0])
        if step.segment is not None and step.segment.keepdims:
            shape = shape[1:]
        offsets = step.offsets.tolist()
        lengths = [end - start for start, end in zip(offsets, [*offsets[1:], total])]
        pieces = []
        k = 0
        while k < len(lengths):
            end = k
            while end < len(lengths) and lengths[end] == lengths[k]:
                end += 1
            count, length = end - k, lengths[k]
            part = self.batched(self.rows_of(rows, list(range(offsets[k], offsets[k] + count * length))), count * length)
            grouped = self.reshaped(part, [count, length, *shape])
            summed = self.axes("ReduceSum", grouped, 1, keepdims=0)
            if step.segment is not None and step.segment.mean:
                summed = self.node("Div", [summed, self.constant(np.array(length, dtype))])[0]
            pieces.append(summed)
            k = end
        result = pieces[0] if len(pieces) == 1 else self.node("Concat", pieces, axis=0)[0]
        if step.segment is not None and step.segment.keepdims:
            result = self.axes("Unsqueeze", result, 1)
        return self.batched(result, len(lengths))

    def fold(self, step: Step, leaves: str) -> list[list[Entry]]:
        """Every state of every node of a fold's trees (``flat_executor._fold``), as entries."""
        states: list[list[Entry | None]] = [[None] * self.plan.rows[write.arena] for write in step.writes]
        leaf_rows = [(leaves, i) for i in range(self.lengths[leaves])]
        for level in step.fold:  # type: ignore[union-attr]
            feeds = {f"w{i}": self.weight(name) for i, name in zip(level.template.fed, level.weights)}
            feeds.update((f"x{i}", self.made(pick(leaf_rows if k == LEAF else states[k], rows)))
                         for i, (k, rows) in zip(level.template.stacked, level.operands))
            for state, value in zip(states, self.call(level.template, feeds)):
                made = range(len(level.nodes)) if level.repeat is None else level.repeat.tolist()
                for node, index in zip(level.nodes.tolist(), made):
                    state[node] = (value, int(index))
        return states  # type: ignore[return-value]

    def sequences(self, step: Step, x: str, states: list[str]) -> list[list[Entry]]:
        """A recurrent layer's outputs chunk by chunk (``batcher.sequences.run_chunks``);
        ``states``: the members' own initial states ``[members, dirs, 1, h]``, if any."""
        template = step.template
        assert template is not None and template.sequences is not None
        feeds = {f"w{i}": self.weight(name) for i, name in zip(template.fed, step.weights)}
        rows = self.lengths[x]
        x0 = template.graph.values["x0"].type  # [T, N, d]
        width, dtype = x0.shape[-1], helper.tensor_dtype_to_np_dtype(x0.elem_type)
        padded = self.batched(self.node("Concat", [self.reshaped(x, [rows, width]),
                                                   self.constant(np.zeros((1, width), dtype))], axis=0)[0], rows + 1)
        results: list[list[Entry | None]] = []
        for write in step.writes:
            if type(write) is Block:
                results.append([None] * self.plan.rows[write.arena])
            else:  # a final state a member: zeros for an empty sequence, which no chunk holds
                zeros = self.constant(np.zeros((1, *self.kind(write)[0]), dtype))
                results.append([(zeros, 0)] * step.size)
        own = [(k, state, template.graph.values[f"x{k}"].type.shape) for k, state in zip(template.stacked[1:], states)]
        for part in step.chunked(COST):
            size = len(part.members)
            feeds["x0"] = self.reshaped(self.rows_of(padded, part.source.tolist()), [-1, size, width])
            feeds["x4"] = self.constant(part.lengths)
            for k, state, (dirs, _, hidden) in own:  # [size, dirs, 1, h] -> [dirs, size, h]
                columns = self.reshaped(self.rows_of(state, part.members.tolist()), [size, dirs, hidden])
                feeds[f"x{k}"] = self.node("Transpose", [columns], perm=[1, 0, 2])[0]
            for index, value, result, write in zip(template.sequences, self.call(template, feeds), results, step.writes):
                if index == 0:  # [T, dirs, size, h] -> a row a (time, sequence): [T * size, dirs, 1, h]
                    time_major = self.node("Transpose", [value], perm=[0, 2, 1, 3])[0]
                    flat = self.reshaped(time_major, [-1, *self.kind(write)[0]])
                    for p, target in enumerate(part.targets.tolist()):
                        result[target] = (flat, int(part.time[p]) * size + int(part.column[p]))
                else:  # [dirs, size, h] -> [size, dirs, 1, h]
                    member_major = self.node("Transpose", [value], perm=[1, 0, 2])[0]
                    member_rows = self.reshaped(member_major, [size, *self.kind(write)[0]])
                    for j, member in enumerate(part.members.tolist()):
                        result[member] = (member_rows, j)
        return results  # type: ignore[return-value]
