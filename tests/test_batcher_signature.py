"""Signatures split groups on every field that changes what a node computes, and only on those;
schedulers produce valid, deterministic schedules that respect the lower bound."""

from __future__ import annotations

import random

import numpy as np
import onnx
import onnx.parser
import pytest
from onnx import TensorProto, helper

from autobatch import Batch, InferenceSession
from autobatch.backends import Interpreter
from autobatch.graphs import run_graphs
from autobatch.batcher import SCHEDULERS, build_problem, flat, node_signature
from autobatch.batcher.plan import TemplateCache
from autobatch.batcher.problem import SCHEDULING, UNBATCHABLE, Problem, problem_from
from autobatch.batcher import schedulers
from autobatch.batcher.schedulers import LEVEL_TIE_BREAKS, _level_schedule, level_groups
from autobatch.datasets import synthetic_tree
from autobatch.examples import bilstm_tagger, tree_lstm
from autobatch.batcher.node_rules import has_rule
from autobatch.ir import Graph, ValueType, from_onnx

F32, F16, I64 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT64


def two_nodes(
    op_a: str = "Relu", op_b: str | None = None, *, attrs_a: dict | None = None, attrs_b: dict | None = None,
    type_a: ValueType | None = None, type_b: ValueType | None = None, inputs_a: list[str] | None = None,
    inputs_b: list[str] | None = None, domain_b: str = "", version_b: int | None = None,
    outputs_a: list[str] | None = None, outputs_b: list[str] | None = None, name_b: str = "",
) -> tuple[Graph, object, object]:
    """A graph with per-instance inputs x0 (instance 0) and x1 (instance 1), shared weights W
    and V, and one node per instance; returns it with both nodes."""
    g = Graph("pair", {"": 18, "custom": 1})
    g.add_input("x0", type_a or ValueType.tensor(F32, [2, 3]))
    g.add_input("x1", type_b or type_a or ValueType.tensor(F32, [2, 3]))
    g.add_initializer("W", np.ones((2, 3), np.float32))
    g.add_initializer("V", np.ones((2, 3), np.float32))
    out_type = ValueType.tensor(F32, [2, 3])
    # A constant read by one node only is that node's literal (per-instance data); W and V are
    # read by other nodes too, so they are shared weights.
    g.add_node("Identity", ["W"], ["w_read"], output_types=[out_type])
    g.add_node("Identity", ["V"], ["v_read"], output_types=[out_type])

    def outs(names: list[str] | None, k: int) -> tuple[list[str], list]:
        names = names or [f"y{k}"]
        return names, [out_type if n else None for n in names]

    names_a, types_a = outs(outputs_a, 0)
    names_b, types_b = outs(outputs_b, 1)
    a = g.add_node(op_a, inputs_a or ["x0"], names_a, attrs_a, instance=0, name="first", output_types=types_a)
    b = g.add_node(op_b or op_a, inputs_b or ["x1"], names_b, attrs_b if attrs_b is not None else attrs_a,
                   domain=domain_b, version=version_b, instance=1, name=name_b or "second",
                   output_types=types_b)
    return g, a, b


def signatures_of(built: tuple[Graph, object, object]) -> tuple:
    g, a, b = built
    return node_signature(g, a), node_signature(g, b)


