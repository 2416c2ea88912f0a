"""InferenceSession: run one, run_batch many (with different shapes), stats, errors; the demo."""

from __future__ import annotations

import gc
import re
import subprocess
import sys
import weakref
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnx
import pytest

import autobatch
import autobatch.typed_instances
from autobatch.backends import FeedError
from autobatch.batcher.plan import Template
from autobatch.examples.ray_serve import MODEL_TEXT
from autobatch.feed_keys import input_signature
from autobatch.ir.recent import Budgeted
from tests.cycles import no_cycles_left

MODEL = onnx.parser.parse_model(MODEL_TEXT)  # a tiny tagger: x has a length of its own


def feeds(lengths, seed=0):
    rng = np.random.default_rng(seed)
    return [{"x": (0.1 * rng.standard_normal((n, 4))).astype(np.float32),
             "b": rng.standard_normal(4).astype(np.float32)} for n in lengths]


@pytest.fixture(params=["numpy", "onnxruntime"])
def backend(request):
    return request.param


@pytest.mark.parametrize("scheduler", ["depth", "agenda", "level"])
def test_run_batch_equals_run_alone_for_different_lengths(scheduler, backend):
    session = autobatch.InferenceSession(MODEL, backend=backend, scheduler=scheduler)
    instances = feeds([2, 3, 2, 2, 5, 3])
    batched = session.run_batch(None, instances)
    for instance, outputs in zip(instances, batched, strict=True):
        for alone, got in zip(session.run(None, instance), outputs, strict=True):
            assert got.dtype == alone.dtype and got.shape == alone.shape
            np.testing.assert_allclose(got, alone, rtol=1e-5, atol=1e-6)
    report = session.stats.report
    assert report.lower_bound <= report.launches < report.nodes
    assert report.fallback_nodes == 0


def test_a_new_mix_of_known_shapes_reuses_each_instances_records(backend):
    """A batch is put together from records kept per input signature: a new mix of shapes seen
    before types no graph and builds no union, and still equals each instance run alone."""
    session = autobatch.InferenceSession(MODEL, backend=backend)
    session.run_batch(None, feeds([2, 3]))
    typed, pieces = dict(session.instances.typed), dict(session.instances.records)
    instances = feeds([3, 2, 3, 3, 2], seed=1)  # a mix not seen before
    batched = session.run_batch(None, instances)
    assert not session.stats.plan_cached
    assert session.instances.typed == typed
    assert session.instances.records.keys() == pieces.keys()
    assert all(session.instances.records[key] is piece for key, piece in pieces.items())
    for instance, outputs in zip(instances, batched, strict=True):
        for alone, got in zip(session.run(None, instance), outputs, strict=True):
            np.testing.assert_allclose(got, alone, rtol=1e-5, atol=1e-6)


def test_graphs_typed_for_different_shapes_share_their_equal_constants():
    """A mix finds what every instance shares by identity (``instances.mix_records``), not by comparing
    each constant of each instance each batch: the graph typed for each input signature holds
    the first signature's array of an equal constant (a Constant node is made anew each time)."""
    model = onnx.parser.parse_model("""<ir_version: 8, opset_import: ["" : 18]>
    g (float[N, 4] x) => (float[N, 4] y) { c = Constant<value = float[4] {1.0, 2.0, 3.0, 4.0}>()
    y = Mul(x, c) }""")
    session = autobatch.InferenceSession(model)
    session.run_batch(None, [{"x": np.ones((n, 4), np.float32)} for n in (2, 3)])
    first, second = (graph.values["c"].const for graph in session.instances.typed.values())
    assert first is second


