"""Models of one op each, at the opsets where its form, its defaults or the element types it
takes changed, over instances of one shape and of several (``[L, d]`` and exported ``[1, L, d]``),
with shared and per-instance operands: what ``tests/test_opsets.py`` batches against each
instance alone. An audit of the rules at old opsets wrote the table; each case it found wrong
(a Softmax before opset 13 normalized rows of several instances together; an opset-8 Gather, a
Slice by int32 starts, ReduceMax before opset 9 and IR 3 models did not run batched) has its
own test beside the code it fixed."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import onnx
from onnx import helper, numpy_helper


class X(NamedTuple):
    """A per-instance input: its element type, its shape (one for all, or one an instance) and
    how its values are drawn (None: normal; "pos", "nz", or ("idx", low, high))."""

    dtype: Any
    shapes: Any
    kind: Any = None


class W(NamedTuple):
    """A shared operand (an initializer)."""

    array: np.ndarray


E = None  # an optional input left out


class Case(NamedTuple):
    op_type: str
    opset: int
    inputs: list[X | W | None]
    attributes: dict[str, Any]
    outputs: int
    tag: str

    @property
    def name(self) -> str:
        return f"{self.op_type}-{self.opset} {self.tag}"


CASES: list[Case] = []


def c(op: str, opset: int, ins: list, attrs: dict | None = None, nout: int = 1, tag: str = "") -> None:
    CASES.append(Case(op, opset, ins, attrs or {}, nout, tag))


f32, f64, f16, i32, i64, b, u8, i8, u32, u64 = (np.float32, np.float64, np.float16, np.int32, np.int64, np.bool_,
                                                 np.uint8, np.int8, np.uint32, np.uint64)
SAME, VARY, EXP = (3, 4), [(2, 4), (3, 4), (5, 4)], [(1, 2, 4), (1, 3, 4), (1, 5, 4)]
PAT = {"same": SAME, "vary": VARY, "exp": EXP}

# ---- unary
for op, opsets, dts, kind in [
    ("Relu", (6, 13), (f32, f64, f16), None), ("Abs", (6, 13), (f32, i32, i64, i8, f16), None),
    ("Neg", (6, 13), (f32, i32, i64, i8), None), ("Sqrt", (6,), (f32, f64), "pos"), ("Exp", (6, 13), (f32, f16), None),
    ("Log", (6,), (f32,), "pos"), ("Sigmoid", (6,), (f32, f64), None), ("Tanh", (6,), (f32,), None),
    ("Not", (5,), (b,), None), ("Sign", (9, 13), (f32, i32, i64), None), ("Erf", (9,), (f32,), None),
    ("IsNaN", (9,), (f32, f16), None), ("Floor", (6,), (f32,), None), ("Reciprocal", (6,), (f32,), "nz"),
    ("Identity", (5, 13), (b, i64, u8, f16), None), ("Softsign", (7,), (f32,), None),
    ("LeakyRelu", (6,), (f32,), None), ("Elu", (6,), (f32,), None), ("HardSigmoid", (6,), (f32,), None),
    ("Round", (11,), (f32,), None), ("Softplus", (7,), (f32,), None), ("Selu", (6,), (f32,), None),
    ("IsInf", (10,), (f32,), None), ("Shrink", (9,), (f32,), None)]:
    for opset in opsets:
        for dt in dts:
            for pat in ("same", "vary"):
                c(op, opset, [X(dt, PAT[pat], kind)], tag=f"{np.dtype(dt)} {pat}")
for opset, dts in [(6, (f32, i32, b)), (9, (f32, i64, b, f16)), (13, (i32, f64))]:
    for to_dt in dts:
        for pat in ("same", "vary"):
            c("Cast", opset, [X(f32 if opset < 9 else i64, PAT[pat])], {"to": int(helper.np_dtype_to_tensor_dtype(np.dtype(to_dt)))}, tag=f"->{np.dtype(to_dt)} {pat}")

# ---- binary broadcasting
def binops(op, opsets, dts, kind2=None):
    for opset in opsets:
        for dt in dts:
            c(op, opset, [X(dt, SAME), X(dt, SAME, kind2)], tag=f"{np.dtype(dt)} xx same")
            c(op, opset, [X(dt, VARY), W(np.ones(4, dt) if kind2 else np.arange(4).astype(dt))], tag=f"{np.dtype(dt)} x,w[4] vary")
            c(op, opset, [W(np.arange(12).reshape(3, 4).astype(dt) + (1 if kind2 else 0)), X(dt, (4,), kind2)], tag=f"{np.dtype(dt)} w[3,4],x[4] same")
            c(op, opset, [X(dt, EXP), X(dt, EXP, kind2)], tag=f"{np.dtype(dt)} xx exp")
binops("Add", (6, 7, 13), (f32, i32, i64, f64, f16))
binops("Sub", (7,), (f32, i64))
binops("Mul", (7, 13), (f32, i32, i64))
binops("Div", (7, 13), (f32, i32, i64), "nz")
binops("Pow", (7, 12, 13), (f32,), "pos")
binops("Equal", (7, 11, 13), (i32, i64, b, f32))
binops("Less", (7, 9, 13), (f32, i64, i32))
binops("Greater", (7, 9), (f32, i64))
binops("GreaterOrEqual", (12,), (f32, i64))
binops("And", (7,), (b,)); binops("Or", (7,), (b,)); binops("Xor", (7,), (b,))
binops("Max", (6, 8, 12, 13), (f32, i64)); binops("Min", (8, 12), (f32, i32))
binops("Sum", (6, 8), (f32,)); binops("Mean", (8,), (f32,))
binops("Mod", (10, 13), (i64, i32), "nz")
binops("PRelu", (6, 7, 9), (f32,))
for d in ("LEFT", "RIGHT"):
    for dt in (u8, u32, u64):
        c("BitShift", 11, [X(dt, VARY), W(np.array([1, 2, 0, 3], dt))], {"direction": d}, tag=f"{np.dtype(dt)} x,w vary {d}")
        c("BitShift", 11, [X(dt, SAME), X(dt, SAME, ("idx", 0, 4))], {"direction": d}, tag=f"{np.dtype(dt)} xx same {d}")
for opset in (9, 13):
    for dt in (f32, i64, b, f16):
        c("Where", opset, [X(b, VARY), X(dt, VARY), W(np.zeros(4, dt))], tag=f"{np.dtype(dt)} c,x,w vary")
        c("Where", opset, [W(np.array([True, False, True, False])), X(dt, SAME), X(dt, SAME)], tag=f"{np.dtype(dt)} wc,x,x same")
        c("Where", opset, [X(b, (4,)), W(np.ones((3, 4), dt)), W(np.zeros((3, 1), dt))], tag=f"{np.dtype(dt)} c[4] shared-data same")
c("Mod", 10, [X(f32, SAME, "nz"), X(f32, SAME, "nz")], {"fmod": 1}, tag="float32 fmod same")
c("Mod", 13, [X(f64, VARY, "nz"), W(np.full(4, 1.5))], {"fmod": 1}, tag="float64 fmod vary")
# PRelu with per-instance slope, shared X
for opset in (7, 9, 16):
    c("PRelu", opset, [W(np.linspace(-1, 1, 12).reshape(3, 4).astype(np.float32)), X(f32, (4,))], tag="w X[3,4], x slope[4]")
    c("PRelu", opset, [X(f32, VARY), X(f32, (1,))], tag="x X vary, x slope[1]")
# ---- Clip
for opset, extra in [(6, "attr"), (11, "in"), (12, "in"), (13, "in")]:
    for dt in (f32, i64, i32) if opset >= 12 else (f32,):
        for pat in ("same", "vary"):
            if extra == "attr":
                c("Clip", opset, [X(dt, PAT[pat])], {"min": -0.5, "max": 0.5}, tag=f"{np.dtype(dt)} {pat}")
            else:
                c("Clip", opset, [X(dt, PAT[pat]), W(np.array(-1, dt)), W(np.array(2, dt))], tag=f"{np.dtype(dt)} {pat}")
                c("Clip", opset, [X(dt, PAT[pat]), E, W(np.array(2, dt))], tag=f"{np.dtype(dt)} nomin {pat}")
# ---- MatMul
for opset in (5, 9, 13):
    for dt in (f32, f64) + ((i32, i64) if opset >= 9 else ()):
        c("MatMul", opset, [X(dt, VARY), W(np.arange(8).reshape(4, 2).astype(dt))], tag=f"{np.dtype(dt)} x[L,4]@w vary")
        c("MatMul", opset, [X(dt, (3, 4)), X(dt, (4, 2))], tag=f"{np.dtype(dt)} x@x same")
        c("MatMul", opset, [X(dt, (4,)), X(dt, (4,))], tag=f"{np.dtype(dt)} vec.vec")
        c("MatMul", opset, [X(dt, (4,)), W(np.ones((2, 4, 3), dt))], tag=f"{np.dtype(dt)} vec@w[2,4,3]")
        c("MatMul", opset, [W(np.ones((2, 3, 4), dt)), X(dt, (4,))], tag=f"{np.dtype(dt)} w[2,3,4]@vec")
        c("MatMul", opset, [X(dt, EXP), W(np.ones((4, 2), dt))], tag=f"{np.dtype(dt)} exp@w")
# ---- Gemm
for opset in (5, 6, 7, 9, 11, 13):
    for dt in (f32, f64) + ((i32, i64) if opset >= 11 else ()):
        bw = W(np.arange(8).reshape(4, 2).astype(dt))
        c("Gemm", opset, [X(dt, VARY), bw, W(np.ones(2, dt))], tag=f"{np.dtype(dt)} C[2] vary", attrs={"broadcast": 1} if opset < 7 else {})
        c("Gemm", opset, [X(dt, (1, 4)), bw, W(np.ones((1, 2), dt))], tag=f"{np.dtype(dt)} A[1,4] C[1,2] same")
        c("Gemm", opset, [X(dt, SAME), W(np.arange(8).reshape(2, 4).astype(dt)), W(np.ones((3, 2), dt))], {"transB": 1, "alpha": 2.0, "beta": 0.5}, tag=f"{np.dtype(dt)} transB C[3,2] same")
        c("Gemm", opset, [X(dt, (1, 4)), bw, W(np.ones((1, 1), dt))], tag=f"{np.dtype(dt)} A[1,4] C[1,1] same")
        if opset >= 11:
            c("Gemm", opset, [X(dt, VARY), bw], tag=f"{np.dtype(dt)} noC vary")
# ---- axis ops
for op in ("Softmax", "LogSoftmax", "Hardmax"):
    for opset in (5, 11, 13):
        for dt in (f32, f64):
            c(op, opset, [X(dt, EXP)], tag=f"{np.dtype(dt)} exp default axis")
            c(op, opset, [X(dt, EXP)], {"axis": 2}, tag=f"{np.dtype(dt)} exp axis2")
            c(op, opset, [X(dt, VARY)], tag=f"{np.dtype(dt)} vary default")
            c(op, opset, [X(dt, [(2, 3, 4)] * 3)], {"axis": 1}, tag=f"{np.dtype(dt)} [2,3,4] axis1 same")
            if opset >= 11:
                c(op, opset, [X(dt, [(1, 2, 4), (1, 3, 4), (1, 5, 4)])], {"axis": -1}, tag=f"{np.dtype(dt)} exp axis-1")
for op in ("ArgMax", "ArgMin"):
    for opset in (5, 11, 12, 13):
        for dt in (f32, i64, i32):
            c(op, opset, [X(dt, VARY)], {"axis": 1}, tag=f"{np.dtype(dt)} vary axis1")
            c(op, opset, [X(dt, SAME)], {"axis": 0, "keepdims": 0}, tag=f"{np.dtype(dt)} same axis0 nokeep")
            c(op, opset, [X(dt, EXP)], {"axis": 2, "keepdims": 0}, tag=f"{np.dtype(dt)} exp axis2 nokeep")
            if opset >= 12:
                c(op, opset, [X(dt, SAME)], {"axis": -1, "select_last_index": 1}, tag=f"{np.dtype(dt)} same last")
for opset in (5, 11, 13):
    for dt in (f32, i64, b, f16, u8):
        c("Concat", opset, [X(dt, VARY), X(dt, VARY)], {"axis": 1}, tag=f"{np.dtype(dt)} xx vary axis1")
        c("Concat", opset, [X(dt, SAME), W(np.zeros((1, 4), dt))], {"axis": 0}, tag=f"{np.dtype(dt)} x,w axis0 same")
        c("Concat", opset, [X(dt, EXP), X(dt, EXP)], {"axis": 2}, tag=f"{np.dtype(dt)} exp axis2")
        c("Concat", opset, [X(dt, VARY), X(dt, VARY)], {"axis": 0}, tag=f"{np.dtype(dt)} xx vary axis0")
for opset in (8, 9):
    for dt in (f32, b, i8, f16):
        c("Concat", opset, [X(dt, SAME), W(np.zeros((3, 1), dt))], {"axis": 1}, tag=f"{np.dtype(dt)} x,w axis1 same")
for opset in (5, 11, 13):
    for dt in (f32, i64, b):
        if opset < 13:
            c("Split", opset, [X(dt, (3, 4))], {"axis": 1, "split": [1, 3]}, nout=2, tag=f"{np.dtype(dt)} same split attr")
            c("Split", opset, [X(dt, VARY)], {"axis": 1}, nout=2, tag=f"{np.dtype(dt)} vary equal")
        else:
            c("Split", opset, [X(dt, (3, 4)), W(np.array([1, 3], np.int64))], {"axis": 1}, nout=2, tag=f"{np.dtype(dt)} same split in")
            c("Split", opset, [X(dt, VARY)], {"axis": -1}, nout=2, tag=f"{np.dtype(dt)} vary equal")
        c("Split", opset, [X(dt, EXP)], {"axis": 2}, nout=2, tag=f"{np.dtype(dt)} exp axis2")
for opset in (5, 13):
    for dt in (f32, f64):
        c("LpNormalization", opset, [X(dt, VARY)], {"p": 2}, tag=f"{np.dtype(dt)} vary")
        c("LpNormalization", opset, [X(dt, SAME)], {"axis": 0, "p": 1}, tag=f"{np.dtype(dt)} same axis0")
for opset in (17,):
    c("LayerNormalization", opset, [X(f32, EXP), W(np.ones(4, np.float32)), W(np.zeros(4, np.float32))], tag="exp")
    c("LayerNormalization", opset, [X(f32, SAME), W(np.ones(4, np.float32))], tag="same noB")
# ---- Gather
for opset in (5, 9, 10, 11, 13):
    for dt in (f32, i64, b, f16):
        for idt in (i64, i32):
            c("Gather", opset, [W(np.arange(40).reshape(10, 4).astype(dt)), X(idt, [(2,), (3,), (5,)], ("idx", 0, 10))], tag=f"{np.dtype(dt)}/{np.dtype(idt)} shared table vary")
            c("Gather", opset, [X(dt, VARY), W(np.array([0, 3], idt))], {"axis": 1}, tag=f"{np.dtype(dt)}/{np.dtype(idt)} x, w idx axis1 vary")
            c("Gather", opset, [X(dt, SAME), X(idt, (2,), ("idx", 0, 3))], tag=f"{np.dtype(dt)}/{np.dtype(idt)} xx axis0 same")
            c("Gather", opset, [X(dt, SAME), X(idt, (2, 2), ("idx", 0, 3))], tag=f"{np.dtype(dt)}/{np.dtype(idt)} xx idx[2,2] same")
        c("Gather", opset, [X(dt, SAME), X(i64, (), ("idx", 0, 3))], tag=f"{np.dtype(dt)} xx scalar idx same")
        c("Gather", opset, [X(dt, SAME), X(i64, (2,), ("idx", -3, 3))], tag=f"{np.dtype(dt)} xx negidx same")
        c("Gather", opset, [W(np.arange(40).reshape(10, 4).astype(dt)), X(i64, (3,), ("idx", -10, 10))], tag=f"{np.dtype(dt)} shared table negidx")
# ---- reductions
for op in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"):
    for opset in (5, 11, 13):
        dts = (f32, i64, i32) if op in ("ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceMean") else (f32,)
        for dt in dts:
            kind = "pos" if op == "ReduceLogSum" else None
            axes_in = op == "ReduceSum" and opset >= 13
            def ax(axes, **kw):
                return ([W(np.array(axes, np.int64))], kw) if axes_in else ([], dict(axes=axes, **kw))
            for axes, kw, pat in (([1], {}, "vary"), ([0], {"keepdims": 0}, "vary"), ([1], {"keepdims": 0}, "exp"), ([-1], {}, "same"), ([0, 1], {}, "same")):
                extra, attrs = ax(axes, **kw)
                c(op, opset, [X(dt, PAT[pat], kind)] + extra, attrs, tag=f"{np.dtype(dt)} axes{axes} {kw} {pat}")
            c(op, opset, [X(dt, VARY, kind)], {}, tag=f"{np.dtype(dt)} all axes vary")
            if axes_in:
                c(op, opset, [X(dt, SAME, kind), W(np.array([], np.int64))], {"noop_with_empty_axes": 1}, tag=f"{np.dtype(dt)} noop empty")
# ---- reshapes
for opset in (5, 11, 13):
    for dt in (f32, b, i64, f16, u8):
        c("Reshape", opset, [X(dt, SAME), W(np.array([2, 6], np.int64))], tag=f"{np.dtype(dt)} same")
        c("Reshape", opset, [X(dt, EXP), W(np.array([-1, 2], np.int64))], tag=f"{np.dtype(dt)} exp -1")
        c("Reshape", opset, [X(dt, SAME), W(np.array([0, -1], np.int64))], tag=f"{np.dtype(dt)} 0,-1 same")
        c("Flatten", opset, [X(dt, [(2, 3, 4)] * 3)], {"axis": 2}, tag=f"{np.dtype(dt)} same axis2")
        c("Flatten", opset, [X(dt, VARY)], {"axis": 0}, tag=f"{np.dtype(dt)} vary axis0")
        if opset < 13:
            c("Squeeze", opset, [X(dt, EXP)], {"axes": [0]}, tag=f"{np.dtype(dt)} exp")
            c("Unsqueeze", opset, [X(dt, VARY)], {"axes": [0, 3]}, tag=f"{np.dtype(dt)} vary")
        else:
            c("Squeeze", opset, [X(dt, EXP), W(np.array([0], np.int64))], tag=f"{np.dtype(dt)} exp")
            c("Unsqueeze", opset, [X(dt, VARY), W(np.array([0, -1], np.int64))], tag=f"{np.dtype(dt)} vary")
            c("Squeeze", opset, [X(dt, EXP)], tag=f"{np.dtype(dt)} exp noaxes")
        c("Transpose", opset, [X(dt, [(2, 3, 4)] * 3)], {"perm": [2, 0, 1]}, tag=f"{np.dtype(dt)} same")
        c("Transpose", opset, [X(dt, VARY)], tag=f"{np.dtype(dt)} vary default perm")
        c("Transpose", opset, [X(dt, EXP)], {"perm": [1, 0, 2]}, tag=f"{np.dtype(dt)} exp moves 1")
# ---- Slice
for opset in (5, 9, 10, 11, 13):
    for dt in (f32, i64, b):
        if opset < 10:
            c("Slice", opset, [X(dt, VARY)], {"starts": [1], "ends": [3], "axes": [1]}, tag=f"{np.dtype(dt)} vary axis1")
            c("Slice", opset, [X(dt, SAME)], {"starts": [0, 1], "ends": [2, 100]}, tag=f"{np.dtype(dt)} same noaxes")
            c("Slice", opset, [X(dt, EXP)], {"starts": [0], "ends": [2], "axes": [2]}, tag=f"{np.dtype(dt)} exp axis2")
        else:
            I = lambda *v: W(np.array(v, np.int64))
            c("Slice", opset, [X(dt, VARY), I(1), I(3), I(1)], tag=f"{np.dtype(dt)} vary axis1")
            c("Slice", opset, [X(dt, SAME), I(0, 1), I(2, 100)], tag=f"{np.dtype(dt)} same noaxes")
            c("Slice", opset, [X(dt, EXP), I(3), I(0), I(2), I(-1)], tag=f"{np.dtype(dt)} exp step-1")
            c("Slice", opset, [X(dt, SAME), I(0), I(4), E, I(2)], tag=f"{np.dtype(dt)} same noaxes step2")
            c("Slice", opset, [X(dt, VARY), I(-2), I(100), I(-1)], tag=f"{np.dtype(dt)} vary neg axis")
            c("Slice", opset, [X(dt, SAME), W(np.array([1], np.int32)), W(np.array([3], np.int32)), W(np.array([0], np.int32))], tag=f"{np.dtype(dt)} int32 params")
# ---- Expand / Tile
for opset in (8, 13):
    for dt in (f32, b, i64, f16):
        c("Expand", opset, [X(dt, (3, 1)), W(np.array([3, 4], np.int64))], tag=f"{np.dtype(dt)} [3,1]->[3,4]")
        c("Expand", opset, [X(dt, (4,)), W(np.array([2, 1, 4], np.int64))], tag=f"{np.dtype(dt)} [4]->[2,1,4]")
        c("Expand", opset, [X(dt, [(2, 1), (3, 1), (5, 1)]), W(np.array([1, 4], np.int64))], tag=f"{np.dtype(dt)} vary [L,1]->[L,4]")
for opset in (5, 6, 13):
    for dt in (f32, b, i64):
        if opset >= 6:  # (Tile-1, of one axis by an input, neither runtime runs)
            c("Tile", opset, [X(dt, SAME), W(np.array([2, 1], np.int64))], tag=f"{np.dtype(dt)} same")
            c("Tile", opset, [X(dt, VARY), W(np.array([1, 3], np.int64))], tag=f"{np.dtype(dt)} vary")
# ---- recurrent
rng = np.random.default_rng(1)
for op, gates in (("LSTM", 4), ("GRU", 3), ("RNN", 1)):
    for opset in (5, 7, 13, 14):
        for dt in (f32, f64):
            H, I = 3, 4
            Wt = W(rng.standard_normal((1, gates * H, I)).astype(dt)); R = W(rng.standard_normal((1, gates * H, H)).astype(dt))
            B = W(rng.standard_normal((1, 2 * gates * H)).astype(dt))
            c(op, opset, [X(dt, [(2, 1, I), (3, 1, I), (5, 1, I)]), Wt, R, B], {"hidden_size": H}, nout=2, tag=f"{np.dtype(dt)} vary seq")
            c(op, opset, [X(dt, (3, 2, I)), Wt, R, B], {"hidden_size": H}, nout=2, tag=f"{np.dtype(dt)} same batch2")
            c(op, opset, [X(dt, (3, 2, I)), Wt, R], {"hidden_size": H}, nout=1, tag=f"{np.dtype(dt)} noB Y only")
            if opset >= 14:
                c(op, opset, [X(dt, (2, 3, I)), Wt, R, B], {"hidden_size": H, "layout": 1}, nout=2, tag=f"{np.dtype(dt)} layout1")
            c(op, opset, [X(dt, (3, 2, I)), Wt, R, B, E, W(np.zeros((1, 2, H), dt))], {"hidden_size": H}, nout=2, tag=f"{np.dtype(dt)} shared h0")
# ---- per-sample
for opset in (5, 6, 7, 9, 10, 11, 12, 13):
    for dt in (f32, f64):
        x = lambda shp=(1, 2, 5, 5): X(dt, shp)
        if opset in (5, 11):
            c("Conv", opset, [x(), W(rng.standard_normal((3, 2, 3, 3)).astype(dt)), W(np.ones(3, dt))], {"pads": [1, 1, 1, 1]}, tag=f"{np.dtype(dt)} 2d")
            c("Conv", opset, [x((2, 2, 5)), W(rng.standard_normal((4, 1, 3)).astype(dt))], {"group": 2}, tag=f"{np.dtype(dt)} 1d group")
        if opset in (5, 7, 10, 11):
            c("AveragePool", opset, [x()], {"kernel_shape": [2, 2], "pads": [1, 1, 1, 1], **({"count_include_pad": 1} if opset >= 7 else {})}, tag=f"{np.dtype(dt)}")
        if opset in (5, 9, 10, 12):
            c("MaxPool", opset, [x()], {"kernel_shape": [3, 3], "strides": [2, 2]}, tag=f"{np.dtype(dt)}")
            if opset >= 9:
                c("MaxPool", opset, [x()], {"kernel_shape": [2, 2]}, nout=2, tag=f"{np.dtype(dt)} with indices")
        if opset in (5, 13):
            c("GlobalAveragePool", opset, [x()], tag=f"{np.dtype(dt)}")
            c("GlobalMaxPool", opset, [x((2, 2, 4))], tag=f"{np.dtype(dt)} 1d batch2")
            c("LRN", opset, [x()], {"size": 3}, tag=f"{np.dtype(dt)}")
            c("LpPool", opset, [x()], {"kernel_shape": [2, 2]}, tag=f"{np.dtype(dt)}")
        if opset in (5, 6, 13):
            c("InstanceNormalization", opset, [x(), W(np.ones(2, dt)), W(np.zeros(2, dt))], tag=f"{np.dtype(dt)}")
        if opset in (6, 7, 9, 13):
            c("BatchNormalization", opset, [x(), W(np.ones(2, dt)), W(np.zeros(2, dt)), W(np.zeros(2, dt)), W(np.ones(2, dt))], tag=f"{np.dtype(dt)}")
    if opset == 12:
        c("MaxPool", 12, [X(i8, (1, 2, 5, 5))], {"kernel_shape": [2, 2]}, tag="int8")
        c("MaxPool", 12, [X(u8, (1, 2, 5, 5))], {"kernel_shape": [2, 2]}, tag="uint8")
    if opset == 11:
        c("Conv", opset, [X(f16, (1, 2, 5, 5)), W(np.ones((3, 2, 3, 3), np.float16))], tag="float16 2d")
# ---- extra probes
I32 = lambda *v: W(np.array(v, np.int32))
for opset in (10, 11, 13):
    c("Slice", opset, [X(f32, VARY), I32(1), I32(3), I32(1)], tag="float32 int32 params vary axis1")
    c("Slice", opset, [X(f32, EXP), I32(0), I32(2), I32(2)], tag="float32 int32 params exp axis2")
    c("Slice", opset, [X(f32, SAME), I32(0), I32(4), I32(1), I32(2)], tag="float32 int32 params same steps")
for opset in (7, 8, 9, 10, 12):
    for op in ("ReduceMax", "ReduceMin"):
        c(op, opset, [X(f32, VARY)], {"axes": [1]}, tag="float32 vary axes1")
        c(op, opset, [X(f16, SAME)], {"axes": [0], "keepdims": 0}, tag="float16 same axes0")
    for op in ("ArgMax", "ArgMin"):
        c(op, opset, [X(f32, VARY)], {"axis": 1}, tag="float32 vary axis1")
        c(op, opset, [X(f64, SAME)], {"axis": 0, "keepdims": 0}, tag="float64 same axis0")
for opset in (7, 9, 11, 12):
    for op in ("Softmax", "LogSoftmax"):
        c(op, opset, [X(f32, [(1, 2, 4), (1, 3, 4), (1, 5, 4)])], tag="exp default axis(1)")
        c(op, opset, [X(f32, [(1, 1, 2, 4), (1, 1, 3, 4), (1, 1, 5, 4)])], {"axis": 2}, tag="[1,1,L,4] axis2")
        c(op, opset, [X(f32, [(2, 2, 3), (3, 2, 3), (5, 2, 3)])], tag="[L,2,3] default axis(1)")
        c(op, opset, [X(f32, [(1, 3, 4)] * 3)], tag="same [1,3,4] default axis")
for opset in (9, 10):  # per-instance data and indices: constant offsets
    for n in (2, 3):
        c("Gather", opset, [X(f32, SAME), X(i64, (2,), ("idx", -3, 3))], tag=f"xx negidx opset{opset}")
        c("Gather", opset, [X(i32, VARY), X(i32, (2,), ("idx", 0, 2))], tag="xx vary data int32 idx")
for opset in (9, 11):
    c("Gather", opset, [X(f32, SAME), X(i64, (2,), ("idx", 3, 4))], tag="xx out of range idx")
# Concat with shared part at opset 8 (Expand), various dtypes; Concat shared part in exp layout
for opset in (8, 11):
    for dt in (f32, u8, f16, f64, b):
        c("Concat", opset, [W(np.zeros((1, 1, 4), dt)), X(dt, EXP)], {"axis": 1}, tag=f"{np.dtype(dt)} w,x exp axis1")
# Elementwise rank alignment: per-instance lower rank operand
for opset in (7, 9, 13):
    for dt in (f32, i64, b):
        op = "Add" if dt != b else "And"
        c(op, opset, [X(dt, (2, 3, 4)), X(dt, (4,))], tag=f"{np.dtype(dt)} x[2,3,4]+x[4]")
        c("Where" if opset >= 9 else op, opset, ([X(b, (4,)), X(dt, (2, 3, 4)), X(dt, (3, 1))] if opset >= 9 else [X(dt, (3, 1)), X(dt, (2, 3, 4))]), tag=f"{np.dtype(dt)} mixed ranks")
# Pow int exponents (12+) / mixed types
for opset in (12, 13):
    c("Pow", opset, [X(f32, SAME, "pos"), X(i64, SAME, ("idx", 0, 3))], tag="f32^i64 same")
    c("Pow", opset, [X(i64, VARY, ("idx", 0, 4)), W(np.array([2, 1, 0, 3], np.int64))], tag="i64^w vary")
# CastLike (15)
c("CastLike", 15, [X(f32, VARY), W(np.array([1], np.int64))], tag="x, w int64 vary")
c("CastLike", 15, [W(np.arange(4, dtype=np.float32)), X(i32, SAME)], tag="shared w to x int32")
# Clip with per-instance min (refused) and shared; int8 clip
c("Clip", 12, [X(i8, VARY), W(np.array(-2, np.int8)), W(np.array(2, np.int8))], tag="int8 vary")
c("Clip", 13, [X(f32, VARY), X(f32, ()), W(np.array(1, np.float32))], tag="per-instance min")
# Expand exp layout & per-instance lower rank
for opset in (8, 13):
    c("Expand", opset, [X(f32, [(1, 2, 1), (1, 3, 1), (1, 5, 1)]), W(np.array([1, 1, 4], np.int64))], tag="exp [1,L,1]->[1,L,4]")
    c("Expand", opset, [X(u8, (3, 1)), W(np.array([2, 3, 4], np.int64))], tag="uint8 [3,1]->[2,3,4]")
# Split opset 13 without split input but vary, and 3 outputs
for opset in (11, 13):
    c("Split", opset, [X(f32, [(2, 6), (3, 6), (5, 6)])], {"axis": 1}, nout=3, tag="vary 3 outputs")
    c("Split", opset, [X(f32, [(6, 2)] * 3)], {"axis": 0}, nout=3, tag="same axis0 3 outputs")
# MatMul int at 9 ragged exp
for opset in (9, 13):
    c("MatMul", opset, [X(i64, EXP), W(np.arange(8).reshape(4, 2).astype(np.int64))], tag="int64 exp@w")
    c("MatMul", opset, [X(u32, VARY), W(np.arange(8).reshape(4, 2).astype(np.uint32))], tag="uint32 vary@w")
# Reductions int8/uint8/double on 12+ and ReduceSum 13 with axes as per-instance input (refused)
for opset in (12, 13):
    c("ReduceMax", opset, [X(i8, VARY)], {"axes": [1]}, tag="int8 vary")
    c("ReduceMin", opset, [X(u8, SAME)], {"axes": [0]}, tag="uint8 same")
    c("ReduceSum", opset, [X(f64, VARY)] + ([W(np.array([0], np.int64))] if opset >= 13 else []), {} if opset >= 13 else {"axes": [0]}, tag="f64 vary axis0 segment")
    c("ReduceMean", opset, [X(f16, VARY)], {"axes": [0]}, tag="f16 vary axis0 (no segment)")
    c("ReduceSum", opset, [X(f16, VARY)] + ([W(np.array([0], np.int64))] if opset >= 13 else []), {} if opset >= 13 else {"axes": [0]}, tag="f16 vary axis0")
c("ReduceSum", 13, [X(f32, SAME), X(i64, (1,), ("idx", 0, 2))], tag="per-instance axes")
# Transpose of float16/double ragged
for opset in (5, 13):
    c("Transpose", opset, [X(f64, [(1, 2, 4), (1, 3, 4), (1, 5, 4)])], {"perm": [0, 2, 1]}, tag="f64 exp moves rows")


IR_VERSIONS = {5: 3, 6: 3, 7: 3, 8: 3, 9: 4, 10: 5, 11: 6, 12: 7, 13: 7, 14: 7}  # the IR each opset came with (else 8)


def build(case: Case, instances: int = 3, seed: int = 0) -> tuple[onnx.ModelProto, list[dict[str, np.ndarray]]]:
    """The case's model (its outputs typed by ONNX's reference where shape inference cannot)
    and feeds for ``instances`` instances. IR 3 lists the initializers as inputs, as it must."""
    names, inputs, initializers, drawn = [], [], [], []
    for i, spec in enumerate(case.inputs):
        if spec is None:
            names.append("")
        elif isinstance(spec, X):
            shapes = spec.shapes if isinstance(spec.shapes, list) else [spec.shapes] * instances
            dims = [shapes[0][axis] if len({s[axis] for s in shapes}) == 1 else f"d{i}_{axis}"
                    for axis in range(len(shapes[0]))]
            inputs.append(helper.make_tensor_value_info(f"in{i}", helper.np_dtype_to_tensor_dtype(np.dtype(spec.dtype)), dims))
            drawn.append((f"in{i}", spec, shapes))
            names.append(f"in{i}")
        else:
            initializers.append(numpy_helper.from_array(np.asarray(spec.array), f"w{i}"))
            names.append(f"w{i}")
    ir_version = IR_VERSIONS.get(case.opset, 8)
    if ir_version < 4:
        inputs += [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in initializers]
    outputs = [f"y{k}" for k in range(case.outputs)]
    graph = helper.make_graph([helper.make_node(case.op_type, names, outputs, **case.attributes)], "g", inputs,
                              [helper.make_empty_tensor_value_info(o) for o in outputs], initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", case.opset)], ir_version=ir_version)
    rng = np.random.default_rng(seed)
    feeds = [{name: _draw(rng, shapes[k], spec.dtype, spec.kind) for name, spec, shapes in drawn} for k in range(instances)]
    return _typed_outputs(onnx.shape_inference.infer_shapes(model), feeds), feeds


def _draw(rng: np.random.Generator, shape: tuple[int, ...], dtype: Any, kind: Any) -> np.ndarray:
    dt = np.dtype(dtype)
    if kind == "pos":
        return (rng.random(shape) + 0.5).astype(dt)
    if isinstance(kind, tuple):  # ("idx", low, high)
        return rng.integers(kind[1], kind[2], size=shape).astype(dt)
    if dt == np.bool_:
        return rng.random(shape) < 0.5
    if dt.kind in "iu":
        if kind == "nz":
            sign = 1 if dt.kind == "u" else rng.choice([-1, 1], size=shape)
            return (rng.integers(1, 6, size=shape) * sign).astype(dt)
        return rng.integers(0 if dt.kind == "u" else -5, 6, size=shape).astype(dt)
    if kind == "nz":
        return (rng.random(shape) + 0.5).astype(dt) * rng.choice([-1, 1], size=shape).astype(dt)
    return rng.standard_normal(shape).astype(dt)


def _typed_outputs(model: onnx.ModelProto, feeds: list[dict[str, np.ndarray]]) -> onnx.ModelProto:
    """Outputs typed as ONNX's reference computes them for every instance (a dimension that
    differs symbolic) where shape inference left one untyped (some ops' at old opsets)."""
    from onnx.reference import ReferenceEvaluator
    if all(o.type.tensor_type.elem_type and o.type.tensor_type.HasField("shape") for o in model.graph.output):
        return model
    try:
        results = [ReferenceEvaluator(model).run(None, f) for f in feeds]
    except Exception:  # noqa: BLE001 - the reference cannot run it: leave the outputs to shape inference
        return model
    del model.graph.output[:]
    for j, first in enumerate(results[0]):
        shapes = [np.shape(r[j]) for r in results]
        dims = [shapes[0][a] if len({s[a] for s in shapes}) == 1 else f"o{j}_{a}" for a in range(len(shapes[0]))]
        model.graph.output.append(helper.make_tensor_value_info(f"y{j}", helper.np_dtype_to_tensor_dtype(np.asarray(first).dtype), dims))
    return model
