"""onnxruntime: OrtBackend for plain models, and OrtExecutor for batched graphs in each mode."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
import pytest

from autobatch.backends import FeedError, Interpreter, NodeExecutionError, OrtBackend, OrtExecutor, SessionCache
from autobatch.backends.ort_runtime import CPU, default_providers
from autobatch.batcher import BatchingPass
from autobatch.ir import Graph, ValueType, to_onnx
from benchmarks.models import Workload, bilstm_workload, traced_graph, tree_lstm_workload
from tests.test_onnx_io import LIGHT_MODELS, ort_run, random_feeds


def test_provider_is_decided_once_and_runs_here():
    providers = default_providers()
    assert providers is default_providers()
    assert providers[-1] == CPU
    assert OrtBackend.supports_device("CPU")
    assert OrtBackend.supports_device("CUDA") == (providers[0] == "CUDAExecutionProvider")


@pytest.mark.parametrize("path", LIGHT_MODELS[:3], ids=lambda p: p.stem)
def test_plain_models_match_onnxruntime_on_the_original(path):
    original = onnx.load(path)
    feeds = random_feeds(original)
    expected = ort_run(original, feeds)
    got = OrtBackend.prepare(original).run(feeds)
    for e, g in zip(expected, got, strict=True):
        np.testing.assert_array_equal(g, e)


def test_bad_feeds_are_named():
    model = onnx.parser.parse_model("""
    <ir_version: 9, opset_import: ["" : 18]>
    g (float[2] x) => (float[2] y) { y = Relu(x) }
    """)
    rep = OrtBackend.prepare(model)
    with pytest.raises(FeedError, match="input 'x': dtype int64"):
        rep.run([np.array([1, 2])])
    assert rep.run([np.array([-1, 2], np.float32)])[0].tolist() == [0, 2]


def traced(make: Callable[..., Workload], count: int, size: int = 16) -> tuple[list[Graph], Graph]:
    """Per-instance graphs of a workload and their batched graph (primitive ops)."""
    loss, instances, params, _ = make(count, size)
    graphs = [traced_graph((loss, [x], params, "")) for x in instances]
    return graphs, BatchingPass("level")(traced_graph((loss, instances, params, ""))).graph


def small_tree_lstm(trees: int = 6) -> tuple[list[Graph], Graph]:
    return traced(tree_lstm_workload, trees)


def small_bilstm(sentences: int = 5) -> tuple[list[Graph], Graph]:
    return traced(bilstm_workload, sentences)


@pytest.mark.parametrize("build", [small_tree_lstm, small_bilstm], ids=["tree_lstm", "bilstm"])
@pytest.mark.parametrize("whole, device_values", [(False, False), (True, False), (True, True), (False, True)])
def test_executor_modes_agree_with_running_each_instance_alone(build, whole, device_values):
    graphs, batched = build()
    alone = [value for g in graphs for value in Interpreter(g).run({})]
    executor = OrtExecutor(batched, SessionCache(threads=1), whole=whole, device_values=device_values)
    for _ in range(2):  # the second run uses cached sessions only
        got = executor.run({})
        for a, b in zip(alone, got, strict=True):
            np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)
    if whole:
        assert executor.stats.segments == 1 and executor.stats.session_calls == 1
    else:
        assert executor.stats.numpy_steps > 0 and executor.stats.segments > 1


def test_segments_of_the_same_structure_share_a_session():
    _, batched = small_tree_lstm(trees=12)
    cache = SessionCache(threads=1)
    executor = OrtExecutor(batched, cache, whole=False)
    executor.run({})
    # Tree levels repeat the same cell computation on other rows: far fewer sessions than segments.
    assert cache.stats.sessions_created < executor.stats.segments
    assert cache.stats.cache_hits > 0


def test_failing_segment_is_named():
    graph = Graph("bad", {"": 18})
    graph.add_input("x", ValueType.tensor(np.float32, [2, 3]))
    graph.add_input("w", ValueType.tensor(np.float32, [5, 4]))
    graph.add_node("MatMul", ["x", "w"], ["y"], name="the_matmul")
    graph.add_node("Relu", ["y"], ["z"])
    graph.add_output("z")
    executor = OrtExecutor(graph, SessionCache(threads=1), whole=False)
    with pytest.raises(NodeExecutionError, match=r"segment of 2 ops starting at Node#0 'the_matmul' MatMul-18 failed"):
        executor.run({"x": np.zeros((2, 3), np.float32), "w": np.zeros((5, 4), np.float32)})


def test_session_cache_keeps_only_the_most_recent_sessions(monkeypatch):
    monkeypatch.setattr("autobatch.backends.ort_runtime.SESSIONS_KEPT", 2)
    cache = SessionCache(threads=1)

    def model(op: str) -> Callable[[], onnx.ModelProto]:
        graph = Graph(op, {"": 18})
        graph.add_input("x", ValueType.tensor(np.float32, (3,)))
        graph.add_node(op, ["x"], ["y"])
        graph.add_output("y")
        return lambda: to_onnx(graph)

    x = np.array([-1.0, 0.5, 2.0], np.float32)
    for op in ("Relu", "Neg", "Abs", "Relu"):  # Relu is evicted by Abs, and made again
        (y,) = cache.get(op, model(op)).run(None, {"x": x})
        np.testing.assert_array_equal(y, {"Relu": np.maximum(x, 0), "Neg": -x, "Abs": np.abs(x)}[op])
        assert len(cache) <= 2
    assert cache.stats.sessions_created == 4 and cache.stats.cache_hits == 0
    cache.get("Relu", model("Relu"))
    assert cache.stats.cache_hits == 1


def test_both_onnxruntime_packages_installed_is_named(monkeypatch):
    import importlib.metadata

    from autobatch.backends import ort_runtime

    versions = {"onnxruntime": "1.31.1", "onnxruntime-gpu": "1.31.1"}
    monkeypatch.setattr(importlib.metadata, "version", lambda name: versions[name])
    with pytest.warns(RuntimeWarning, match="both onnxruntime 1.31.1 and onnxruntime-gpu 1.31.1 are installed"):
        ort_runtime.check_one_onnxruntime()
    del versions["onnxruntime"]

    def only_gpu(name):
        if name not in versions:
            raise importlib.metadata.PackageNotFoundError(name)
        return versions[name]

    monkeypatch.setattr(importlib.metadata, "version", only_gpu)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ort_runtime.check_one_onnxruntime()
