"""What the batcher can do with each op type: one row an op, read off the rule tables that do
the work (JAX's ``batching.py`` keeps one table of rules filled by installers; ours are
``rules.RULES``, ``ragged.ROW_WISE`` and ``padding.PADDED``, whose texts say when a way applies)
and the fixed families of the other ways (their texts written here). "Stacked" says only that
the op has a rule: a rule may still refuse a case, and says why.

The ways, from the cheapest:

- **stacked**: members of one shape run as one launch along a new leading axis (``rules``);
- **ragged**: members of different lengths run once over all their rows concatenated, no
  padding, when the op treats rows independently (``ragged``; the text says when);
- **reshape of rows**: an op that only reshapes each row runs as a view of the rows;
- **per-member reduction**: a sum or mean over each member's rows (a segment reduction), or a
  loss summed or averaged over them;
- **packed**: a recurrent layer's sequences run in padded chunks with ``sequence_lens``;
- **padded**: what ragged batching cannot take runs in chunks padded to their longest member,
  where padding changes no real position (``padding``; the text says when).

``autobatch ops`` prints the table; a node that runs alone says why in ``session.stats`` and
``autobatch inspect``.
"""

from __future__ import annotations

from dataclasses import dataclass

from autobatch.batcher.padding import PADDED
from autobatch.batcher.ragged import ROW_LOSS, ROW_RESHAPES, ROW_WISE, SEGMENT_REDUCTIONS
from autobatch.batcher.rules import RULES
from autobatch.batcher.sequences import RECURRENT

# ``classing``'s sums of terms take a Sum whose terms are all per-instance floats of its type
SUM_OF_TERMS_NOTE = ("; but a Sum of per-instance float terms alone batches as a sum of terms (any number "
                     "of them), a class per shape")
WAYS = ("stacked", "ragged", "reshape of rows", "per-member reduction", "packed", "padded")


@dataclass(frozen=True)
class Capabilities:
    """What the batcher can do with one op type: per way (``WAYS``), None where it cannot, else
    when it can (an empty text: always, given what every way asks: per-instance operands, shared
    weights)."""

    op_type: str
    stacked: str | None
    ragged: str | None
    row_reshape: str | None
    reduction: str | None
    packed: str | None
    padded: str | None

    @property
    def ways(self) -> dict[str, str | None]:
        return dict(zip(WAYS, (self.stacked, self.ragged, self.row_reshape, self.reduction, self.packed,
                               self.padded)))


def capabilities(op_type: str) -> Capabilities:
    """What the batcher can do with ``op_type`` (of ONNX's domain)."""
    ragged = ROW_WISE.get(op_type)
    padded = PADDED.get(op_type)
    reduction = None
    if op_type in SEGMENT_REDUCTIONS:
        reduction = "over axis 0 alone, of float32 or float64 values"
    elif op_type == ROW_LOSS:
        reduction = "of per-instance scores [n, C] and labels [n], summed or averaged, no class weights"
    return Capabilities(
        op_type,
        stacked="" if op_type in RULES else None,
        ragged=ragged.when + (SUM_OF_TERMS_NOTE if op_type == "Sum" else "") if ragged else None,
        row_reshape="" if op_type in ROW_RESHAPES else "moving only axes of 1" if op_type == "Transpose" else None,
        reduction=reduction,
        packed="layout 0, shared weights, no sequence_lens; initial states shared zeros or each instance's own"
        if op_type in RECURRENT else None,
        padded=padded.when if padded else None)


def known_op_types() -> list[str]:
    """Every op type some way batches, sorted."""
    return sorted(set(RULES) | set(ROW_WISE) | set(PADDED) | SEGMENT_REDUCTIONS | ROW_RESHAPES | RECURRENT
                  | {ROW_LOSS, "Transpose"})


def capability_table(op_types: list[str] | None = None) -> list[Capabilities]:
    """The table's rows, for ``op_types`` (default: every op some way batches)."""
    return [capabilities(op_type) for op_type in (op_types if op_types is not None else known_op_types())]
