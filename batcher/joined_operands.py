"""Stacked operands that a template's Concat joins, read as one (issue 19: the parser's scoring
cell joins its four feature vectors, ``concat([s2, s1, s0, b0])``, every lockstep round).

A member's operands, one after the other, are its joined value's rows: the members' values read
in turn as one stack (``Shaped`` to the joined shape) come joined, and the template without its
Concat copies them no more. The plan keeps the template's steps as the planner made them (every
way of planning a round makes the same plan); the executor reads a step so where its joined
operands lie alike (``joined_step``). onnxruntime's Concat of four ``[64, 512]`` stacks took
~55 us of the ~390 us scoring run, and each stack was a read of its own (``benchmarks/README.md``).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np

from autobatch.batcher.plan import LITERALS, Shaped, Step, Template
from autobatch.ir.nodes import attribute_value
from autobatch.ir.types import ValueType

JOINED = "joined"  # its key in ``Template.variants``
_UNKNOWN = object()


@dataclass(frozen=True)
class Joined:
    """``template`` without the Concat, reading the joined value as stacked operand
    ``operands[0]``; ``operands``: those joined, in the Concat's order; ``shape``: a member's
    joined value."""

    template: Template
    operands: tuple[int, ...]
    shape: tuple[int, ...]


def joined_step(step: Step) -> tuple[Template, list[Any]] | None:
    """The template reading the step's joined operands as one, and the step's reads for it; None
    where its template joins none, or they are not all literals or all rows of one arena."""
    joined = joined_operands(step.template)  # type: ignore[arg-type]
    if joined is None:
        return None
    reads = dict(zip(step.template.stacked, step.reads))  # type: ignore[union-attr]
    parts = [reads[i] for i in joined.operands]
    arena = parts[0][0]
    if any(part[0] != arena for part in parts):
        return None
    if arena == LITERALS and all(type(rows) is list for _, rows in parts):
        rows: Any = list(itertools.chain.from_iterable(zip(*[rows for _, rows in parts])))
    elif arena >= 0 and all(isinstance(rows, (slice, np.ndarray)) for _, rows in parts):
        rows = np.stack([np.arange(r.start, r.stop) if type(r) is slice else r for _, r in parts], axis=1).reshape(-1)
    else:
        return None
    reads[joined.operands[0]] = (arena, Shaped(rows, (step.size, *joined.shape)))
    return joined.template, [reads[i] for i in joined.template.stacked]


def joined_operands(template: Template) -> Joined | None:
    """The template reading its joined operands as one, made once a template; None where no
    Concat joins two or more stacked operands, each read by it alone, of one static type, along
    a member's first axis (then each member's values in turn are its joined rows)."""
    joined = template.variants.get(JOINED, _UNKNOWN)
    if joined is _UNKNOWN:  # (threads that race here all keep the first one's)
        joined = template.variants.setdefault(JOINED, _joined(template))
    return joined


def _joined(template: Template) -> Joined | None:
    if not template.stacks_members:
        return None
    graph = template.graph
    stacked = {f"x{i}": i for i in template.stacked}
    for node in graph.nodes.values():
        names = node.inputs
        if node.op_type != "Concat" or node.domain or len(names) < 2 or len(set(names)) != len(names) \
                or not all(name in stacked and graph.consumer_count(name) == 1 and name not in graph.outputs
                           for name in names):
            continue
        vtype = graph.values[names[0]].type
        if vtype is None or vtype.shape is None or len(vtype.shape) < 2 \
                or not all(isinstance(d, int) for d in vtype.shape[1:]) \
                or any(graph.values[name].type != vtype for name in names) \
                or "axis" not in node.attributes or attribute_value(node.attributes["axis"]) % len(vtype.shape) != 1 \
                or node.outputs[0] in graph.outputs:
            continue
        joined = graph.subgraph([n for n in graph.nodes if n != node.id], f"{graph.name}_joined")
        joined.outputs = list(graph.outputs)  # (in the template's order, not its producers')
        for name in graph.inputs:  # those nothing reads too: the executor feeds every one
            if name not in joined.values and name not in names:
                joined.add_input(name, graph.values[name].type)
        shape = (len(names) * vtype.shape[1], *vtype.shape[2:])
        joined.values[node.outputs[0]].type = ValueType.tensor(vtype.elem_type, (vtype.shape[0], *shape))
        joined = joined.renamed({node.outputs[0]: names[0]})
        dropped = {stacked[name] for name in names[1:]}
        return Joined(Template(joined, [i for i in template.stacked if i not in dropped], list(template.fed),
                               template.once), tuple(stacked[name] for name in names), shape)
    return None
