"""What the frontends record and the batcher reads: a traced op (``TraceRecord``), and the
one op of our own a record may be, a tree fold (``FoldTree`` of domain ``autobatch.folds``: a
tree's leaf and node cells over its shape, ``LEAF`` marking a leaf in its children matrix)."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Protocol

from onnx import AttributeProto

from autobatch.ir.types import ValueType

FOLD_DOMAIN = "autobatch.folds"
FOLD_TREE = "FoldTree"
LEAF = -1  # a leaf's entry in a tree's children matrix


class TraceRecord(Protocol):
    """What planning reads of one traced op (``frontends.tracing`` makes them; an ONNX model's
    nodes are read as them too).

    ``entries``: per input, its name when every instance shares it (a weight, a shared
    constant), else its type, or ``ir.types.MISSING``. ``key``: equal only for records of one
    signature class (made of op, attributes and entries, or an object standing for them).
    ``preds``: indices of the records it reads (one may be listed more than once).
    """

    op_type: str
    domain: str
    inputs: list[str]
    outputs: list[str]
    attributes: dict[str, AttributeProto]
    types: list[ValueType]
    entries: tuple
    key: Hashable
    preds: list[int]
