"""A batch run alone on onnxruntime's CPU runs several instances at once, one per thread, each
on a one-thread session (``backends.parallel_runs``): each instance's own results, its own error,
and the caller's deadline on every thread."""

from __future__ import annotations

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
from autobatch.ways import BATCHED_FIRST

ATTENTION = onnx.parser.parse_model("""<ir_version: 8, opset_import: ["" : 17]>
    g (float[L, 8] x) => (float[L, 8] y, float[8] pooled) <float[8, 8] w = {0.1, -0.2, 0.3, 0.05, -0.1, 0.2, 0.15, -0.3,
        0.2, 0.1, -0.1, 0.3, 0.05, -0.2, 0.1, 0.25, -0.3, 0.2, 0.1, -0.05, 0.3, 0.1, -0.2, 0.15,
        0.1, 0.3, -0.2, 0.1, 0.2, -0.1, 0.05, 0.3, 0.25, -0.1, 0.2, 0.3, -0.3, 0.1, 0.2, -0.2,
        0.3, 0.2, 0.1, -0.1, 0.05, 0.3, -0.2, 0.1, -0.2, 0.1, 0.3, 0.2, 0.1, -0.3, 0.25, 0.05,
        0.05, -0.3, 0.2, 0.1, 0.3, 0.2, -0.1, 0.2}> {
        q = MatMul(x, w)
        x_t = Transpose <perm = [1, 0]> (x)
        scores = MatMul(q, x_t)
        weights = Softmax <axis = -1> (scores)
        y = MatMul(weights, x)
        pooled = ReduceMean <axes = [0], keepdims = 0> (y)
    }""")

RESHAPE = onnx.parser.parse_model("""<ir_version: 8, opset_import: ["" : 17]>
    g (float[N] x, int64[R] shape) => (float[A, B] y) { y = Reshape(x, shape) }""")

LOOP = onnx.parser.parse_model("""<ir_version: 8, opset_import: ["" : 17]>
    g (int64 m, float[2] x) => (float[2] y) {
        y = Loop(m, , x) <body = step (int64 i, bool c, float[2] h) => (bool c_out, float[2] h2) {
            c_out = Identity(c)
            h2 = Add(h, h)
        }>
    }""")


def _texts(rng: np.random.Generator, n: int) -> list[dict[str, np.ndarray]]:
    return [{"x": rng.standard_normal((int(length), 8)).astype(np.float32)} for length in rng.integers(1, 40, n)]


def test_instances_run_at_once_give_each_instances_own_results_bitwise() -> None:
    runs = ParallelRuns(from_onnx(ATTENTION), [CPU], callers=3)
    alone = ort.InferenceSession(ATTENTION.SerializeToString(), providers=[CPU])
    rng = np.random.default_rng(0)
    for n in (11, 2, 1):  # more instances than callers, fewer, one
        texts = _texts(rng, n)
        got = runs.run(["y", "pooled"], texts)
        assert len(got) == n
        for feeds, outputs in zip(texts, got):
            for value, expected in zip(outputs, alone.run(["y", "pooled"], feeds)):
                np.testing.assert_array_equal(value, expected)


def test_a_failed_instance_raises_its_own_error_and_the_next_batch_runs() -> None:
    runs = ParallelRuns(from_onnx(RESHAPE), [CPU], callers=2)
    good = [{"x": np.arange(6, dtype=np.float32), "shape": np.array([2, 3])} for _ in range(9)]
    bad = list(good)
    bad[5] = {"x": np.arange(6, dtype=np.float32), "shape": np.array([7, 1])}
    bad[8] = {"x": np.arange(6, dtype=np.float32), "shape": np.array([9, 1])}
    with pytest.raises(Exception, match=r"\{7,1\}"):  # instance 5's, the first that failed
        runs.run(["y"], bad)
    got = runs.run(["y"], good)
    assert all(np.array_equal(outputs[0], np.arange(6, dtype=np.float32).reshape(2, 3)) for outputs in got)


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
    session = InferenceSession(model, backend="onnxruntime", threads=2)
    rng = np.random.default_rng(3)
    for _ in range(BATCHED_FIRST + 4):
        feeds = [{"v0": rng.standard_normal(int(n)).astype(np.float32)} for n in rng.integers(1, 400, 8)]
        got = session.run_batch(None, feeds)
        for instance, outputs in zip(feeds, got):
            np.testing.assert_array_equal(outputs[0], session.run(None, instance)[0])
    assert session.stats.alone == 8 and session.stats.at_once == 2
    assert "each run alone, 2 at once" in str(session.stats)