# ----------------------------------------------------------------------------- fields that split
SPLITTING = {
    "attribute int value": dict(op_a="LeakyRelu", attrs_a={"alpha": 0.1}, attrs_b={"alpha": 0.2}),
    "attribute ints value": dict(op_a="Transpose", attrs_a={"perm": [1, 0]}, attrs_b={"perm": [0, 1]}),
    "attribute string value": dict(op_a="Gelu", attrs_a={"approximate": "none"}, attrs_b={"approximate": "tanh"}),
    "attribute int": dict(op_a="Softmax", attrs_a={"axis": 0}, attrs_b={"axis": 1}),
    "attribute floats value": dict(op_a="Relu", attrs_a={"f": [1.0, 2.0]}, attrs_b={"f": [1.0, 3.0]}),
    "attribute strings value": dict(op_a="Relu", attrs_a={"s": ["a", "b"]}, attrs_b={"s": ["a", "c"]}),
    "attribute tensor value": dict(op_a="Relu", attrs_a={"t": np.array([1.0], np.float32)},
                                   attrs_b={"t": np.array([2.0], np.float32)}),
    "attribute tensor dtype": dict(op_a="Relu", attrs_a={"t": np.array([1.0], np.float32)},
                                   attrs_b={"t": np.array([1.0], np.float64)}),
    "attribute type (int vs float)": dict(op_a="Relu", attrs_a={"v": 1}, attrs_b={"v": 1.0}),
    "signed zero float attribute": dict(op_a="Celu", attrs_a={"alpha": 0.0}, attrs_b={"alpha": -0.0}),
    "attribute presence": dict(op_a="LeakyRelu", attrs_a={"alpha": 0.01}, attrs_b={}),
    "attribute name": dict(op_a="Relu", attrs_a={"a": 1}, attrs_b={"b": 1}),
    "ELU vs Relu (op_type)": dict(op_a="Elu", op_b="Relu", attrs_a={}, attrs_b={}),
    "domain": dict(op_a="Relu", domain_b="custom", version_b=1),
    "opset version": dict(op_a="Relu", version_b=14),
    "dtype": dict(op_a="Relu", type_a=ValueType.tensor(F32, [2, 3]), type_b=ValueType.tensor(F16, [2, 3])),
    "shape": dict(op_a="Relu", type_a=ValueType.tensor(F32, [2, 3]), type_b=ValueType.tensor(F32, [3, 2])),
    "rank": dict(op_a="Relu", type_a=ValueType.tensor(F32, [6]), type_b=ValueType.tensor(F32, [1, 6])),
    "shared value identity": dict(op_a="Add", inputs_a=["x0", "W"], inputs_b=["x1", "V"]),
    "shared vs per-instance": dict(op_a="Add", inputs_a=["x0", "W"], inputs_b=["x1", "x1"]),
    "operand order": dict(op_a="Sub", inputs_a=["x0", "W"], inputs_b=["W", "x1"]),
    "missing optional input": dict(op_a="Clip", inputs_a=["x0", "", "W"], inputs_b=["x1", "W", ""]),
    "missing vs present optional input": dict(op_a="Clip", inputs_a=["x0", "W"], inputs_b=["x1", ""]),
    "missing optional output": dict(op_a="Dropout", outputs_a=["y0", ""], outputs_b=["y1", "m1"]),
    "number of outputs": dict(op_a="Dropout", outputs_a=["y0"], outputs_b=["y1", "m1"]),
}


@pytest.mark.parametrize("field", list(SPLITTING))
def test_field_splits_signature(field: str) -> None:
    sig_a, sig_b = signatures_of(two_nodes(**SPLITTING[field]))
    assert sig_a is not None and sig_b is not None
    assert sig_a != sig_b
    assert len({sig_a, sig_b}) == 2  # usable as distinct dict keys


# ----------------------------------------------------------------------------- fields that must not
KEEPING = {
    "node name": dict(op_a="Tanh", name_b="a completely different name"),
    "instance index and per-instance value names": dict(op_a="Add", inputs_a=["x0", "W"], inputs_b=["x1", "W"]),
    "attribute order": dict(op_a="Relu", attrs_a={"a": 1, "b": 2.5}, attrs_b={"b": 2.5, "a": 1}),
    "NaN float attribute": dict(op_a="Relu", attrs_a={"f": float("nan")}),
    "output names": dict(op_a="Dropout", outputs_a=["y0", "m0"], outputs_b=["q1", "r1"]),
}


@pytest.mark.parametrize("field", list(KEEPING))
def test_field_keeps_signature(field: str) -> None:
    sig_a, sig_b = signatures_of(two_nodes(**KEEPING[field]))
    assert sig_a is not None and sig_a == sig_b
    assert hash(sig_a) == hash(sig_b)


