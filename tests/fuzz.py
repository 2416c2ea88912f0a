"""A random-program fuzzer of the correctness contract.

Each program is an ONNX model of ONE instance (``x [N, 4]`` floats and ``ids [N]`` word ids, N
the instance's own length) whose nodes are a random DAG over the ops we batch and the ops we do
not: elementwise ops with broadcasting, MatMul and Gemm by shared weights, products of two
per-instance values (attention-like ``[N, N]``), concatenations along either axis, slices,
reductions, Softmax and LayerNormalization, reshapes and transposes, embedding lookups, values
computed from shapes (``Range(Shape(x)[0])``, ``Expand`` to another value's shape), an LSTM over
the rows, and ops without a rule (TopK, CumSum, Pad, Trilu, Einsum, ArgMax feeding a lookup).
Several instances of different lengths run batched through ``InferenceSession.run_batch`` on a
backend; every instance's outputs must equal it run alone, and so must a second batch of the
same shapes with other values (a stale plan would give the first batch's) and a third of a new
mix; one program in ten has an instance without rows. Floats compare within rtol 1e-5 and atol 1e-6 plus 1e-5 times the output's largest value:
a ragged launch puts instances' rows through one larger BLAS call, whose summation order may
differ, and later cancellation magnifies those last bits. A step function (Floor, Sign, ArgMax, the
condition of a Where) takes only values computed without sums: of a sum, the last bit that summation
order may change can move it across a step (Floor(0.99999994) is 0, Floor(1.0) is 1; seed 101093).
LayerNormalization divides by its row's deviation, so a row whose values are equal but for
rounding (a Softmax over the rows, summed over them: seed 611481) comes out as those last bits
times up to 1/sqrt(epsilon); a computed input gets a ramp added first, as a bias would, so that
its rows vary.

    python -m tests.fuzz --programs 10000 --backends numpy onnxruntime [--seed 0] [--minutes M] [--node-level] [--poison-arenas]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import random
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnx.reference
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from autobatch import InferenceSession
from tests.poison import poisoned_arenas

WIDTH, VOCAB, HIDDEN = 4, 8, 3
Rows = tuple[int, int]  # k * N + c rows
N = (1, 0)


@dataclass
class Value:
    name: str
    rows: Rows  # for an int64 id vector: its length
    cols: int  # 0: a vector of ids [rows]
    exact: bool = True  # computed without sums, so alike in any summation order


@dataclass
class Program:
    """Nodes and shared constants being built, and the values so far."""

    rng: random.Random
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    values: list[Value] = field(default_factory=list)
    ops: collections.Counter = field(default_factory=collections.Counter)

    def fresh(self, kind: str) -> str:
        return f"{kind}{len(self.nodes)}_{len(self.constants)}"

    def constant(self, array: np.ndarray) -> str:
        name = self.fresh("k")
        self.constants[name] = array
        return name

    def weight(self, *shape: int) -> str:
        rng = np.random.default_rng(self.rng.randrange(1 << 30))
        return self.constant((rng.standard_normal(shape) * 0.5).astype(np.float32))

    def node(self, op: str, inputs: list[str], **attrs) -> str:
        out = self.fresh("v")
        self.nodes.append(helper.make_node(op, inputs, [out], **attrs))
        self.ops[op] += 1
        return out

    def floats(self) -> list[Value]:
        return [v for v in self.values if v.cols]

    def exact(self) -> list[Value]:  # what a step function (Floor, Sign, ArgMax, > 0) may take
        return [v for v in self.floats() if v.exact]

    def pick(self, candidates: list[Value] | None = None) -> Value:
        candidates = self.floats() if candidates is None else candidates
        return self.rng.choice(candidates[-6:] if self.rng.random() < 0.7 else candidates)

    def add(self, name: str, rows: Rows, cols: int, *sources: Value, sums: bool = False) -> None:
        self.values.append(Value(name, rows, cols, not sums and all(v.exact for v in sources)))


def _ints(*values: int) -> np.ndarray:
    return np.array(values, np.int64)


UNARY = ("Relu", "Tanh", "Sigmoid", "Neg", "Abs", "Softplus", "Erf", "LeakyRelu", "Elu", "HardSigmoid", "Sin",
         "Floor", "Sign")
STEP_FUNCTIONS = ("Floor", "Sign")
BINARY = ("Add", "Sub", "Mul", "Max", "Min")
REDUCE = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceL2", "ReduceLogSumExp")


def unary(p: Program) -> None:
    a = p.pick()
    op = p.rng.choice(UNARY)
    if op in STEP_FUNCTIONS and not a.exact:
        a = p.pick(p.exact())
    p.add(p.node(op, [a.name]), a.rows, a.cols, a)


def binary(p: Program) -> None:
    a = p.pick()
    same = [v for v in p.floats() if (v.rows, v.cols) == (a.rows, a.cols)]
    b = p.pick(same)
    p.add(p.node(p.rng.choice(BINARY), [a.name, b.name]), a.rows, a.cols, a, b)


def shared_operand(p: Program) -> None:  # a bias row, a scale, a column: broadcast from a shared value
    a = p.pick()
    shape = p.rng.choice([(a.cols,), (1, a.cols), ()])
    p.add(p.node(p.rng.choice(("Add", "Mul", "Sub")), [a.name, p.weight(*shape)]), a.rows, a.cols, a)


def broadcast_row(p: Program) -> None:  # each instance's mean row added back to its rows
    a = p.pick()
    mean = p.node("ReduceMean", [a.name, p.constant(_ints(0))], keepdims=1)
    p.add(p.node("Add", [a.name, mean]), a.rows, a.cols, sums=True)


def matmul(p: Program) -> None:
    a = p.pick()
    cols = p.rng.randint(1, 5)
    p.add(p.node("MatMul", [a.name, p.weight(a.cols, cols)]), a.rows, cols, sums=True)


def gemm(p: Program) -> None:
    a = p.pick()
    cols = p.rng.randint(1, 5)
    trans = p.rng.random() < 0.5
    weight = p.weight(cols, a.cols) if trans else p.weight(a.cols, cols)
    p.add(p.node("Gemm", [a.name, weight, p.weight(cols)], transB=int(trans), alpha=0.5), a.rows, cols, sums=True)


def attention(p: Program) -> None:  # softmax(a b^T) c: per-instance [rows_a, rows_b] scores
    a = p.pick()
    keys = [v for v in p.floats() if v.cols == a.cols]
    b = p.pick(keys)
    scores = p.node("MatMul", [a.name, p.node("Transpose", [b.name], perm=[1, 0])])
    weights = p.node("Softmax", [scores], axis=-1)
    values = [v for v in p.floats() if v.rows == b.rows]
    c = p.pick(values)
    p.add(p.node("MatMul", [weights, c.name]), a.rows, c.cols, sums=True)


def concat(p: Program) -> None:
    a = p.pick()
    if p.rng.random() < 0.5:
        partners = [v for v in p.floats() if v.rows == a.rows and v.cols + a.cols <= 8]
        if partners:
            b = p.pick(partners)
            p.add(p.node("Concat", [a.name, b.name], axis=1), a.rows, a.cols + b.cols, a, b)
            return
    partners = [v for v in p.floats() if v.cols == a.cols and v.rows[0] + a.rows[0] <= 2 and v.rows[1] + a.rows[1] <= 3]
    if partners:
        b = p.pick(partners)
        p.add(p.node("Concat", [a.name, b.name], axis=0), (a.rows[0] + b.rows[0], a.rows[1] + b.rows[1]), a.cols, a, b)


def slice_(p: Program) -> None:
    a = p.pick()
    if p.rng.random() < 0.5 and a.cols > 1:
        start = p.rng.randrange(a.cols - 1)
        end = p.rng.randint(start + 1, a.cols)
        p.add(p.node("Slice", [a.name, p.constant(_ints(start)), p.constant(_ints(end)), p.constant(_ints(1))]),
              a.rows, end - start, a)
    else:  # the first row of each instance
        p.add(p.node("Slice", [a.name, p.constant(_ints(0)), p.constant(_ints(1)), p.constant(_ints(0))]), (0, 1), a.cols, a)


def reduce(p: Program) -> None:
    a = p.pick()
    axis = p.rng.randrange(2)
    op = p.rng.choice(REDUCE)
    out = p.node(op, [a.name, p.constant(_ints(axis))], keepdims=1)
    p.add(out, (0, 1) if axis == 0 else a.rows, a.cols if axis == 0 else 1, a, sums=op not in ("ReduceMax", "ReduceMin"))


def normalize(p: Program) -> None:
    a = p.pick()
    kind = p.rng.choice(("Softmax", "LogSoftmax", "LayerNormalization"))
    if kind == "LayerNormalization":
        x = a.name
        if not a.exact:  # (see the docstring: a ramp, as a bias would, keeps its rows from being flat)
            x = p.node("Add", [x, p.constant(np.arange(a.cols, dtype=np.float32))])
        p.add(p.node(kind, [x, p.weight(a.cols), p.weight(a.cols)], axis=-1), a.rows, a.cols, sums=True)
    else:
        p.add(p.node(kind, [a.name], axis=p.rng.choice((-1, 0))), a.rows, a.cols, sums=True)


def transpose(p: Program) -> None:  # of a value with a fixed number of rows: [c, cols] -> [cols, c]
    fixed = [v for v in p.floats() if v.rows[0] == 0]
    if not fixed:
        return unary(p)
    a = p.pick(fixed)
    p.add(p.node("Transpose", [a.name], perm=[1, 0]), (0, a.cols), a.rows[1], a)


def reshape(p: Program) -> None:
    a = p.pick([v for v in p.floats() if v.cols in (2, 4, 6, 8)] or p.floats())
    if a.cols % 2:
        return
    split = p.node("Reshape", [a.name, p.constant(_ints(-1, 2, a.cols // 2))])
    swapped = p.node("Transpose", [split], perm=[0, 2, 1])
    p.add(p.node("Reshape", [swapped, p.constant(_ints(-1, a.cols))]), a.rows, a.cols, a)


def select(p: Program) -> None:  # PyTorch's packed q, k, v: one picked after a Transpose (ir.select_first)
    a = p.pick([v for v in p.floats() if v.cols % 2 == 0 or v.cols % 3 == 0] or p.floats())
    k = 3 if a.cols % 3 == 0 else 2
    if a.cols % k:
        return
    c = a.cols // k
    split = p.node("Reshape", [a.name, p.constant(_ints(-1, k, c))])  # [n, k, c]
    unsqueezed = p.node("Unsqueeze", [split, p.constant(_ints(p.rng.choice((0, -4))))])  # [1, n, k, c]
    turned = p.node("Transpose", [unsqueezed], perm=[2, 1, 0, 3])  # [k, n, 1, c]
    squeezed = p.node("Squeeze", [turned, p.constant(_ints(p.rng.choice((2, -2))))])  # [k, n, c]
    index = p.constant(np.array(p.rng.randrange(-k, k), np.int64))
    p.add(p.node("Gather", [squeezed, index], axis=p.rng.choice((0, -3))), a.rows, c, a)


def mask_pick(p: Program) -> None:  # attention whose key mask is picked by positions made from the length (HF's exports)
    a = p.pick()
    b = p.pick([v for v in p.floats() if v.cols == a.cols])
    flags = [v for v in p.exact() if v.rows == b.rows]
    if not flags:
        return attention(p)
    flat = p.node("Gather", [p.pick(flags).name, p.constant(np.array(0, np.int64))], axis=1)  # [rows]: which keys are kept
    length = p.node("Gather", [p.node("Shape", [flat]), p.constant(np.array(0, np.int64))], axis=0)
    ids = p.node("Range", [p.constant(np.array(0, np.int64)), length, p.constant(np.array(1, np.int64))])
    if p.rng.random() < 0.5:  # from the end: -1, -2, ...
        ids = p.node("Sub", [p.constant(np.array(-1, np.int64)), ids])
    if p.rng.random() < 0.5:  # the legacy exporter's Gather, or dynamo's GatherND of (0, position) pairs
        picked = p.node("Gather", [flat, ids], axis=0)
    else:
        column_ids = p.node("Unsqueeze", [ids, p.constant(_ints(-1))])
        pairs = p.node("Concat", [p.node("Mul", [column_ids, p.constant(np.array(0, np.int64))]), column_ids], axis=-1)
        picked = p.node("GatherND", [p.node("Unsqueeze", [flat, p.constant(_ints(0))]), pairs])
    keep = p.node("Unsqueeze", [p.node("Greater", [picked, p.constant(np.array(0, np.float32))]), p.constant(_ints(0))])
    scores = p.node("MatMul", [a.name, p.node("Transpose", [b.name], perm=[1, 0])])
    masked = p.node("Where", [p.node("Expand", [keep, p.node("Shape", [scores])]), scores,
                              p.constant(np.array(-1e4, np.float32))])
    weights = p.node("Softmax", [masked], axis=-1)
    c = p.pick([v for v in p.floats() if v.rows == b.rows])
    p.add(p.node("MatMul", [weights, c.name]), a.rows, c.cols, sums=True)


def pool(p: Program) -> None:  # a classifier's pooler: each instance's first (or last) row, then a dense layer
    a = p.pick()
    # [1, rows, cols], as an exporter's batch of one (a Reshape: ``ir.select_first`` would move the
    # Gather before an Unsqueeze, leaving no axis of 1 before the rows)
    lifted = p.node("Reshape", [a.name, p.constant(_ints(1, -1, a.cols))])
    row = p.node("Gather", [lifted, p.constant(np.array(p.rng.choice((0, -1)), np.int64))], axis=1)  # [1, cols]
    cols = p.rng.randint(1, 5)
    p.add(p.node("Tanh", [p.node("MatMul", [row, p.weight(a.cols, cols)])]), (0, 1), cols, sums=True)


def found(p: Program) -> None:  # GPT-2's classifier: each instance's row at the first max (or min) of a column
    a = p.pick(p.exact())  # (it decides the position)
    column_ = p.node("Gather", [a.name, p.constant(_ints(p.rng.randrange(a.cols)))], axis=1)  # [rows, 1]
    flat = p.node("Reshape", [column_, p.constant(_ints(1, -1))])
    at = p.node(p.rng.choice(("ArgMax", "ArgMin")), [flat], axis=1, keepdims=0)  # [1]
    b = p.pick([v for v in p.floats() if v.rows == a.rows])
    lifted = p.node("Reshape", [b.name, p.constant(_ints(1, -1, b.cols))])
    if p.rng.random() < 0.5:  # the legacy exporter's Gather, or dynamo's GatherND of (0, position)
        row = p.node("Reshape", [p.node("Gather", [lifted, at], axis=1), p.constant(_ints(1, b.cols))])
    else:
        pair = p.node("Concat", [p.constant(np.zeros((1, 1), np.int64)), p.node("Unsqueeze", [at, p.constant(_ints(1))])],
                      axis=1)
        row = p.node("GatherND", [lifted, pair])
    cols = p.rng.randint(1, 5)
    p.add(p.node("Tanh", [p.node("MatMul", [row, p.weight(b.cols, cols)])]), (0, 1), cols, sums=True)


def conv(p: Program) -> None:  # a text CNN's convolution along the rows: Conv1d over [1, cols, rows], as long
    a = p.pick()
    kernel, dilation = p.rng.choice((1, 3, 5)), p.rng.choice((1, 2))
    pad = dilation * (kernel - 1) // 2
    x = p.node("Unsqueeze", [p.node("Transpose", [a.name], perm=[1, 0]), p.constant(_ints(0))])
    cols = p.rng.randint(1, 6)
    y = p.node("Conv", [x, p.weight(cols, a.cols, kernel), p.weight(cols)], kernel_shape=[kernel], pads=[pad, pad],
               dilations=[dilation])
    p.add(p.node("Transpose", [p.node("Squeeze", [y, p.constant(_ints(0))])], perm=[1, 0]), a.rows, cols, sums=True)


def regrouped(p: Program) -> None:  # attention whose scores gain an axis before their two of rows (ALiBi's [1, H, L, L])
    a = p.pick()
    b = p.pick([v for v in p.floats() if v.cols == a.cols])
    scores = p.node("Unsqueeze", [p.node("MatMul", [a.name, p.node("Transpose", [b.name], perm=[1, 0])]),
                                  p.constant(_ints(0))])
    weights = p.node("Squeeze", [p.node("Softmax", [scores], axis=-1), p.constant(_ints(0))])
    rows = a.rows
    if p.rng.random() < 0.5:  # P^T P: a product over the queries' rows too
        weights, rows = p.node("MatMul", [p.node("Transpose", [weights], perm=[1, 0]), weights]), b.rows
    c = p.pick([v for v in p.floats() if v.rows == b.rows])
    p.add(p.node("MatMul", [weights, c.name]), rows, c.cols, sums=True)


def column(p: Program) -> None:  # each row by one column of its own: [rows, cols] op [rows, 1] (a masked mean's Div)
    a = p.pick()
    first = p.node("Gather", [a.name, p.constant(_ints(p.rng.randrange(a.cols)))], axis=1)  # [rows, 1]
    b = p.pick([v for v in p.floats() if v.rows == a.rows])
    operands = [b.name, first] if p.rng.random() < 0.5 else [first, b.name]
    p.add(p.node(p.rng.choice(BINARY), operands), b.rows, b.cols, a, b)


def lookup(p: Program) -> None:
    ids = p.pick([v for v in p.values if not v.cols])
    p.add(p.node("Gather", [p.weight(VOCAB, WIDTH), ids.name], axis=0), ids.rows, WIDTH)


def positions(p: Program) -> None:  # Range(0, Shape(a)[0]): position ids computed from a shape
    a = p.pick()
    length = p.node("Gather", [p.node("Shape", [a.name]), p.constant(np.array(0, np.int64))], axis=0)
    ids = p.node("Range", [p.constant(np.array(0, np.int64)), length, p.constant(np.array(1, np.int64))])
    clipped = p.node("Min", [ids, p.constant(np.array(VOCAB - 1, np.int64))])
    p.values.append(Value(clipped, a.rows, 0))


def expand(p: Program) -> None:  # a shared row expanded to another value's shape
    a = p.pick()
    p.add(p.node("Expand", [p.weight(1, a.cols), p.node("Shape", [a.name])]), a.rows, a.cols)


def lstm(p: Program) -> None:
    a = p.pick()
    x = p.node("Unsqueeze", [a.name, p.constant(_ints(1))])
    gates = 4 * HIDDEN
    y = p.node("LSTM", [x, p.weight(1, gates, a.cols), p.weight(1, gates, HIDDEN), p.weight(1, 2 * gates)],
               hidden_size=HIDDEN, direction=p.rng.choice(("forward", "reverse")))
    p.add(p.node("Squeeze", [y, p.constant(_ints(1, 2))]), a.rows, HIDDEN, sums=True)


def no_rule(p: Program) -> None:  # ops that run one instance at a time inside the plan
    a = p.pick()
    kind = p.rng.choice(("TopK", "CumSum", "Pad", "Trilu", "Einsum", "ArgMax"))
    if kind == "TopK":
        k = p.rng.randint(1, a.cols)
        values = p.fresh("v")
        p.nodes.append(helper.make_node("TopK", [a.name, p.constant(_ints(k))], [values, values + "i"], axis=1))
        p.ops["TopK"] += 1
        p.add(values, a.rows, k, a)
    elif kind == "CumSum":
        p.add(p.node("CumSum", [a.name, p.constant(np.array(p.rng.randrange(2), np.int64))],
                     reverse=p.rng.randrange(2)), a.rows, a.cols, sums=True)
    elif kind == "Pad":
        p.add(p.node("Pad", [a.name, p.constant(_ints(0, 1, 0, 1))]), a.rows, a.cols + 2, a)
    elif kind == "Trilu":
        p.add(p.node("Trilu", [a.name], upper=p.rng.randrange(2)), a.rows, a.cols, a)
    elif kind == "Einsum":
        cols = p.rng.randint(1, 4)
        p.add(p.node("Einsum", [a.name, p.weight(a.cols, cols)], equation="ij,jk->ik"), a.rows, cols, sums=True)
    else:
        if not a.exact:
            a = p.pick(p.exact())
        ids = p.node("ArgMax", [a.name], axis=1, keepdims=0)
        p.values.append(Value(ids, a.rows, 0))


def where(p: Program) -> None:
    a = p.pick()
    if not a.exact:  # it decides the branch
        a = p.pick(p.exact())
    b = p.pick([v for v in p.floats() if (v.rows, v.cols) == (a.rows, a.cols)])
    condition = p.node("Greater", [a.name, p.constant(np.array(0, np.float32))])
    p.add(p.node("Where", [condition, a.name, b.name]), a.rows, a.cols, a, b)


def cast(p: Program) -> None:
    a = p.pick()
    wide = p.node("Cast", [a.name], to=TensorProto.DOUBLE)
    p.add(p.node("Cast", [p.node("Tanh", [wide])], to=TensorProto.FLOAT), a.rows, a.cols, a)


STEPS: dict[str, tuple[float, Callable[[Program], None]]] = {
    "unary": (3, unary), "binary": (3, binary), "shared": (2, shared_operand), "broadcast_row": (1, broadcast_row),
    "matmul": (3, matmul), "gemm": (1, gemm), "attention": (1.5, attention), "concat": (1.5, concat),
    "slice": (1, slice_), "reduce": (1.5, reduce), "normalize": (1.5, normalize), "transpose": (0.5, transpose),
    "reshape": (0.7, reshape), "lookup": (1, lookup), "positions": (0.7, positions), "expand": (0.7, expand),
    "lstm": (0.6, lstm), "no_rule": (1.5, no_rule), "where": (0.7, where), "cast": (0.5, cast),
}
# Steps added after seeds were recorded in tests: drawn only where asked for by kind, so that a
# recorded seed still makes its program.
LATER_STEPS: dict[str, tuple[float, Callable[[Program], None]]] = {"select": (0.7, select), "mask_pick": (1, mask_pick),
                                                                   "pool": (0.7, pool), "column": (1, column),
                                                                   "found": (0.7, found), "conv": (0.7, conv),
                                                                   "regrouped": (0.7, regrouped)}


# The steps a model planned once per node takes (``batcher.instance_axis``): the programs of
# ``--node-level`` are made of these alone, so that most of their batches go that way.
NODE_LEVEL = ("unary", "binary", "shared", "matmul", "gemm", "attention", "normalize", "reshape", "lookup",
              "positions", "expand", "lstm", "where", "cast")


def random_program(seed: int, steps: int | None = None,
                   kinds: tuple[str, ...] | None = None) -> tuple[onnx.ModelProto, collections.Counter]:
    """A one-instance model (inputs ``x [N, 4]``, ``ids [N]``) of ``steps`` random steps (of these
    ``kinds``; all by default), and the ops it holds."""
    p = Program(random.Random(seed))
    p.values = [Value("x", N, WIDTH), Value("ids", N, 0)]
    table = {**STEPS, **LATER_STEPS}
    names = list(kinds or STEPS)
    weights = [table[name][0] for name in names]
    for _ in range(steps or p.rng.randint(3, 14)):
        table[p.rng.choices(names, weights)[0]][1](p)
    computed = [v for v in p.floats() if v.name != "x"]
    if not computed:
        p.add(p.node("Identity", ["x"]), N, WIDTH)
        computed = p.floats()[-1:]
    outputs = list(dict.fromkeys([computed[-1].name, p.rng.choice(computed).name]))
    graph = helper.make_graph(
        p.nodes, f"fuzz{seed}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", WIDTH]),
         helper.make_tensor_value_info("ids", TensorProto.INT64, ["N"])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in outputs],
        [numpy_helper.from_array(array, name) for name, array in p.constants.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    for output in model.graph.output:  # onnx's checker wants output shapes: give their ranks
        output.type.tensor_type.shape.SetInParent()
        output.type.tensor_type.shape.dim.add().dim_param = "R"
        output.type.tensor_type.shape.dim.add().dim_param = "C"
    return model, p.ops


def instances(rng: np.random.Generator, lengths: list[int]) -> list[dict[str, np.ndarray]]:
    return [{"x": rng.standard_normal((n, WIDTH)).astype(np.float32), "ids": rng.integers(0, VOCAB, n)}
            for n in lengths]


def close(got: np.ndarray, want: np.ndarray) -> str | None:
    """Why a batched output differs from the instance's alone, or None (the tolerance above)."""
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"{got.dtype}{list(got.shape)} batched, {want.dtype}{list(want.shape)} alone"
    scale = float(np.nanmax(np.abs(want), initial=0.0)) if want.size and np.isfinite(want).any() else 0.0
    if not np.allclose(got, want, rtol=1e-5, atol=1e-6 + 1e-5 * scale, equal_nan=True):
        return f"largest difference {float(np.nanmax(np.abs(got.astype(np.float64) - want))):.3g} (scale {scale:.3g})"
    return None


