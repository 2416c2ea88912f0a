"""Padded batching (``batcher/padding.py``): one node of a model over instances of different
lengths, where ragged batching cannot take it, runs a launch for every chunk of instances, each
padded to the chunk's longest, and still equals each instance run alone."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from autobatch import InferenceSession
from autobatch.batcher.padding import CHUNK
from tests.oracle import assert_batched_equals_alone

ATTENTION = onnx.parser.parse_model("""<ir_version: 8, opset_import: ["" : 17]>
    g (float[1, L, 4] x) => (float[1, L, 4] c) {
    k = Transpose<perm = [0, 2, 1]>(x)
    s = MatMul(x, k)
    p = Softmax<axis = -1>(s)
    c = MatMul(p, x) }""")


@pytest.fixture(params=["numpy", "onnxruntime"])
def backend(request):
    return request.param


def run(backend: str, lengths: list[int]) -> InferenceSession:
    session = InferenceSession(ATTENTION, backend=backend)
    rng = np.random.default_rng(0)
    # summed over more (padded, zero) terms, a product may round otherwise: 1e-5 absolute more
    assert_batched_equals_alone(session, [{"x": rng.standard_normal((1, n, 4)).astype(np.float32)} for n in lengths],
                                atol=1e-5)
    return session


def test_instances_of_many_lengths_take_a_launch_a_chunk(backend):
    lengths = [3, 9, 1, 4, 4, 7, 2, 8, 5, 6, 12, 10]  # 11 lengths
    launches = run(backend, lengths).stats.report.launches_by_op
    chunks = -(-len(lengths) // CHUNK)
    assert launches == {"Transpose": chunks, "MatMul": 2 * chunks, "Softmax": chunks}


def test_instances_of_one_shape_are_not_cut_into_chunks(backend):
    """31 of one length and one of another: a plain launch for the 31, one for the other (cut
    into chunks of 8 they took 5 each)."""
    launches = run(backend, [4] * 31 + [5]).stats.report.launches_by_op
    assert launches == {"Transpose": 2, "MatMul": 4, "Softmax": 2}
