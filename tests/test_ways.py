"""A session runs a batch of a new mix each instance alone where that was measured faster
(``autobatch.ways``): the choice changes speed only, and is counted."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from autobatch import InferenceSession
from autobatch.ways import (ALONE, AT_ONCE, BATCHED, BATCHED_FIRST, IN_TURN, MARGIN, PROBE_EVERY, SERVED_MARGIN,
                            WayChooser)
from tests.oracle import assert_same


def _runs(chooser: WayChooser, n: int, seconds: dict[str, float], batches: int, kept: bool = False) -> list[str]:
    ways = []
    for _ in range(batches):
        way = chooser.choose(n, kept)
        chooser.record(n, kept, way, seconds[way] * n)
        ways.append(way)
    return ways


def test_alone_is_taken_once_measured_faster_and_batched_is_tried_again_less_often_the_slower_it_was() -> None:
    ways = _runs(WayChooser(), 8, {BATCHED: 4e-3, ALONE: 1e-3}, 300)
    assert ways[:BATCHED_FIRST + 2] == [BATCHED] * BATCHED_FIRST + [ALONE] * 2
    probes = [k for k, way in enumerate(ways[BATCHED_FIRST + 2:]) if way == BATCHED]
    assert len(probes) >= 3 and all(b - a == PROBE_EVERY * 4 + 1 for a, b in zip(probes, probes[1:])), ways


def test_batched_stays_where_it_is_faster_and_alone_is_tried_again_every_probe() -> None:
    ways = _runs(WayChooser(), 8, {BATCHED: 1e-3, ALONE: 1e-3 * 1.05}, 100)  # within the margin: batched
    probes = [k for k, way in enumerate(ways[BATCHED_FIRST + 2:]) if way == ALONE]
    assert len(probes) >= 3 and all(b - a == math.ceil(PROBE_EVERY * 1.05) + 1 for a, b in zip(probes, probes[1:])), ways


def test_one_slow_run_does_not_turn_the_choice() -> None:
    """A way's time is the median of its last runs: a batch slowed tenfold once (a collection,
    a noisy host) leaves batched where it is faster; a way that stays slower turns it."""
    chooser = WayChooser()
    ways = _runs(chooser, 8, {BATCHED: 1e-3, ALONE: 2e-3}, 20)
    assert ways[-1] == BATCHED
    chooser.record(8, False, BATCHED, 10e-3 * 8)
    assert chooser.choose(8, False) == BATCHED
    ways = _runs(chooser, 8, {BATCHED: 10e-3, ALONE: 2e-3}, 6)
    assert ways[-1] == ALONE, ways


def test_kinds_are_measured_apart_and_a_new_size_starts_from_the_nearest_measured_one() -> None:
    chooser = WayChooser()
    _runs(chooser, 8, {BATCHED: 4e-3, ALONE: 1e-3}, 20)
    assert chooser.choose(8, False) == ALONE
    assert chooser.choose(64, False) == ALONE  # nothing measured at 64 yet: as at 8
    assert chooser.choose(8, True) == BATCHED  # nor of kept mixes: those run batched first
    _runs(chooser, 64, {BATCHED: 1e-4, ALONE: 1e-3}, 300)  # batched tried at 64, and found faster there
    _runs(chooser, 8, {BATCHED: 1e-4, ALONE: 1e-3}, 20, kept=True)
    assert chooser.choose(64, False) == BATCHED and chooser.choose(8, False) == ALONE
    assert chooser.choose(8, True) == BATCHED
    assert "a new mix batched 4.000 ms" in chooser.why(8, False) and "kept plan" in chooser.why(8, True)


def test_the_warm_up_is_paid_once_whatever_the_sizes_of_the_first_batches() -> None:
    """A server's first batches come in many sizes: BATCHED_FIRST batched batches in all, not
    that many of every size, before alone is tried; then each size takes what was measured."""
    chooser = WayChooser()
    sizes = [3, 9, 40, 17, 64, 5, 33, 12, 50, 7, 20, 60] * 4
    ways = []
    for n in sizes:
        ways.append(chooser.choose(n, False))
        chooser.record(n, False, ways[-1], {BATCHED: 4e-3, ALONE: 1e-3}[ways[-1]] * n)
    assert ways[:BATCHED_FIRST + 2] == [BATCHED] * BATCHED_FIRST + [ALONE] * 2, ways
    assert ways[-len(sizes) // 2:] == [ALONE] * (len(sizes) // 2)


def _chain(nodes: int) -> onnx.ModelProto:
    """Many tiny ops over ``x [n]``: planning a new mix of them costs far more than running
    each instance alone."""
    ops = []
    for k in range(nodes):
        ops.append(helper.make_node("Add" if k % 2 else "Mul", [f"v{k}", "c"], [f"v{k + 1}"]))
    graph = helper.make_graph(ops, "chain", [helper.make_tensor_value_info("v0", TensorProto.FLOAT, ["n"])],
                              [helper.make_tensor_value_info(f"v{nodes}", TensorProto.FLOAT, ["n"])],
                              [helper.make_tensor("c", TensorProto.FLOAT, [], [0.5])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_session_runs_new_mixes_alone_where_measured_faster_with_the_same_results() -> None:
    model = _chain(300)
    rng = np.random.default_rng(0)
    for backend in ("onnxruntime", "numpy"):
        session = InferenceSession(model, backend=backend, node_level=False)
        plain = InferenceSession(model, backend=backend, alone_when_faster=False, node_level=False)
        alone = []
        for _ in range(BATCHED_FIRST + 2 + 3):
            feeds = [{"v0": rng.standard_normal(int(n)).astype(np.float32)} for n in rng.integers(1, 400, 8)]
            got = session.run_batch(None, feeds)
            alone.append(session.stats.alone)
            for instance, result in zip(feeds, got):
                assert_same(result[0], session.run(None, instance)[0])
        assert alone[:BATCHED_FIRST] == [0] * BATCHED_FIRST
        assert alone[-3:] == [8] * 3, (backend, alone)  # measured: alone is faster for this model
        assert "measured" in str(session.stats) and session.stats.report is None
        plain.run_batch(None, feeds)
        assert plain.stats.alone == 0 and plain.stats.report is not None


def test_a_mix_with_a_plan_kept_runs_batched() -> None:
    model = _chain(300)
    rng = np.random.default_rng(1)
    session = InferenceSession(model, backend="onnxruntime", node_level=False)
    kept = [{"v0": rng.standard_normal(n).astype(np.float32)} for n in (3, 5, 7)]
    session.run_batch(None, kept)
    for _ in range(BATCHED_FIRST + 4):
        session.run_batch(None, [{"v0": rng.standard_normal(int(n)).astype(np.float32)} for n in rng.integers(1, 400, 3)])
    assert session.stats.alone == 3
    session.run_batch(None, kept)
    assert session.stats.alone == 0 and session.stats.plan_cached


def test_a_server_counts_the_instances_it_ran_alone_by_choice() -> None:
    pytest.importorskip("starlette")
    from autobatch.serving import Engine, SessionRunner
    from autobatch.serving.metrics import render

    model = _chain(300)
    session = InferenceSession(model, node_level=False)
    rng = np.random.default_rng(2)
    for _ in range(BATCHED_FIRST + 2):  # what batches of 8 cost both ways, measured before serving
        session.run_batch(None, [{"v0": rng.standard_normal(int(n)).astype(np.float32)} for n in rng.integers(1, 400, 8)])
    engine = Engine(SessionRunner(session), name="chain", max_batch_size=8, batch_wait_timeout_s=2.0)
    requests = [{"v0": rng.standard_normal(int(n)).astype(np.float32)} for n in rng.integers(1, 400, 8)]
    try:
        with ThreadPoolExecutor(len(requests)) as pool:
            results = list(pool.map(engine.infer_sync, requests))
    finally:
        engine.shutdown()
    for feeds, outputs in zip(requests, results):
        assert_same(outputs["v300"], session.run(None, feeds)[0])
    assert engine.metrics.batch_sizes.count == 1 and engine.metrics.instances_alone == 8
    assert 'autobatch_instances_alone_total{model="chain"} 8' in render([("chain", engine.metrics, 0)])


def test_a_chooser_of_how_a_batch_runs_alone_starts_at_once_and_takes_in_turn_where_faster():
    """The same chooser between the ways a batch runs alone: at once first; in turn (onnxruntime
    alone) once measured faster by the margin, at once tried again now and then."""
    ways = _runs(WayChooser(AT_ONCE, IN_TURN), 8, {AT_ONCE: 4e-3, IN_TURN: 1e-3}, 200)
    assert ways[:BATCHED_FIRST + 2] == [AT_ONCE] * BATCHED_FIRST + [IN_TURN] * 2
    assert ways[-20:].count(IN_TURN) >= 19 and AT_ONCE in ways[BATCHED_FIRST + 2:]
    kept = _runs(WayChooser(AT_ONCE, IN_TURN), 8, {AT_ONCE: 1e-3, IN_TURN: 1e-3 * 1.05}, 100)  # within the margin
    assert kept[-10:] == [AT_ONCE] * 10


@pytest.mark.parametrize("margin", [1.1, 1.5])
def test_alone_is_taken_only_past_the_margin(margin: float) -> None:
    """Alone measured 1.3x faster: taken with a margin of 1.1, not with 1.5 (a server's)."""
    ways = _runs(WayChooser(margin=margin), 8, {BATCHED: 1.3e-3, ALONE: 1e-3}, 30)
    assert ways[-1] == (ALONE if margin < 1.3 else BATCHED), ways


def test_a_served_model_takes_the_served_margin_and_a_session_its_own() -> None:
    """An engine that loads its model chooses alone only past ``SERVED_MARGIN``; a session
    takes a number as its margin, refuses one under 1, and False is always batched."""
    pytest.importorskip("starlette")
    from autobatch.serving import Engine

    model = _chain(3)
    engine = Engine(model, name="chain", backend="onnxruntime")
    assert engine.runner.session._ways.margin == SERVED_MARGIN
    assert Engine(model, name="chain", alone_when_faster=np.True_).runner.session._ways.margin == SERVED_MARGIN
    assert Engine(model, name="chain", alone_when_faster=False).runner.session._ways is None
    assert InferenceSession(model)._ways.margin == MARGIN
    assert InferenceSession(model, alone_when_faster=2.0)._ways.margin == 2.0
    assert InferenceSession(model, alone_when_faster=np.True_)._ways.margin == MARGIN
    for refused in (0.5, 0):
        with pytest.raises(ValueError, match="a margin of at least 1"):
            InferenceSession(model, alone_when_faster=refused)