@dataclass
class Outcome:
    programs: int = 0
    instances: int = 0
    mismatches: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # a batch that raised where every instance ran alone
    alone_failed: int = 0  # programs that onnxruntime (or ONNX's reference, for NumPy) cannot run either
    # programs whose batched results differ where onnxruntime runs what the standard refuses (a
    # Concat of an empty value of another width: the output's part for it is never written)
    undefined: int = 0
    nodes: int = 0  # of the batches, in the plans
    launches: int = 0  # the plans' steps
    node_level: int = 0  # batches run as the model's graph over every instance's rows (``autobatch.axis_batches``)
    ops: collections.Counter = field(default_factory=collections.Counter)


ORACLES = {"numpy": "ONNX's reference", "onnxruntime": "onnxruntime's own session"}


def runs_elsewhere(model: onnx.ModelProto, batches: list[list[dict[str, np.ndarray]]], backend: str) -> bool:
    """Whether what our backend stands for runs every instance, so that our one-instance run
    must too: onnxruntime's own session, or for NumPy ONNX's reference (onnxruntime also runs
    what the standard refuses, such as a Concat of an empty value of another width)."""
    try:
        if backend == "numpy":
            run = onnx.reference.ReferenceEvaluator(model).run
        else:
            run = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run
        for feeds in (feeds for batch in batches for feeds in batch):
            run(None, feeds)
    except Exception:  # noqa: BLE001 - the program does not hold for some instance: not ours to run
        return False
    return True


