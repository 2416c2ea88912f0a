"""Padded batching (``batcher/padding.py``): one node of a model over instances of different
lengths, where ragged batching cannot take it, runs a launch for every chunk of instances, each
padded to the chunk's longest, and still equals each instance run alone."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from autobatch import InferenceSession
from autobatch.batcher.padding import CHUNK
from autobatch.ir import from_onnx
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
    session = InferenceSession(ATTENTION, backend=backend, node_level=False)
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


HEADS = onnx.parser.parse_model("""<ir_version: 8, opset_import: ["" : 17]>
    g (float[1, L, 6] x) => (float[1, L, 2] y) {
    target = Constant<value = int64[4] {1, -1, 3, 2}>()
    r = Reshape(x, target)
    t = Transpose<perm = [2, 0, 1, 3]>(r)
    one = Constant<value = int64[1] {1}>()
    q = Squeeze(t, one)
    first = Constant<value = int64 {0}>()
    second = Constant<value = int64 {1}>()
    a = Gather<axis = 0>(q, first)
    b = Gather<axis = 0>(q, second)
    bt = Transpose<perm = [1, 0]>(b)
    s = MatMul(a, bt)
    p = Softmax<axis = -1>(s)
    c = MatMul(p, a)
    zero = Constant<value = int64[1] {0}>()
    u = Unsqueeze(c, zero)
    y = Concat<axis = -2>(u) }""")


def test_heads_split_by_gather_and_squeeze_take_a_launch_a_chunk(backend):
    """The heads of an exporter's attention: ``[3, L, ...]`` split by a Gather of a shared index,
    a Squeeze, and a Concat of one operand (an exporter's past keys and values, none) run padded
    too, a launch a chunk of instances (they took a launch a length)."""
    lengths = [3, 9, 1, 4, 4, 7, 2, 8, 5, 6, 12, 10]
    session = InferenceSession(from_onnx(HEADS), backend=backend, node_level=False)  # (a graph: run as given)
    rng = np.random.default_rng(1)
    assert_batched_equals_alone(session, [{"x": rng.standard_normal((1, n, 6)).astype(np.float32)} for n in lengths],
                                atol=1e-5)
    launches = session.stats.report.launches_by_op
    chunks = -(-len(lengths) // CHUNK)
    assert (launches["Gather"], launches["Squeeze"], launches["Concat"]) == (2 * chunks, chunks, chunks), launches


def test_heads_selected_before_their_transpose_take_a_launch_for_every_row(backend):
    """The same model given as ONNX: its Gathers of one index are moved before the Squeeze and
    Transpose (``ir.select_first``), and pick each head from every instance's rows in one launch."""
    lengths = [3, 9, 1, 4, 4, 7, 2, 8, 5, 6, 12, 10]
    session = InferenceSession(HEADS, backend=backend, node_level=False)
    rng = np.random.default_rng(1)
    assert_batched_equals_alone(session, [{"x": rng.standard_normal((1, n, 6)).astype(np.float32)} for n in lengths],
                                atol=1e-5)
    launches = session.stats.report.launches_by_op
    assert (launches["Gather"], launches["Squeeze"]) == (2, 1), launches


def test_concat_along_a_padded_axis_is_not_padded(backend):
    """Two operands joined along the length axis: padded, the second's rows would land after
    the first's padding, so it runs a launch a length, and each result still equals its own."""
    model = onnx.parser.parse_model("""<ir_version: 8, opset_import: ["" : 17]>
        g (float[1, L, 2] x) => (float[1, M, 2] y) {
        s = Sigmoid(x)
        y = Concat<axis = -2>(s, x) }""")
    session = InferenceSession(model, backend=backend, node_level=False)
    rng = np.random.default_rng(2)
    lengths = [2, 2, 3, 5]
    assert_batched_equals_alone(session, [{"x": rng.standard_normal((1, n, 2)).astype(np.float32)} for n in lengths])
    assert session.stats.report.launches_by_op["Concat"] == len(set(lengths))
    # and the plan says why neither ragged nor padded batching took it
    assert session.stats.report.by_shape == {
        "Concat: not ragged (an output whose rows are not its operands' in number); "
        "not padded (operands joined along an axis that members pad)": 1}
    assert "1 nodes of the model ran a class per shape (1 x Concat: not ragged" in str(session.stats.report)


def test_a_plan_meeting_more_keys_than_its_session_keeps_still_says_why(backend):
    """What a session learnt of record keys is bounded (``KEYS_KEPT``): a plan meeting more
    forgets the first ones before it says why a node ran a class per shape, and still runs."""
    model = onnx.parser.parse_model("""<ir_version: 8, opset_import: ["" : 17]>
        g (float[1, L, 2] x) => (float[1, M, 2] y) {
        s = Sigmoid(x)
        y = Concat<axis = -2>(s, x) }""")
    session = InferenceSession(model, backend=backend, node_level=False)
    session._known_records.size = 1
    rng = np.random.default_rng(5)
    assert_batched_equals_alone(session, [{"x": rng.standard_normal((1, n, 2)).astype(np.float32)} for n in (2, 3, 5)])
    assert list(session.stats.report.by_shape) == [
        "Concat: not ragged (rows of different shapes); not padded (operands joined along an axis that members pad)"]


def _masked(mask: str) -> onnx.ModelProto:
    """Attention whose scores ``s [1, L, L]`` get a mask computed from their shape alone, which
    the session folds into a constant of each length's own."""
    return onnx.parser.parse_model(f"""<ir_version: 8, opset_import: ["" : 17]>
        g (float[1, L, 4] x) => (float[1, L, 4] c) {{
        k = Transpose<perm = [0, 2, 1]>(x)
        s = MatMul(x, k)
        shape = Shape(s)
        {mask}
        masked = Add(s, mask)
        p = Softmax<axis = -1>(masked)
        c = MatMul(p, x) }}""")


CAUSAL = """ones = ConstantOfShape<value = float[1] {1.0}>(shape)
        one = Constant<value = int64 {1}>()
        future = Trilu<upper = 1>(ones, one)
        lowest = Constant<value = float {-1e9}>()
        mask = Mul(future, lowest)"""
# position / L: each length's is not the corner of a longer one's
FRACTION = """two = Constant<value = int64 {2}>()
        length = Gather<axis = 0>(shape, two)
        start = Constant<value = int64 {0}>()
        step = Constant<value = int64 {1}>()
        positions = Range(start, length, step)
        numerator = Cast<to = 1>(positions)
        denominator = Cast<to = 1>(length)
        mask = Div(numerator, denominator)"""


def test_a_causal_mask_of_each_length_own_runs_padded(backend):
    """A causal mask folded for each length is the corner of every longer one's: its Add runs a
    launch a chunk of instances (it took a launch a length), each result its own."""
    lengths = [3, 9, 1, 4, 4, 7, 2, 8, 5, 6, 12, 10]
    session = InferenceSession(_masked(CAUSAL), backend=backend, node_level=False)
    rng = np.random.default_rng(3)
    assert_batched_equals_alone(session, [{"x": rng.standard_normal((1, n, 4)).astype(np.float32)} for n in lengths],
                                atol=1e-5)
    chunks = -(-len(lengths) // CHUNK)
    assert session.stats.report.launches_by_op["Add"] == chunks and not session.stats.report.by_shape


def test_a_mask_of_each_length_that_is_not_a_corner_runs_a_launch_a_length(backend):
    lengths = [3, 9, 1, 4, 4, 7]
    session = InferenceSession(_masked(FRACTION), backend=backend, node_level=False)
    rng = np.random.default_rng(4)
    assert_batched_equals_alone(session, [{"x": rng.standard_normal((1, n, 4)).astype(np.float32)} for n in lengths],
                                atol=1e-5)
    assert session.stats.report.launches_by_op["Add"] == len(set(lengths))
    assert list(session.stats.report.by_shape) == [
        "Add: not ragged (rows of different shapes); not padded (a constant of one instance's own that is not a "
        "corner of a longer one's, or that broadcasts differently for different members)"]
