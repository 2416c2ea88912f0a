"""The traced ops: what the seed paper's models need, each recording ONNX ops.

Every op checks shapes and dtypes when traced and names itself and the shapes on a mismatch.
Row-vector convention: ``affine(x, W, b) = x @ W + b``.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

from autobatch.frontends import recorder
from autobatch.frontends.tensors import Parameter, Tensor, TraceError, _current, attributes, batch_of, current_batch
from autobatch.frontends.cells import Cell

Operand = Tensor | Parameter | np.ndarray | float | int


def _python_tensors(op: str, *values: Operand) -> list[Tensor]:
    """Operands as tensors of one batch; Python scalars take the dtype of the tensor operands."""
    first = values[0]
    if type(first) is Tensor:  # the common case, kept cheap: tensors and parameters of one batch and dtype
        batch, dtype = first.batch, first.dtype
        tensors = []
        for v in values:
            kind = type(v)
            if kind is Parameter:
                v = batch.parameter(v)
            elif kind is not Tensor or v.batch is not batch:
                break
            if v.dtype is not dtype and v.dtype != dtype:
                break
            tensors.append(v)
        else:
            active = _current.get(None)
            if active is None or active is batch:
                return tensors
    batch = batch_of(*values)
    dtypes = [v.dtype if isinstance(v, Tensor) else v.array.dtype for v in values if isinstance(v, (Tensor, Parameter))]
    dtype = dtypes[0] if dtypes else None
    result = []
    for value in values:
        if isinstance(value, (int, float, np.number)) and not isinstance(value, bool):
            value = np.asarray(value, dtype=dtype or np.float32)
        result.append(batch.as_tensor(value))
    if len({t.dtype for t in result}) > 1:
        raise TraceError(f"{op}: operands have different dtypes {[str(t.dtype) for t in result]}")
    return result


def _python_elementwise(op_type: str, *values: Operand) -> Tensor:
    """An elementwise op of ONNX's domain over ``values`` (broadcast), with no attributes."""
    inputs = _tensors(op_type, *values)
    shape = inputs[0].shape
    for t in inputs:  # a loop, not any(): a generator costs every traced op more than the test
        if t.shape != shape:
            try:
                shape = np.broadcast_shapes(*(t.shape for t in inputs))
            except ValueError:
                raise TraceError(f"{op_type}: shapes {[t.shape for t in inputs]} do not broadcast") from None
            break
    return inputs[0].batch.record_one(op_type, inputs, shape, inputs[0].dtype)


# ----------------------------------------------------------------------------- elementwise
def add(a: Operand, b: Operand) -> Tensor:
    return _elementwise("Add", a, b)


def sub(a: Operand, b: Operand) -> Tensor:
    return _elementwise("Sub", a, b)


def mul(a: Operand, b: Operand) -> Tensor:
    return _elementwise("Mul", a, b)


cmult = mul


def div(a: Operand, b: Operand) -> Tensor:
    return _elementwise("Div", a, b)


def tanh(x: Operand) -> Tensor:
    return _elementwise("Tanh", x)


def sigmoid(x: Operand) -> Tensor:
    return _elementwise("Sigmoid", x)


logistic = sigmoid


def relu(x: Operand) -> Tensor:
    return _elementwise("Relu", x)


rectify = relu


def exp(x: Operand) -> Tensor:
    return _elementwise("Exp", x)


def log(x: Operand) -> Tensor:
    return _elementwise("Log", x)


def neg(x: Operand) -> Tensor:
    return _elementwise("Neg", x)


def square(x: Operand) -> Tensor:
    (t,) = _tensors("Mul", x)
    return _elementwise("Mul", t, t)


# ONNX's Sum is defined for these element types only; other sums are a tree of Adds.
_SUM_DTYPES = frozenset({np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)})


def esum(xs: Sequence[Operand]) -> Tensor:
    """The sum of a list of tensors (DyNet's esum): one Sum of float terms (batched whatever
    their number), else pairwise Adds (ONNX has no integer Sum)."""
    if not xs:
        raise TraceError("esum of an empty list")
    terms = _tensors("Sum", *xs)
    if len(terms) > 1 and terms[0].dtype in _SUM_DTYPES:
        return _elementwise("Sum", *terms)
    while len(terms) > 1:
        paired = [add(a, b) for a, b in zip(terms[::2], terms[1::2])]
        terms = paired + terms[len(paired) * 2:]
    return terms[0]