def check_program(seed: int, backend: str, outcome: Outcome, kinds: tuple[str, ...] | None = None) -> None:
    model, ops = random_program(seed, kinds=kinds)
    rng = np.random.default_rng(seed)
    lengths = [int(n) for n in rng.integers(1, 7, int(rng.integers(2, 7)))]
    if seed % 10 == 0:  # now and then an instance without rows
        lengths[0] = 0
    first = instances(rng, lengths)
    batches = [first, instances(rng, lengths),  # the same shapes, other values: no stale plan
               instances(rng, [int(n) for n in rng.permutation(lengths)[:max(2, len(lengths) - 1)]] + [7])]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            session = InferenceSession(model, backend=backend)
            alone = [[session.run(None, feeds) for feeds in batch] for batch in batches]
        except Exception as error:  # noqa: BLE001 - nothing to compare, unless onnxruntime runs it
            if runs_elsewhere(model, batches, backend):
                outcome.errors.append(f"seed {seed} {backend}: an instance alone raised, but {ORACLES[backend]} ran "
                                      f"every instance: {type(error).__name__}: {error}"[:500])
            else:  # the program does not hold for some instance (a row sliced out of no rows, say)
                outcome.alone_failed += 1
            return
        outcome.programs += 1
        outcome.ops.update(ops)
        differ: list[tuple[dict, str]] = []  # (the instance, what differs)
        try:
            _compare(seed, backend, session, batches, alone, outcome, differ)
        finally:
            # Where the standard refuses the instance, onnxruntime's own results are undefined.
            defined = [why for feeds, why in differ if backend == "numpy" or runs_elsewhere(model, [[feeds]], "numpy")]
            outcome.mismatches += defined
            outcome.undefined += len(defined) < len(differ)


