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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from autobatch.batcher.instances import alike
from autobatch.batcher.ragged import record_attribute
from autobatch.batcher.rules import Refusal, refuse
from autobatch.ir import ValueType

CHUNK = 8  # instances a padded launch (as ``batcher.sequences`` chunks sequences)
ELEMENTWISE = frozenset({
    "Add", "Sub", "Mul", "Where", "Cast", "Equal", "Not", "And", "Or", "Neg", "Relu", "Tanh", "Sigmoid", "Erf",
    "Abs", "Exp", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "IsNaN", "IsInf", "Identity",
})
DIVISORS = frozenset({"Div"})  # elementwise, by a shared divisor only (a padded one would divide by 0)
SOFTMAX = frozenset({"Softmax", "LogSoftmax"})
RESHAPES = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten"})  # each member's elements keep their order


@dataclass(frozen=True)
class Padding:
    """The template of a class of padded members: its steps are worked out from its members
    (``flat``). ``fills``: by input index, ``(axis, value)`` to pad that operand with along that
    axis of its own (zeros everywhere else)."""

    fills: tuple[tuple[int, tuple[int, float]], ...]


def padding(records: list[Any], opset: int, weights: Mapping[str, np.ndarray]) -> Padding | Refusal:
    """How the records (one of each class of one node: per class, its members' types) batch
    padded, or a refusal saying why padding could change a real position's value (see the module).
    ``weights``: the shared values, an instance's own constants among them."""
    first = records[0]
    if first.domain:
        return refuse(f"an op of domain {first.domain}")
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
    # for its length) that is a corner of every longer member's (``_corners``).
    own_target = {1} if first.op_type == "Reshape" else set()
    own = [i for i in range(len(first.entries)) if i not in data and i not in own_target
           and any(r.entries[i] != first.entries[i] for r in records)]
    op = first.op_type
    elementwise = op in ELEMENTWISE or op in DIVISORS and data == [0]
    if own and not elementwise:
        return refuse("a shared operand that differs between members (a constant of one instance's own)")
    fills: dict[int, tuple[int, float]] = {}
    if elementwise:
        if not _broadcasts_alike([[r.entries[i].shape for r in records] for i in data], records):
            return refuse("operands that broadcast differently for different members")
        for i in own:
            constants = [np.asarray(weights[r.inputs[i]]) for r in records]
            if not _broadcasts_alike([[c.shape for c in constants]], records) or not _corners(constants):
                return refuse("a constant of one instance's own that is not a corner of a longer one's, or that "
                              "broadcasts differently for different members")
    elif op == "MatMul":
        if any(len(first.entries[i].shape) < 2 for i in data) or not _broadcasts_alike(
                [[r.entries[i].shape for r in records] for i in data], records, 2):
            return refuse("a vector operand, or operands that broadcast differently for different members")
    elif op == "Transpose":
        pass
    elif op in RESHAPES:
        if data != [0] or not _keeps_padded_axes_whole([row[0] for row in shapes], [row[1] for row in shapes]):
            return refuse("a per-instance shape, or a reshape that does not keep the padded axes whole")
    elif op == "Gather":  # by a shared index, along an axis no member pads
        axis = record_attribute(first, "axis", 0) % len(shapes[0][0])
        if data != [0] or len({row[0][axis] for row in shapes}) > 1:
            return refuse("per-instance indices, or a gather along an axis that members pad")
    elif op == "Concat":  # one operand (an exporter's past keys and values, none), or along an axis none pads
        axis = record_attribute(first, "axis", 0) % len(shapes[0][0])
        if len(data) != len(first.entries):
            return refuse("a shared operand joined to per-instance ones")
        if len(data) > 1 and any(len({row[k][axis] for row in shapes}) > 1 for k in range(len(data))):
            return refuse("operands joined along an axis that members pad")
    elif op in SOFTMAX and opset >= 13:
        if data != [0]:
            return refuse("a per-instance operand other than the scores")
        axis = record_attribute(first, "axis", -1) % len(shapes[0][0])
        if len({row[0][axis] for row in shapes}) > 1:  # padded scores: exp(-inf - max) is 0
            fills[0] = (axis, float("-inf"))
    else:
        return refuse("no exact padding" + (" before opset 13" if op in SOFTMAX else ""))
    return Padding(tuple(sorted(fills.items())))


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
