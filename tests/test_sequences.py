"""Recurrent layers over sequences of different lengths (``batcher/sequences.py``): one launch
a layer, chunks of padded sequences, and every instance's result equal to its own run."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import autobatch
from autobatch import Batch, Parameter, TraceError, ops
from autobatch.backends.flat_executor import OrtTemplate
from autobatch.batch import TRACED_TEMPLATES
from autobatch.batcher.plan import Template
from autobatch.batcher import sequences as sequences_module
from autobatch.batcher.sequences import CHUNK, CallCost, chunks

# More members than a chunk holds, lengths in no order, some repeated.
LENGTHS = [3, 1, 5, 3, 2, 9, 4, 12, 1, 7, 5, 6, 2, 11, 8, 3, 10, 4, 6]
D, H = 3, 4
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}  # blocks of rows in W and R


@pytest.fixture(params=["numpy", "onnxruntime"])
def backend(request):
    return request.param


def layer_model(op: str, direction: str, outputs: int, rng: np.random.Generator) -> onnx.ModelProto:
    """One layer over ``x [T, 1, D]`` of any length T, with its weights as initializers."""
    dirs = 2 if direction == "bidirectional" else 1
    gates = GATES[op]
    names = ["Y", "Y_h", "Y_c"][:outputs]
    shapes = {"Y": f"[T, {dirs}, 1, {H}]", "Y_h": f"[{dirs}, 1, {H}]", "Y_c": f"[{dirs}, 1, {H}]"}
    model = onnx.parser.parse_model(f"""<ir_version: 8, opset_import: ["" : 18]>
    g (float[T, 1, {D}] x) => ({", ".join(f"float{shapes[n]} {n}" for n in names)}) {{
        {", ".join(names)} = {op}<hidden_size={H}, direction="{direction}">(x, W, R, B)
    }}""")
    for name, shape in (("W", (dirs, gates * H, D)), ("R", (dirs, gates * H, H)), ("B", (dirs, 2 * gates * H))):
        value = (rng.standard_normal(shape) * 0.5).astype(np.float32)
        model.graph.initializer.append(onnx.numpy_helper.from_array(value, name))
    return model


def sequences(lengths: list[int], rng: np.random.Generator) -> list[dict[str, np.ndarray]]:
    return [{"x": rng.standard_normal((n, 1, D)).astype(np.float32)} for n in lengths]


@pytest.mark.parametrize("op,outputs", [("LSTM", 3), ("LSTM", 1), ("GRU", 2), ("RNN", 2)])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_one_launch_a_layer_whatever_the_lengths(backend, op, outputs, direction):
    rng = np.random.default_rng(len(op) + outputs)
    session = autobatch.InferenceSession(layer_model(op, direction, outputs, rng), backend=backend, node_level=False)
    instances = sequences(LENGTHS, rng)
    batched = session.run_batch(None, instances)
    assert session.stats.report.launches == 1 == session.stats.report.lower_bound
    for instance, got in zip(instances, batched, strict=True):
        for alone, value in zip(session.run(None, instance), got, strict=True):
            assert value.shape == alone.shape
            np.testing.assert_allclose(value, alone, rtol=1e-5, atol=1e-6)


def stated_model(op: str, direction: str, rng: np.random.Generator) -> onnx.ModelProto:
    """A layer whose initial states are inputs of the instance (``h0``, LSTM's ``c0`` too)."""
    dirs = 2 if direction == "bidirectional" else 1
    states = ["h0", "c0"] if op == "LSTM" else ["h0"]
    outputs = ["Y", "Y_h", "Y_c"] if op == "LSTM" else ["Y", "Y_h"]
    shapes = {"Y": f"[T, {dirs}, 1, {H}]", "Y_h": f"[{dirs}, 1, {H}]", "Y_c": f"[{dirs}, 1, {H}]"}
    model = onnx.parser.parse_model(f"""<ir_version: 8, opset_import: ["" : 18]>
    g (float[T, 1, {D}] x, {", ".join(f"float[{dirs}, 1, {H}] {s}" for s in states)})
      => ({", ".join(f"float{shapes[n]} {n}" for n in outputs)}) {{
        {", ".join(outputs)} = {op}<hidden_size={H}, direction="{direction}">(x, W, R, B, , {", ".join(states)})
    }}""")
    gates = GATES[op]
    for name, shape in (("W", (dirs, gates * H, D)), ("R", (dirs, gates * H, H)), ("B", (dirs, 2 * gates * H))):
        model.graph.initializer.append(onnx.numpy_helper.from_array(
            (rng.standard_normal(shape) * 0.5).astype(np.float32), name))
    return model


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_initial_states_of_each_instance_own_pack_across_lengths(backend, op, direction, monkeypatch):
    """Each sequence starts from its own states, stacked a column a sequence in each chunk:
    still one launch a layer, and each result equals its instance alone, run and lowered (in
    calls of at most 4 sequences, so that there are several)."""
    monkeypatch.setattr(sequences_module, "CALL_COST", CallCost(most=4))
    rng = np.random.default_rng(len(op) + len(direction))
    model = stated_model(op, direction, rng)
    session = autobatch.InferenceSession(model, backend=backend)
    dirs = 2 if direction == "bidirectional" else 1
    states = [i.name for i in model.graph.input][1:]
    instances = [{"x": rng.standard_normal((n, 1, D)).astype(np.float32),
                  **{s: rng.standard_normal((dirs, 1, H)).astype(np.float32) for s in states}} for n in LENGTHS]
    batched = session.run_batch(None, instances)
    assert session.stats.report.launches == 1, session.stats.report
    lowered = session.plan_model(instances)
    dirs_flops = 2.0 * dirs * GATES[op] * H * (D + H)
    calls = len(sequences_module.CALL_COST.chunks(np.array(LENGTHS), dirs_flops))
    assert calls >= -(-len(LENGTHS) // 4) and sum(node.op_type == op for node in lowered.graph.node) == calls
    ort_session = ort.InferenceSession(lowered.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {f"i{k}/{name}": value for k, instance in enumerate(instances) for name, value in instance.items()}
    names = [o.name for o in ort_session.get_outputs()]
    got_lowered = dict(zip(names, ort_session.run(None, {i.name: feeds[i.name] for i in ort_session.get_inputs()})))
    for k, (instance, got) in enumerate(zip(instances, batched, strict=True)):
        for name, alone, value in zip(session.graph.outputs, session.run(None, instance), got, strict=True):
            np.testing.assert_allclose(value, alone, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(got_lowered[f"i{k}/{name}"], alone, rtol=1e-5, atol=1e-6)


def test_empty_sequences_among_others_get_zero_states(backend):
    """A sequence of length 0 is packed with the others but needs no call: its final states are
    zeros, as ONNX defines them, run and lowered (its empty ``Y`` a constant of the lowered
    graph). The reference is each instance alone on NumPy: onnxruntime alone leaves an empty
    sequence's final states uninitialized (whatever its memory held)."""
    rng = np.random.default_rng(6)
    model = layer_model("LSTM", "forward", 3, rng)
    session = autobatch.InferenceSession(model, backend=backend)
    reference = autobatch.InferenceSession(model, backend="numpy")
    instances = sequences([3, 0, 2, 0, 5], rng)
    lowered = ort.InferenceSession(session.plan_model(instances).SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {f"i{k}/{name}": value for k, instance in enumerate(instances) for name, value in instance.items()}
    got_lowered = dict(zip([o.name for o in lowered.get_outputs()],
                           lowered.run(None, {i.name: feeds[i.name] for i in lowered.get_inputs()})))
    for k, (instance, got) in enumerate(zip(instances, session.run_batch(None, instances), strict=True)):
        for name, alone, value in zip(session.graph.outputs, reference.run(None, instance), got, strict=True):
            assert value.shape == got_lowered[f"i{k}/{name}"].shape == alone.shape
            np.testing.assert_allclose(value, alone, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(got_lowered[f"i{k}/{name}"], alone, rtol=1e-5, atol=1e-6)
    assert session.stats.report.launches == 1


def test_layers_read_by_onnx_reference_agree():
    """The oracle is onnx.reference, run on the model one instance at a time."""
    from onnx.reference import ReferenceEvaluator

    rng = np.random.default_rng(1)
    model = layer_model("LSTM", "bidirectional", 3, rng)
    instances = sequences(LENGTHS, rng)
    session = autobatch.InferenceSession(model, backend="onnxruntime")
    oracle = ReferenceEvaluator(model)
    for instance, got in zip(instances, session.run_batch(None, instances), strict=True):
        for want, value in zip(oracle.run(None, instance), got, strict=True):
            np.testing.assert_allclose(value, want, rtol=1e-5, atol=1e-5)


def test_chunks_cover_every_row_once_longest_first():
    parts = chunks(LENGTHS)
    assert [len(p.members) for p in parts] == [CHUNK, CHUNK, len(LENGTHS) - 2 * CHUNK]
    lengths = [int(n) for p in parts for n in p.lengths]
    assert lengths == sorted(LENGTHS, reverse=True)
    real = np.concatenate([p.targets for p in parts])
    assert sorted(real.tolist()) == list(range(sum(LENGTHS)))  # every row read once
    for p in parts:  # a chunk is as long as its first member; padding reads the row past the last
        assert len(p.source) == p.lengths[0] * len(p.members)
        padded = np.ones(len(p.source), dtype=bool)
        padded[p.time * len(p.members) + p.column] = False
        assert np.all(p.source[padded] == sum(LENGTHS))
        np.testing.assert_array_equal(p.source[~padded], p.targets)


# ----------------------------------------------------------------------------- traced: ops.lstm
def numpy_lstm(x: np.ndarray, W: np.ndarray, R: np.ndarray, B: np.ndarray, reverse: bool) -> np.ndarray:
    """ONNX's LSTM for one direction, written out: gates i, o, f, c."""
    h = np.zeros(R.shape[1], dtype=np.float64)
    c = np.zeros_like(h)
    states = np.zeros((len(x), R.shape[1]))
    hidden = R.shape[1]
    for t in reversed(range(len(x))) if reverse else range(len(x)):
        gates = W @ x[t] + R @ h + B[:4 * hidden] + B[4 * hidden:]
        i, o, f, g = np.split(gates, 4)
        c = 1 / (1 + np.exp(-f)) * c + 1 / (1 + np.exp(-i)) * np.tanh(g)
        h = 1 / (1 + np.exp(-o)) * np.tanh(c)
        states[t] = h
    return states


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_traced_lstm_equals_the_layer_written_out(backend, direction):
    rng = np.random.default_rng(2)
    dirs = 2 if direction == "bidirectional" else 1
    W, R, B = (Parameter((rng.standard_normal(shape) * 0.5).astype(np.float32))
               for shape in ((dirs, 4 * H, D), (dirs, 4 * H, H), (dirs, 8 * H)))
    table = Parameter(rng.standard_normal((20, D)).astype(np.float32))
    words = [rng.integers(0, 20, n).tolist() for n in LENGTHS]
    with Batch(backend=backend) as batch:
        results = [ops.lstm(ops.lookup(table, w), W, R, B, direction=direction) for w in words]
        batch.run([t for pair in results for t in pair])
    assert batch.reports[-1].launches == 5  # Gather, Unsqueeze, LSTM, Flatten, Reshape
    for w, (states, last) in zip(words, results, strict=True):
        x = table.array[w].astype(np.float64)
        ways = [numpy_lstm(x, W.array[d], R.array[d], B.array[d], direction == "reverse" or d == 1)
                for d in range(dirs)]
        np.testing.assert_allclose(states.value, np.concatenate(ways, axis=1), rtol=1e-4, atol=1e-5)
        finals = [way[0] if direction == "reverse" or d == 1 else way[-1] for d, way in enumerate(ways)]
        np.testing.assert_allclose(last.value, np.concatenate(finals), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op,extra", [("LSTM", {}), ("GRU", {}), ("GRU", {"linear_before_reset": True}),
                                      ("RNN", {})])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_traced_layers_equal_onnx_reference_per_instance(op, extra, direction):
    """``ops.lstm``, ``ops.gru`` and ``ops.rnn`` batched on onnxruntime, against onnx.reference
    running the ONNX node on each instance alone."""
    from onnx.reference import ReferenceEvaluator

    rng = np.random.default_rng(4)
    dirs, gates = 2 if direction == "bidirectional" else 1, GATES[op]
    W, R, B = (Parameter((rng.standard_normal(shape) * 0.5).astype(np.float32))
               for shape in ((dirs, gates * H, D), (dirs, gates * H, H), (dirs, 2 * gates * H)))
    inputs = [rng.standard_normal((n, D)).astype(np.float32) for n in LENGTHS]
    layer = {"LSTM": ops.lstm, "GRU": ops.gru, "RNN": ops.rnn}[op]
    with Batch(backend="onnxruntime") as batch:
        results = [layer(batch.constant(x), W, R, B, direction=direction, **extra) for x in inputs]
        batch.run([t for pair in results for t in pair])
    assert batch.reports[-1].launches == 4  # Unsqueeze, the layer, Flatten, Reshape
    attributes = {"hidden_size": H, "direction": direction, **{k: int(v) for k, v in extra.items()}}
    node = onnx.helper.make_node(op, ["X", "W", "R", "B"], ["Y", "Y_h"], **attributes)
    graph = onnx.helper.make_graph([node], "layer", [onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None)
                                                     for name in ("X", "W", "R", "B")],
                                   [onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None)
                                    for name in ("Y", "Y_h")])
    oracle = ReferenceEvaluator(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)]))
    for x, (states, last) in zip(inputs, results, strict=True):
        y, y_h = oracle.run(None, {"X": x[:, None, :], "W": W.array, "R": R.array, "B": B.array})
        np.testing.assert_allclose(states.value, y.reshape(len(x), -1), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(last.value, y_h.reshape(-1), rtol=1e-5, atol=1e-5)


def test_traced_lstm_refuses_wrong_shapes_by_name():
    W, R = Parameter(np.zeros((1, 16, 3), np.float32)), Parameter(np.zeros((1, 16, 4), np.float32))
    with Batch():
        x = ops.lookup(Parameter(np.zeros((5, 3), np.float32)), [0, 1])
        ops.lstm(x, W, R, Parameter(np.zeros((1, 32), np.float32)))  # B is [dirs, 8h]
        with pytest.raises(TraceError, match=r"LSTM \(forward, gates i, o, f, c\) over x \(2, 3\).*\(1, 32\).*\(1, 16\)"):
            ops.lstm(x, W, R, Parameter(np.zeros((1, 16), np.float32)))
        with pytest.raises(TraceError, match="x must be"):
            ops.lstm(ops.lookup(Parameter(np.zeros((5, 3), np.float32)), 0), W, R)
        with pytest.raises(TraceError, match="direction must be"):
            ops.lstm(x, W, R, direction="backward")
        # A layer's checks are kept by its shapes but the length: an empty sequence still fails.
        ops.lstm(x, W, R)
        with pytest.raises(TraceError, match=r"x must be \[n, d\] \(n > 0\)"):
            ops.lstm(ops.lookup(Parameter(np.zeros((5, 3), np.float32)), []), W, R)


def test_lookup_of_many_rows_refuses_bad_indices():
    table = Parameter(np.zeros((5, 3), np.float32))
    with Batch():
        assert ops.lookup(table, [4, 0, -5]).shape == (3, 3)
        with pytest.raises(TraceError, match=r"out of range for shape \(5, 3\)"):
            ops.lookup(table, [1, 5])
        with pytest.raises(TraceError, match="sequence of ints"):
            ops.lookup(table, [[1, 2]])
        with pytest.raises(TraceError, match="sequence of ints"):
            ops.lookup(table, [0.5])
        with pytest.raises(TraceError, match=r"indices -6\.\.0 are out of range"):
            ops.lookup(table, [0, -6])
        with pytest.raises(TraceError, match=r"indices 0\.\.5 are out of range"):  # a long list: NumPy's bounds
            ops.lookup(table, [0] * 70 + [5])


def test_rows_looked_up_by_an_array_are_those_it_held_when_traced():
    """The batch keeps a copy of the ids (and labels): an array the caller changes after tracing
    does not change what runs."""
    table = Parameter(np.arange(15, dtype=np.float32).reshape(5, 3))
    ids, labels = np.array([1, 2], np.int64), np.array([0, 2], np.int64)
    with Batch() as batch:
        rows = ops.lookup(table, ids)
        loss = ops.softmax_cross_entropy(rows, labels)
        ids[0], labels[0] = 4, 1
        got_rows, got_loss = batch.run([rows, loss])
    np.testing.assert_array_equal(got_rows, table.array[[1, 2]])
    scores = table.array[[1, 2]].astype(np.float64)
    expected = -(scores - np.log(np.exp(scores).sum(1, keepdims=True)))[[0, 1], [0, 2]].sum()
    np.testing.assert_allclose(got_loss, expected, rtol=1e-5)


# ----------------------------------------------------------------------------- weights baked in
@pytest.mark.parametrize("most", [CallCost.most, CHUNK])
def test_lstm_weights_are_baked_and_never_read_stale(monkeypatch, most):
    """onnxruntime packs an LSTM's W and R when they are constants: they are baked in from the
    second run on, whether the step is one call or several (calls of at most 8 sequences: three),
    and one changed in place after a run is read anew (``backends.baked_weights``)."""
    monkeypatch.setattr(sequences_module, "CALL_COST", CallCost(most=most))
    rng = np.random.default_rng(3)
    width = 64  # R is 64 KiB: big enough to bake
    W = Parameter((rng.standard_normal((1, 4 * width, width)) * 0.1).astype(np.float32))
    R = Parameter((rng.standard_normal((1, 4 * width, width)) * 0.1).astype(np.float32))
    inputs = [rng.standard_normal((n, width)).astype(np.float32) for n in LENGTHS]
    templates: list[OrtTemplate] = []

    def run() -> list[np.ndarray]:
        with Batch(backend="onnxruntime") as batch:
            states = [ops.lstm(batch.constant(x), W, R)[0] for x in inputs]
            values = batch.run(states)
        templates[:] = [r for t in TRACED_TEMPLATES.templates.values() if isinstance(t, Template) and t.sequences
                        for r in t.runners.values() if isinstance(r, OrtTemplate)]
        return values

    first = run()  # meets the weights: their snapshots are taken
    for again, before in zip(run(), first, strict=True):  # baked in
        np.testing.assert_array_equal(again, before)
    assert any(t.baked_sessions for t in templates)
    R.array *= 0.5  # in place
    second = run()
    for x, before, after in zip(inputs, first, second, strict=True):
        zeros = np.zeros(8 * width)
        np.testing.assert_allclose(before, numpy_lstm(x, W.array[0], R.array[0] * 2, zeros, False), rtol=1e-4,
                                   atol=1e-5)
        np.testing.assert_allclose(after, numpy_lstm(x, W.array[0], R.array[0], zeros, False), rtol=1e-4, atol=1e-5)


def _modelled(cost: CallCost, lengths: np.ndarray, calls: list[np.ndarray], row_flops: float) -> float:
    return sum(cost.call + lengths[c].max() * (cost.step + len(c) * row_flops / cost.flops) for c in calls)


@pytest.mark.parametrize("most, call", [(5, 1e-4), (3, 1e-4), (2, 1e-6), (4, 1e-3)])
@pytest.mark.parametrize("row_flops", [1e3, 4e5, 2e6, 5e7])
def test_calls_by_cost_are_the_cheapest_modelled(row_flops, most, call):
    """Over sequences sorted longest first, the calls the cost model picks cost no more (as it
    models them) than any other way of cutting them into calls, every one tried; each nonempty
    sequence is in one call, none holds more than ``most``, an empty one in none. (A small
    ``most``, so that full calls start off a run's start.)"""
    import itertools

    rng = np.random.default_rng(int(row_flops) + most)
    cost = CallCost(call=call, most=most)
    for _ in range(40):
        lengths = rng.integers(0, int(rng.choice([4, 16])), size=int(rng.integers(1, 11)))
        calls = cost.chunks(lengths, row_flops)
        members = np.concatenate(calls) if calls else np.zeros(0, dtype=np.int64)
        assert sorted(members.tolist()) == np.flatnonzero(lengths > 0).tolist()
        assert all(len(c) <= cost.most for c in calls)
        assert [int(lengths[c].max()) for c in calls] == sorted((int(lengths[c].max()) for c in calls), reverse=True)
        order = np.argsort(-lengths, kind="stable")
        order = order[lengths[order] > 0]
        best = min((_modelled(cost, lengths, [order[a:b] for a, b in zip((0, *cuts), (*cuts, len(order)))], row_flops)
                    for k in range(len(order)) for cuts in itertools.combinations(range(1, len(order)), k)
                    if all(b - a <= cost.most for a, b in zip((0, *cuts), (*cuts, len(order))))), default=0.0)
        assert _modelled(cost, lengths, calls, row_flops) <= best + 1e-12


def test_calls_grow_where_steps_are_cheap_and_lengths_alike():
    """Many short sequences of a small layer go in a few large calls; a large layer's sequences
    of very different lengths in several, so that the short ones are not padded to the long."""
    cost = CallCost()
    alike = np.repeat([9, 8, 7, 6], 100)
    assert len(cost.chunks(alike, 4e5)) <= 4
    spread = np.array([60, 55, 50, 44, 30, 25, 22, 20, 18, 17, 16, 15, 12, 10, 9, 8, 7, 6, 5, 5] * 3)
    calls = cost.chunks(spread, 2e6)
    assert len(calls) >= 3 and max(len(c) for c in calls) < len(spread)
    assert len(cost.chunks(np.full(1000, 3), 4e5)) == -(-1000 // cost.most)  # at most ``most`` a call
    long = cost.chunks(np.full(40, 2000), 4e5)  # at most ``rows`` padded rows a call
    assert all(len(c) * 2000 <= cost.rows for c in long) and len(long) == -(-40 // (cost.rows // 2000))


def test_a_layer_of_unknown_width_runs_in_fixed_chunks():
    """Where the template does not say its weights' shapes (so neither its arithmetic), the
    calls are chunks of ``CHUNK``; where it does, the cost model's."""
    from autobatch.batcher.plan import Step
    from autobatch.batcher.sequences import COST, row_step_flops
    from autobatch.ir import Graph, ValueType

    def template(weights: tuple) -> Template:
        graph = Graph("layer", {"": 18})
        graph.add_input("x0", ValueType.tensor(np.float32, ("T", "N", D)))
        for name, shape in zip(("w1", "w2"), weights):
            graph.add_input(name, ValueType.tensor(np.float32, shape))
        graph.add_node("LSTM", ["x0", "w1", "w2"], ["y"], {"hidden_size": H})
        graph.add_output("y")
        return Template(graph, [0], [1, 2], once=False, sequences=(0,))

    groups = [(5, 40)]  # 40 sequences of 5 steps: one call by cost (a tiny layer), five in chunks of 8
    unknown = template(((1, "G", D), (1, 4 * H, H)))
    assert row_step_flops(unknown) is None
    assert [len(p.members) for p in Step(unknown, 40, [], [], [], groups=groups).chunked(COST)] == [CHUNK] * 5
    known = template(((1, 4 * H, D), (1, 4 * H, H)))
    assert row_step_flops(known) == 2.0 * 4 * H * (D + H)
    assert [len(p.members) for p in Step(known, 40, [], [], [], groups=groups).chunked(COST)] == [40]