def _compare(seed: int, backend: str, session: InferenceSession, batches: list, alone: list, outcome: Outcome,
             differ: list[str]) -> None:
    """Each batch run batched against its instances run alone: a failure in ``outcome.errors``,
    an output that differs in ``differ`` (with its instance's feeds)."""
    for b, (batch, wanted) in enumerate(zip(batches, alone)):
        outcome.instances += len(batch)
        try:
            got = session.run_batch(None, batch)
        except Exception as error:  # noqa: BLE001 - a batching failure: what the fuzzer looks for
            outcome.errors.append(f"seed {seed} {backend} batch {b}: {type(error).__name__}: {error}"[:500])
            return
        outcome.nodes += session.stats.report.nodes
        outcome.launches += session.stats.launches
        outcome.node_level += session.stats.report.scheduler == "instance axis"
        refusal = session.axis_batches.refusal if session.axis_batches is not None else None
        if refusal and refusal.startswith("its node-level plan failed"):  # (the batch ran per mix, said at WARNING)
            outcome.errors.append(f"seed {seed} {backend} batch {b}: {refusal}"[:500])
            return
        if len(got) != len(wanted) or any(len(g) != len(w) for g, w in zip(got, wanted)):
            outcome.errors.append(f"seed {seed} {backend} batch {b}: {[len(g) for g in got]} outputs batched, "
                                  f"{[len(w) for w in wanted]} alone")
            return
        for k, (outputs, expected) in enumerate(zip(got, wanted)):
            for j, (g, w) in enumerate(zip(outputs, expected)):
                why = close(g, w)
                if why:
                    differ.append((batch[k], f"seed {seed} {backend} batch {b} instance {k} (lengths "
                                             f"{[len(f['x']) for f in batch]}) output {j}: {why}"))


