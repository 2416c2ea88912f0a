"""Padded batching: one node of a model over instances of different lengths, where ragged
batching cannot take it (attention's ``[1, h, L, L]`` scores, the products that make and use
them, the Transposes and Reshapes between), runs in chunks of instances, each padded to its
longest member, rather than a launch a length.

Instances are sorted by their shapes and cut into chunks of at most ``CHUNK`` (or all those of
one shape, when there are more), each chunk's last member at least as long as the others in
every axis: that member's own template runs for the
chunk, every member's operands placed at the start of zeros of that member's shapes, and each
member's result cut out of it. It is exact where every real position of the result is computed
from real positions of the operands alone: position by position (elementwise ops, with the same
broadcasting for every member), through a product whose padded terms are zeros (MatMul over a
padded axis adds zeros), by a reshape that keeps padded axes whole (Reshape, Squeeze, Unsqueeze,
Flatten), by a Gather of a shared index or a Concat along an axis no member pads (or a Concat of
one operand, which copies it), or by a Softmax over a padded
axis whose padded scores are -inf, along that axis only (a row of real scores keeps its value,
even one all -inf or all the lowest float, as masks write them; a row of padding alone is zeros,
finite). The padded positions of a result are never read. (A product or a sum over more terms, the added ones
zeros, may round differently from the instance alone, as ragged products do.)
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from autobatch.batcher.instances import alike
from autobatch.batcher.ragged import record_attribute
from autobatch.batcher.rule_tables import Refusal, install_in, refuse
from autobatch.ir import ValueType

CHUNK = 8  # instances a padded launch (as ``batcher.sequences`` chunks sequences)


@dataclass(frozen=True)
class Padding:
    """The template of a class of padded members: its steps are worked out from its members
    (``flat``). ``fills``: by input index, ``(axis, value)`` to pad that operand with along that
    axis of its own (zeros everywhere else)."""

    fills: tuple[tuple[int, tuple[int, float]], ...]


@dataclass(frozen=True)
class Members:
    """What a padding rule sees of one node's records over instances apart: ``data``, the
    indices of the per-instance operands; ``shapes[m]``, member m's data shapes then its
    outputs'; ``own``, the shared operands that differ between members (constants of each
    instance's own)."""

    records: list[Any]
    data: list[int]
    shapes: list[list[tuple[int, ...]]]
    own: list[int]
    opset: int
    weights: Mapping[str, np.ndarray]

    def axis(self, name: str, default: int) -> int:
        """The first member's ``name`` attribute as an axis of its first per-instance operand, made positive."""
        return record_attribute(self.records[0], name, default) % len(self.shapes[0][0])

    def varies(self, k: int, axis: int) -> bool:
        """Whether members pad axis ``axis`` of their k-th per-instance operand."""
        return len({row[k][axis] for row in self.shapes}) > 1


Fills = dict[int, tuple[int, float]]
Rule = Callable[[Members], "Fills | Refusal"]


class PadRule(NamedTuple):
    """A row of ``PADDED``: when padding takes the op (``batcher.capabilities`` prints it), its
    rule, and whether the op may read a constant of each instance's own (the rule then checks
    it: ``Members.own``)."""

    when: str
    rule: Rule
    own_constants: bool


# op type -> its rule: padded, each real position of the result is computed from real positions alone.
PADDED: dict[str, PadRule] = {}


def padded(when: str, *op_types: str, own_constants: bool = False) -> Callable[[Rule], Rule]:
    return install_in(PADDED, op_types, lambda rule: PadRule(when, rule, own_constants))


@padded("position by position, operands broadcast alike for every member; a constant of each "
        "instance's own only where it is the corner of every longer one's",
        "Add", "Sub", "Mul", "Where", "Cast", "Equal", "Not", "And", "Or", "Neg", "Relu", "Tanh", "Sigmoid", "Erf",
        "Abs", "Exp", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "IsNaN", "IsInf", "Identity",
        own_constants=True)
def _elementwise(m: Members) -> Fills | Refusal:
    if not _broadcasts_alike([[r.entries[i].shape for r in m.records] for i in m.data], m.records):
        return refuse("operands that broadcast differently for different members")
    for i in m.own:
        constants = [np.asarray(m.weights[r.inputs[i]]) for r in m.records]
        if not _broadcasts_alike([[c.shape for c in constants]], m.records) or not _corners(constants):
            return refuse("a constant of one instance's own that is not a corner of a longer one's, or that "
                          "broadcasts differently for different members")
    return {}


