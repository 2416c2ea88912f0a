"""The plan lowered to one ONNX graph (``backends.lowering``): what ``InferenceSession.plan_model``
gives and ``autobatch rewrite`` writes equals each instance alone, run by onnxruntime itself."""

from __future__ import annotations

import warnings
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from autobatch import InferenceSession
from autobatch.backends import lowering
from autobatch.ir import from_onnx, to_onnx
from autobatch.tools import batch_one_graph, batched_graph, compute_ops, random_feeds
from benchmarks.rewrite_branches import encoder_branches, lstm_tagger_branches
from tests.cycles import no_cycles_left
from tests.fuzz import instances, random_program
from tests.oracle import assert_same



def run_model(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    wanted = {i.name for i in session.get_inputs()}  # inputs no output reads are pruned
    return dict(zip([o.name for o in session.get_outputs()],
                    session.run(None, {name: value for name, value in feeds.items() if name in wanted})))


@pytest.mark.parametrize("seed", range(0, 600, 10))  # every tenth has an instance without rows
def test_the_lowered_plan_of_a_random_program_equals_each_instance_alone(seed):
    model, _ = random_program(seed)
    rng = np.random.default_rng(seed)
    lengths = [int(n) for n in rng.integers(1, 7, int(rng.integers(2, 7)))]
    lengths[0] = 0 if seed % 20 == 0 else lengths[0]
    batch = instances(rng, lengths)
    session = InferenceSession(model, backend="onnxruntime")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            alone = [session.run(None, feeds) for feeds in batch]
        except Exception:  # noqa: BLE001 - onnxruntime cannot run the program alone: nothing to compare
            pytest.skip("the random program does not run alone on onnxruntime")
    got = run_model(session.plan_model(batch), {f"i{k}/{name}": value for k, feeds in enumerate(batch)
                                                for name, value in feeds.items()})
    for k, outputs in enumerate(alone):
        for name, want in zip(session.graph.outputs, outputs):
            assert_same(got[f"i{k}/{name}"], want, what=f"instance {k} output {name}")


LENGTHS = [3, 7, 1, 5, 4, 6, 2, 5]


@pytest.mark.parametrize("build, at_most", [
    (lambda lengths: lstm_tagger_branches(lengths, 6, 5), {"LSTM": 2, "MatMul": 1}),  # a packed launch a layer
    (lambda lengths: encoder_branches(lengths, 6), {"MatMul": 4 + 2 * len(LENGTHS), "Relu": 1}),  # Q, K, V, F ragged
])
def test_rewrite_of_branches_of_different_lengths_batches_them(build, at_most):
    model = build(LENGTHS)
    graph = from_onnx(model)
    rewritten = batch_one_graph(graph)
    assert rewritten is not graph and compute_ops(rewritten) < compute_ops(graph)
    counts = Counter(node.op_type for node in rewritten.nodes.values())
    for op, most in at_most.items():
        assert counts[op] <= most, counts
    feeds = random_feeds(graph, np.random.default_rng(1))
    want, got = run_model(to_onnx(graph), feeds), run_model(to_onnx(rewritten), feeds)
    assert list(got) == list(want)  # the outputs, in order, by name
    for name in want:
        assert_same(got[name], want[name], what=name)


def with_symbolic_lengths(model: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    """The model with each input's and output's first dimension symbolic: input k's named
    ``names[k % len(names)]``, the outputs' left unnamed."""
    for k, info in enumerate([*model.graph.input, *model.graph.output]):
        dim = info.type.tensor_type.shape.dim[0]
        dim.ClearField("dim_value")
        if k < len(model.graph.input):
            dim.dim_param = names[k % len(names)]
    return model


def assert_equal_at_lengths(model: onnx.ModelProto, batched: onnx.ModelProto, lengths) -> None:
    graph = from_onnx(model)
    for length in lengths:
        feeds = random_feeds(graph, np.random.default_rng(length), {"L": length})
        want, got = run_model(model, feeds), run_model(batched, feeds)
        assert list(got) == list(want)
        for name in want:
            assert_same(got[name], want[name], what=f"{name} at length {length}")


@pytest.mark.parametrize("build, at_most", [
    (lambda lengths: lstm_tagger_branches(lengths, 6, 5), {"LSTM": 2, "MatMul": 1}),
    (lambda lengths: encoder_branches(lengths, 6), {"MatMul": 6, "Softmax": 1, "Relu": 1}),
])
def test_rewrite_of_branches_of_one_symbolic_length_holds_for_every_length(build, at_most):
    """Batched for trial lengths; the constants that hold the length read it from an input."""
    model = with_symbolic_lengths(build([4] * 8), ["L"])
    rewritten = batched_graph(from_onnx(model))
    assert not isinstance(rewritten, str), rewritten
    counts = Counter(node.op_type for node in rewritten.nodes.values())
    for op, most in at_most.items():
        assert counts[op] <= most, counts
    batched = to_onnx(rewritten)
    assert [(v.name, v.type) for v in batched.graph.input] == [(v.name, v.type) for v in model.graph.input]
    assert_equal_at_lengths(model, batched, (1, 2, 9, 64))  # none of them a trial's


def test_rewrite_of_branches_of_two_symbolic_lengths_says_why_it_does_not_batch():
    graph = from_onnx(with_symbolic_lengths(encoder_branches([4] * 8, 6), ["L", "M"]))
    reason = batched_graph(graph)
    assert isinstance(reason, str) and "differs with the sizes of its symbolic dimensions" in reason
    assert batch_one_graph(graph) is graph


def branches(body: str, outputs: str, shared: str = "", count: int = 2) -> onnx.ModelProto:
    """``count`` branches of ``body`` (``{k}`` the branch) over inputs ``x0``, ``x1``, ... of
    ``[L, 3]``, after the ``shared`` lines."""
    inputs = ", ".join(f"float[L, 3] x{k}" for k in range(count))
    return onnx.parser.parse_model(f'<ir_version: 9, opset_import: ["" : 18]>\ng ({inputs}) => ({outputs}) {{\n'
                                   + shared + "\n" + "\n".join(body.format(k=k) for k in range(count)) + "\n}")


def test_a_flattened_length_is_read_as_thrice_the_length():
    """A flattened ``[3L]``: an entry 3L in every trial, computed from L at run time."""
    model = branches("f{k} = Flatten <axis = 0> (x{k})  y{k} = Relu(f{k})", "float[1, M] y0, float[1, M] y1")
    batched = to_onnx(batched_graph(from_onnx(model)))
    assert "Mul" in {node.op_type for node in batched.graph.node}
    for length in (0, 1, 2, 5, 40):
        feeds = {f"x{k}": np.random.default_rng(length + k).standard_normal((length, 3)).astype(np.float32)
                 for k in range(2)}
        for name, want in run_model(model, feeds).items():
            assert_same(run_model(batched, feeds)[name], want, what=f"{name} at length {length}")


def test_entries_are_taken_only_as_a_times_one_symbols_size_plus_b():
    """Over the trials' sizes of L and M: 3L - 1 is a term of L, M + 4 of M; L * L and L + M
    are none, and an entry that only two trials could fit is not guessed."""
    from autobatch.symbolic_sizes import TRIAL_SIZES, _symbols_of_entries

    sizes = [dict(zip(["L", "M"], trial)) for trial in TRIAL_SIZES]
    tensor = onnx.TensorProto(name="c", data_type=onnx.TensorProto.INT64)

    def entries(*terms):
        return _symbols_of_entries(tensor, [np.array([term(t["L"], t["M"]) for term in terms]) for t in sizes], sizes)

    assert entries(lambda L, M: 3 * L - 1, lambda L, M: M + 4, lambda L, M: 7) == [("L", 3, -1), ("M", 1, 4), None]
    for wrong in (lambda L, M: L * L, lambda L, M: L + M, lambda L, M: min(L, 29)):
        reason = entries(wrong)
        assert isinstance(reason, str) and "is no a * size + b of one of them (" in reason, reason


@pytest.mark.parametrize("body", [
    "n{k} = Shape <end = 1> (x{k})  m{k} = Mul(n{k}, three)  r{k} = Relu(x{k})  y{k} = Reshape(r{k}, m{k})",
    "n{k} = Shape <end = 1> (x{k})  c{k} = Min(n{k}, two)  s{k} = Slice(x{k}, zero, c{k})  y{k} = Relu(s{k})",
    "n{k} = Size(x{k})  f{k} = Cast <to = 1> (n{k})  y{k} = Mul(x{k}, f{k})",
])
def test_values_computed_from_shapes_are_not_batched_for_trial_sizes(body):
    """Folded in each trial, ``min(L, 2)`` is 2 at every trial size but the first: taken for a
    constant, a length of 1 would be cut wrong. Such graphs are left as they are."""
    constants = ("three = Constant <value = int64[1] {3}> ()  two = Constant <value = int64[1] {2}> ()  "
                 "zero = Constant <value = int64[1] {0}> ()")
    reason = batched_graph(from_onnx(branches(body, "float[M, N] y0, float[M, N] y1", constants)))
    assert isinstance(reason, str) and "it computes values from shapes (" in reason and "of 'x0')" in reason


@pytest.mark.parametrize("body, outputs", [
    ("y{k} = Squeeze(x{k})", "float[3] y0, float[3] y1"),  # no axes: at L = 1 it squeezes L too
    ("y{k} = Add(x{k}, k)", "float[M, 3] y0, float[M, 3] y1"),  # a broadcast of [L, 3] with [5, 3]: valid at L = 1
])
def test_what_a_size_of_1_changes_is_refused_or_kept(body, outputs):
    model = branches(body, outputs, "k = Constant <value = float[5, 3] {" + ", ".join(["0.5"] * 15) + "}> ()")
    rewritten = batched_graph(from_onnx(model))
    if isinstance(rewritten, str):
        return  # refused: the model as written
    batched = to_onnx(rewritten)
    for length in (1, 5):
        feeds = {f"x{k}": np.full((length, 3), 0.25 * (k + 1), np.float32) for k in range(2)}
        for name, want in run_model(model, feeds).items():
            assert_same(run_model(batched, feeds)[name], want, what=f"{name} at length {length}")


def test_inputs_that_share_a_symbol_must_agree_at_run_time():
    """The original runs each branch at its own length; the rewrite, which reads L once, would
    cut all three branches' rows at the first's length: it fails instead."""
    model = branches("m{k} = MatMul(x{k}, w)  y{k} = Tanh(m{k})", "float[L, 3] y0, float[L, 3] y1, float[L, 3] y2",
                     "w = Constant <value = float[3, 3] {1, 2, 3, 4, 5, 6, 7, 8, 9}> ()", count=3)
    batched = to_onnx(batched_graph(from_onnx(model)))
    feeds = {f"x{k}": np.full((length, 3), 0.1, np.float32) for k, length in enumerate((2, 1, 3))}
    assert [y.shape for y in run_model(model, feeds).values()] == [(2, 3), (1, 3), (3, 3)]  # the original takes it
    with pytest.raises(Exception, match="these_inputs_must_agree_in_size:x0_x1_x2"):
        run_model(batched, feeds)
    same = {name: value[:2] for name, value in feeds.items() if len(value) >= 2} | {"x1": np.full((2, 3), 0.1, np.float32)}
    for name, want in run_model(model, same).items():
        assert_same(run_model(batched, same)[name], want, what=name)


def test_a_mix_seen_again_runs_as_one_onnxruntime_session():
    model = lstm_tagger_branches([4], 6, 5)  # one branch: an instance is a sentence
    session = InferenceSession(model, backend="onnxruntime")
    rng = np.random.default_rng(2)
    batch = [{"x0": rng.standard_normal((4, 1, 6)).astype(np.float32)} for _ in range(3)]
    first = session.run_batch(None, batch)
    assert not session.stats.whole_plan and session.stats.launches > 1  # step by step, the first time
    again = [{"x0": rng.standard_normal((4, 1, 6)).astype(np.float32)} for _ in range(3)]
    second = session.run_batch(None, again)
    assert session.stats.whole_plan and session.stats.launches == 1
    assert "one onnxruntime session" in str(session.stats)
    for outputs, feeds in zip(second, again):
        assert_same(outputs[0], session.run(None, feeds)[0])
    assert not np.allclose(first[0][0], second[0][0])  # this batch's values, not the last one's


def test_a_plan_with_a_step_onnxruntime_cannot_take_stays_step_by_step(caplog):
    model = onnx.parser.parse_model("""<ir_version: 9, opset_import: ["" : 21]> g (float[N, 4] x) => (float[N, 4] y) {
        f = Cast<to = 17>(x)
        y = Cast<to = 1>(f) }""")  # float8 values: onnxruntime's Python API takes none
    session = InferenceSession(model, backend="onnxruntime")
    batch = [{"x": np.full((n, 4), 0.5, np.float32)} for n in (1, 2)]
    with caplog.at_level("INFO", logger="autobatch"):
        for _ in range(3):
            got = session.run_batch(None, batch)
    assert not session.stats.whole_plan
    assert "runs step by step: solo_Cast runs on the NumPy interpreter" in caplog.text
    assert caplog.text.count("runs step by step") == 1  # said once, not every batch
    assert_same(got[1][0], batch[1]["x"])


def test_the_lowered_plan_is_an_ir_graph_of_template_calls(monkeypatch):
    """The lowering builds an IR graph, a call of a template's function a launch, and exports it
    through the IR's export: valid IR, freed once exported (no reference cycles), and run by
    onnxruntime as it is (functions not inlined) it equals the model ``plan_model`` gives."""
    model = lstm_tagger_branches([4], 6, 5)  # one branch: an instance is a sentence, of any length
    for value in (model.graph.input[0], model.graph.output[0]):
        value.type.tensor_type.shape.dim[0].dim_param = "L"
    session = InferenceSession(model, backend="onnxruntime")
    rng = np.random.default_rng(3)
    batch = [{"x0": rng.standard_normal((n, 1, 6)).astype(np.float32)} for n in (4, 2, 5)]
    session.plan_model(batch)  # its templates made
    with no_cycles_left():
        inlined = session.plan_model(batch)
    made = []
    original = lowering.lowered_graph
    monkeypatch.setattr(lowering, "lowered_graph", lambda *args: made.append(original(*args)) or made[-1])
    session.plan_model(batch)
    (graph,) = made
    graph.validate()
    calls = [node for node in graph.nodes.values() if node.domain == lowering.DOMAIN]
    assert calls and {(lowering.DOMAIN, node.op_type) for node in calls} <= graph.functions.keys()
    assert not any(node.domain == lowering.DOMAIN for node in inlined.graph.node)
    feeds = {f"i{k}/{name}": value for k, feeds in enumerate(batch) for name, value in feeds.items()}
    want, got = run_model(inlined, feeds), run_model(to_onnx(graph, check=False), feeds)
    assert list(got) == list(want)
    for name in want:
        assert_same(got[name], want[name], what=name)