def test_a_mix_signs_each_instances_own_constants_as_its_weights_would(backend):
    """Position ids folded per length are each instance's own constants: a mix's record keys
    name them by value (equal lengths share them) and sign them as ``_signed`` signs entries
    over the mix's weights (``InstanceRecords.signed`` works it out once per constant)."""
    from autobatch.backends.interpreter import check_feeds
    from autobatch.batcher.instances import _signed, mix_records

    model = onnx.parser.parse_model("""<ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 4] x) => (float[N, 4] y) {
        s = Shape <start = 0, end = 1> (x)
        n = Squeeze(s)
        zero = Constant <value = int64 {0}> ()
        one = Constant <value = int64 {1}> ()
        ids = Range(zero, n, one)
        f = Cast <to = 1> (ids)
        axes = Constant <value = int64[1] {1}> ()
        col = Unsqueeze(f, axes)
        y = Add(x, col)
    }""")
    session = autobatch.InferenceSession(model, backend=backend)
    instances = [{"x": np.full((n, 4), n, np.float32)} for n in (2, 3, 2, 5)]
    for _ in range(2):  # the second mix reads what the first worked out
        records, _, weights = mix_records([session.instances.records_of(check_feeds(session.graph, f)) for f in instances])
        own = [r for r in records if any(type(e) is str and "#" in e for e in r.entries)]
        assert len(own) == len(instances)
        assert all(r.key[3] == _signed(r.entries, weights) for r in records)
        assert own[0].entries == own[2].entries != own[1].entries  # lengths 2 and 2 share theirs
    for instance, outputs in zip(instances, session.run_batch(None, instances), strict=True):
        np.testing.assert_array_equal(outputs[0], instance["x"] + np.arange(len(instance["x"]), dtype=np.float32)[:, None])


def test_a_constant_of_zero_is_not_shared_with_another_instances_minus_zero(backend):
    """A constant folded from the shape is +0.0 for length 2 and -0.0 for length 5: equal as
    numbers, not as constants (``x + c`` of x = -0.0 keeps c's sign). Sharing instance 0's
    constant with the others gave the length-5 instance +0.0."""
    model = onnx.parser.parse_model("""<ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 4] x) => (float[N, 4] y) {
        s = Shape <start = 0, end = 1> (x)
        three = Constant <value = int64[1] {3}> ()
        d = Sub(s, three)
        f = Cast <to = 1> (d)
        z = Constant <value = float {-0.0}> ()
        c = Mul(f, z)
        y = Add(x, c)
    }""")
    session = autobatch.InferenceSession(model, backend=backend)
    instances = [{"x": np.full((n, 4), -0.0, np.float32)} for n in (2, 5, 2, 5)]
    for instance, outputs in zip(instances, session.run_batch(None, instances), strict=True):
        np.testing.assert_array_equal(np.signbit(outputs[0]), np.signbit(session.run(None, instance)[0]))
        assert np.signbit(outputs[0]).all() == (len(instance["x"]) == 5)


def test_caches_keep_only_the_most_recent_shapes_and_mixes(backend, monkeypatch):
    """A server meets ever new shapes: what a session keeps per shape and per mix is bounded,
    and a shape or mix forgotten is planned again, with the same results."""
    monkeypatch.setattr(autobatch.typed_instances, "SHAPES_KEPT", 3)
    monkeypatch.setattr(autobatch.session, "PLANS_KEPT", 2)
    session = autobatch.InferenceSession(MODEL, backend=backend)
    for lengths in ([1, 2], [3, 4], [5, 6], [1, 2], [7, 2], [3, 1]):  # plans of 10 records
        instances = feeds(lengths, seed=sum(lengths))
        for instance, outputs in zip(instances, session.run_batch(None, instances), strict=True):
            for alone, got in zip(session.run(None, instance), outputs, strict=True):
                np.testing.assert_allclose(got, alone, rtol=1e-5, atol=1e-6)
        assert len(session.instances.typed) <= 3 and len(session.instances.records) <= 3
        assert len(session._flat_plans) <= 2


def test_kept_plans_are_bounded_by_their_records(backend, monkeypatch):
    """Plans of a big model are kept by what they hold, not only by how many they are."""
    monkeypatch.setattr(autobatch.session, "PLAN_RECORDS_KEPT", 25)
    session = autobatch.InferenceSession(MODEL, backend=backend, alone_when_faster=False)
    for lengths in ([1, 2], [3, 4], [5, 6], [1, 2, 3], [7, 2]):  # plans of 10 and 15 records
        session.run_batch(None, feeds(lengths))
        assert sum(entry.plan.report.nodes for entry in session._flat_plans.values()) <= 25
    assert [mix for _, mix in session._flat_plans] == [(*map(input_signature, feeds([1, 2, 3])),),
                                                       (*map(input_signature, feeds([7, 2])),)]  # (by outputs and mix)


