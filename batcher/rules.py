"""Batching rules, in the style of JAX's ``batching.py``: for each op, how N nodes of one
signature run as one op over operands stacked along a new leading batch axis.

A rule reads the representative node and its operands and emits ONNX ops through an
``Emitter``; it returns the names of the batched outputs (each ``[N, *per-instance shape]``),
or a ``Refusal`` naming why, before emitting anything, when it cannot batch this case (the
nodes then run one by one, correctly, and the report counts why). A rule that raises has a bug:
nothing catches it. Rules are first run on a dry emitter, once per signature class, to decide
batchability at planning time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from autobatch.batcher.rule_tables import Emitter, Operand, Refusal, Shape, install_in, refuse
from autobatch.ir import Node

Rule = Callable[[Emitter, Node, list[Operand | None], list[Shape]], "list[str] | Refusal"]
RULES: dict[str, Rule] = {}


def rule(*op_types: str) -> Callable[[Rule], Rule]:
    return install_in(RULES, op_types, lambda fn: fn)


def reshape(e: Emitter, name: str, per_instance_shape: Sequence[int]) -> str:
    """Reshape a stacked value to ``[N, *per_instance_shape]`` (0 copies the batch size)."""
    return e.op("Reshape", [name, e.const(np.array([0, *per_instance_shape], dtype=np.int64))])[0]


def _int_list(operand: Operand | None) -> list[int] | None:
    if operand is None or operand.stacked or operand.const is None:
        return None
    return [int(v) for v in np.asarray(operand.const).reshape(-1)]


def _shift(axes: Sequence[int], rank: int) -> list[int]:
    return [(a + rank if a < 0 else a) + 1 for a in axes]


# ----------------------------------------------------------------------------- elementwise
UNARY = (
    "Abs Acos Acosh Asin Asinh Atan Atanh BitwiseNot Cast Ceil Celu Cos Cosh Elu Erf Exp Floor "
    "Gelu HardSigmoid HardSwish Identity IsInf IsNaN LeakyRelu Log Mish Neg Not Reciprocal Relu "
    "Round Selu Shrink Sigmoid Sign Sin Sinh Softplus Softsign Sqrt Tan Tanh ThresholdedRelu"
).split()
BROADCASTING = (
    "Add Sub Mul Div Pow Mod And Or Xor Equal Greater GreaterOrEqual Less LessOrEqual BitShift "
    "BitwiseAnd BitwiseOr BitwiseXor Max Min Sum Mean Where CastLike PRelu"
).split()
FIRST_BROADCASTING_VERSION = 7  # before opset 7, binary ops broadcast by an axis attribute


@rule(*UNARY, *BROADCASTING)
def elementwise(e: Emitter, node: Node, ins: list[Operand | None], outs: list[Shape]) -> list[str] | Refusal:
    if node.op_type in BROADCASTING and node.version < FIRST_BROADCASTING_VERSION:
        return refuse(f"{node.op_type}-{node.version} broadcasts by an axis attribute")
    if node.op_type == "CastLike" and not ins[0].stacked:  # type: ignore[union-attr]
        # The result has the shape of the (shared) value cast, whatever the target: one for all.
        cast = e.op("CastLike", [ins[0].name, ins[1].name])[0]  # type: ignore[union-attr]
        return [_broadcast_to_batch(e, cast, outs[0], ins[1].name)]  # type: ignore[union-attr]
    rank = len(outs[0])
    args = []
    for operand in ins:
        if operand is None:
            args.append("")
        elif operand.stacked and operand.rank < rank:  # align ranks behind the batch axis
            args.append(reshape(e, operand.name, (1,) * (rank - operand.rank) + operand.shape))
        else:
            args.append(operand.name)
    if node.op_type == "PRelu" and not ins[0].stacked:  # type: ignore[union-attr]
        # The slope broadcasts one way only, to X: a shared X is repeated for every instance.
        args[0] = _broadcast_to_batch(e, args[0], ins[0].shape, ins[1].name)  # type: ignore[union-attr]
    return e.op(node.op_type, args, node.attributes, len(node.outputs))


@rule("Clip")
def clip(e: Emitter, node: Node, ins: list[Operand | None], outs: list[Shape]) -> list[str] | Refusal:
    if any(o is not None and o.stacked for o in ins[1:]):
        return refuse("min and max of each instance's own (they must stay scalars)")
    return e.op("Clip", [o.name if o else "" for o in ins], node.attributes)


# ----------------------------------------------------------------------------- matmul-like
@rule("MatMul")
def matmul(e: Emitter, node: Node, ins: list[Operand | None], outs: list[Shape]) -> list[str] | Refusal:
    a, b = ins
    assert a is not None and b is not None
    # A stacked vector is a batch of rows only when the other side is a shared matrix or vector;
    # otherwise both vectors become matrices so that the batch axis lines up (in front of a
    # shared stack of matrices too), and the result is reshaped back.
    a_shape = (1, *a.shape) if a.stacked and a.rank == 1 and (b.stacked or b.rank > 2) else a.shape
    b_shape = (*b.shape, 1) if b.stacked and b.rank == 1 else b.shape
    batch_rank = max(len(a_shape), len(b_shape))

    def prepared(operand: Operand, shape: Shape) -> str:
        if not operand.stacked:
            return operand.name
        padded = (1,) * (batch_rank - len(shape)) + shape if len(shape) >= 2 else shape
        return operand.name if padded == operand.shape else reshape(e, operand.name, padded)

    product = e.op("MatMul", [prepared(a, a_shape), prepared(b, b_shape)])[0]
    # Stacked rows or vectors by a shared matrix or vector come out ``[N, *out]`` as they are
    # (no Reshape: onnxruntime then fuses a bias Add into the product, a Gemm).
    simple = (a.stacked and not b.stacked and b.rank <= 2) or (a.stacked and b.stacked and a.rank == b.rank >= 2)
    return [product] if simple else [reshape(e, product, outs[0])]


@rule("Gemm")
def gemm(e: Emitter, node: Node, ins: list[Operand | None], outs: list[Shape]) -> list[str] | Refusal:
    """Stacked rows times a shared weight: one GEMM over all N*M rows."""
    a, b, *rest = ins
    c = rest[0] if rest else None
    if a is None or b is None or not a.stacked or b.stacked or (c is not None and c.stacked):
        return refuse("A of each instance's own by a shared B and C is what batches")
    if node.attr("transA", 0) or (c is not None and c.rank == 2 and c.shape[0] != 1 and a.shape[0] != 1):
        return refuse("transA, or a bias of a row each (it would be broadcast over other instances' rows)")
    rows = e.op("Reshape", [a.name, e.const(np.array([-1, a.shape[1]], dtype=np.int64))])[0]
    product = e.op("Gemm", [rows, b.name] + ([c.name] if c is not None else []), node.attributes)[0]
    return [e.op("Reshape", [product, e.const(np.array([-1, *outs[0]], dtype=np.int64))])[0]]


# ----------------------------------------------------------------------------- axis-bearing ops
def _default_axis(node: Node) -> int:
    if node.op_type in ("Softmax", "LogSoftmax", "Hardmax"):
        return -1 if node.version >= 13 else 1
    if node.op_type == "LpNormalization":
        return -1
    return 0


@rule("Softmax", "LogSoftmax", "Hardmax", "ArgMax", "ArgMin", "Concat", "Split", "LpNormalization")
def axis_shifted(e: Emitter, node: Node, ins: list[Operand | None], outs: list[Shape]) -> list[str] | Refusal:
    """Ops over one axis: the same op one axis further right. (Softmax before opset 13 coerces
    to 2-D at its axis; the batch axis joins the outer part, so the shift holds there too.)"""
    data = [o for o in ins if o is not None]
    if node.op_type == "Concat":
        return _concat(e, node, data)
    if not data[0].stacked or any(o.stacked for o in data[1:] if node.op_type == "Split"):
        return refuse("the data is shared, or the split sizes are each instance's own")
    axis = node.attr("axis", _default_axis(node))
    attributes = dict(node.attributes)
    attributes["axis"] = _shift([axis], data[0].rank)[0]
    return e.op(node.op_type, [o.name if o else "" for o in ins], attributes, len(node.outputs))


@rule("LayerNormalization")
def layer_normalization(e: Emitter, node: Node, ins: list[Operand | None], outs: list[Shape]) -> list[str] | Refusal:
    """Normalizing the axes from ``axis`` on: the same op one axis further right, by the shared
    scale and bias (which broadcast over those axes). Rows of different lengths take the ragged
    path; this is instances of one shape (exported transformers' ``[1, L, d]``)."""
    x, scale, bias = (ins + [None] * 3)[:3]
    if x is None or not x.stacked or scale is None or scale.stacked or (bias is not None and bias.stacked):
        return refuse("the data is shared, or a scale or bias each instance's own")
    attributes = dict(node.attributes)
    attributes["axis"] = _shift([node.attr("axis", -1)], x.rank)[0]
    return e.op(node.op_type, [o.name if o else "" for o in ins], attributes, len(node.outputs))


def _concat(e: Emitter, node: Node, parts: list[Operand]) -> list[str] | Refusal:
    """Concat one axis further right; a shared part (a padding vector, a bias row) is
    broadcast to every instance first."""
    if not any(o.stacked for o in parts):
        return refuse("every part is shared")
    names = []
    stacked = next(part.name for part in parts if part.stacked)
    for part in parts:
        if part.stacked:
            names.append(part.name)
        else:
            names.append(_broadcast_to_batch(e, part.name, part.shape, stacked))
    axis = _shift([node.attr("axis", 1 if node.version < 4 else 0)], parts[0].rank)[0]
    return e.op("Concat", names, {"axis": axis})


def _broadcast_to_batch(e: Emitter, shared: str, shape: Shape, stacked: str) -> str:
    """A shared value of ``shape`` repeated for every instance of the batch of ``stacked``
    (Expand broadcasts from the right: no reshape to a leading 1 first, whose literal shape
    would read a 0 of an empty constant as "keep that dimension")."""
    full = e.op("Concat", [_batch_size(e, stacked), e.const(np.array(shape, dtype=np.int64))], {"axis": 0})[0]
    return e.op("Expand", [shared, full])[0]


def _batch_size(e: Emitter, stacked: str, scalar: bool = False) -> str:
    """N read from a stacked value at run time (``[N]``, or a scalar): the batched ops then hold
    for every batch size."""
    index = e.const(np.array(0 if scalar else [0], dtype=np.int64))
    return e.op("Gather", [e.op("Shape", [stacked])[0], index], {"axis": 0})[0]


OUT_OF_RANGE = np.iinfo(np.int64).min  # an index no value has: the Gather reading it fails


@rule("Gather")
def gather(e: Emitter, node: Node, ins: list[Operand | None], outs: list[Shape]) -> list[str] | Refusal:
    data, indices = ins
    assert data is not None and indices is not None
    axis = node.attr("axis", 0)
    if data.stacked and not indices.stacked:
        return e.op("Gather", [data.name, indices.name], {"axis": _shift([axis], data.rank)[0]})
    if indices.stacked and not data.stacked and axis in (0, -data.rank):
        return e.op("Gather", [data.name, indices.name], {"axis": 0})  # a shared table lookup
    if data.stacked and indices.stacked and axis in (0, -data.rank):
        # Picking from per-instance data: offset each instance's indices into the flattened batch.
        length = data.shape[0]
        flat = e.op("Reshape", [data.name, e.const(np.array([-1, *data.shape[1:]], dtype=np.int64))])[0]
        as_int64 = e.op("Cast", [indices.name], {"to": 7})[0]  # 7: INT64; indices may be int32
        size, zero = e.const(np.array(length, dtype=np.int64)), e.const(np.array(0, dtype=np.int64))
        negative = e.op("Less", [as_int64, zero])[0]
        inside = e.op("Where", [negative, e.op("Add", [as_int64, size])[0], as_int64])[0]  # negative -> from the end
        # An index outside its own instance would read another's row: sent out of range, where
        # the Gather fails as it does for that instance alone (the batch is then run alone).
        valid = e.op("And", [e.op("Not", [e.op("Less", [inside, zero])[0]])[0], e.op("Less", [inside, size])[0]])[0]
        if node.version >= 11:  # offsets 0, L, 2L ... from the batch's own size: one plan serves every N
            end = e.op("Mul", [_batch_size(e, data.name, scalar=True), size])[0]
            offsets = e.op("Range", [zero, end, size])[0]
            offsets = e.op("Reshape", [offsets, e.const(np.array((-1,) + (1,) * indices.rank, dtype=np.int64))])[0]
        else:
            offsets = e.const((np.arange(e.batch_size, dtype=np.int64) * length).reshape((-1,) + (1,) * indices.rank))
        rows = e.op("Where", [valid, e.op("Add", [inside, offsets])[0], e.const(np.array(OUT_OF_RANGE, np.int64))])[0]
        return e.op("Gather", [flat, rows], {"axis": 0})
    return refuse("indices of each instance's own along an axis other than 0")


REDUCTIONS = (
    "ReduceSum ReduceMean ReduceMax ReduceMin ReduceProd ReduceL1 ReduceL2 ReduceLogSum "
    "ReduceLogSumExp ReduceSumSquare"
).split()


def _axes_are_input(node: Node) -> bool:
    return node.version >= (13 if node.op_type == "ReduceSum" else 18)


@rule(*REDUCTIONS)
def reduction(e: Emitter, node: Node, ins: list[Operand | None], outs: list[Shape]) -> list[str] | Refusal:
    data = ins[0]
    assert data is not None
    if not data.stacked:
        return refuse("the data is shared")
    axes_input = ins[1] if len(ins) > 1 else None
    if _axes_are_input(node):
        axes = _int_list(axes_input)
        if axes_input is not None and axes is None:
            return refuse("axes computed by each instance")
    else:
        axes = node.attr("axes")
    attributes = dict(node.attributes)
    if not axes:
        if node.attr("noop_with_empty_axes", 0):
            return [data.name]  # the identity, batch axis included
        axes = list(range(data.rank))
    shifted = _shift(axes, data.rank)
    if _axes_are_input(node):
        return e.op(node.op_type, [data.name, e.const(np.array(shifted, dtype=np.int64))], attributes)
    attributes["axes"] = shifted
    return e.op(node.op_type, [data.name], attributes)


# ----------------------------------------------------------------------------- data movement
@rule("Reshape", "Flatten", "Squeeze", "Unsqueeze")
def pure_reshape(e: Emitter, node: Node, ins: list[Operand | None], outs: list[Shape]) -> list[str] | Refusal:
    """Every per-instance shape is static, so these are all one Reshape to the known shape."""
    data = ins[0]
    if data is None or not data.stacked or any(o is not None and o.stacked for o in ins[1:]):
        return refuse("the data is shared, or the shape or axes are each instance's own")
    return [reshape(e, data.name, outs[0])]


@rule("Transpose")
def transpose(e: Emitter, node: Node, ins: list[Operand | None], outs: list[Shape]) -> list[str] | Refusal:
    data = ins[0]
    assert data is not None
    perm = node.attr("perm") or list(reversed(range(data.rank)))
    return e.op("Transpose", [data.name], {"perm": [0, *(p + 1 for p in perm)]})


@rule("Slice")
def slice_(e: Emitter, node: Node, ins: list[Operand | None], outs: list[Shape]) -> list[str] | Refusal:
    data = ins[0]
    assert data is not None
    if node.version < 10:
        attributes = dict(node.attributes)
        attributes["axes"] = _shift(node.attr("axes") or range(len(node.attr("starts"))), data.rank)
        return e.op("Slice", [data.name], attributes)
    params = [_int_list(o) if o is not None else None for o in ins[1:]]
    present = [o for o in ins[1:] if o is not None]
    if any(p is None for p, o in zip(params, ins[1:]) if o is not None) or any(o.stacked for o in present):
        return refuse("starts, ends, axes or steps computed by each instance")
    starts = params[0]
    axes = params[2] if len(params) > 2 and params[2] is not None else list(range(len(starts)))
    index_type = np.asarray(ins[1].const).dtype  # int32 or int64: one type for starts, ends, axes and steps
    args = [data.name, ins[1].name, ins[2].name, e.const(np.array(_shift(axes, data.rank), dtype=index_type))]
    if len(ins) > 4 and ins[4] is not None:
        args.append(ins[4].name)
    return e.op("Slice", args)


@rule("Expand")
def expand(e: Emitter, node: Node, ins: list[Operand | None], outs: list[Shape]) -> list[str] | Refusal:
    data, shape = ins
    if data is None or shape is None or not data.stacked or shape.stacked:
        return refuse("the data is shared, or the shape each instance's own")
    rank = len(outs[0])
    aligned = reshape(e, data.name, (1,) * (rank - data.rank) + data.shape) if data.rank < rank else data.name
    return e.op("Expand", [aligned, e.const(np.array([1, *outs[0]], dtype=np.int64))])


@rule("Tile")
def tile(e: Emitter, node: Node, ins: list[Operand | None], outs: list[Shape]) -> list[str] | Refusal:
    data, repeats = ins
    values = _int_list(repeats)
    if data is None or not data.stacked or values is None:
        return refuse("the data is shared, or the repeats are not known constants")
    return e.op("Tile", [data.name, e.const(np.array([1, *values], dtype=np.int64))])


# ----------------------------------------------------------------------------- recurrent layers
@rule("LSTM", "GRU", "RNN")
def recurrent(e: Emitter, node: Node, ins: list[Operand | None], outs: list[Shape]) -> list[str] | Refusal:
    """Instances become more sequences of one layer call: their batch axes are merged."""
    padded = ins + [None] * (8 - len(ins))
    x, w, r, bias, seq_lens = padded[:5]
    states = padded[5:7] if node.op_type == "LSTM" else padded[5:6]
    peephole = padded[7] if node.op_type == "LSTM" else None
    if x is None or not x.stacked or any(o is not None and o.stacked for o in (w, r, bias, peephole)):
        return refuse("weights of each instance's own, or a shared X")
    # A shared initial state (exporters write zeros from the shape, alike for every instance of
    # one length) or sequence length is every instance's: repeated for each, then merged.
    states = [_stacked(e, s, x.name) for s in states]
    seq_lens = _stacked(e, seq_lens, x.name)
    layout = node.attr("layout", 0)
    seq, batch, width = x.shape if layout == 0 else (x.shape[1], x.shape[0], x.shape[2])
    n_dirs = 2 if node.attr("direction", "forward") == "bidirectional" else 1

    def const(*dims: int) -> str:
        return e.const(np.array(dims, dtype=np.int64))

    def merged(operand: Operand | None, shape: tuple[int, ...]) -> str:
        if operand is None:
            return ""
        # Time-major values carry the instance axis in front of their batch axis: move it next to it.
        moved = e.op("Transpose", [operand.name], {"perm": [1, 0, 2, 3]})[0] if layout == 0 else operand.name
        return e.op("Reshape", [moved, const(*shape)])[0]

    if layout == 0:
        args = [merged(x, (seq, -1, width))] + [merged(s, (n_dirs, -1, s.shape[-1])) if s else "" for s in states]
    else:
        args = [merged(x, (-1, seq, width))] + [merged(s, (-1, n_dirs, s.shape[-1])) if s else "" for s in states]
    lens = e.op("Reshape", [seq_lens.name, const(-1)])[0] if seq_lens is not None else ""
    inputs = [args[0], w.name, r.name, bias.name if bias else "", lens, *args[1:]]
    if peephole is not None:
        inputs.append(peephole.name)
    results = e.op(node.op_type, inputs, node.attributes, len(node.outputs))
    unmerged = []
    for index, (name, shape) in enumerate(zip(results, outs)):
        if not shape:  # an output the model does not use
            unmerged.append(name)
        elif layout == 1:  # batch-major outputs: the instances are already the leading blocks
            unmerged.append(e.op("Reshape", [name, const(-1, *shape)])[0])
        elif index == 0:  # Y: [seq, dirs, N*batch, H] -> [N, seq, dirs, batch, H]
            split = e.op("Reshape", [name, const(shape[0], shape[1], -1, batch, shape[3])])[0]
            unmerged.append(e.op("Transpose", [split], {"perm": [2, 0, 1, 3, 4]})[0])
        else:  # Y_h, Y_c: [dirs, N*batch, H] -> [N, dirs, batch, H]
            split = e.op("Reshape", [name, const(shape[0], -1, batch, shape[2])])[0]
            unmerged.append(e.op("Transpose", [split], {"perm": [1, 0, 2, 3]})[0])
    return unmerged


def _stacked(e: Emitter, operand: Operand | None, stacked: str) -> Operand | None:
    """``operand`` with the batch axis of ``stacked`` in front: a shared one repeated for every instance."""
    if operand is None or operand.stacked:
        return operand
    return Operand(_broadcast_to_batch(e, operand.name, operand.shape, stacked), True, operand.shape)


# ----------------------------------------------------------------------------- per-sample ops
PER_SAMPLE = (
    "Conv AveragePool MaxPool GlobalAveragePool GlobalMaxPool LpPool LRN InstanceNormalization "
    "BatchNormalization"
).split()


@rule(*PER_SAMPLE)
def per_sample(e: Emitter, node: Node, ins: list[Operand | None], outs: list[Shape]) -> list[str] | Refusal:
    """Ops that treat each sample of their leading (N) axis alone, with shared weights: the
    instances' samples are merged into that axis, the op runs once, and is split back."""
    data = ins[0]
    if data is None or not data.stacked or data.rank < 3 or any(o is not None and o.stacked for o in ins[1:]):
        return refuse("shared data, data of rank under 3, or weights of each instance's own")
    if len([o for o in node.outputs if o]) != 1:
        return refuse("a second output (MaxPool's indices, BatchNormalization's statistics) counts across samples")
    if node.op_type == "BatchNormalization" and (node.attr("training_mode", 0) or node.version < 7):
        return refuse("batch statistics in training mode would mix the instances")
    merged = e.op("Reshape", [data.name, e.const(np.array([-1, *data.shape[1:]], dtype=np.int64))])[0]
    result = e.op(node.op_type, [merged] + [o.name if o else "" for o in ins[1:]], node.attributes,
                  len(node.outputs))[0]
    return [e.op("Reshape", [result, e.const(np.array([-1, *outs[0]], dtype=np.int64))])[0]]