# ----------------------------------------------------------------------------- linear algebra
def matmul(a: Operand, b: Operand) -> Tensor:
    """``a @ b``, NumPy's matmul (batch axes broadcast)."""
    return _matmul(a, b)


def _python_matmul(a: Operand, b: Operand) -> Tensor:
    x, w = _tensors("MatMul", a, b)
    shape = _matmul_shape(x.shape, w.shape)
    if shape is None:
        raise TraceError(f"MatMul: shapes {x.shape} and {w.shape} do not match")
    return x.batch.record_one("MatMul", [x, w], shape, x.dtype)


def _matmul_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...] | None:
    if not a or not b:
        return None
    if len(a) <= 2 and len(b) == 2:  # the common case: no batch axes to broadcast
        return (*a[:-1], b[1]) if a[-1] == b[0] else None
    a2, b2 = (1, *a) if len(a) == 1 else a, (*b, 1) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        return None
    try:
        batch = np.broadcast_shapes(a2[:-2], b2[:-2])
    except ValueError:
        return None
    return (*batch, *([a2[-2]] if len(a) > 1 else []), *([b2[-1]] if len(b) > 1 else []))


def affine(x: Operand, weight: Operand, bias: Operand) -> Tensor:
    """``x @ W + b``. Of a vector, one node (see ``_AFFINE``); else its two ops."""
    if type(x) is Tensor and len(x.shape) == 1 and type(weight) in _NODE_OPERANDS and type(bias) in _NODE_OPERANDS \
            and not x.batch.in_cell_body:
        return _AFFINE(x, weight, bias)
    return _affine(x, weight, bias)


def _affine(x: Operand, weight: Operand, bias: Operand) -> Tensor:
    return add(matmul(x, weight), bias)


# ----------------------------------------------------------------------------- structure
def concat(xs: Sequence[Operand], axis: int = 0) -> Tensor:
    """``xs`` joined along ``axis``; their other dimensions agree."""
    return _concat(xs, axis)


def _python_concat(xs: Sequence[Operand], axis: int = 0) -> Tensor:
    inputs = _tensors("Concat", *xs)
    first = inputs[0].shape
    rank = len(first)
    axis = axis + rank if axis < 0 else axis
    head, tail, length = first[:axis], first[axis + 1:], 0
    for t in inputs:  # one loop, no generators: this runs for every traced concat
        if len(t.shape) != rank or not 0 <= axis < rank or t.shape[:axis] != head or t.shape[axis + 1:] != tail:
            raise TraceError(f"Concat on axis {axis}: shapes {[t.shape for t in inputs]} do not fit")
        length += t.shape[axis]
    return inputs[0].batch.record_one("Concat", inputs, (*head, length, *tail), inputs[0].dtype, _axis(axis))


_AXES: dict[int, dict] = {}


def _axis(axis: int) -> dict:
    """``attributes(axis=axis)``, without building keywords a call (made once an axis)."""
    made = _AXES.get(axis)
    if made is None:
        made = _AXES[axis] = attributes(axis=axis)
    return made


def stack(xs: Sequence[Operand]) -> Tensor:
    """Values of one shape stacked along a new first axis: ``[len(xs), *shape]``."""
    inputs = _tensors("Concat", *xs)
    if len({t.shape for t in inputs}) > 1:
        raise TraceError(f"stack: shapes {[t.shape for t in inputs]} differ")
    batch = inputs[0].batch
    axis_0 = batch.shared_constant([0])
    # (a known value of one instance, a word's row looked up by a Python int, is a known row)
    rows = [batch.record_one("Unsqueeze", [t, axis_0], (1, *t.shape), t.dtype) if t.value is None or type(t.entry) is str
            else batch.known_row(t) for t in inputs]
    return concat(rows, axis=0)


def split(x: Operand, parts: int, axis: int = 0) -> list[Tensor]:
    """``parts`` equal parts of ``x`` along ``axis``."""
    return _split(x, parts, axis)