def test_unknown_or_symbolic_shapes_are_unbatchable() -> None:
    g, a, b = two_nodes("Relu", type_a=ValueType.tensor(F32, ["n", 3]), type_b=ValueType.tensor(F32, None))
    assert node_signature(g, a) is None and node_signature(g, b) is None


def test_value_produced_outside_every_instance_is_shared() -> None:
    g = Graph("shared_producer", {"": 18})
    g.add_input("x0", ValueType.tensor(F32, [3]))
    g.add_input("x1", ValueType.tensor(F32, [3]))
    g.add_initializer("W", np.ones(3, np.float32))
    g.add_node("Neg", ["W"], ["nw"], output_types=[ValueType.tensor(F32, [3])])  # instance None
    a = g.add_node("Add", ["x0", "nw"], ["y0"], instance=0, output_types=[ValueType.tensor(F32, [3])])
    b = g.add_node("Add", ["x1", "nw"], ["y1"], instance=1, output_types=[ValueType.tensor(F32, [3])])
    assert node_signature(g, a) == node_signature(g, b)
    assert ("shared", "nw") in node_signature(g, a)[4]


ONE_INSTANCE = """
<ir_version: 8, opset_import: ["" : 18]>
agraph (float[2, 3] x) => (float[2, 3] y) <float[3] w = {1.0, 2.0, 3.0}> {
    a = Add(x, w)
    y = Tanh(a)
}
"""


def test_union_of_parsed_models_gives_equal_signatures_across_instances() -> None:
    one = from_onnx(onnx.parser.parse_model(ONE_INSTANCE))
    union = Graph.union([one, one, one])
    union.infer_shapes()
    by_op: dict[str, set] = {}
    for node in union.nodes.values():
        by_op.setdefault(node.op_type, set()).add(node_signature(union, node))
    assert {op: len(sigs) for op, sigs in by_op.items()} == {"Add": 1, "Tanh": 1}
    assert all(sig is not None for sigs in by_op.values() for sig in sigs)


READ_TWICE = ONE_INSTANCE.replace("y = Tanh(a)", "b = Mul(a, w)\n    y = Tanh(b)")


def test_union_with_different_weights_splits_signatures() -> None:
    """Weights read by several nodes are shared values compared by identity: different
    contents, different names after the union, different signatures."""
    one = from_onnx(onnx.parser.parse_model(READ_TWICE))
    other = from_onnx(onnx.parser.parse_model(READ_TWICE.replace("{1.0, 2.0, 3.0}", "{1.0, 2.0, 4.0}")))
    union = Graph.union([one, other])
    union.infer_shapes()
    adds = [n for n in union.nodes.values() if n.op_type == "Add"]
    assert adds[0].inputs[1] != adds[1].inputs[1]
    assert node_signature(union, adds[0]) != node_signature(union, adds[1])
    tanhs = [n for n in union.nodes.values() if n.op_type == "Tanh"]
    assert node_signature(union, tanhs[0]) == node_signature(union, tanhs[1])
    same = Graph.union([one, from_onnx(onnx.parser.parse_model(READ_TWICE))])
    same.infer_shapes()
    adds = [n for n in same.nodes.values() if n.op_type == "Add"]
    assert adds[0].inputs[1] == adds[1].inputs[1] == "w"
    assert node_signature(same, adds[0]) == node_signature(same, adds[1])


def test_different_single_use_literals_batch_and_stay_correct() -> None:
    """A constant read by one node is that instance's literal: nodes differing only in it share
    a signature, and batching them still gives each instance its own result."""
    models = [ONE_INSTANCE.replace("{1.0, 2.0, 3.0}", f"{{1.0, 2.0, {k}.5}}") for k in range(3)]
    graphs = [from_onnx(onnx.parser.parse_model(m)) for m in models]
    union = Graph.union(graphs)
    union.infer_shapes()
    adds = [n for n in union.nodes.values() if n.op_type == "Add"]
    assert len({node_signature(union, n) for n in adds}) == 1
    x = np.arange(6, dtype=np.float32).reshape(2, 3) / 6
    got, report = run_graphs(graphs, [{"x": x}] * 3)
    for k, g in enumerate(graphs):
        np.testing.assert_allclose(got[k][0], Interpreter(g).run({"x": x})[0], rtol=1e-5, atol=1e-6)
    assert report.launches < report.nodes