def fuzz(seeds: range, backends: list[str], minutes: float | None = None, progress: bool = False,
         kinds: tuple[str, ...] | None = None) -> dict[str, Outcome]:
    outcomes = {backend: Outcome() for backend in backends}
    stop = time.monotonic() + minutes * 60 if minutes else None
    start = time.monotonic()
    for count, seed in enumerate(seeds, 1):
        if stop is not None and time.monotonic() > stop:
            break
        for backend in backends:
            try:
                check_program(seed, backend, outcomes[backend], kinds)
            except Exception:  # noqa: BLE001 - the fuzzer itself must go on, and say what broke
                outcomes[backend].errors.append(f"seed {seed} {backend}: " + traceback.format_exc(limit=3)[-500:])
        if progress and count % 100 == 0:
            done = "; ".join(f"{b}: {o.programs} programs, {len(o.mismatches)} mismatches, {len(o.errors)} errors"
                             for b, o in outcomes.items())
            print(f"[{time.monotonic() - start:6.0f} s] seed {seed}: {done}", file=sys.stderr, flush=True)
    return outcomes


def report(outcomes: dict[str, Outcome]) -> str:
    lines = []
    for backend, o in outcomes.items():
        lines.append(f"{backend}: {o.programs} programs ({o.instances} instances in {3 * o.programs} batches, "
                     f"{o.nodes} nodes in {o.launches} launches; {o.node_level} batches planned once per node), {len(o.mismatches)} mismatches, {len(o.errors)} batch errors, "
                     f"{o.alone_failed} programs that {ORACLES[backend]} could not run either"
                     + (f", {o.undefined} that differ where the standard refuses an instance" if o.undefined else ""))
        lines += [f"  {line}" for line in (o.mismatches + o.errors)[:10]]
    ops = collections.Counter()
    for o in outcomes.values():
        ops.update(o.ops)
    lines.append("ops exercised: " + ", ".join(f"{op} {n}" for op, n in ops.most_common()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__.split("\n\n")[0])
    parser.add_argument("--programs", type=int, default=1000, help="programs per backend (default 1000)")
    parser.add_argument("--seed", type=int, default=0, help="the first program's seed (default 0)")
    parser.add_argument("--backends", nargs="+", choices=["numpy", "onnxruntime"], default=["numpy", "onnxruntime"])
    parser.add_argument("--minutes", type=float, help="stop after this long, whatever is left")
    parser.add_argument("--node-level", action="store_true",
                        help="programs of the steps a model planned once per node takes (most of their batches go so)")
    parser.add_argument("--kinds", nargs="+", choices=[*STEPS, *LATER_STEPS],
                        help="programs of these steps only (the later ones, such as select, are drawn only so)")
    parser.add_argument("--poison-arenas", action="store_true",
                        help="fill every arena with garbage before a plan runs (tests/poison.py)")
    args = parser.parse_args(argv)
    if args.programs < 1:
        parser.error("--programs must be positive")
    start = time.perf_counter()
    kinds = tuple(args.kinds) if args.kinds else NODE_LEVEL if args.node_level else None
    with poisoned_arenas() if args.poison_arenas else contextlib.nullcontext():
        outcomes = fuzz(range(args.seed, args.seed + args.programs), args.backends, args.minutes, progress=True,
                        kinds=kinds)
    print(report(outcomes))
    print(f"{time.perf_counter() - start:.0f} s")
    return 1 if any(o.mismatches or o.errors for o in outcomes.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