def _python_split(x: Operand, parts: int, axis: int = 0) -> list[Tensor]:
    (t,) = _tensors("Split", x)
    try:
        parts = operator.index(parts)
    except TypeError:
        raise TraceError(f"Split: parts must be an int, not {type(parts).__name__}") from None
    axis = axis + t.ndim if axis < 0 else axis
    if not 0 <= axis < t.ndim or parts < 1 or t.shape[axis] % parts:
        raise TraceError(f"Split: axis {axis} of shape {t.shape} does not split into {parts} equal parts")
    shape = list(t.shape)
    shape[axis] //= parts
    return t.batch.record_outputs("Split", [t], [tuple(shape)] * parts, [t.dtype] * parts,
                                  _split_attributes(axis, parts))


_SPLITS: dict[tuple[int, int], dict] = {}


def _split_attributes(axis: int, parts: int) -> dict:
    """``attributes(axis=axis, num_outputs=parts)``, made once a pair."""
    made = _SPLITS.get((axis, parts))
    if made is None:
        made = _SPLITS[axis, parts] = attributes(axis=axis, num_outputs=parts)
    return made


def reshape(x: Operand, shape: Sequence[int]) -> Tensor:
    (t,) = _tensors("Reshape", x)
    target = tuple(int(d) for d in shape)
    if int(np.prod(target)) != int(np.prod(t.shape)) or any(d < 0 for d in target):
        raise TraceError(f"Reshape: {t.shape} cannot become {target}")
    # A 0 here means a dimension of size 0; ONNX reads it as "copy the input's" unless allowzero.
    attrs = attributes(allowzero=1) if 0 in target else None
    return t.batch.record_one("Reshape", [t, t.batch.shared_constant(target)], target, t.dtype, attrs)


def transpose(x: Operand, perm: Sequence[int] | None = None) -> Tensor:
    (t,) = _tensors("Transpose", x)
    perm = tuple(perm) if perm is not None else tuple(reversed(range(t.ndim)))
    if sorted(perm) != list(range(t.ndim)):
        raise TraceError(f"Transpose: {perm} is not a permutation of the axes of {t.shape}")
    return t.batch.record_one("Transpose", [t], tuple(t.shape[p] for p in perm), t.dtype, attributes(perm=perm))


def index(x: Operand, key: Any) -> Tensor:
    """``x[i]`` (an element or row, i may be a traced int64 tensor) or ``x[a:b]`` on axis 0."""
    (t,) = _tensors("Gather", x)
    if isinstance(key, slice):
        start, stop, step = key.indices(t.shape[0])
        if step != 1:
            raise TraceError(f"slicing {t.shape} with step {step}: only step 1 is traced")
        length = max(0, stop - start)
        batch = t.batch
        bounds = [batch.shared_constant([start]), batch.shared_constant([stop]), batch.shared_constant([0])]
        return batch.record_one("Slice", [t, *bounds], (length, *t.shape[1:]), t.dtype)
    return pick(t, key)


_AXIS_0 = attributes(axis=0)


def _check_index(i: int, shape: tuple[int, ...]) -> None:
    """An int index into axis 0 of ``shape``, checked when traced."""
    if not -shape[0] <= i < shape[0]:
        raise TraceError(f"Gather: index {i} is out of range for shape {shape}")


def _python_pick(x: Operand, i: Any) -> Tensor:
    known = not isinstance(i, Tensor)
    if known:
        i = _python_index(i)
    if type(x) is Parameter:  # an embedding lookup: the common case
        batch, t, shape = current_batch(), None, x.shape
    else:
        t = _tensors("Gather", x)[0]
        batch, shape = t.batch, t.shape
    if not shape:
        raise TraceError("Gather: cannot pick from a scalar")
    if known:
        _check_index(i, shape)
        if t is None and not batch.in_cell_body:
            return batch.row(x, i)  # a known row: no traced op
        position = batch.constant(i, dtype=np.int64)
    elif i.batch is not batch:
        raise TraceError(f"{i!r} belongs to another batch; values cannot cross batches")
    else:
        position = i
    if t is None:
        t = batch.parameter(x)
    return batch.record_one("Gather", [t, position], (*position.shape, *t.shape[1:]), t.dtype, _AXIS_0)


def _python_index(i: Any) -> int:
    try:
        return operator.index(i)
    except TypeError:
        raise TraceError(f"Gather: an index must be an integer or an integer tensor, not {type(i).__name__} "
                         f"{i!r}") from None