def test_missing_optional_output_batches_correctly() -> None:
    """Instances that want different optional outputs of a recurrent layer: each gets its own."""
    rng = np.random.default_rng(1)
    hidden, width = 3, 2
    weights = {
        "W": rng.standard_normal((1, hidden, width)).astype(np.float32),
        "R": rng.standard_normal((1, hidden, hidden)).astype(np.float32),
    }

    def instance(outputs: list[str]) -> Graph:
        node = helper.make_node("RNN", ["X", "W", "R"], outputs, hidden_size=hidden)
        wanted = [o for o in outputs if o]
        graph = helper.make_graph(
            [node], "rnn", [helper.make_tensor_value_info("X", F32, [2, 1, width])],
            [helper.make_tensor_value_info(o, F32, [2, 1, 1, hidden] if o == "Y" else [1, 1, hidden])
             for o in wanted],
            [onnx.numpy_helper.from_array(a, n) for n, a in weights.items()],
        )
        g = from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]))
        g.infer_shapes()
        return g

    graphs = [instance(["", "Yh"]), instance(["Y", "Yh"]), instance(["", "Yh"])]
    feeds = [rng.standard_normal((2, 1, width)).astype(np.float32) for _ in graphs]
    got, _ = run_graphs(graphs, [{"X": x} for x in feeds])
    batched = [out for outputs in got for out in outputs]
    expected = [out for g, x in zip(graphs, feeds) for out in Interpreter(g).run({"X": x})]
    assert len(batched) == len(expected) == 4
    for got, want in zip(batched, expected):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- schedulers
def random_union(seed: int, instances: int = 4, nodes: int = 12) -> Graph:
    """Instances of random DAGs over a few ops and two shapes; some instances share structure."""
    rng = random.Random(seed)
    graphs = []
    for k in range(instances):
        g = Graph(f"r{k}", {"": 18})
        g.add_input("x", ValueType.tensor(F32, [2, 3]))
        g.add_initializer("W", np.full((3, 3), 0.5, np.float32))
        values = ["x"]
        for i in range(rng.randint(2, nodes)):
            op = rng.choice(["Tanh", "Relu", "Add", "Mul", "MatMul", "Sigmoid"])
            if op in ("Add", "Mul"):
                inputs = [rng.choice(values), rng.choice(values)]
            elif op == "MatMul":
                inputs = [rng.choice(values), "W"]
            else:
                inputs = [rng.choice(values)]
            g.add_node(op, inputs, [f"v{i}"], output_types=[ValueType.tensor(F32, [2, 3])])
            values.append(f"v{i}")
        g.add_output(values[-1])
        graphs.append(g)
    return Graph.union(graphs)


def check_valid(problem, schedule: list[list[int]]) -> None:
    seen = [i for group in schedule for i in group]
    assert sorted(seen) == list(range(problem.size)), "every node exactly once"
    position = {i: g for g, group in enumerate(schedule) for i in group}
    for g, group in enumerate(schedule):
        assert group, "no empty groups"
        classes = {int(problem.sig[i]) for i in group}
        assert len(classes) == 1, "one signature class per group"
        if classes == {UNBATCHABLE}:
            assert len(group) == 1, "unbatchable nodes run alone"
        for i in group:
            assert all(position[p] < g for p in problem.preds[i]), "dependencies in earlier groups"


