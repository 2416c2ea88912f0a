"""The NumPy interpreter: errors that name the node, feeds checked, values freed after their
last use, an overridable run_node, and graphs too deep for recursion."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from autobatch.backends import FeedError, Interpreter, NodeExecutionError, NumpyBackend
from autobatch.ir import Graph, ValueType, from_onnx

MODEL = onnx.parser.parse_model("""
<ir_version: 9, opset_import: ["" : 18]>
g (float[2, 3] x, float[3, 4] w) => (float[2, 4] y) {
    h = MatMul(x, w)
    r = Relu(h)
    y = Tanh(r)
}
""")


def test_runs_and_matches_numpy():
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    w = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    (y,) = NumpyBackend.prepare(MODEL).run([x, w])
    np.testing.assert_allclose(y, np.tanh(np.maximum(x @ w, 0)), rtol=1e-6)
    assert y.dtype == np.float32


def test_error_names_node_op_and_input_shapes():
    graph = Graph("bad", {"": 18})
    graph.add_input("x", ValueType.tensor(TensorProto.FLOAT, None))
    graph.add_input("w", ValueType.tensor(TensorProto.FLOAT, None))
    graph.add_node("MatMul", ["x", "w"], ["y"], name="the_matmul")
    graph.add_output("y")
    with pytest.raises(NodeExecutionError, match=r"'the_matmul' MatMul-18 failed on inputs \(float32\[2, 3\], float32\[5, 4\]\)"):
        Interpreter(graph).run({"x": np.zeros((2, 3), np.float32), "w": np.zeros((5, 4), np.float32)})


@pytest.mark.parametrize(
    "feeds, message",
    [
        ({"x": np.zeros((2, 3), np.float32)}, r"missing input\(s\) \['w'\]"),
        ({"x": np.zeros((2, 3), np.float32), "w": np.zeros((3, 4), np.float32), "z": 1}, r"unknown input\(s\) \['z'\]"),
        ({"x": np.zeros((2, 3), np.float64), "w": np.zeros((3, 4), np.float32)}, r"input 'x': dtype float64 where float32"),
        ({"x": np.zeros((2, 5), np.float32), "w": np.zeros((3, 4), np.float32)}, r"input 'x': shape \(2, 5\) where FLOAT\[2,3\]"),
        ({"x": np.zeros((2, 3, 1), np.float32), "w": np.zeros((3, 4), np.float32)}, r"input 'x': shape \(2, 3, 1\) where rank 2"),
    ],
)
def test_bad_feeds_are_named(feeds, message):
    with pytest.raises(FeedError, match=message):
        Interpreter(from_onnx(MODEL)).run(feeds)


def test_values_are_freed_after_their_last_use():
    live_sizes = []

    class Watching(Interpreter):
        def run_node(self, node, impl, inputs, env):
            live_sizes.append(sorted(k for k in env if k not in ("", "x", "w")))
            return super().run_node(node, impl, inputs, env)

    Watching(from_onnx(MODEL)).run({"x": np.ones((2, 3), np.float32), "w": np.ones((3, 4), np.float32)})
    # Before Relu only h is live; before Tanh only r: h was freed after Relu read it.
    assert live_sizes == [[], ["h"], ["r"]]


def test_run_node_can_replace_execution():
    class Doubling(Interpreter):
        def run_node(self, node, impl, inputs, env):
            outputs = super().run_node(node, impl, inputs, env)
            return [2 * o for o in outputs] if node.op_type == "Tanh" else outputs

    feeds = {"x": np.ones((2, 3), np.float32), "w": np.ones((3, 4), np.float32)}
    (plain,) = Interpreter(from_onnx(MODEL)).run(feeds)
    (doubled,) = Doubling(from_onnx(MODEL)).run(feeds)
    np.testing.assert_allclose(doubled, 2 * plain)


def test_a_graph_too_deep_for_recursion_runs():
    depth = 20_000
    nodes = [helper.make_node("Neg", [f"v{i}"], [f"v{i + 1}"]) for i in range(depth)]
    model = helper.make_model(
        helper.make_graph(nodes, "deep", [helper.make_tensor_value_info("v0", TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info(f"v{depth}", TensorProto.FLOAT, [1])]),
        opset_imports=[helper.make_opsetid("", 18)])
    (y,) = NumpyBackend.prepare(model).run([np.array([3.0], np.float32)])
    assert y.tolist() == [3.0]  # an even number of negations


def test_model_local_function_runs():
    model = onnx.parser.parse_model("""
    <ir_version: 9, opset_import: ["" : 18, "local" : 1]>
    g (float[3] x) => (float[3] y) { y = local.Cube(x) }
    <domain: "local", opset_import: ["" : 18]>
    Cube (a) => (b) { s = Mul(a, a)  b = Mul(s, a) }
    """)
    (y,) = NumpyBackend.prepare(model).run([np.array([1, 2, 3], np.float32)])
    assert y.tolist() == [1, 8, 27]


def test_a_function_may_call_one_listed_after_it():
    """ONNX does not order a model's functions: the interpreter makes each one's evaluator after
    those it calls (a caller listed first failed: "Node type 'G' from domain 'local' is unknown")."""
    (y,) = NumpyBackend.prepare(NESTED_FUNCTIONS).run([np.ones((2, 4), np.float32)])
    assert y.tolist() == [[0, 3, -2, 5]] * 2


NESTED_FUNCTIONS = onnx.parser.parse_model("""<ir_version: 10, opset_import: ["" : 18, "local" : 1]>
    g (float[2, 4] x) => (float[2, 4] y) <float[4] w = {1, -2, 3, -4}> { y = local.F(x, w) }
    <domain: "local", opset_import: ["" : 18, "local" : 1]>
    F (a, b) => (d) <float[4] c, float[2, 4] d> { c = local.G(b)  d = Add(a, c) }
    <domain: "local", opset_import: ["" : 18]>
    G (u) => (v) { v = Neg(u) }
    """)


def test_outputs_never_alias_weights_or_feeds():
    model = onnx.parser.parse_model("""
    <ir_version: 9, opset_import: ["" : 18]>
    g (float[2] x) => (float[2] a, float[2] b) <float[2] w = {1, 2}> { a = Identity(w)  b = Identity(x) }
    """)
    rep = NumpyBackend.prepare(model)
    x = np.array([5, 6], np.float32)
    a, b = rep.run([x])
    a[:] = 0
    b[:] = 0
    assert x.tolist() == [5, 6]
    again, _ = rep.run([x])
    assert again.tolist() == [1, 2]