def _python_lookup(table: Parameter | Tensor, i: Any) -> Tensor:
    if isinstance(i, (list, tuple, np.ndarray)):
        indices = np.array(i)  # a copy: the batch keeps it, and a caller may change an array of theirs
        rows = table.shape[0]
        if indices.ndim != 1 or indices.dtype.kind not in "iu" and indices.size:
            raise TraceError(f"Gather: rows are looked up by a sequence of ints, not {indices.dtype} of shape "
                             f"{indices.shape}")
        if indices.size:
            # A short list's bounds in Python: two NumPy reductions cost more than the rest of a lookup.
            low, high = (min(i), max(i)) if type(i) is list and len(i) < 64 else (indices.min(), indices.max())
            if not -rows <= low <= high < rows:
                raise TraceError(f"Gather: indices {low}..{high} are out of range for shape {table.shape}")
        return pick(table, current_batch().indices(indices))
    return pick(table, i)


# Where the recorder is compiled, the common cases of these run in C (tensors of one batch and
# dtype; elementwise of one shape; matmul of [k] or [m, k] by [k, n]; a row looked up before in
# the batch; a tensor's element or row by an int; a split into equal parts; a concat whose shapes
# agree), and everything else through the Python functions above, which C calls.
if recorder.compiled:
    recorder.compiled.configure_ops(Parameter, _current, _python_elementwise, _python_tensors, _python_pick,
                                    _python_lookup, _python_matmul, _python_split, _split_attributes, _AXIS_0,
                                    np.int64, _python_concat, _axis)
    _tensors, _elementwise, _matmul, _pick, _lookup, _split, _concat = (
        recorder.compiled.operands, recorder.compiled.elementwise, recorder.compiled.matmul, recorder.compiled.pick,
        recorder.compiled.lookup, recorder.compiled.split, recorder.compiled.concat)
else:
    _tensors, _elementwise, _matmul, _pick, _lookup, _split, _concat = (
        _python_tensors, _python_elementwise, _python_matmul, _python_pick, _python_lookup, _python_split,
        _python_concat)


def pick(x: Operand, i: Any) -> Tensor:
    """Element (or row) ``i`` of ``x`` along axis 0: DyNet's pick. ``i``: an int (a NumPy
    integer too), or an integer tensor of the same batch."""
    return _pick(x, i)


def lookup(table: Parameter | Tensor, i: Any) -> Tensor:
    """Row ``i`` of an embedding table; rows ``[n, d]`` for a sequence of ``n`` ints."""
    return _lookup(table, i)


# ----------------------------------------------------------------------------- recurrent layers
DIRECTIONS = {"forward": 1, "reverse": 1, "bidirectional": 2}
GATES = {"LSTM": ("i, o, f, c", 4), "GRU": ("z, r, h", 3), "RNN": ("the one", 1)}
_FROM_AXIS_1 = attributes(axis=1)


def lstm(x: Operand, W: Operand, R: Operand, B: Operand | None = None, direction: str = "forward",
         ) -> tuple[Tensor, Tensor]:
    """ONNX's LSTM over ONE sequence ``x [n, d]``, in ONNX's layout: ``W [dirs, 4h, d]``,
    ``R [dirs, 4h, h]``, ``B [dirs, 8h]`` (input and recurrent biases), gates in the order i, o,
    f, c; zero initial states. Returns the hidden states ``[n, h]`` (``[n, 2h]`` when
    bidirectional: forward, backward, as PyTorch's) and the last ones ``[h]`` (``[2h]``; a
    reverse layer's is at position 0). Calls over sequences of different lengths batch as
    packed sequences (``batcher.sequences``)."""
    return _recurrent("LSTM", x, W, R, B, direction)


def gru(x: Operand, W: Operand, R: Operand, B: Operand | None = None, direction: str = "forward",
        linear_before_reset: bool = False) -> tuple[Tensor, Tensor]:
    """ONNX's GRU over ONE sequence ``x [n, d]``: as ``lstm``, with ``W [dirs, 3h, d]``,
    ``R [dirs, 3h, h]``, ``B [dirs, 6h]``, gates z, r, h (``linear_before_reset`` as ONNX's,
    PyTorch's GRU is ``True``)."""
    if linear_before_reset:
        return _python_recurrent("GRU", x, W, R, B, direction, linear_before_reset=1)
    return _recurrent("GRU", x, W, R, B, direction)