@pytest.mark.parametrize("scheduler", sorted(SCHEDULERS))
@pytest.mark.parametrize("seed", range(12))
def test_schedulers_valid_deterministic_and_above_lower_bound(scheduler: str, seed: int) -> None:
    union = random_union(seed)
    problem = build_problem(union, lambda node: has_rule(union, node))
    schedule = SCHEDULERS[scheduler](problem)
    check_valid(problem, schedule)
    assert SCHEDULERS[scheduler](problem) == schedule
    again = random_union(seed)
    assert SCHEDULERS[scheduler](build_problem(again, lambda node: has_rule(again, node))) == schedule
    assert problem.lower_bound() <= len(schedule) <= problem.size


@pytest.mark.parametrize("seed", range(12))
def test_launches_by_class_and_level_reach_the_bound_or_refuse(seed: int) -> None:
    """``level_groups``: where it gives a schedule, it is valid and reaches the lower bound;
    where it refuses, its launches by class and level read each other in a cycle, and the
    level scheduler's own search still gives a valid schedule."""
    union = random_union(seed, instances=6)
    problem = build_problem(union, lambda node: has_rule(union, node))
    early, late = level_groups(problem, problem.level), level_groups(problem, problem.late_level)
    for grouped in (early, late):
        if grouped is not None:
            check_valid(problem, grouped)
            assert len(grouped) == problem.lower_bound()
    if early is not None or late is not None:
        assert SCHEDULERS["level"](problem) == (early if early is not None else late)
    else:
        check_valid(problem, SCHEDULERS["level"](problem))


def test_launches_by_class_and_level_refuse_a_cycle() -> None:
    """Two instances, a then b in one and b then a in the other: every node is level 1 in its
    class, and the launch of the a's and that of the b's would each read the other."""
    sig = np.array([0, 1, 1, 0], dtype=np.int64)
    classes = [("", "A"), ("", "B")]
    problem = problem_from(list(range(4)), sig, [[], [0], [], [2]], classes)
    assert problem.level.tolist() == [1, 1, 1, 1]
    assert level_groups(problem, problem.level) is None
    assert level_groups(problem, problem.late_level) is None
    schedule = SCHEDULERS["level"](problem)
    check_valid(problem, schedule)
    assert len(schedule) == 3 > problem.lower_bound() == 2
    chains = problem_from(list(range(4)), sig[[0, 1, 0, 1]], [[], [0], [], [2]], classes)
    assert level_groups(chains, chains.level) == [[0, 2], [1, 3]]


def test_unbatchable_nodes_count_in_lower_bound() -> None:
    union = random_union(3)
    problem = build_problem(union, lambda node: node.op_type != "Tanh")
    n_tanh = sum(1 for n in union.nodes.values() if n.op_type == "Tanh")
    assert int((problem.sig == UNBATCHABLE).sum()) == n_tanh
    for scheduler in SCHEDULERS.values():
        schedule = scheduler(problem)
        check_valid(problem, schedule)
        assert problem.lower_bound() <= len(schedule)


def tree_instance(depth: int, leaves_first: bool) -> Graph:
    """A balanced binary tree of Tanh(Add(left, right)) over leaves Tanh(x_i @ W)."""
    g = Graph("tree", {"": 18})
    g.add_initializer("W", np.full((4, 4), 0.1, np.float32))
    t = ValueType.tensor(F32, [1, 4])
    level = []
    for i in range(2 ** depth):
        g.add_input(f"x{i}", t)
        g.add_node("MatMul", [f"x{i}", "W"], [f"m{i}"], output_types=[t])
        g.add_node("Tanh", [f"m{i}"], [f"h{i}"], output_types=[t])
        level.append(f"h{i}")
    count = 0
    while len(level) > 1:
        nxt = []
        for left, right in zip(level[::2], level[1::2]):
            g.add_node("Add", [left, right], [f"s{count}"], output_types=[t])
            g.add_node("Tanh", [f"s{count}"], [f"t{count}"], output_types=[t])
            nxt.append(f"t{count}")
            count += 1
        level = nxt
    g.add_output(level[0])
    return g


