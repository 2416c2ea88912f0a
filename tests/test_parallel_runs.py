"""A batch run alone on onnxruntime's CPU runs several instances at once, one per thread, each
on a one-thread session (``backends.parallel_runs``): each instance's own results, its own error,
and the caller's deadline on every thread."""

from __future__ import annotations

import threading
import time

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from autobatch import InferenceSession
from autobatch.backends.ort_runtime import CPU
from autobatch.backends.parallel_runs import ParallelRuns
from autobatch.ir import from_onnx
from autobatch.ir.limits import DeadlineExceeded, deadline
from autobatch.ways import ALONE, AT_ONCE, BATCHED_FIRST, IN_TURN

def _projection() -> onnx.ModelProto:
    """``x [L, 256]`` by a ``[256, 512]`` weight, then sums: big enough that onnxruntime splits
    its products across threads, so a result that depended on the thread count would show."""
    rng = np.random.default_rng(5)
    w = onnx.numpy_helper.from_array(rng.standard_normal((256, 512)).astype(np.float32), "w")
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("MatMul", ["x", "w"], ["y"]),
         onnx.helper.make_node("Softmax", ["y"], ["p"], axis=-1),
         onnx.helper.make_node("ReduceSum", ["y"], ["total"], keepdims=0)], "projection",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["L", 256])],
        [onnx.helper.make_tensor_value_info("p", onnx.TensorProto.FLOAT, ["L", 512]),
         onnx.helper.make_tensor_value_info("total", onnx.TensorProto.FLOAT, [])], [w])
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)], ir_version=8)


FAILING_LATE = onnx.parser.parse_model("""<ir_version: 8, opset_import: ["" : 17]>
    g (int64 m, float[2] x, int64[R] shape) => (float[A, B] y) {
        h = Loop(m, , x) <body = step (int64 i, bool c, float[2] h) => (bool c_out, float[2] h2) {
            c_out = Identity(c)
            h2 = Add(h, h)
        }>
        y = Reshape(h, shape)
    }""")

LOOP = onnx.parser.parse_model("""<ir_version: 8, opset_import: ["" : 17]>
    g (int64 m, float[2] x) => (float[2] y) {
        y = Loop(m, , x) <body = step (int64 i, bool c, float[2] h) => (bool c_out, float[2] h2) {
            c_out = Identity(c)
            h2 = Add(h, h)
        }>
    }""")


def test_instances_run_at_once_give_each_instances_own_results_bitwise() -> None:
    model = _projection()
    runs = ParallelRuns(from_onnx(model), [CPU], callers=3)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    alone = ort.InferenceSession(model.SerializeToString(), options, providers=[CPU])
    rng = np.random.default_rng(0)
    for n in (11, 2, 1):  # more instances than callers, fewer, one
        texts = [{"x": rng.standard_normal((int(length), 256)).astype(np.float32)} for length in rng.integers(1, 300, n)]
        got = runs.run(["p", "total"], texts)
        assert len(got) == n
        for feeds, outputs in zip(texts, got):
            for value, expected in zip(outputs, alone.run(["p", "total"], feeds)):
                np.testing.assert_array_equal(value, expected)


def _failing(m: int, shape: tuple[int, int] = (1, 2)) -> dict[str, np.ndarray]:
    return {"m": np.array(m, np.int64), "x": np.array([1, -1], np.float32), "shape": np.array(shape)}


def test_the_first_failed_instance_raises_its_error_and_the_next_batch_runs() -> None:
    """Instance 0 fails after a long Loop, instance 1 at once: instance 0's error is raised,
    as running them in order would raise it."""
    runs = ParallelRuns(from_onnx(FAILING_LATE), [CPU], callers=2)
    bad = [_failing(3 * 10**5, (7, 3)), _failing(1, (9, 3))] + [_failing(1)] * 6
    with pytest.raises(Exception, match=r"\{7,3\}"):
        runs.run(["y"], bad)
    got = runs.run(["y"], [_failing(3)] * 5)
    assert all(np.array_equal(outputs[0], [[8.0, -8.0]]) for outputs in got)


def test_an_interrupt_stops_the_other_threads_taking_instances(monkeypatch) -> None:
    """Ctrl-C in the caller's thread reaches the caller, and the helper stops after the run
    it is in rather than running the rest of the batch."""
    import autobatch.backends.parallel_runs as parallel_runs

    calls: list[str] = []
    main = threading.main_thread()

    def interrupted(run, names, feeds):  # type: ignore[no-untyped-def]
        calls.append(threading.current_thread().name)
        if threading.current_thread() is main and calls.count(main.name) == 2:
            raise KeyboardInterrupt
        time.sleep(0.02)
        return run(names, feeds)

    runs = ParallelRuns(from_onnx(FAILING_LATE), [CPU], callers=2)
    monkeypatch.setattr(parallel_runs, "run_session", interrupted)
    with pytest.raises(KeyboardInterrupt):
        runs.run(["y"], [_failing(3)] * 40)
    assert len(calls) < 10, calls
    monkeypatch.undo()
    assert len(runs.run(["y"], [_failing(3)] * 4)) == 4