def rnn(x: Operand, W: Operand, R: Operand, B: Operand | None = None, direction: str = "forward",
        ) -> tuple[Tensor, Tensor]:
    """ONNX's RNN (tanh) over ONE sequence ``x [n, d]``: as ``lstm``, with ``W [dirs, h, d]``,
    ``R [dirs, h, h]``, ``B [dirs, 2h]``."""
    return _recurrent("RNN", x, W, R, B, direction)


def _python_recurrent(op: str, x: Operand, W: Operand, R: Operand, B: Operand | None, direction: str,
                      **extra: Any) -> tuple[Tensor, Tensor]:
    """Records Unsqueeze (to ONNX's ``[n, 1, d]``), the layer, and the reshapes of its outputs."""
    t, w, r, *b = _tensors(op, x, W, R, *([] if B is None else [B]))
    shapes = (op, direction, t.shape[1:], w.shape, r.shape, *[v.shape for v in b], *extra.items())
    layer = _LAYERS.get(shapes)
    if layer is None or len(t.shape) != 2 or not t.shape[0]:
        layer = _LAYERS[shapes] = _checked_layer(op, t, w, r, b, direction, extra)
    dirs, hidden, attrs = layer
    batch, n = t.batch, t.shape[0]
    sequence = batch.record_one("Unsqueeze", [t, batch.shared_constant([1])], (n, 1, t.shape[1]), t.dtype)
    y, last = batch.record_outputs(op, [sequence, w, r, *b], [(n, dirs, 1, hidden), (dirs, 1, hidden)], [t.dtype] * 2, attrs)
    y = batch.record_one("Flatten", [y], (n, dirs * hidden), t.dtype, _FROM_AXIS_1)
    last = batch.record_one("Reshape", [last, batch.shared_constant([dirs * hidden])], (dirs * hidden,), t.dtype)
    return y, last


# What a layer's checks found, by its op, direction, attributes and operand shapes but the
# sequence's length: checked once, not on every one of a minibatch's hundreds of calls (the
# compiled recorder reads it too: a layer without extra attributes found here is recorded in C).
_LAYERS: dict[tuple, tuple[int, int, dict]] = {}
if recorder.compiled:
    recorder.compiled.configure_recurrent(_python_recurrent, _LAYERS, _FROM_AXIS_1)
    _recurrent = recorder.compiled.recurrent
else:
    _recurrent = _python_recurrent


def _checked_layer(op: str, t: Tensor, w: Tensor, r: Tensor, b: list[Tensor], direction: str,
                   extra: dict[str, Any]) -> tuple[int, int, dict]:
    """(directions, hidden size, the layer's attributes), or TraceError naming what does not fit."""
    if direction not in DIRECTIONS:
        raise TraceError(f"{op}: direction must be one of {sorted(DIRECTIONS)}, not {direction!r}")
    dirs, (order, gates) = DIRECTIONS[direction], GATES[op]
    if t.ndim != 2 or not t.shape[0] or w.ndim != 3 or r.ndim != 3:
        raise TraceError(f"{op}: x must be [n, d] (n > 0), W [dirs, {gates}h, d] and R [dirs, {gates}h, h]; got "
                         f"{t.shape}, {w.shape} and {r.shape}")
    hidden = r.shape[2]
    expected = [(dirs, gates * hidden, t.shape[1]), (dirs, gates * hidden, hidden)]
    expected += [(dirs, 2 * gates * hidden)] * len(b)
    if [w.shape, r.shape, *(v.shape for v in b)] != expected:
        raise TraceError(f"{op} ({direction}, gates {order}) over x {t.shape}: W, R and B must be {expected}, got "
                         f"{[w.shape, r.shape, *(v.shape for v in b)]}")
    return dirs, hidden, attributes(hidden_size=hidden, direction=direction, **extra)


# ----------------------------------------------------------------------------- normalisation and losses
def softmax(x: Operand, axis: int = -1) -> Tensor:
    (t,) = _tensors("Softmax", x)
    return t.batch.record_one("Softmax", [t], t.shape, t.dtype, attributes(axis=axis))