@padded("elementwise, by a shared divisor", "Div", own_constants=True)
def _divide(m: Members) -> Fills | Refusal:
    if m.data != [0]:
        # (its padded positions, zeros, would make infinities where nothing reads them: refused all the same)
        return refuse("a divisor of each instance's own, whose padding would divide by 0")
    return _elementwise(m)


@padded("a product of matrices, operands broadcast alike (a padded axis adds zeros)", "MatMul")
def _matmul(m: Members) -> Fills | Refusal:
    first = m.records[0]
    if any(len(first.entries[i].shape) < 2 for i in m.data) or not _broadcasts_alike(
            [[r.entries[i].shape for r in m.records] for i in m.data], m.records, 2):
        return refuse("a vector operand, or operands that broadcast differently for different members")
    return {}


@padded("any permutation", "Transpose")
def _transpose(m: Members) -> Fills | Refusal:
    return {}


@padded("a reshape of one per-instance value that keeps the padded axes whole",
        "Reshape", "Squeeze", "Unsqueeze", "Flatten")
def _reshape(m: Members) -> Fills | Refusal:
    if m.data != [0] or not _keeps_padded_axes_whole([row[0] for row in m.shapes], [row[1] for row in m.shapes]):
        return refuse("a per-instance shape, or a reshape that does not keep the padded axes whole")
    return {}


@padded("by a shared index, along an axis no member pads", "Gather")
def _gather(m: Members) -> Fills | Refusal:
    if m.data != [0] or m.varies(0, m.axis("axis", 0)):
        return refuse("per-instance indices, or a gather along an axis that members pad")
    return {}


@padded("per-instance operands along an axis none pads, or one operand", "Concat")
def _concat(m: Members) -> Fills | Refusal:
    if len(m.data) != len(m.records[0].entries):
        return refuse("a shared operand joined to per-instance ones")
    axis = m.axis("axis", 0)
    if len(m.data) > 1 and any(m.varies(k, axis) for k in range(len(m.data))):
        return refuse("operands joined along an axis that members pad")
    return {}


@padded("from opset 13, over one axis: a padded one is filled with -inf", "Softmax", "LogSoftmax")
def _softmax(m: Members) -> Fills | Refusal:
    if m.opset < 13:
        return refuse("no exact padding before opset 13 (it normalizes over every later axis)")
    if m.data != [0]:
        return refuse("a per-instance operand other than the scores")
    axis = m.axis("axis", -1)
    return {0: (axis, float("-inf"))} if m.varies(0, axis) else {}  # padded scores: exp(-inf - max) is 0


def padding(records: list[Any], opset: int, weights: Mapping[str, np.ndarray]) -> Padding | Refusal:
    """How the records (one of each class of one node: per class, its members' types) batch
    padded, or a refusal saying why padding could change a real position's value (see the module).
    ``weights``: the shared values, an instance's own constants among them."""
    first = records[0]
    if first.domain:
        return refuse(f"an op of domain {first.domain}")
    if first.op_type not in PADDED:
        return refuse("no exact padding")
    if any(len(r.entries) != len(first.entries) or len(r.types) != len(first.types) for r in records):
        return refuse("members with different numbers of inputs or outputs")
    data = [i for i, entry in enumerate(first.entries) if isinstance(entry, ValueType)]
    if not data or any([i for i, e in enumerate(r.entries) if isinstance(e, ValueType)] != data for r in records):
        return refuse("no per-instance operand, or not the same ones for every member")
    shapes = [[r.entries[i].shape for i in data] + [t.shape if t is not None else None for t in r.types] for r in records]
    if any(shape is None for row in shapes for shape in row):
        return refuse("a shape not known")
    if any(len(shape) != len(other) for row in shapes for shape, other in zip(row, shapes[0])):
        return refuse("members whose values differ in rank")
    if any(r.entries[i].elem_type != first.entries[i].elem_type for r in records for i in data):
        return refuse("members whose values differ in element type")
    # Shared operands the same for every member (but a Reshape's target: the longest member's
    # is the padded shape), or, for an elementwise op, an instance's own constant (a mask folded
    # for its length) that is a corner of every longer member's (``_elementwise``).
    own_target = {1} if first.op_type == "Reshape" else set()
    own = [i for i in range(len(first.entries)) if i not in data and i not in own_target
           and any(r.entries[i] != first.entries[i] for r in records)]
    row = PADDED[first.op_type]
    if own and not row.own_constants:
        return refuse("a shared operand that differs between members (a constant of one instance's own)")
    fills = row.rule(Members(records, data, shapes, own, opset, weights))
    return fills if isinstance(fills, Refusal) else Padding(tuple(sorted(fills.items())))