def test_threads_sharing_a_session_get_right_results(backend, monkeypatch):
    """Several threads batching through one session at once (small caches: entries are evicted
    while others read them)."""
    monkeypatch.setattr(autobatch.typed_instances, "SHAPES_KEPT", 2)
    monkeypatch.setattr(autobatch.session, "PLANS_KEPT", 2)
    session = autobatch.InferenceSession(MODEL, backend=backend)
    rng = np.random.default_rng(0)
    work = [feeds(rng.integers(1, 6, 4).tolist(), seed=k) for k in range(24)]
    expected = [[session.run(None, instance) for instance in instances] for instances in work]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda instances: session.run_batch(None, instances), work))
    for got_batch, want_batch in zip(results, expected, strict=True):
        for got, want in zip(got_batch, want_batch, strict=True):
            for g, w in zip(got, want, strict=True):
                np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_recent_keeps_the_most_recently_used():
    recent = autobatch.ir.Recent(2)
    recent["a"], recent["b"] = 1, 2
    assert recent.get("a") == 1  # "a" used: "b" is now the oldest
    recent["c"] = 3
    assert list(recent) == ["a", "c"] and recent.get("b") is None
    recent["a"] = 4  # setting uses an entry too
    recent["d"] = 5
    assert list(recent) == ["a", "d"] and recent.get("a") == 4


def test_budgeted_keeps_the_most_recent_within_their_cost():
    kept = Budgeted(10, budget=5, cost=len)
    kept["a"], kept["b"] = "xx", "yy"
    assert kept.get("a") == "xx"  # "a" used: "b" is now the oldest
    kept["c"] = "zz"  # 6 > 5: the oldest goes
    assert list(kept) == ["a", "c"] and kept.total == 4
    kept["a"] = "x"  # set again: its old cost is no longer counted
    assert kept.total == 3 and list(kept) == ["c", "a"]
    kept["big"] = "y" * 9  # the newest stays whatever it costs
    assert list(kept) == ["big"] and kept.total == 9


CONSTANT_OUTPUTS = onnx.parser.parse_model("""<ir_version: 8, opset_import: ["" : 18]>
g (float[N, 4] x) => (float[N, 4] y, float[2] k, float[3] c) <float[2] k = {1.0, 2.0}> {
    y = Tanh(x)
    c = Constant<value = float[3] {5.0, 6.0, 7.0}>()
}""")


def test_outputs_that_are_constants_come_back_for_every_instance(backend):
    session = autobatch.InferenceSession(CONSTANT_OUTPUTS, backend=backend)
    instances = [{"x": np.full((n, 4), 0.5, np.float32)} for n in (2, 3)]
    for instance, (y, k, c) in zip(instances, session.run_batch(None, instances), strict=True):
        np.testing.assert_allclose(y, np.tanh(instance["x"]), rtol=1e-6)
        np.testing.assert_array_equal(k, [1.0, 2.0])
        np.testing.assert_array_equal(c, [5.0, 6.0, 7.0])


def test_stats_describe_the_last_run(backend):
    session = autobatch.InferenceSession(MODEL, backend=backend)
    session.run_batch(["s"], feeds([2, 2, 2, 2]))
    stats = session.stats
    assert stats.instances == 4
    # Same shapes: each of the 5 ops runs once for all four instances, reading the inputs
    # directly where they are already stacked in order.
    assert stats.report.nodes == 20 and stats.report.launches == 5 == stats.report.lower_bound
    assert {"build", "analyse", "schedule", "plan", "execute"} <= set(stats.seconds)
    # run step by step: what its gathers, kernels and writes took of ``execute``
    assert set(stats.execution) == {"gather", "kernels", "scatter"}
    assert 0 < sum(stats.execution.values()) <= stats.seconds["execute"]
    assert "launches" in str(stats) and "kernels" in str(stats)
    assert not stats.plan_cached


def test_a_repeated_plan_is_reused(backend):
    session = autobatch.InferenceSession(MODEL, backend=backend)
    first = feeds([2, 3, 2])
    expected = session.run_batch(None, first)
    assert not session.stats.plan_cached
    for seed in (1, 2, 3):  # same shapes, new values
        again = feeds([2, 3, 2], seed=seed)
        got = session.run_batch(None, again)
        assert session.stats.plan_cached and "build" not in session.stats.seconds
        for instance, outputs in zip(again, got):
            for alone, value in zip(session.run(None, instance), outputs):
                np.testing.assert_allclose(value, alone, rtol=1e-5, atol=1e-6)
    if backend == "onnxruntime":  # from the second use on: one whole-plan session call
        assert session.stats.launches == 1 and session.stats.whole_plan
    assert len(expected) == 3


