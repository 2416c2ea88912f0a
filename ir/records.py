"""What the frontends record and the batcher reads: one op to plan (``Record``: a traced op, or
a node of an ONNX model read as one), and the one op of our own a record may be, a tree fold
(``FoldTree`` of domain ``autobatch.folds``: a tree's leaf and node cells over its shape,
``LEAF`` marking a leaf in its children matrix)."""

from __future__ import annotations

from collections.abc import Hashable
from typing import NamedTuple

from onnx import AttributeProto

from autobatch.ir.types import ValueType

FOLD_DOMAIN = "autobatch.folds"
FOLD_TREE = "FoldTree"
LEAF = -1  # a leaf's entry in a tree's children matrix


class Record(NamedTuple):
    """One op to plan.

    ``types``: per output, its type (None: not known, or the output is not wanted).
    ``entries``: per input, its name when every instance shares it (a weight, a shared
    constant), else its type (None where not known), or ``ir.types.MISSING``. ``key``: equal
    only for records of one signature class (made of op, attributes and entries, or an object
    standing for them). ``preds``: indices of the records it reads (one may be listed more than
    once). ``captured``: for an op with subgraphs, the values they read from outside, as
    ``(name inside, name outside, type)``: the bodies keep the instance's own names while the
    batch renames its values.

    A named tuple: tracing makes one a traced op, and ``new_record`` (all eleven fields, no
    defaults applied) makes one without a call of Python code.
    """

    op_type: str
    domain: str
    inputs: list[str]
    outputs: list[str]
    attributes: dict[str, AttributeProto]
    types: list[ValueType | None]
    entries: tuple
    key: Hashable
    preds: list[int]
    instance: int = 0
    captured: tuple[tuple[str, str, ValueType | None], ...] = ()


new_record = tuple.__new__  # new_record(Record, (op_type, ..., captured)): a Record, without its __new__'s Python call