def log_softmax(x: Operand, axis: int = -1) -> Tensor:
    (t,) = _tensors("LogSoftmax", x)
    return t.batch.record_one("LogSoftmax", [t], t.shape, t.dtype, attributes(axis=axis))


def pick_neg_log_softmax(scores: Operand, i: Any) -> Tensor:
    """``-log_softmax(scores)[i]``: the negative log-likelihood of class i. Of a vector's class
    given as an int, one node (see ``_AFFINE``); else its three ops."""
    if type(scores) is Tensor and len(scores.shape) == 1 and type(i) is int and not scores.batch.in_cell_body:
        _check_index(i, scores.shape)
        return _PICK_NEG_LOG_SOFTMAX(scores, i)
    return _pick_neg_log_softmax(scores, i)


def _pick_neg_log_softmax(scores: Operand, i: Any) -> Tensor:
    return neg(pick(log_softmax(scores), i))


# One node a call where DyNet has one (affine_transform, pickneglogsoftmax): a cell of their ops,
# which a Tree-LSTM of primitive ops traces, plans and frees a fifth fewer records of, and runs
# in a launch where it ran two or three. Of other shapes they stay their ops, which batch across
# lengths (a cell's calls of other shapes are other functions); inside a cell's body too, whose
# rules see the ops of the body whole.
_AFFINE = Cell(_affine, "affine")
_NODE_OPERANDS = frozenset({Tensor, Parameter})  # (a scalar bias takes x's dtype in the ops, not in a cell)
_PICK_NEG_LOG_SOFTMAX = Cell(_pick_neg_log_softmax, "pick_neg_log_softmax")


def softmax_cross_entropy(scores: Operand, labels: Sequence[int]) -> Tensor:
    """``sum_k -log_softmax(scores[k])[labels[k]]`` over the rows of ``scores [n, C]``: ONNX's
    SoftmaxCrossEntropyLoss summed, one op (which batches across instances of any ``n``)."""
    (t,) = _tensors("SoftmaxCrossEntropyLoss", scores)
    targets = np.array(labels)  # a copy, kept by the batch
    if t.ndim != 2 or targets.shape != t.shape[:1] or targets.dtype.kind not in "iu" and targets.size:
        raise TraceError(f"SoftmaxCrossEntropyLoss: scores must be [n, C] and labels n ints; got {t.shape} and "
                         f"labels of shape {targets.shape}")
    if targets.size and not (0 <= targets.min() and targets.max() < t.shape[1]):
        raise TraceError(f"SoftmaxCrossEntropyLoss: labels {targets.min()}..{targets.max()} are not classes of "
                         f"scores {t.shape}")
    return t.batch.record_one("SoftmaxCrossEntropyLoss", [t, t.batch.indices(targets)], (), t.dtype,
                              attributes(reduction="sum"))


def reduce_sum(x: Operand, axis: int | None = None) -> Tensor:
    (t,) = _tensors("ReduceSum", x)
    axes = list(range(t.ndim)) if axis is None else [axis + t.ndim if axis < 0 else axis]
    shape = tuple(d for k, d in enumerate(t.shape) if k not in axes)
    return t.batch.record_one("ReduceSum", [t, t.batch.shared_constant(axes)], shape, t.dtype, attributes(keepdims=0))


def zeros(shape: Sequence[int], dtype: Any = np.float32) -> Tensor:
    """Equal requests in one batch share a tensor, so that calls reading it can be reused."""
    return current_batch().zeros(tuple(shape), np.dtype(dtype))


def _install_operators() -> None:
    """``Tensor``'s numpy-like operators, as the ops above (bound once here: an import inside
    each operator would cost every traced op a module lookup)."""
    Tensor.__add__, Tensor.__sub__, Tensor.__mul__, Tensor.__truediv__ = add, sub, mul, div  # type: ignore[method-assign]
    Tensor.__radd__ = lambda self, other: add(other, self)  # type: ignore[method-assign]
    Tensor.__rsub__ = lambda self, other: sub(other, self)  # type: ignore[method-assign]
    Tensor.__rmul__ = lambda self, other: mul(other, self)  # type: ignore[method-assign]
    Tensor.__matmul__, Tensor.__neg__, Tensor.__getitem__ = matmul, neg, index  # type: ignore[method-assign]


_install_operators()
