"""Property tests of the correctness contract: random programs over random instances whose
structures differ (sequence lengths, number of ops), batched, equal each instance run alone.

A program is a list of steps over 2-D float values; each dimension is tracked symbolically as
``coef * L**power`` (L: the instance's sequence length), so that every instance takes the same
decisions whatever its length, and instance k runs only the first ``m_k`` steps.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from autobatch import InferenceSession
from autobatch.backends import Interpreter
from autobatch.batcher import SCHEDULERS
from autobatch.graphs import run_graphs
from autobatch.ir import from_onnx

D = 4  # feature width
VOCAB = 7
OPSET = 18
# AUTOBATCH_PROPERTY_EXAMPLES=1000 for a longer hunt.
SETTINGS = settings(max_examples=int(os.environ.get("AUTOBATCH_PROPERTY_EXAMPLES", "40")), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])

Dim = tuple[int, int]  # (coef, power): coef * L**power
UNARY = ("Tanh", "Relu", "Sigmoid", "Neg", "Abs")
BINARY = ("Add", "Mul", "Sub")
OPS = (
    "unary", "binary", "bias", "matmul_shared", "matmul_own", "matmul_t", "concat", "slice",
    "gather_table", "gather_rows", "reduce", "softmax", "reshape", "transpose", "sum",
)


def _weights(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "W": (rng.standard_normal((D, D)) * 0.4).astype(np.float32),
        "bias": rng.standard_normal(D).astype(np.float32),
        "table": rng.standard_normal((VOCAB, D)).astype(np.float32),
        "rows": np.array([0, -1], dtype=np.int64),
        "flat_row": np.array([1, -1], dtype=np.int64),
        "flat_col": np.array([-1, 1], dtype=np.int64),
    }


SHARED = _weights(0)


class Program:
    """Steps resolved against symbolic shapes: a list of (op, operand indices, parameter)."""

    def __init__(self, draws: list[tuple[int, int, int, int]]) -> None:
        self.shapes: list[tuple[Dim, Dim]] = [((1, 1), (D, 0)), ((1, 1), (D, 0))]  # x, table[ids]
        self.steps: list[tuple[str, tuple[int, ...], int]] = []
        for op_pick, a_pick, b_pick, param in draws:
            self._add(OPS[op_pick % len(OPS)], a_pick, b_pick, param)

    def _add(self, op: str, a_pick: int, b_pick: int, param: int) -> None:
        n = len(self.shapes)
        a, b = a_pick % n, b_pick % n
        sa, sb = self.shapes[a], self.shapes[b]
        width = (D, 0)
        if op == "binary" and _broadcast(sa, sb) is not None:
            self._step(op, (a, b), param, _broadcast(sa, sb))
        elif op == "bias" and sa[1] == width:
            self._step(op, (a,), param, sa)
        elif op in ("matmul_shared", "matmul_own") and sa[1] == width:
            self._step(op, (a,), param, sa)
        elif op == "matmul_t" and sa[1] == sb[1]:
            self._step(op, (a, b), param, (sa[0], sb[0]))
        elif op == "concat" and sa[1] == sb[1] and sa[0][1] == sb[0][1]:
            self._step(op, (a, b), param, ((sa[0][0] + sb[0][0], sa[0][1]), sa[1]))
        elif op == "slice":
            shape = list(sa)
            shape[param % 2] = (1, 0)
            self._step(op, (a,), param, tuple(shape))
        elif op == "gather_table":
            self._step(op, (), param, ((1, 1), width))
        elif op == "gather_rows":
            self._step(op, (a,), param, ((2, 0), sa[1]))
        elif op == "reduce":
            shape = list(sa)
            shape[param % 2] = (1, 0)
            self._step(op, (a,), param, tuple(shape))
        elif op == "softmax":
            self._step(op, (a,), param, sa)
        elif op == "reshape":
            flat = (sa[0][0] * sa[1][0], sa[0][1] + sa[1][1])
            self._step(op, (a,), param, ((1, 0), flat) if param % 2 else (flat, (1, 0)))
        elif op == "transpose":
            self._step(op, (a,), param, (sa[1], sa[0]))
        elif op == "sum" and _broadcast(sa, sb) is not None and _broadcast(_broadcast(sa, sb), self.shapes[-1]):
            self._step(op, (a, b, n - 1), param, _broadcast(_broadcast(sa, sb), self.shapes[-1]))
        else:
            self._step("unary", (a,), param, sa)

    def _step(self, op: str, operands: tuple[int, ...], param: int, shape: tuple[Dim, Dim]) -> None:
        self.steps.append((op, operands, param))
        self.shapes.append(shape)

    def model(self, steps: int, length: int | str, instance_seed: int) -> onnx.ModelProto:
        """The ONNX model of one instance running the first ``steps`` steps."""
        own = _weights(100 + instance_seed)["W"]  # this instance's own weight
        nodes, inits = [], dict(SHARED)
        nodes.append(helper.make_node("Gather", ["table", "ids"], ["v1"], axis=0))
        names = ["x", "v1"]
        for index, (op, operands, param) in enumerate(self.steps[:steps]):
            out = f"v{index + 2}"
            ins = [names[i] for i in operands]
            if op == "unary":
                nodes.append(helper.make_node(UNARY[param % len(UNARY)], ins, [out]))
            elif op == "binary":
                nodes.append(helper.make_node(BINARY[param % len(BINARY)], ins, [out]))
            elif op == "bias":
                nodes.append(helper.make_node("Add", [ins[0], "bias"], [out]))
            elif op == "matmul_shared":
                nodes.append(helper.make_node("MatMul", [ins[0], "W"], [out]))
            elif op == "matmul_own":
                inits[f"own{index}"] = (own * (1 + index)).astype(np.float32)
                nodes.append(helper.make_node("MatMul", [ins[0], f"own{index}"], [out]))
            elif op == "matmul_t":
                nodes.append(helper.make_node("Transpose", [ins[1]], [out + "t"], perm=[1, 0]))
                nodes.append(helper.make_node("MatMul", [ins[0], out + "t"], [out]))
            elif op == "concat":
                nodes.append(helper.make_node("Concat", ins, [out], axis=-2 if param % 2 else 0))
            elif op == "slice":
                inits[f"start{index}"] = np.array([0], np.int64)
                inits[f"end{index}"] = np.array([1], np.int64)
                inits[f"axis{index}"] = np.array([param % 2 - 2 * (param // 2 % 2)], np.int64)
                nodes.append(helper.make_node(
                    "Slice", [ins[0], f"start{index}", f"end{index}", f"axis{index}"], [out]))
            elif op == "gather_table":
                nodes.append(helper.make_node("Gather", ["table", "ids"], [out], axis=0))
            elif op == "gather_rows":
                nodes.append(helper.make_node("Gather", [ins[0], "rows"], [out], axis=0))
            elif op == "reduce":
                kind = "ReduceSum" if param // 4 % 2 else "ReduceMean"
                inits[f"axes{index}"] = np.array([param % 2 - 2 * (param // 2 % 2)], np.int64)
                nodes.append(helper.make_node(kind, [ins[0], f"axes{index}"], [out], keepdims=1))
            elif op == "softmax":
                nodes.append(helper.make_node("Softmax", ins, [out], axis=-1 if param % 2 else 0))
            elif op == "reshape":
                nodes.append(helper.make_node("Reshape", [ins[0], "flat_row" if param % 2 else "flat_col"], [out]))
            elif op == "transpose":
                nodes.append(helper.make_node("Transpose", ins, [out], perm=[1, 0]))
            elif op == "sum":  # many-input Sum (a loss over many terms)
                nodes.append(helper.make_node("Sum", ins + ins[:param % 3], [out]))
            names.append(out)
        outputs = sorted({names[-1], names[len(names) // 2]})
        used = {i for node in nodes for i in node.input}
        graph = helper.make_graph(
            nodes, "program",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [length, D]),
             helper.make_tensor_value_info("ids", TensorProto.INT64, [length])],
            [helper.make_tensor_value_info(name, TensorProto.FLOAT, [None, None]) for name in outputs],
            [numpy_helper.from_array(a, name) for name, a in inits.items() if name in used],
        )
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=9)


def _broadcast(a: tuple[Dim, Dim], b: tuple[Dim, Dim]) -> tuple[Dim, Dim] | None:
    result = []
    for x, y in zip(a, b):
        if x == y or y == (1, 0):
            result.append(x)
        elif x == (1, 0):
            result.append(y)
        else:
            return None
    return tuple(result)


def _feeds(length: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "x": rng.standard_normal((length, D)).astype(np.float32),
        "ids": rng.integers(0, VOCAB, length).astype(np.int64),
    }


def _assert_close(got: np.ndarray, want: np.ndarray, what: str, normwise: bool = False) -> None:
    """The contract's tolerance; ``normwise`` adds an absolute error relative to the output's
    largest value, for batches whose summation order legitimately differs from one instance's
    (a ragged launch concatenates instances' rows, and BLAS may then take another kernel, whose
    last-bit differences cancellation later magnifies)."""
    assert got.dtype == want.dtype and got.shape == want.shape, f"{what}: {got.dtype}{got.shape} vs {want.dtype}{want.shape}"
    if want.dtype.kind == "f":
        scale = float(np.abs(want).max(initial=0.0)) if normwise else 0.0
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 + 1e-5 * scale, err_msg=what)
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


PICK = st.sampled_from(range(64))
STEP = st.tuples(st.sampled_from(range(len(OPS))), PICK, PICK, PICK)


@st.composite
def programs(draw, min_instances: int = 1, same_structure: bool = False):
    program = Program(draw(st.lists(STEP, min_size=3, max_size=12)))
    n = draw(st.integers(min_instances, 6))
    if same_structure:
        length = draw(st.integers(1, 4))
        plan = [(len(program.steps), length)] * n
    else:
        plan = [(draw(st.integers(1, len(program.steps))), draw(st.integers(1, 4))) for _ in range(n)]
    return program, plan


def _instances(program: Program, plan: list[tuple[int, int]], own_weights: bool = True):
    graphs, feeds = [], []
    for k, (steps, length) in enumerate(plan):
        graph = from_onnx(program.model(steps, length, k if own_weights else 0))
        graph.infer_shapes()
        graphs.append(graph)
        feeds.append(_feeds(length, 1000 + k))
    return graphs, feeds


@SETTINGS
@given(programs())
def test_batched_programs_equal_instances_alone(case) -> None:
    program, plan = case
    graphs, feeds = _instances(program, plan)
    expected = [Interpreter(g).run(f) for g, f in zip(graphs, feeds)]
    for scheduler in sorted(SCHEDULERS):
        for backend in ("numpy", "onnxruntime"):
            got, report = run_graphs(graphs, feeds, backend, scheduler)
            assert report.lower_bound <= report.launches <= report.nodes
            assert [len(outputs) for outputs in got] == [len(outputs) for outputs in expected]
            for k, (outputs, wanted) in enumerate(zip(got, expected)):
                for j, (value, want) in enumerate(zip(outputs, wanted)):
                    _assert_close(value, want, f"{scheduler} on {backend}: instance {k} output {j} (plan {plan})")


@SETTINGS
@given(programs(min_instances=2, same_structure=True))
def test_identical_instances_batch_below_node_count(case) -> None:
    program, plan = case
    graphs, feeds = _instances(program, plan, own_weights=False)
    for scheduler in sorted(SCHEDULERS):
        report = run_graphs(graphs, feeds, scheduler=scheduler)[1]
        assert report.lower_bound <= report.launches < report.nodes
        assert report.fallback_nodes == 0


@SETTINGS
@given(programs(), st.sampled_from(sorted(SCHEDULERS)), st.sampled_from(["numpy", "onnxruntime"]))
def test_session_run_batch_over_lengths(case, scheduler: str, backend: str) -> None:
    """One model with a symbolic length; instances differ in their input shapes (compared
    norm-wise: row-wise ops of different lengths run as one ragged launch)."""
    program, plan = case
    model = program.model(len(program.steps), "L", 0)
    session = InferenceSession(model, scheduler=scheduler, backend=backend)
    feeds = [_feeds(length, 2000 + k) for k, (_, length) in enumerate(plan)]
    batched = session.run_batch(None, feeds)
    report = session.stats.report
    assert report.lower_bound <= report.launches <= report.nodes
    for k, f in enumerate(feeds):
        for j, (got, want) in enumerate(zip(batched[k], session.run(None, f))):
            _assert_close(got, want, f"{scheduler}: instance {k} output {j}", normwise=True)