def test_a_plan_runs_as_one_session_from_its_first_use_where_asked():
    """On CUDA a plan runs as one onnxruntime session from its first use (``whole_plan_after``
    1), keeping values on the device between steps; the same on the CPU provider here."""
    session = autobatch.InferenceSession(MODEL, backend="onnxruntime")
    assert session.whole_plan_after == 2  # the CPU's default
    session.whole_plan_after = 1
    for lengths in ([2, 3, 2], [4, 1]):  # each mix new
        instances = feeds(lengths, seed=len(lengths))
        got = session.run_batch(None, instances)
        assert session.stats.whole_plan and session.stats.launches == 1 and not session.stats.plan_cached
        for instance, outputs in zip(instances, got, strict=True):
            for alone, value in zip(session.run(None, instance), outputs, strict=True):
                np.testing.assert_allclose(value, alone, rtol=1e-5, atol=1e-6)


def test_a_sessions_templates_go_with_it(backend):
    """Templates (and the onnxruntime sessions prepared for them) belong to the session that
    planned them, not to a module: nothing keeps them once the session is gone."""
    session = autobatch.InferenceSession(MODEL, backend=backend)
    session.run_batch(None, feeds([2, 3]))
    kept = [weakref.ref(t) for t in session.templates.templates.values() if isinstance(t, Template)]
    assert kept
    other = autobatch.InferenceSession(MODEL, backend=backend)
    other.run_batch(None, feeds([2, 3]))
    assert not {id(t) for t in other.templates.templates.values()} & {id(ref()) for ref in kept}
    del session
    gc.collect()
    assert [ref for ref in kept if ref() is not None] == []


def test_a_new_mix_of_known_shapes_builds_no_template(backend):
    session = autobatch.InferenceSession(MODEL, backend=backend)
    session.run_batch(None, feeds([2, 3]))
    templates = dict(session.templates.templates)
    mix = feeds([3, 2, 3, 3], seed=4)  # a plan of its own, from instance shapes seen before
    got = session.run_batch(None, mix)
    assert not session.stats.plan_cached
    assert session.templates.templates.keys() == templates.keys()
    assert all(session.templates.templates[k] is templates[k] for k in templates)
    for instance, outputs in zip(mix, got):
        for alone, value in zip(session.run(None, instance), outputs):
            np.testing.assert_allclose(value, alone, rtol=1e-5, atol=1e-6)