def test_the_callers_deadline_stops_the_instances_on_every_thread() -> None:
    """Each of these instances runs a Loop of 2 * 10^7 iterations (about 40 s here); the helper threads must
    stop by the caller's deadline too, or ``run`` would wait for them."""
    runs = ParallelRuns(from_onnx(LOOP), [CPU], callers=2)
    feeds = [{"m": np.array(2 * 10**7, np.int64), "x": np.array([1, -1], np.float32)}] * 2
    runs.run(["y"], [{"m": np.array(3, np.int64), "x": np.array([1, -1], np.float32)}] * 2)  # the session is made
    start = time.monotonic()
    with pytest.raises(DeadlineExceeded), deadline(0.5):
        runs.run(["y"], feeds)
    assert time.monotonic() - start < 10


def test_a_session_runs_a_batch_alone_at_once_on_its_threads_with_each_instances_results() -> None:
    """A chain of tiny ops, whose new mixes run faster alone (tests/test_ways.py): once the
    session takes alone, its batches run 2 at once with each instance's own results."""
    model = onnx.parser.parse_model("""<ir_version: 8, opset_import: ["" : 17]>
        g (float[n] v0) => (float[n] v) <float c = {0.5}> {""" + "".join(
        f"\n v{k + 1} = {'Add' if k % 2 else 'Mul'}(v{k}, c)" for k in range(299)) + "\n v = Mul(v299, c)\n}")
    session = InferenceSession(model, backend="onnxruntime", threads=2, node_level=False)
    rng = np.random.default_rng(3)
    at_once = []  # of each batch run alone: how many at once
    for _ in range(BATCHED_FIRST + 6):
        feeds = [{"v0": rng.standard_normal(int(n)).astype(np.float32)} for n in rng.integers(1, 400, 8)]
        got = session.run_batch(None, feeds)
        for instance, outputs in zip(feeds, got):
            np.testing.assert_array_equal(outputs[0], session.run(None, instance)[0])
        if session.stats.alone:
            at_once.append(session.stats.at_once)
            if session.stats.at_once == 2:
                assert "each run alone, 2 at once" in str(session.stats)
    # at once first, then in turn on the session's own threads, measured both ways (``autobatch.ways``)
    assert at_once[:BATCHED_FIRST] == [2] * BATCHED_FIRST and 1 in at_once, at_once
    assert set(session._alone_ways.kinds[(8).bit_length(), False].recent) == {AT_ONCE, IN_TURN}


def test_a_batch_run_alone_runs_in_turn_where_that_was_measured_faster() -> None:
    """onnxruntime alone, one instance after another on its own threads, is the way a CNN's
    images ran faster than two at once: a session takes it where measured so."""
    model = onnx.parser.parse_model("""<ir_version: 8, opset_import: ["" : 17]>
        g (float[n] x) => (float[n] y) { y = Tanh(x) }""")
    session = InferenceSession(model, backend="onnxruntime", threads=2)
    session._ways.choose = lambda n, kept: ALONE  # type: ignore[union-attr]  # these batches run alone
    chooser = session._alone_ways
    for way, seconds in [(AT_ONCE, 4e-3)] * 5 + [(IN_TURN, 1e-3)] * 5:  # what both ways were measured at
        chooser.record(8, False, way, seconds)
    feeds = [{"x": np.full(n, 0.5, np.float32)} for n in range(1, 9)]
    got = session.run_batch(None, feeds)
    assert session.stats.alone == 8 and session.stats.at_once == 1
    for instance, outputs in zip(feeds, got, strict=True):
        np.testing.assert_array_equal(outputs[0], session.run(None, instance)[0])


def test_a_batch_whose_empty_sequences_run_in_turn_runs_the_others_at_once() -> None:
    """onnxruntime may abort on an LSTM over no steps, so those instances run one by one (on
    NumPy for that layer); the others run at once; every result is the instance's own."""
    rng = np.random.default_rng(4)
    weights = [onnx.numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)
               for name, shape in (("W", (1, 12, 4)), ("R", (1, 12, 3)))]
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("LSTM", ["x", "W", "R"], ["y"], hidden_size=3)], "lstm",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["L", 1, 4])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["L", 1, 1, 3])], weights)
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)], ir_version=8)
    session = InferenceSession(model, backend="onnxruntime", threads=2)
    session._ways.choose = lambda n, kept: ALONE  # type: ignore[union-attr]  # this batch is run alone
    instances = [{"x": rng.standard_normal((n, 1, 4)).astype(np.float32)} for n in (3, 0, 5, 0, 2, 4)]
    got = session.run_batch(None, instances)
    assert session.stats.alone == 6 and session.stats.at_once == 2
    for feeds, outputs in zip(instances, got):
        np.testing.assert_array_equal(outputs[0], session.run(None, feeds)[0])