def _broadcasts_alike(operands: list[list[tuple[int, ...]]], records: list[Any], matrix: int = 0) -> bool:
    """Every operand (``operands[k][m]``: operand k's shape in member m) broadcasts to the result
    the same way for every member: along each axis (but the last ``matrix`` ones, a product's),
    its size is the result's for every member, or 1 for every member. Padded, a size of 1 for one
    member and not for another would stop broadcasting its value over that member's real positions."""
    outs = [r.types[0].shape for r in records]
    for shapes in operands:
        if any(len(shape) != len(shapes[0]) or len(shape) > len(out) for shape, out in zip(shapes, outs)):
            return False
        for axis in range(1, len(shapes[0]) - matrix + 1):
            pairs = [(shape[-axis - matrix], out[-axis - matrix]) for shape, out in zip(shapes, outs)]
            if not (all(size == out for size, out in pairs) or all(size == 1 for size, _ in pairs)):
                return False
    return True


def _corners(constants: list[np.ndarray]) -> bool:
    """Each member's constant is the corner (the first positions along every axis) of the
    largest one's (a causal or an all-zeros mask folded for each length is). Then a chunk's
    longest member's constant, which its template reads, holds each member's own at that
    member's real positions: padded, every real position reads its own instance's value."""
    largest = max(constants, key=lambda c: c.size)
    if any(c.ndim != largest.ndim or any(a > b for a, b in zip(c.shape, largest.shape)) for c in constants):
        return False
    return all(alike(c, largest[tuple(map(slice, c.shape))]) for c in constants)  # bit for bit: -0.0 is not 0.0


def _keeps_padded_axes_whole(ins: list[tuple[int, ...]], outs: list[tuple[int, ...]]) -> bool:
    """A reshape of each member's ``ins[m]`` to ``outs[m]`` maps padded values to padded
    values: the axes whose sizes differ between members are as many on both sides, of the same
    sizes in order for every member, and the axes between them (the same for every member)
    hold as many elements on both sides. Then each member's elements move as the longest's do."""
    def varying(shapes: list[tuple[int, ...]]) -> list[int]:
        return [axis for axis in range(len(shapes[0])) if len({shape[axis] for shape in shapes}) > 1]

    vin, vout = varying(ins), varying(outs)
    if len(vin) != len(vout) or any(i[a] != o[b] for i, o in zip(ins, outs) for a, b in zip(vin, vout)):
        return False
    bounds_in, bounds_out = [-1, *vin, len(ins[0])], [-1, *vout, len(outs[0])]
    return all(math.prod(ins[0][a + 1:b]) == math.prod(outs[0][c + 1:d])
               for (a, b), (c, d) in zip(zip(bounds_in, bounds_in[1:]), zip(bounds_out, bounds_out[1:])))


def padded_chunks(members: list[Any]) -> list[list[Any]]:
    """Members (records) sorted by their shapes, cut into chunks whose last member is at least
    as long as each other one along every axis of every value: those of one shape together when
    they are ``CHUNK`` or more (a plain launch), else at most ``CHUNK`` a chunk."""
    def shapes(member: Any) -> tuple:
        return tuple(tuple(e.shape) for e in member.entries if isinstance(e, ValueType)) + \
            tuple(tuple(t.shape) for t in member.types if t is not None)

    keyed = sorted(((shapes(member), member.instance, member) for member in members), key=lambda item: item[:2])
    parts: list[list[Any]] = []
    tops: list[tuple] = []  # the shapes of each chunk's last member
    for mine, same in itertools.groupby(keyed, key=lambda item: item[0]):
        run = [member for _, _, member in same]
        if len(run) >= CHUNK or not parts or len(parts[-1]) + len(run) > CHUNK or not all(
                all(a >= b for a, b in zip(x, y)) for x, y in zip(mine, tops[-1])):
            parts.append(run)
            tops.append(mine)
        else:
            parts[-1].extend(run)
            tops[-1] = mine
    return parts
