"""The IR Graph: building, producers/consumers, order, subgraphs, union, validation, display."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from autobatch.ir import CAPTURED, Graph, ValidationError, ValueType, from_onnx, to_onnx
from autobatch.ir.graph import SHAPE_DATA_LIMIT

F32 = TensorProto.FLOAT


def tiny_graph() -> Graph:
    """y = tanh(x @ W + x @ W), with Add reading the same value twice."""
    g = Graph("tiny", {"": 18})
    g.add_input("x", ValueType.tensor(F32, [1, 3]))
    g.add_initializer("W", np.ones((3, 2), np.float32))
    g.add_node("MatMul", ["x", "W"], ["xw"])
    g.add_node("Add", ["xw", "xw"], ["s"])
    g.add_node("Tanh", ["s"], ["y"])
    g.add_output("y")
    return g


def test_parallel_edges_for_repeated_input():
    g = tiny_graph()
    matmul, _ = g.producer("xw")
    add = g.consumers("xw")[0][0]
    assert sorted(k for _, _, k in g.nx.edges(matmul.id, keys=True)) == [(0, 0), (0, 1)]
    assert [index for _, index in g.consumers("xw")] == [0, 1]
    assert add.op_type == "Add"


def test_producer_and_consumers_of_inputs_and_constants():
    g = tiny_graph()
    assert g.producer("x") is None and g.producer("W") is None
    assert [n.op_type for n, _ in g.consumers("W")] == ["MatMul"]
    assert g.values["W"].is_shared and not g.values["x"].is_shared


def test_topological_order_is_deterministic_and_respects_edges():
    g = Graph("order", {"": 18})
    g.add_input("x", ValueType.tensor(F32, [2]))
    # Added out of dependency order on purpose: the consumer first.
    g.add_node("Relu", ["x"], ["a"])
    g.add_node("Neg", ["x"], ["b"])
    g.add_node("Add", ["a", "b"], ["c"])
    orders = {tuple(n.op_type for n in g.topological_order()) for _ in range(5)}
    assert orders == {("Relu", "Neg", "Add")}


def test_subgraph_extraction_turns_boundary_values_into_inputs_and_outputs():
    g = tiny_graph()
    add_and_tanh = [n.id for n in g.nodes.values() if n.op_type in ("Add", "Tanh")]
    sub = g.subgraph(add_and_tanh)
    assert sub.inputs == ["xw"] and sub.outputs == ["y"]
    first = g.subgraph([n.id for n in g.nodes.values() if n.op_type == "MatMul"])
    assert first.inputs == ["x"] and first.outputs == ["xw"] and "W" in first.initializers()


def test_union_shares_equal_constants_and_tags_instances():
    u = Graph.union([tiny_graph(), tiny_graph(), tiny_graph()])
    assert len(u) == 9
    assert u.inputs == ["i0/x", "i1/x", "i2/x"]
    assert list(u.initializers()) == ["W"]  # one shared weight, read by every instance
    assert {n.instance for n, _ in u.consumers("W")} == {0, 1, 2}
    u.validate()


def test_renamed_copies_with_the_names_given_and_keeps_the_rest():
    g = tiny_graph()
    for node in g.nodes.values():
        node.instance = 3
    copy = g.renamed({"x": "x0", "xw": "product", "y": "out"})
    assert copy.inputs == ["x0"] and copy.outputs == ["out"]
    assert copy.values["x0"].type == g.values["x"].type and "x" not in copy.values
    np.testing.assert_array_equal(copy.values["W"].const, g.values["W"].const)
    assert [(n.op_type, n.inputs, n.outputs, n.instance) for n in copy.topological_order()] == [
        ("MatMul", ["x0", "W"], ["product"], 3), ("Add", ["product", "product"], ["s"], 3), ("Tanh", ["s"], ["out"], 3)]
    copy.validate()
    assert g.inputs == ["x"] and "product" not in g.values  # the original as it was


def test_union_keeps_different_constants_apart():
    a, b = tiny_graph(), tiny_graph()
    b.values["W"].const = np.zeros((3, 2), np.float32)
    u = Graph.union([a, b])
    assert sorted(u.initializers()) == ["i0/W", "i1/W"]


@pytest.mark.parametrize(("first", "second", "shared"), [
    (0.0, -0.0, False),  # equal as numbers, but 1 / c differs: not one constant
    (np.nan, np.nan, True),  # the same NaN: one constant
    (1.0, 1.0, True),
])
def test_union_shares_constants_equal_bit_for_bit(first, second, shared):
    a, b = tiny_graph(), tiny_graph()
    a.values["W"].const = np.full((3, 2), first, np.float32)
    b.values["W"].const = np.full((3, 2), second, np.float32)
    u = Graph.union([a, b])
    assert sorted(u.initializers()) == (["W"] if shared else ["i0/W", "i1/W"])


def test_dangling_input_is_named():
    g = Graph("bad", {"": 18})
    g.add_input("x", ValueType.tensor(F32, [2]))
    g.add_node("Add", ["x", "nowhere"], ["y"])
    with pytest.raises(ValidationError, match="reads 'nowhere'"):
        g.validate()


def test_cycle_is_reported_with_its_nodes():
    g = Graph("loop", {"": 18})
    g.add_input("x", ValueType.tensor(F32, [2]))
    g.add_node("Add", ["x", "b"], ["a"])  # reads b before anything defines it
    g.add_node("Relu", ["a"], ["b"])  # defining b closes the cycle
    with pytest.raises(ValidationError, match="cycle: Node#0 .*Add.* -> Node#1 .*Relu"):
        g.validate()
    with pytest.raises(ValidationError, match="cycle"):
        g.topological_order()


def test_unknown_op_is_named():
    g = Graph("odd", {"": 18})
    g.add_input("x", ValueType.tensor(F32, [2]))
    g.add_node("Frobnicate", ["x"], ["y"])
    with pytest.raises(ValidationError, match="unknown op Frobnicate"):
        g.validate()


def test_type_mismatch_is_found_by_strict_inference():
    g = Graph("types", {"": 18})
    g.add_input("x", ValueType.tensor(F32, [2]))
    g.add_input("n", ValueType.tensor(TensorProto.INT64, [2]))
    g.add_node("Add", ["x", "n"], ["y"])
    g.add_output("y")
    g.validate()  # structure is fine
    with pytest.raises(ValidationError, match="type mismatch"):
        g.validate(check_types=True)


def test_value_defined_twice_is_refused():
    g = tiny_graph()
    with pytest.raises(ValidationError, match="'xw' is defined twice"):
        g.add_node("Relu", ["x"], ["xw"])


def test_infer_shapes_fills_every_value():
    g = tiny_graph()
    g.infer_shapes()
    assert repr(g.values["xw"].type) == "FLOAT[1,2]"
    assert g.values["y"].type.shape == (1, 2) and g.values["y"].type.dtype == np.float32


def test_shape_inference_reads_small_constants_and_only_the_types_of_weights():
    """Typing a graph for a new input shape must not copy its weights (a model's MB of them for
    every shape): large constants go to inference as typed inputs, small ones (a Reshape's
    target shape) with their values, which inference needs."""
    g = Graph("g", {"": 18})
    g.add_input("x", ValueType.tensor(np.float32, [5, 64]))
    g.add_initializer("W", np.ones((64, 128), np.float32))  # 8192 elements: a weight
    g.add_initializer("shape", np.array([-1, 32], np.int64))
    g.add_node("MatMul", ["x", "W"], ["xw"])
    g.add_node("Reshape", ["xw", "shape"], ["y"])
    g.add_output("y")
    model = to_onnx(g, check=False, data_limit=SHAPE_DATA_LIMIT)
    assert [t.name for t in model.graph.initializer] == ["shape"]
    assert "W" in [i.name for i in model.graph.input]
    g.infer_shapes()
    assert g.values["xw"].type.shape == (5, 128)
    assert g.values["y"].type.shape == (20, 32)  # from the value of "shape"
    assert g.values["W"].const is not None and g.values["W"].const.shape == (64, 128)


def test_str_lists_nodes_with_types():
    g = tiny_graph()
    g.infer_shapes()
    text = str(g)
    assert "%xw: FLOAT[1,2] = MatMul(%x, %W)" in text
    assert "%s: FLOAT[1,2] = Add(%xw, %xw)" in text
    assert "shared %W: FLOAT[3,2]" in text


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_draw_writes_an_image(tmp_path, suffix):
    path = tmp_path / f"tiny{suffix}"
    tiny_graph().draw(str(path))
    head = path.read_bytes()[:200]
    assert head.startswith(b"\x89PNG") if suffix == ".png" else b"<svg" in head or b"<?xml" in head


def test_captured_values_are_edges():
    then_branch = onnx.helper.make_graph(
        [onnx.helper.make_node("Neg", ["a"], ["t"])], "then", [],
        [onnx.helper.make_tensor_value_info("t", F32, [2])])
    else_branch = onnx.helper.make_graph(
        [onnx.helper.make_node("Identity", ["a"], ["e"])], "else", [],
        [onnx.helper.make_tensor_value_info("e", F32, [2])])
    g = Graph("cond", {"": 18})
    g.add_input("x", ValueType.tensor(F32, [2]))
    g.add_input("c", ValueType.tensor(TensorProto.BOOL, []))
    g.add_node("Relu", ["x"], ["a"])
    node = g.add_node("If", ["c"], ["y"], {"then_branch": then_branch, "else_branch": else_branch})
    g.add_output("y")
    assert (node, CAPTURED) in g.consumers("a")
    relu = g.producer("a")[0]
    assert [o.op_type for o in g.topological_order()] == ["Relu", "If"]
    assert g.nx.has_edge(relu.id, node.id)
    back = from_onnx(to_onnx(g))
    assert back.consumers("a")[0][1] == CAPTURED


def test_a_plan_is_drawn_a_row_a_launch_and_past_300_nodes_a_box_a_class(tmp_path):
    import re

    from autobatch.ir.draw import MAX_DRAWN_NODES
    from autobatch.tools import plan_view

    def chains(instances: int, length: int) -> Graph:
        body = "\n".join(f"r{k} = Relu(v{k})  v{k + 1} = Tanh(r{k})" for k in range(length))
        model = onnx.parser.parse_model(f'<ir_version: 8, opset_import: ["" : 17]> g (float[2] v0) => (float[2] v{length}) '
                                        f"{{ {body} }}")
        graph = Graph.union([from_onnx(model) for _ in range(instances)])
        graph.infer_shapes()
        return graph

    small = chains(3, 2)  # 12 nodes: 4 launches of 3
    small.draw(str(tmp_path / "small.dot"), plan_view(small, "level"))
    text = (tmp_path / "small.dot").read_text()
    assert text.count("subgraph cluster_") == 4 and text.count('label="Relu"') == 6
    assert len(set(re.findall(r'fillcolor="(#\w+)"', text))) == 2  # a colour a signature class
    assert '[label="2"]' in text  # the shape each edge carries
    big = chains(4, MAX_DRAWN_NODES // 8 + 1)
    big.draw(str(tmp_path / "big.dot"), plan_view(big, "level"))
    text = (tmp_path / "big.dot").read_text()
    assert text.count("subgraph cluster_") == 2 and "nodes, " in text  # Relu's box and Tanh's
    big.draw(str(tmp_path / "big.png"), plan_view(big, "level"))
    assert (tmp_path / "big.png").read_bytes().startswith(b"\x89PNG")
