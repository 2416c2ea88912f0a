"""``autobatch ops``: what the batcher can do with each op type (``batcher.capabilities``), as text."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import onnx.defs

from autobatch.batcher.capabilities import Capabilities, capability_table, known_op_types

Print = Callable[[str], None]


class UnknownOp(ValueError):
    """An op type that ONNX's default domain does not define."""


def ways_text(row: Capabilities) -> str:
    """The ways of one op, short: ``stacked, ragged, padded`` (``alone`` where there is none)."""
    ways = [way for way, when in row.ways.items() if when is not None]
    return ", ".join(ways) if ways else "alone"


def print_capabilities(op_types: Sequence[str], out: Print) -> None:
    """Every op some way batches, a line each; or, for ``op_types``, each way and when it applies."""
    if not op_types:
        width = max(map(len, known_op_types()))
        for row in capability_table():
            out(f"{row.op_type:<{width}}  {ways_text(row)}")
        out("(autobatch ops OP ... says when each way applies; an op not listed runs one member at a time)")
        return
    unknown = [op for op in op_types if not onnx.defs.has(op)]
    if unknown:
        raise UnknownOp(f"not an op of ONNX's default domain: {', '.join(unknown)}")
    for row in capability_table(list(op_types)):
        out(f"{row.op_type}: {ways_text(row)}")
        for way, when in row.ways.items():
            out(f"  {way}: " + ("no" if when is None else f"yes, {when}" if when else "yes"))


def model_ways(op_types: Sequence[str]) -> str:
    """One line for ``autobatch inspect``: each op type of a model with its ways."""
    return "; ".join(f"{row.op_type} {ways_text(row)}" for row in capability_table(sorted(set(op_types)))) or "no ops"