def chain_instance(length: int) -> Graph:
    g = Graph("chain", {"": 18})
    t = ValueType.tensor(F32, [1, 4])
    g.add_input("x", t)
    g.add_initializer("W", np.full((4, 4), 0.1, np.float32))
    name = "x"
    for i in range(length):
        g.add_node("MatMul", [name, "W"], [f"m{i}"], output_types=[t])
        g.add_node("Tanh", [f"m{i}"], [f"c{i}"], output_types=[t])
        name = f"c{i}"
    g.add_output(name)
    return g


def test_level_scheduler_reaches_lower_bound_on_trees_and_chains() -> None:
    union = Graph.union([tree_instance(3, True), tree_instance(2, True), tree_instance(1, True),
                         chain_instance(5), chain_instance(2)])
    problem = build_problem(union, lambda node: has_rule(union, node))
    launches = {name: len(s(problem)) for name, s in SCHEDULERS.items()}
    assert launches["level"] == problem.lower_bound()
    assert level_groups(problem, problem.level) == SCHEDULERS["level"](problem)  # found in bulk
    assert all(problem.lower_bound() <= n for n in launches.values())
    # the lower bound here: MatMul at most 5 on a path (the chain), Tanh at most 5 (chain: 5;
    # depth-3 tree: leaf + 3 levels = 4), Add at most 3.
    assert problem.lower_bound() == 5 + 5 + 3


def traced_problem(loss, examples, params) -> Problem:  # type: ignore[no-untyped-def]
    """The scheduling problem of the examples' losses traced into one batch (nothing runs)."""
    with Batch() as batch:
        losses = [loss(example, params) for example in examples]
        planner = flat._Planner(TemplateCache(), batch._weights, batch._literals, batch.functions, batch._opsets())
        records, preds, _ = flat._live(batch._records, [t.producer for t in losses])
        problem = planner.sign(records, preds)
        batch.discard()
    return problem


def test_level_scheduler_nears_the_bound_on_tree_lstms_op_by_op() -> None:
    """Traced op by op, a Tree-LSTM's per-class bounds do not line up (``Uf1`` reads left
    children only, so its levels follow left spines, not tree heights): the agenda tie-break
    over-splits, and the fewest-ready tie-break does better, within 1.1x of the bound."""
    rng = random.Random(0)
    trees = [synthetic_tree(rng) for _ in range(8)]
    params = tree_lstm.make_params(tree_lstm.make_vocabulary(trees), size=4)
    problem = traced_problem(tree_lstm.loss_primitive, trees, params)
    schedule = SCHEDULERS["level"](problem)
    check_valid(problem, schedule)
    by_tie_break = {tie_break.__name__: len(_level_schedule(problem, tie_break)) for tie_break in LEVEL_TIE_BREAKS}
    assert len(schedule) == min(by_tie_break.values()) <= 1.1 * problem.lower_bound()
    assert by_tie_break["_fewest_ready"] < min(v for k, v in by_tie_break.items() if k != "_fewest_ready")


def test_a_tagger_op_by_op_is_launched_by_late_levels() -> None:
    """Traced op by op, the BiLSTM tagger's per-token Tanh shares its class with the LSTMs'; by
    their first levels, its launches and the LSTMs' would read each other, but by their last
    (every token's Tanh in the one launch after the LSTMs) they reach the bound, found in bulk."""
    sentences = [[(f"w{k % 5}", f"t{k % 3}") for k in range(length)] for length in (3, 5, 2, 7)]
    params = bilstm_tagger.make_params(*bilstm_tagger.make_vocabularies(sentences), size=4)
    problem = traced_problem(bilstm_tagger.loss_primitive, sentences, params)
    assert level_groups(problem, problem.level) is None
    late = level_groups(problem, problem.late_level)
    assert late is not None and len(late) == problem.lower_bound()
    check_valid(problem, late)
    assert SCHEDULERS["level"](problem) == late


