"""``ir.select_first``: a Gather of one constant index moved before the Transpose, Squeeze and
Unsqueeze that make its data gives the same arrays, and lets PyTorch's packed q, k, v keep
their rows when batched along the length."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from onnx.reference import ReferenceEvaluator

from autobatch import InferenceSession
from autobatch.ir.select_first import select_first

# PyTorch's multi-head attention on a packed projection [L, 1, 3E]: unflatten, unsqueeze(0),
# transpose(0, -2), squeeze(-2), then q, k, v = proj[0], proj[1], proj[2] (as dynamo writes it).
PACKED = """
<ir_version: 8, opset_import: ["" : 18]>
packed (float[L, 1, 12] x) => (float[L, 1, 4] q, float[L, 1, 4] k, float[L, 1, 4] v) <int64[4] shape = {0, 1, 3, 4},
        int64[1] zero = {0}, int64[1] minus2 = {-2}, int64 i0 = {0}, int64 i1 = {1}, int64 i2 = {2}> {
    view = Reshape(x, shape)
    unsqueezed = Unsqueeze(view, zero)
    turned = Transpose<perm = [3, 1, 2, 0, 4]>(unsqueezed)
    squeezed = Squeeze(turned, minus2)
    q = Gather<axis = 0>(squeezed, i0)
    k = Gather<axis = 0>(squeezed, i1)
    v = Gather<axis = -4>(squeezed, i2)
}"""

# Opset 11: axes as attributes; the Transpose also read by another node, so it stays.
ATTRIBUTES = """
<ir_version: 7, opset_import: ["" : 11]>
attributes (float[2, 5, 1, 3] x) => (float[5, 1, 2] y, float[3, 5, 1, 2] kept) {
    turned = Transpose<perm = [3, 1, 2, 0]>(x)
    unsqueezed = Unsqueeze<axes = [-1]>(turned)
    kept = Squeeze<axes = [4]>(unsqueezed)
    index = Constant<value = int64 {-1}>()
    y = Gather<axis = 0>(kept, index)
}"""

# What is not moved: a Gather of indices that are not one constant, of an axis an Unsqueeze made.
NOT_MOVED = """
<ir_version: 8, opset_import: ["" : 18]>
not_moved (float[4, 3] x, int64 i) => (float[4] a, float[4, 3] b) <int64[1] zero = {0}, int64 z = {0}> {
    turned = Transpose<perm = [1, 0]>(x)
    a = Gather<axis = 0>(turned, i)
    unsqueezed = Unsqueeze(x, zero)
    b = Gather<axis = 0>(unsqueezed, z)
}"""


def _same(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> onnx.ModelProto:
    moved = select_first(model)
    onnx.checker.check_model(moved, full_check=True)
    for got, want in zip(ReferenceEvaluator(moved).run(None, feeds), ReferenceEvaluator(model).run(None, feeds)):
        np.testing.assert_array_equal(got, want)
    return moved


def test_q_k_v_of_a_packed_projection_are_selected_before_the_moves():
    model = onnx.parser.parse_model(PACKED)
    moved = _same(model, {"x": np.random.default_rng(0).standard_normal((5, 1, 12)).astype(np.float32)})
    producers = {output: node for node in moved.graph.node for output in node.output}
    for node in moved.graph.node:
        if node.op_type == "Gather":
            assert producers[node.input[0]].op_type == "Reshape"  # reads the view itself, [L, 1, 3, E]
    # the moves nobody reads any more are gone, with the axes only they read
    assert Counter(n.op_type for n in moved.graph.node) == {"Reshape": 1, "Gather": 3, "Unsqueeze": 3, "Transpose": 3,
                                                             "Squeeze": 3}
    assert "minus2" not in {tensor.name for tensor in moved.graph.initializer}


def test_axes_given_as_attributes_and_a_move_read_elsewhere():
    model = onnx.parser.parse_model(ATTRIBUTES)
    moved = _same(model, {"x": np.arange(30, dtype=np.float32).reshape(2, 5, 1, 3)})
    gathers = [node for node in moved.graph.node if node.op_type == "Gather"]
    assert [node.input[0] for node in gathers] == ["x"]
    assert sum(node.op_type == "Squeeze" for node in moved.graph.node) == 2  # ``kept`` is still an output


def test_a_gather_of_given_indices_or_of_an_axis_an_unsqueeze_made_stays():
    model = onnx.parser.parse_model(NOT_MOVED)
    moved = _same(model, {"x": np.arange(12, dtype=np.float32).reshape(4, 3), "i": np.array(2, np.int64)})
    assert [(n.op_type, list(n.input)) for n in moved.graph.node] == [(n.op_type, list(n.input)) for n in model.graph.node]


def test_the_dynamo_encoders_q_k_v_keep_their_rows(tmp_path):
    """In the ``nn.TransformerEncoder`` as ``dynamo=True`` exports it, q, k and v are picked in
    the rows layout: one launch each for every mix, no longer one a chunk."""
    pytest.importorskip("torch")
    from benchmarks import exports

    path = tmp_path / "encoder.onnx"
    exports.export(exports.build("encoder", 16), path, dynamo=True)
    session = InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feeds = [{"ids": rng.integers(0, exports.VOCABULARY, (1, n))} for n in (3, 9, 17, 4, 12, 30, 7, 5, 22, 6)]
    for got, alone in zip(session.run_batch(None, feeds), (session.run(None, f) for f in feeds)):
        np.testing.assert_allclose(got[0], alone[0], rtol=1e-4, atol=1e-5)
    plan = session.axis_batches.runner.plan
    selects = [step.kind for record, step in zip(plan.records, plan.steps)
               if record.op_type == "Gather" and record.inputs[0] not in plan.weights]
    layers = sum(node.op_type == "MatMul" for node in onnx.load(str(path)).graph.node) // 4
    assert selects == ["ragged"] * 3 * layers


@pytest.mark.slow  # about 9 s: run by .ci/run beside the fuzzer
def test_a_chain_of_moves_longer_than_pythons_recursion_limit():
    """A Gather after thousands of Unsqueeze/Squeeze pairs (a hostile file may chain any number):
    worked out without recursion, moved first, and the same array."""
    from onnx import TensorProto, helper, numpy_helper

    pairs = 600  # 1,200 moves: past the 1,000 frames a recursive walk would need
    nodes, value = [], "x"
    for k in range(pairs):
        nodes += [helper.make_node("Unsqueeze", [value, "zero"], [f"u{k}"]),
                  helper.make_node("Squeeze", [f"u{k}", "zero"], [f"s{k}"])]
        value = f"s{k}"
    nodes.append(helper.make_node("Gather", [value, "one"], ["y"], axis=1))
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
                              [numpy_helper.from_array(np.array([0], np.int64), "zero"),
                               numpy_helper.from_array(np.array(1, np.int64), "one")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    moved = _same(model, {"x": x})
    assert [n.op_type for n in moved.graph.node][0] == "Gather"  # picked from x itself, before every move
    np.testing.assert_array_equal(InferenceSession(model).run(None, {"x": x})[0], x[:, 1])


def test_many_selects_after_one_long_chain_redo_it_a_bounded_number_of_times():
    """200 Gathers after one chain of 400 moves would redo the chain 200 times (80,000 nodes):
    the moves redone are bounded by the model's size, and every output is still the same."""
    from onnx import TensorProto, helper, numpy_helper

    nodes, value = [], "x"
    for k in range(200):
        nodes += [helper.make_node("Unsqueeze", [value, "zero"], [f"u{k}"]),
                  helper.make_node("Squeeze", [f"u{k}", "zero"], [f"s{k}"])]
        value = f"s{k}"
    nodes += [helper.make_node("Gather", [value, "one"], [f"y{k}"], axis=1) for k in range(200)]
    graph = helper.make_graph(nodes, "fan", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info(f"y{k}", TensorProto.FLOAT, [2]) for k in range(200)],
                              [numpy_helper.from_array(np.array([0], np.int64), "zero"),
                               numpy_helper.from_array(np.array(1, np.int64), "one")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    moved = _same(model, {"x": np.arange(6, dtype=np.float32).reshape(2, 3)})
    assert len(moved.graph.node) < 10 * len(model.graph.node)


def test_a_failing_rewrite_leaves_the_model_as_written(monkeypatch, caplog):
    """A bug in the rewrite (injected here) must not stop a model from loading: the session runs
    the model as written, and says so at WARNING."""
    import autobatch.session

    def broken(model):
        raise IndexError("injected")

    monkeypatch.setattr(autobatch.session, "select_first", broken)
    model = onnx.parser.parse_model(PACKED)
    x = np.random.default_rng(1).standard_normal((4, 1, 12)).astype(np.float32)
    with caplog.at_level("WARNING", logger="autobatch"):
        session = InferenceSession(model)
    assert "selects are left where it has them (IndexError: injected)" in caplog.text
    for got, want in zip(session.run(None, {"x": x}), ReferenceEvaluator(model).run(None, {"x": x})):
        np.testing.assert_array_equal(got, want)