def test_selected_outputs_and_order(backend):
    session = autobatch.InferenceSession(MODEL, backend=backend)
    instances = feeds([3, 1])
    batched = session.run_batch(["s", "y"], instances)
    for instance, (s, y) in zip(instances, batched):
        alone_y, alone_s = session.run(None, instance)
        np.testing.assert_allclose(s, alone_s, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(y, alone_y, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("node_level", [True, False])
def test_a_mix_run_again_for_other_outputs_gives_those_outputs(backend, node_level):
    """A plan is kept for a mix and the outputs it computes: the same mix asked for other
    outputs (fewer, or in another order), step by step and as one session, gives those, not the
    kept plan's (a plan kept by the mix alone handed back its own outputs, shifted)."""
    session = autobatch.InferenceSession(MODEL, backend=backend, node_level=node_level, alone_when_faster=False)
    instances = feeds([3, 1, 2])
    alone = [dict(zip(["y", "s"], session.run(None, instance))) for instance in instances]
    for names in (None, None, ["s"], ["s"], ["s"], ["s", "y"], None, ["y"], ["s", "y"]):
        got = session.run_batch(names, instances)
        for expected, outputs in zip(alone, got, strict=True):
            assert len(outputs) == len(names or ["y", "s"])
            for name, value in zip(names or ["y", "s"], outputs, strict=True):
                assert value.shape == expected[name].shape, (names, name)
                np.testing.assert_allclose(value, expected[name], rtol=1e-5, atol=1e-6)


def test_one_instance_run_again_for_other_outputs_gives_those_outputs():
    """``run`` of an instance whose recurrent layer gets no steps goes the flat path on
    onnxruntime (onnxruntime aborts there): its plan too is kept under its outputs, so asking
    for another output gives that one (found by a review: it gave the first's)."""
    from onnx import helper, numpy_helper

    from tests.test_sequences import D, H, layer_model

    model = layer_model("GRU", "forward", 2, np.random.default_rng(0))  # x [T, 1, D] -> Y, Y_h
    model.graph.initializer.extend([numpy_helper.from_array(np.array(k, np.float32), f"c{k}") for k in (1, 2)])
    model.graph.node.extend([helper.make_node("Add", ["Y_h", f"c{k}"], [f"o{k}"]) for k in (1, 2)])
    del model.graph.output[:]
    model.graph.output.extend([helper.make_tensor_value_info(f"o{k}", onnx.TensorProto.FLOAT, [1, 1, H]) for k in (1, 2)])
    session = autobatch.InferenceSession(model, backend="onnxruntime", alone_when_faster=False)
    empty = {"x": np.zeros((0, 1, D), np.float32)}  # no steps: Y_h is 0
    for names, value in ((["o1"], 1.0), (["o2"], 2.0), (["o2", "o1"], 2.0), (["o1"], 1.0)):
        np.testing.assert_array_equal(session.run(names, empty)[0], np.full((1, 1, H), value, np.float32))


def test_bad_instance_is_named(backend):
    session = autobatch.InferenceSession(MODEL, backend=backend)
    instances = feeds([2, 2])
    instances[1]["x"] = instances[1]["x"].astype(np.float64)
    with pytest.raises(FeedError, match=r"instance 1: input 'x': dtype float64"):
        session.run_batch(None, instances)
    with pytest.raises(FeedError, match="unknown output"):
        session.run_batch(["nope"], feeds([2]))


def test_unknown_backend_and_scheduler():
    with pytest.raises(ValueError, match="unknown backend"):
        autobatch.InferenceSession(MODEL, backend="tpu")
    with pytest.raises(ValueError, match="unknown scheduler"):
        autobatch.InferenceSession(MODEL, scheduler="psychic")


def test_demo_command_agrees_and_writes_a_valid_model(tmp_path):
    output = tmp_path / "demo.onnx"
    result = subprocess.run(
        [sys.executable, "-m", "autobatch", "demo", "--trees", "6", "--size", "16", "-o", str(output)],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "losses agree (rtol 1e-5, atol 1e-6): yes" in result.stdout
    assert re.search(r"batched +\d+\.\d+ +\d+ +\(\d+\.\dx faster\)", result.stdout), result.stdout
    assert re.search(r"launches +\d+ +batched runs of a kernel or cell; at least \d+ are needed", result.stdout)
    model = onnx.load(output)
    onnx.checker.check_model(model)
    # The batch's plan, lowered, means the same on onnxruntime as on our interpreter.
    import onnxruntime

    from autobatch.backends import NumpyBackend

    ours = NumpyBackend.prepare(model).run({})
    theirs = onnxruntime.InferenceSession(output.read_bytes(), providers=["CPUExecutionProvider"]).run(None, {})
    assert len(ours) == 6 and all(loss.shape == () for loss in ours)  # a tree's loss an output
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_demo_rejects_bad_arguments():
    result = subprocess.run([sys.executable, "-m", "autobatch", "demo", "--trees", "0"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "--trees: 0 is out of range: it must be at least 1" in result.stderr


def test_the_same_script_runs_on_onnxruntime_and_on_ours(tmp_path):
    """What users write for onnxruntime runs unchanged on ``autobatch.InferenceSession``."""
    import onnxruntime

    model = onnx.parser.parse_model("""<ir_version: 8, opset_import: ["" : 17]>
        tagger (float[N, 4] x, int64[N] ids) => (float[N, 4] y, int64[N] back) { y = Relu(x)  back = Identity(ids) }""")
    model.producer_name, model.model_version, model.doc_string = "a test", 3, "two outputs"
    onnx.helper.set_model_props(model, {"author": "us"})
    path = str(tmp_path / "m.onnx")
    onnx.save(model, path)

    def script(session_class) -> tuple:
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1
        session = session_class(path, options, providers=["CPUExecutionProvider"])
        inputs, outputs = session.get_inputs(), session.get_outputs()
        feeds = {inputs[0].name: np.array([[1, -2, 3, -4]], np.float32), inputs[1].name: np.array([7])}
        everything = session.run(None, feeds)
        first = session.run([outputs[0].name], feeds, None)
        meta = session.get_modelmeta()
        return ([(a.name, a.shape, a.type) for a in inputs + outputs], [v.tolist() for v in everything + first],
                session.get_providers(), (meta.producer_name, meta.graph_name, meta.description, meta.version,
                                          meta.custom_metadata_map))

    assert script(autobatch.InferenceSession) == script(onnxruntime.InferenceSession)


def test_a_mix_whose_session_was_let_go_runs_step_by_step_rather_than_making_it_again():
    """More mixes recurring than ``whole_plans`` keeps would make a session (tens of ms) on every
    other use of each: a mix whose session was let go runs step by step from then on."""
    session = autobatch.InferenceSession(MODEL, backend="onnxruntime", whole_plans=1, alone_when_faster=False)
    first, second = feeds([2, 3]), feeds([4, 1, 2])
    ran = []
    for instances in (first, first, second, second, first, first, second):
        session.whole_plan_seconds = 0.0  # a session as cheap as can be: made at each mix's second use
        got = session.run_batch(None, instances)
        ran.append(session.stats.whole_plan)
        for instance, outputs in zip(instances, got, strict=True):
            for alone, value in zip(session.run(None, instance), outputs, strict=True):
                np.testing.assert_allclose(value, alone, rtol=1e-5, atol=1e-6)
    # the second mix's session evicted the first's: the first never gets one again
    assert ran == [False, True, False, True, False, False, True]


def test_a_mix_gets_its_session_once_running_it_step_by_step_cost_what_a_session_did():
    """Making a whole-plan session costs tens of milliseconds: after the first (made at a mix's
    second use, the price unknown), a mix is made one only once its step-by-step runs have
    cost what the last one took to make, so that mixes seen a few times do not each pay it."""
    session = autobatch.InferenceSession(MODEL, backend="onnxruntime", alone_when_faster=False)
    first, second = feeds([2, 3]), feeds([4, 1, 2])
    session.run_batch(None, first)
    assert session.whole_plan_seconds is None and not session.stats.whole_plan
    session.run_batch(None, first)
    assert session.stats.whole_plan and session.whole_plan_seconds > 0
    session.whole_plan_seconds = 3600.0  # as if a session took an hour to make
    for _ in range(3):
        got = session.run_batch(None, second)
        assert not session.stats.whole_plan
    session.whole_plan_seconds = 0.0  # ... or nothing: the rent paid so far is enough
    again = session.run_batch(None, second)
    assert session.stats.whole_plan
    for instance, outputs, outputs_again in zip(second, got, again, strict=True):
        for alone, value, value_again in zip(session.run(None, instance), outputs, outputs_again, strict=True):
            np.testing.assert_allclose(value, alone, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(value_again, alone, rtol=1e-5, atol=1e-6)


def test_a_new_mix_leaves_no_reference_cycles(backend):
    """A plan's garbage is freed when planning ends, not by the collector's next pass: a cycle
    kept BERT's planner and its records (about 13,000 objects a mix) for the collector to walk."""
    session = autobatch.InferenceSession(MODEL, backend=backend, alone_when_faster=False)
    session.run_batch(None, feeds([2, 3]))  # templates and typed graphs made once
    with no_cycles_left():
        session.run_batch(None, feeds([3, 1, 2, 4, 3]))  # a new mix
        assert session.stats.report is not None and not session.stats.plan_cached


def test_template_sessions_share_one_cpu_arena_and_whole_plans_keep_their_own():
    """Hundreds of template sessions each with an arena at its peak grew a server's memory;
    a whole plan's session, which runs a model's worth of ops, keeps its own arena."""
    session = autobatch.InferenceSession(MODEL, backend="onnxruntime", alone_when_faster=False)
    batch = feeds([2, 3, 1])
    for _ in range(3):  # step by step, then as one session
        session.run_batch(None, batch)
    assert session.stats.whole_plan
    fed = [runner._fed for template in session.templates.templates.values() if isinstance(template, Template)
           for runner in template.runners.values() if getattr(runner, "_fed", None) is not None]
    assert fed and all(s.get_session_options().get_session_config_entry("session.use_env_allocators") == "1"
                       for s in fed)
    (whole,) = session._whole_plans.values()
    with pytest.raises(RuntimeError, match="does not have configuration"):  # not asked for
        whole.session.get_session_options().get_session_config_entry("session.use_env_allocators")