def test_batched_trees_equal_trees_alone() -> None:
    graphs = [tree_instance(2, True), tree_instance(3, True), chain_instance(3)]
    rng = np.random.default_rng(0)
    feeds = [{name: rng.standard_normal((1, 4)).astype(np.float32) for name in g.inputs} for g in graphs]
    expected = [Interpreter(g).run(f)[0] for g, f in zip(graphs, feeds)]
    for scheduler in SCHEDULERS:
        got, report = run_graphs(graphs, feeds, scheduler=scheduler)
        for (a,), b in zip(got, expected, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        assert report.lower_bound <= report.launches < report.nodes


def test_session_run_batch_reports_launches() -> None:
    session = InferenceSession(onnx.parser.parse_model(ONE_INSTANCE))
    feeds = [{"x": np.full((2, 3), k, np.float32)} for k in range(5)]
    out = session.run_batch(None, feeds)
    for k, f in enumerate(feeds):
        np.testing.assert_allclose(out[k][0], session.run(None, f)[0], rtol=1e-5, atol=1e-6)
    report = session.stats.report
    assert report.nodes == 10 and report.launches == 2 == report.lower_bound


@pytest.mark.parametrize("with_edge", [False, True])
def test_levels_of_independent_nodes_are_one(with_edge: bool) -> None:
    """Nodes with no dependencies (a lockstep round over known values): every batchable node
    is level 1, so the bound is the number of classes plus the unbatchable nodes; one edge
    makes its head level 2 in its class."""
    sig = np.array([0, 1, 0, UNBATCHABLE, 1, 0], dtype=np.int64)
    preds: list[list[int]] = [[], [], [], [], [], [0] if with_edge else []]
    problem = problem_from(list(range(6)), sig, preds, ["a", "b"])
    want = [1, 1, 1, 0, 1, 2 if with_edge else 1]
    assert problem.level.tolist() == want
    assert problem.lower_bound() == (4 if with_edge else 3)


@pytest.mark.parametrize("scheduler", sorted(SCHEDULERS))
def test_a_report_works_its_lower_bound_out_when_asked(scheduler: str) -> None:
    """Only the level scheduler needs the levels; for the others a report's lower bound is
    deferred until read, and then equals the bound worked out at once."""
    graphs = [tree_instance(2, True), tree_instance(3, True), chain_instance(3)]
    rng = np.random.default_rng(0)
    feeds = [{name: rng.standard_normal((1, 4)).astype(np.float32) for name in g.inputs} for g in graphs]
    report = run_graphs(graphs, feeds, scheduler=scheduler)[1]
    assert callable(report.bound) == (scheduler != "level")
    want = build_problem(Graph.union(graphs), lambda node: True).lower_bound()
    assert report.lower_bound == want and report.bound == want


def test_a_deferred_bound_keeps_no_list_a_node_alive() -> None:
    """A report outlives its plan: where the compiled depths pass made the edges, its deferred
    bound holds them as arrays, not the per-node lists of predecessors (each one more object
    for every garbage collection to walk while the report lives), and still works it out."""
    sig = np.array([0, 0, 1, 0], dtype=np.int64)
    preds: list[list[int]] = [[], [0], [1], [2]]
    problem = problem_from(list(range(4)), sig, preds, ["a", "b"])
    bound = problem.deferred_lower_bound()
    held = [cell.cell_contents for cell in bound.__closure__]  # type: ignore[union-attr]
    if SCHEDULING is not None:
        assert not any(value is preds or isinstance(value, list) for value in held)
    assert bound() == problem.lower_bound() == 1 + 3


@pytest.mark.parametrize("seed", range(12))
def test_levels_worked_out_per_instance_equal_those_of_the_whole_problem(seed: int) -> None:
    """With the instances apart (``Problem.parts``), only classes with two nodes in one instance
    run the DP; the others' levels are 1, and every level is what the whole DP gives."""
    union = random_union(seed)
    problem = build_problem(union, lambda node: has_rule(union, node))
    parts = np.array([union.nodes[node_id].instance for node_id in problem.node_ids], dtype=np.int64)
    apart = problem_from(problem.node_ids, problem.sig, problem.preds, problem.classes, parts)
    np.testing.assert_array_equal(apart.level, problem.level)
    np.testing.assert_array_equal(apart.late_level, problem.late_level)
    assert apart.lower_bound() == problem.lower_bound()
    batchable = problem.sig != UNBATCHABLE
    assert ((1 <= problem.level) & (problem.level <= problem.late_level))[batchable].all()


def test_the_level_scheduler_searches_again_only_where_launches_could_pay_for_it(monkeypatch) -> None:
    """After a tie-break's search, another runs only while the launches it could save (down to
    the bound) are worth more than a search of every node: on 32 Tree-LSTMs traced op by op the
    first search comes within a few launches of the bound, and is the only one; on a small
    random problem all three run, and the shortest schedule is kept."""
    searches = []
    search = schedulers._level_schedule
    monkeypatch.setattr(schedulers, "_level_schedule", lambda *args, **kw: searches.append(1) or search(*args, **kw))
    rng = random.Random(0)
    trees = [synthetic_tree(rng) for _ in range(32)]
    big = traced_problem(tree_lstm.loss_primitive, trees, tree_lstm.make_params(tree_lstm.make_vocabulary(trees), 4))
    schedule = SCHEDULERS["level"](big)
    check_valid(big, schedule)
    assert (len(schedule) - big.lower_bound()) * schedulers.NODES_A_LAUNCH_IS_WORTH <= big.size
    assert len(searches) == 1 and len(schedule) < 1.1 * big.lower_bound()
    searches.clear()
    union = random_union(6, instances=6)  # 61 nodes, a bound of 11: the searches give 25, 25 and 22 launches
    small = build_problem(union, lambda node: has_rule(union, node))
    schedule = SCHEDULERS["level"](small)
    check_valid(small, schedule)
    assert len(searches) == 3 and len(schedule) == min(len(search(small, tie_break)) for tie_break in LEVEL_TIE_BREAKS)
    assert len(schedule) < len(search(small, LEVEL_TIE_BREAKS[0]))  # the last search paid for itself


@pytest.mark.parametrize("seed", range(4))
def test_levels_first_and_last_equal_their_definitions_on_random_dags(seed: int) -> None:
    """``Problem.level``: the most nodes of a node's class on a path ending at it; ``late_level``:
    its class's highest level, less the most on a path starting at it, plus one. Both against a
    plain DP over nodes, on random DAGs with repeated reads and unbatchable nodes."""
    rng = random.Random(seed)
    for _ in range(75):
        n, classes = rng.randint(1, 40), rng.randint(1, 4)
        preds = [sorted(rng.sample(range(i), rng.randint(0, min(i, 3)))) + ([rng.randrange(i)] if i and rng.random() < 0.1
                                                                            else []) for i in range(n)]
        sig = [rng.randrange(UNBATCHABLE, classes) for _ in range(n)]
        ending = [[0] * classes for _ in range(n)]  # per node and class: the most of that class on a path ending here
        for i in range(n):
            for p in preds[i]:
                ending[i] = [max(a, b) for a, b in zip(ending[i], ending[p])]
            if sig[i] != UNBATCHABLE:
                ending[i][sig[i]] += 1
        starting = [[0] * classes for _ in range(n)]  # ... on a path starting here
        for i in reversed(range(n)):
            if sig[i] != UNBATCHABLE:
                starting[i][sig[i]] += 1
            for p in preds[i]:
                starting[p] = [max(a, b) for a, b in zip(starting[p], starting[i])]
        level = [ending[i][c] if c != UNBATCHABLE else 0 for i, c in enumerate(sig)]
        highest = [max([level[i] for i in range(n) if sig[i] == c], default=0) for c in range(classes)]
        late = [highest[c] - starting[i][c] + 1 if c != UNBATCHABLE else 0 for i, c in enumerate(sig)]
        problem = problem_from(list(range(n)), np.array(sig, dtype=np.int64), preds,
                               [("", f"op{c}") for c in range(classes)])
        assert problem.level.tolist() == level
        assert problem.late_level.tolist() == late
