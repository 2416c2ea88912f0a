"""``autobatch.graphs.run_graphs``: instances given as IR graphs of their own, batched by one plan."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from autobatch.backends import FeedError, Interpreter
from autobatch.graphs import run_graphs
from autobatch.ir import from_onnx

TANH = """<ir_version: 8, opset_import: ["" : 18]>
g (float[N, 3] x) => (float[N, 3] y) { y = Tanh(x) }"""
TANH_RELU = """<ir_version: 8, opset_import: ["" : 18]>
g (float[N, 3] x) => (float[N, 3] y, float[N, 3] z) { y = Tanh(x)  z = Relu(y) }"""


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_graphs_of_different_structures_and_lengths_batch_and_equal_each_alone(backend):
    graphs = [from_onnx(onnx.parser.parse_model(text)) for text in (TANH, TANH_RELU, TANH)]
    rng = np.random.default_rng(0)
    feeds = [{"x": rng.standard_normal((n, 3)).astype(np.float32)} for n in (2, 5, 1)]
    got, report = run_graphs(graphs, feeds, backend)
    assert [len(outputs) for outputs in got] == [1, 2, 1]
    for outputs, graph, instance in zip(got, graphs, feeds, strict=True):
        for value, want in zip(outputs, Interpreter(graph).run(instance), strict=True):
            np.testing.assert_allclose(value, want, rtol=1e-5, atol=1e-6)
    assert report.nodes == 4 and report.launches == 2  # the three Tanhs in one launch, across lengths


def test_bad_calls_say_what_is_wrong():
    tanh = from_onnx(onnx.parser.parse_model(TANH))
    x = {"x": np.zeros((2, 3), np.float32)}
    with pytest.raises(ValueError, match="2 graphs and 1 feeds"):
        run_graphs([tanh, tanh], [x])
    with pytest.raises(ValueError, match="unknown scheduler 'psychic'"):
        run_graphs([tanh], [x], scheduler="psychic")
    older = from_onnx(onnx.parser.parse_model(TANH.replace('"" : 18', '"" : 17')))
    with pytest.raises(ValueError, match="different opsets"):
        run_graphs([tanh, older], [x, x])
    with pytest.raises(FeedError, match="instance 1: .*'x'"):
        run_graphs([tanh, tanh], [x, {"x": np.zeros((2, 4), np.float32)}])
