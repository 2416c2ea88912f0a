"""Ragged batching (``batcher/ragged.py``): instances of different lengths along axis 0 share a
launch for row-wise ops and segment reductions, and still equal each instance run alone."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import onnx
import onnxruntime
import pytest

import autobatch
from autobatch import Batch, Parameter, ops
from autobatch.batcher.plan import Block, Copied, Pieces
from tests.oracle import assert_batched_equals_alone, traced_alone

LENGTHS = [3, 1, 5, 3, 2, 5, 4]


def model(body: str, inputs: str = "float[N, 4] x", outputs: str = "float[M] y", weights: str = "") -> onnx.ModelProto:
    return onnx.parser.parse_model(f"""<ir_version: 8, opset_import: ["" : 18]>
    g ({inputs}) => ({outputs}) {('<' + weights + '>') if weights else ''} {{ {body} }}""")


W = ("float[4, 3] W = {1.0, -2.0, 0.5, 0.25, 1.0, -1.0, 0.0, 0.5, 2.0, -1.0, 0.75, 1.5}, "
     "float[3] b = {0.1, -0.2, 0.3}")
POOLED = model("h = MatMul(x, W)\n t = Tanh(h)\n u = Add(t, b)\n y = ReduceMean<keepdims=0>(u, axis)",
               outputs="float[3] y", weights=W + ", int64[1] axis = {0}")


def feeds(lengths: list[int], seed: int = 0, name: str = "x") -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{name: rng.standard_normal((n, 4)).astype(np.float32)} for n in lengths]


@pytest.fixture(params=["numpy", "onnxruntime"])
def backend(request):
    return request.param


def assert_equal_alone(session: autobatch.InferenceSession, instances: list[dict]) -> None:
    assert_batched_equals_alone(session, instances)


def test_instances_of_different_lengths_share_each_launch(backend):
    """Before ragged batching each length made its own MatMul, Tanh, Add and ReduceMean."""
    session = autobatch.InferenceSession(POOLED, backend=backend)
    assert_equal_alone(session, feeds(LENGTHS))
    assert session.stats.report.launches == 4 == session.stats.report.lower_bound
    assert_equal_alone(session, feeds([2, 7, 2], seed=1))  # other lengths: the same templates serve


@pytest.mark.filterwarnings("ignore:Mean of empty slice", "ignore:invalid value encountered")  # NumPy: NaN
def test_instances_without_rows_batch_apart(backend):
    """An instance of length 0 is not merged: an empty sum or mean has a value of its own."""
    session = autobatch.InferenceSession(POOLED, backend=backend)
    assert_equal_alone(session, feeds([3, 0, 2, 0, 4]))


# case -> (body, outputs, weights, whether its lengths share launches)
CASES = {
    "shared operand of lower rank": ("y = Mul(x, b4)", "float[N, 4] y", "float[4] b4 = {1.0, 2.0, 3.0, 4.0}", True),
    "per-instance operands of one shape": ("s = Mul(x, x)\n y = Sub(s, x)", "float[N, 4] y", "", True),
    "softmax over the last axis": ("y = Softmax<axis=-1>(x)", "float[N, 4] y", "", True),
    "log-softmax over axis 1": ("y = LogSoftmax<axis=1>(x)", "float[N, 4] y", "", True),
    "sum over axis 0, kept": ("y = ReduceSum<keepdims=1>(x, axis)", "float[1, 4] y", "int64[1] axis = {0}", True),
    "cast": ("y = Cast<to=11>(x)", "double[N, 4] y", "", True),
    "a shared row broadcast along axis 0": ("y = Add(x, r)", "float[N, 4] y", "float[1, 4] r = {1.0, 2.0, 3.0, 4.0}",
                                            True),
    "layer norm over the last axis": ("y = LayerNormalization<axis=-1>(x, g, b4)", "float[N, 4] y",
                                      "float[4] g = {1.0, 0.5, 2.0, 1.5}, float[4] b4 = {0.0, 1.0, -1.0, 0.5}", True),
    "gemm by a shared matrix": ("y = Gemm<alpha=0.5>(x, m, c)", "float[N, 2] y",
                                "float[4, 2] m = {1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0}, float[2] c = {1.0, -1.0}", True),
    "concat along axis 1": ("t = Tanh(x)\n y = Concat<axis=1>(x, t)", "float[N, 8] y", "", True),
    "clip by shared bounds": ("y = Clip(x, lo, hi)", "float[N, 4] y", "float lo = {-0.5}, float hi = {0.5}", True),
    "unsqueeze and squeeze after axis 0": ("t = Unsqueeze(x, one)\n y = Squeeze(t, one)", "float[N, 4] y",
                                           "int64[1] one = {1}", True),
    "flatten from axis 1": ("t = Unsqueeze(x, one)\n y = Flatten<axis=1>(t)", "float[N, 4] y", "int64[1] one = {1}",
                            True),
    # rows meet rows of the same instance: not ragged, but padded (``batcher.padding``), one
    # launch for these 7 instances
    "a product of two per-instance operands": ("t = Transpose<perm=[1, 0]>(x)\n y = MatMul(x, t)", "float[N, N] y",
                                               "", True),
    "softmax over axis 0": ("y = Softmax<axis=0>(x)", "float[N, 4] y", "", True),
    # neither: each length keeps its own launch
    "concat along axis 0": ("y = Concat<axis=0>(x, x)", "float[M, 4] y", "", False),
    "a max over axis 0": ("y = ReduceMax<keepdims=0>(x, axis)", "float[4] y", "int64[1] axis = {0}", False),
    # reshapes that keep each row's elements in order are row-wise, wherever the rows' axis goes
    "unsqueeze at axis 0": ("y = Unsqueeze(x, zero)", "float[1, N, 4] y", "int64[1] zero = {0}", True),
    "flatten from axis 2": ("t = Unsqueeze(x, one)\n y = Flatten<axis=2>(t)", "float[N, 4] y", "int64[1] one = {1}",
                            True),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_row_wise_ops_merge_lengths_and_others_do_not(backend, case):
    body, outputs, weights, merged = CASES[case]
    session = autobatch.InferenceSession(model(body, outputs=outputs, weights=weights), backend=backend)
    assert_equal_alone(session, feeds(LENGTHS))
    launches = session.stats.report.launches
    if merged:
        assert launches == len(body.splitlines())  # one an op
    else:
        assert launches >= len(set(LENGTHS))  # at least one a length


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean"])
@pytest.mark.parametrize("width", [4, 300])  # narrow rows: one reduceat; wide rows: one reduce a member
def test_segment_reductions_of_narrow_and_wide_rows(backend, op, width):
    pooled = model(f"y = {op}<keepdims=0>(x, axis)", inputs=f"float[N, {width}] x", outputs=f"float[{width}] y",
                   weights="int64[1] axis = {0}")
    session = autobatch.InferenceSession(pooled, backend=backend)
    rng = np.random.default_rng(width)
    assert_equal_alone(session, [{"x": rng.standard_normal((n, width)).astype(np.float32)} for n in LENGTHS])
    assert session.stats.report.launches == 1


def test_sums_of_terms_of_different_lengths(backend):
    """A sum-of-terms class takes any number of terms, so it is not merged across lengths by
    its first member's count (found by the property test: wrong sums, or an IndexError)."""
    body = "t = Tanh(x)\n s = Sum(x, x, t)\n y = Sum(x, s)"
    session = autobatch.InferenceSession(model(body, outputs="float[N, 4] y"), backend=backend)
    assert_equal_alone(session, feeds([1, 2, 1, 3]))


def test_embedding_lookup_of_sentences_of_different_lengths(backend):
    table = "float[6, 2] E = {0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0}"
    session = autobatch.InferenceSession(model("e = Gather<axis=0>(E, ids)\n y = Tanh(e)", inputs="int64[N] ids",
                                               outputs="float[N, 2] y", weights=table), backend=backend)
    rng = np.random.default_rng(0)
    assert_equal_alone(session, [{"ids": rng.integers(0, 6, n)} for n in LENGTHS])
    assert session.stats.report.launches == 2


def test_traced_matrices_of_different_lengths(backend):
    """The traced path merges lengths too: sentences as [n, d] matrices through an affine map."""
    rng = np.random.default_rng(0)
    weight = Parameter(rng.standard_normal((4, 3)).astype(np.float32))
    bias = Parameter(rng.standard_normal(3).astype(np.float32))
    sentences = [rng.standard_normal((n, 4)).astype(np.float32) for n in LENGTHS]
    with Batch(backend=backend) as batch:
        outputs = [ops.tanh(ops.affine(batch.constant(s), weight, bias)) for s in sentences]
        values = batch.run(outputs)
    assert batch.reports[-1].launches == 3  # MatMul, Add, Tanh: once each, whatever the lengths
    for sentence, value in zip(sentences, values, strict=True):
        np.testing.assert_allclose(value, np.tanh(sentence @ weight.array + bias.array), rtol=1e-5, atol=1e-6)


def random_program(seed: int):
    """A random chain of row-wise steps over an [n, 4] matrix, ending (or not) in a sum over
    rows; the same program for every instance."""
    rng = np.random.default_rng(seed)
    weight = Parameter(rng.standard_normal((4, 4)).astype(np.float32) / 2)
    shift = Parameter(rng.standard_normal(4).astype(np.float32))
    steps = rng.choice(["tanh", "affine", "square", "shift", "softmax", "relu"], size=int(rng.integers(2, 7)))
    pooled = bool(rng.integers(2))

    def program(x):
        for step in steps:
            x = {"tanh": ops.tanh, "relu": ops.relu, "square": lambda v: v * v, "softmax": ops.softmax,
                 "affine": lambda v: ops.matmul(v, weight), "shift": lambda v: v + shift}[step](x)
        return ops.reduce_sum(x, axis=0) if pooled else x

    program.ops = len(steps) + pooled  # type: ignore[attr-defined]
    return program


@pytest.mark.parametrize("seed", range(8))
def test_random_row_wise_programs_equal_each_instance_alone(backend, seed):
    program = random_program(seed)
    rng = np.random.default_rng(100 + seed)
    lengths = rng.integers(1, 6, size=6).tolist()
    sentences = [rng.standard_normal((n, 4)).astype(np.float32) for n in lengths]
    with Batch(backend=backend) as batch:
        values = batch.run([program(batch.constant(s)) for s in sentences])
    assert batch.reports[-1].launches == program.ops  # one launch an op, whatever the lengths
    for sentence, value in zip(sentences, values, strict=True):
        expected = traced_alone(lambda tracer, s: program(tracer.constant(s)), sentence)
        np.testing.assert_allclose(value, expected, rtol=1e-5, atol=1e-6)


def test_ragged_results_read_back_in_any_order_and_by_any_step(backend):
    """A ragged step's result is one block; later steps read it as a view (same members, same
    order), by an index (another order), by runs (a step of one length) or value by value (a
    step whose members' values were made by different steps)."""
    rng = np.random.default_rng(5)
    lengths = [3, 3, 5, 4, 3]
    xs = [rng.standard_normal((n, 4)).astype(np.float32) for n in lengths]
    with Batch(backend=backend) as batch:
        tanh = [ops.tanh(batch.constant(x)) for x in xs]  # one ragged step: a block
        same_order = [ops.exp(t) for t in tanh]  # a view of the block
        other_order = [ops.neg(t) for t in reversed(tanh)][::-1]  # the rows gathered by an index
        # Members of one class made by different steps: the odd ones by a per-length transpose.
        mixed = [t if k % 2 == 0 else ops.transpose(ops.transpose(t)) for k, t in enumerate(same_order)]
        totals = [ops.reduce_sum(m) for m in mixed]  # over every axis: a class per length
        values = batch.run([*same_order, *other_order, *totals])
    k = len(xs)
    for j, x in enumerate(xs):
        np.testing.assert_allclose(values[j], np.exp(np.tanh(x)), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(values[k + j], -np.tanh(x), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(values[2 * k + j], np.exp(np.tanh(x)).sum(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_a_loss_over_rows_is_one_launch_for_every_length(backend, reduction):
    """SoftmaxCrossEntropyLoss summed or averaged over each instance's rows: one value a row,
    then each instance's sum or mean."""
    loss = model(f'y = SoftmaxCrossEntropyLoss<reduction="{reduction}">(x, labels)',
                 inputs="float[N, 4] x, int64[N] labels", outputs="float y")
    session = autobatch.InferenceSession(loss, backend=backend)
    rng = np.random.default_rng(8)
    instances = [{"x": x["x"], "labels": rng.integers(0, 4, len(x["x"]))} for x in feeds(LENGTHS)]
    assert_equal_alone(session, instances)
    assert session.stats.report.launches == 1
    assert_equal_alone(session, instances[:1])  # one instance: the same ragged step


def test_traced_softmax_cross_entropy(backend):
    rng = np.random.default_rng(9)
    scores = [rng.standard_normal((n, 5)).astype(np.float32) for n in LENGTHS]
    labels = [rng.integers(0, 5, n).tolist() for n in LENGTHS]
    with Batch(backend=backend) as batch:
        losses = [ops.softmax_cross_entropy(batch.constant(s), y) for s, y in zip(scores, labels)]
        batch.run(losses)
        with pytest.raises(autobatch.TraceError, match="not classes of scores"):
            ops.softmax_cross_entropy(batch.constant(scores[0]), [5] * LENGTHS[0])
        with pytest.raises(autobatch.TraceError, match="labels n ints"):
            ops.softmax_cross_entropy(batch.constant(scores[0]), [0])
    assert batch.reports[-1].launches == 1
    for s, y, loss in zip(scores, labels, losses, strict=True):
        log_p = s - np.log(np.exp(s).sum(axis=1, keepdims=True))
        np.testing.assert_allclose(loss.value, -log_p[np.arange(len(y)), y].sum(), rtol=1e-5, atol=1e-5)


# An exporter's layout: one instance's rows along axis 1 ([1, n, 4]), moved to axis 0 and back
INSTANCE_AXIS = model(
    "h = MatMul(x, W)\n a = Add(h, b)\n n = LayerNormalization<axis=-1>(a, g3, b)\n s = Softmax<axis=-1>(n)\n"
    " t = Transpose<perm=[1, 0, 2]>(s)\n r = Reshape(t, shape)\n q, k = Split<axis=2>(r, halves)\n"
    " m = ReduceMean<keepdims=1>(q, last)\n y = Concat<axis=2>(m, k)",
    inputs="float[1, N, 4] x", outputs="float[N, 1, 3] y",
    weights=W + ", float[3] g3 = {1.0, 0.5, 2.0}, int64[3] shape = {-1, 1, 3}, int64[2] halves = {2, 1}, "
    "int64[1] last = {-1}")


def test_rows_along_a_later_axis_batch_across_lengths(backend):
    """Exports of one instance give its values leading axes of 1 ([1, n, d]); their rows run
    along the first axis that is not 1, and each op is one launch whatever the lengths (the
    instance of one row too)."""
    session = autobatch.InferenceSession(INSTANCE_AXIS, backend=backend)
    rng = np.random.default_rng(0)
    instances = [{"x": rng.standard_normal((1, n, 4)).astype(np.float32)} for n in LENGTHS]
    assert_equal_alone(session, instances)
    assert session.stats.report.launches == 9


def test_a_transpose_that_moves_rows_past_other_axes_is_not_a_reshape(backend):
    """[1, n, 2, 2] -> [1, 2, n, 2] interleaves the rows: not a view of them, it runs padded."""
    session = autobatch.InferenceSession(model("r = Reshape(x, shape)\n y = Transpose<perm=[0, 2, 1, 3]>(r)",
                                               inputs="float[1, N, 4] x", outputs="float[1, 2, N, 2] y",
                                               weights="int64[4] shape = {1, -1, 2, 2}"), backend=backend)
    rng = np.random.default_rng(1)
    assert_equal_alone(session, [{"x": rng.standard_normal((1, n, 4)).astype(np.float32)} for n in LENGTHS])
    assert session.stats.report.launches_by_op["Transpose"] == 1
    assert session.stats.report.launches == 2


def test_records_of_every_length_share_what_their_rows_say_only_where_it_is_the_same() -> None:
    """The planner works out a record's rows once for the records of every length of one op
    (``classing._length_free_key``). For traced ops over values of many lengths (1 and 2
    included, leading 1s, square values, rows doubled by a concat, reshapes, sequences), each
    record's kind is the one a planner that has seen no other record works out."""
    from autobatch.batcher.flat import _Planner
    from autobatch.batcher.plan import TemplateCache
    rng = np.random.default_rng(0)
    W = Parameter(rng.standard_normal((4, 4)).astype(np.float32))
    lstm = [Parameter(rng.standard_normal(shape).astype(np.float32)) for shape in ((1, 12, 4), (1, 12, 3), (1, 24))]
    with Batch() as batch:
        picks = batch.shared_constant(np.array([[0, 1, 0]], np.int64))
        for n in (1, 2, 3, 4, 5, 8, 2, 16):
            x = batch.constant(rng.standard_normal((n, 4)).astype(np.float32))
            h = ops.tanh(ops.add(ops.matmul(x, W), np.float32(1.0)))
            ops.softmax(h, axis=0), ops.softmax(h), ops.concat([h, x]), ops.concat([h, x], axis=1)
            ops.matmul(h, ops.transpose(x)), ops.reshape(h, (1, n, 4)), ops.reshape(h, (n * 4,))
            ops.reduce_sum(h, axis=0), ops.reduce_sum(h, axis=1), ops.index(h, 0)
            ops.softmax(ops.reshape(h, (1, n, 4)), axis=1), ops.lstm(h, *lstm)
            ops.lookup(W, rng.integers(0, 4, n).tolist())
            longer = batch.constant(rng.standard_normal((n + 1, 4)).astype(np.float32))
            ops.concat([h, longer]), ops.concat([x, h])  # rows of two lengths, and of one, made twice as many
            # rows out along another axis, as many as the operand's for n = 3 only: refused either
            # way, for a reason a report names (a reviewer's case)
            batch.record("Gather", [x, picks], [(1, 3, 4)], [np.dtype(np.float32)])
        records = list(batch._records)
        cache, opsets = TemplateCache(), batch._opsets()
        shared = _Planner(cache, batch._weights, batch._literals, batch.functions, opsets)
        kinds = [shared._kind(record) for record in records]
        alone = [_Planner(cache, batch._weights, batch._literals, batch.functions, opsets)._kind(record)
                 for record in records]
        batch.discard()
    for record, got, want in zip(records, kinds, alone):
        assert got == want, (record.op_type, [getattr(e, "shape", e) for e in record.entries])
    assert len(shared.rows_of_kinds) < len(records) / 2  # lengths did share (square values, reshapes to n * 4 did not)


@pytest.mark.parametrize("whole_plan", [False, True])
def test_rows_picked_by_known_indices_from_a_block_are_read_where_they_lie(backend, whole_plan):
    """``ops.index(block_value, i)`` (the parser reading its BiLSTM's states word by word): the
    row where it lies, no launch (a Gather step copied each member's whole value to pick one
    row); negative indices too; a traced index still runs a Gather."""
    if whole_plan and backend != "onnxruntime":
        pytest.skip("a whole plan is an onnxruntime session")
    rng = np.random.default_rng(7)
    lengths = [3, 5, 1, 4, 5]
    xs = [rng.standard_normal((n, 4)).astype(np.float32) for n in lengths]
    picks = [(0, -1), (4, -3), (0, 0), (-2, 3), (2, -5)]  # two known rows of each instance
    with Batch(backend=backend, whole_plan=whole_plan) as batch:
        tanh = [ops.tanh(batch.constant(x)) for x in xs]  # one ragged step: a block
        rows = [ops.index(t, i) for t, (i, _) in zip(tanh, picks)]
        others = [ops.index(t, j) for t, (_, j) in zip(tanh, picks)]
        scaled = [ops.exp(r) for r in rows]  # a later step reads the picked rows
        values = batch.run([*rows, *others, *scaled])
        assert batch.reports[-1].launches_by_op == {"Tanh": 1, "Exp": 1} and batch.reports[-1].launches == 2
        traced = [ops.index(t, batch.constant(np.int64(n - 2)) + batch.constant(np.int64(1))) for t, n in zip(tanh, lengths)]
        values += batch.run(traced)
        assert batch.reports[-1].launches_by_op["Gather"] == 4  # one a length
    k = len(xs)
    for j, (x, n, (i, i2)) in enumerate(zip(xs, lengths, picks)):
        np.testing.assert_allclose(values[j], np.tanh(x)[i], rtol=1e-6)
        np.testing.assert_allclose(values[k + j], np.tanh(x)[i2], rtol=1e-6)
        np.testing.assert_allclose(values[2 * k + j], np.exp(np.tanh(x)[i]), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(values[3 * k + j], np.tanh(x)[n - 1], rtol=1e-6)


@pytest.mark.parametrize("whole_plan", [False, True])
def test_rows_stacked_into_values_of_different_lengths_are_read_once_into_a_block(backend, whole_plan):
    """``ops.stack`` of rows (a Concat of ``[1, d]`` values along axis 0; the char tagger stacks
    its word vectors so): the members of every length read their rows at once into one block,
    no Concat launch; rows made by a step, literals and rows picked from a block alike. A Concat
    of wider values, or one reading a weight, still runs as a Concat."""
    if whole_plan and backend != "onnxruntime":
        pytest.skip("a whole plan is an onnxruntime session")
    rng = np.random.default_rng(11)
    lengths = [3, 5, 1, 3, 2]
    xs = [rng.standard_normal((n, 4)).astype(np.float32) for n in lengths]
    weight = Parameter(rng.standard_normal((1, 4)).astype(np.float32))
    with Batch(backend=backend, whole_plan=whole_plan) as batch:
        tanh = [ops.tanh(batch.constant(x)) for x in xs]  # a block: its rows are picked below
        rows = [[ops.exp(ops.index(t, k)) if k % 2 else ops.index(t, k) for k in range(len(x))]
                for t, x in zip(tanh, xs)]
        stacked = [ops.stack(r) for r in rows]
        summed = [ops.reduce_sum(s, axis=0) for s in stacked]  # a later ragged step reads the block
        literal = [ops.stack([batch.constant(row) for row in x]) for x in xs]
        wide = [ops.concat([t, t]) for t in tanh]
        with_weight = [ops.concat([ops.stack([ops.index(t, 0)]), weight]) for t in tanh]
        values = batch.run([*stacked, *summed, *literal, *wide, *with_weight])
    k = len(xs)
    for j, x in enumerate(xs):
        expected = np.tanh(x)
        expected[1::2] = np.exp(expected[1::2])
        np.testing.assert_allclose(values[j], expected, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(values[k + j], expected.sum(0), rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(values[2 * k + j], x)
        np.testing.assert_allclose(values[3 * k + j], np.concatenate([np.tanh(x)] * 2), rtol=1e-6)
        np.testing.assert_allclose(values[4 * k + j], np.concatenate([np.tanh(x)[:1], weight.array]), rtol=1e-6)
    steps = Counter(step.template.graph.name for step in batch.last_plan.steps if step.template is not None)
    # Rows stacked: one step for every length (3, 5, 1, 2), the literals' and the single rows'
    # too, no Concat run. Concats run: the wide ones (lengths 3, 5 and 2; length 1's are rows)
    # and the one reading a weight.
    assert steps["reshape_rows"] == 1 and steps["template_Concat"] == 4, steps


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_known_values_stacked_are_known_rows_not_traced_ops(backend, dtype):
    """``ops.stack`` of values known when traced (rows of a parameter looked up by a Python int,
    values computed by an earlier run, literals) beside pending ones: a known one is a known
    row of its own dtype, no Unsqueeze to plan, and the stack equals NumPy's."""
    rng = np.random.default_rng(13)
    table = Parameter((rng.standard_normal((6, 4)) * 10).astype(dtype))
    with Batch(backend=backend) as batch:
        computed = ops.add(batch.constant(np.ones(4, dtype), dtype), ops.lookup(table, 0))
        computed.numpy()  # known from here on
        parts = [[ops.lookup(table, 1), ops.add(ops.lookup(table, 2), ops.lookup(table, 3)), computed, batch.constant(table.array[4], dtype)],
                 [ops.lookup(table, 1)]]
        stacked = [ops.stack(p) for p in parts]
        records = [r.op_type for r in batch._records]
        values = batch.run(stacked)
    want = [np.stack([table.array[1], table.array[2] + table.array[3], table.array[0] + 1, table.array[4]]),
            table.array[1:2]]
    for got, expected in zip(values, want):
        assert got.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(got, expected)
    assert records.count("Unsqueeze") == 1, records  # the pending sum's only


@pytest.mark.parametrize("whole_plan", [False, True])
def test_rows_of_no_elements_stack_and_reduce(whole_plan):
    """Stacks of rows of width 0 (and a sum over them), step by step and as one onnxruntime
    session: the whole plan's Reshape to ``[rows, 0]`` took its 0 as "copy the input's size"
    and failed (``allowzero``)."""
    with Batch(backend="onnxruntime", whole_plan=whole_plan) as batch:
        stacks = [ops.stack([ops.tanh(batch.constant(np.zeros(0, np.float32))) for _ in range(n)]) for n in (2, 3)]
        sums = [ops.reduce_sum(s, axis=0) for s in stacks]
        values = batch.run([*stacks, *sums])
    assert [v.shape for v in values] == [(2, 0), (3, 0), (0,), (0,)]
    assert ("whole plan run" in batch.reports[-1].execution) == whole_plan


def test_stacks_of_several_numbers_of_rows_not_read_as_one_run_a_step_a_number(backend, monkeypatch):
    """Stacks of rows are one class whatever their number of rows; where their rows cannot be
    read as one run (``Layout._stacked_rows`` says None), the class runs a Concat a number of
    rows, each equal to its instance alone."""
    from autobatch.batcher.layout import Layout
    monkeypatch.setattr(Layout, "_stacked_rows", lambda self, members: None)
    rng = np.random.default_rng(12)
    xs = [rng.standard_normal((n, 4)).astype(np.float32) for n in (3, 5, 1, 3)]
    with Batch(backend=backend) as batch:
        stacks = [ops.stack([ops.tanh(batch.constant(row)) for row in x]) for x in xs]
        # a later group of the class holds one number of rows, not its first member's
        later = ops.stack([ops.index(ops.tanh(stacks[0]), k) for k in (0, 1, 2, 0, 1)])
        values = batch.run([*stacks, later])
    for x, value in zip(xs, values):
        np.testing.assert_allclose(value, np.tanh(x), rtol=1e-6)
    np.testing.assert_allclose(values[-1], np.tanh(np.tanh(xs[0]))[[0, 1, 2, 0, 1]], rtol=1e-6)
    assert batch.last_plan.report.launches_by_op["Concat"] == 4


def test_a_models_rows_picked_by_constant_indices_cost_no_launch(backend):
    """A model's Gather of one row by an initializer (the first and the last token's states) of
    a value kept in a block: read where it lies, for instances of any length."""
    session = autobatch.InferenceSession(model("h = Tanh(x)\n first = Gather<axis=0>(h, i0)\n last = Gather<axis=0>(h, i1)\n"
                                               " y = Add(first, last)", outputs="float[4] y",
                                               weights="int64 i0 = {0}, int64 i1 = {-1}"), backend=backend)
    assert_equal_alone(session, feeds(LENGTHS))
    assert session.stats.report.launches_by_op == {"Tanh": 1, "Add": 1}


def _picks_and_stacks(tracer: Any, x: np.ndarray, seed: int) -> list:
    """A random program of one instance over rows: rows picked from blocks (by known indices,
    negative too), rows computed, rows of data, stacked (into blocks rows are picked from
    again), and read by ragged and row steps. Its draws depend on the seed and the length."""
    rng = np.random.default_rng([seed, len(x)])
    block = ops.tanh(tracer.constant(x))
    outputs = []
    for _ in range(3):
        n = block.shape[0]
        rows = []
        for _ in range(int(rng.integers(1, 5))):
            kind = rng.integers(3)
            row = ops.index(block, int(rng.integers(-n, n)))
            rows.append(row if kind == 0 else ops.exp(row) if kind == 1 else tracer.constant(x[0] * 2))
        block = ops.stack(rows) if rng.integers(2) else ops.sigmoid(ops.stack(rows))
        outputs += [block, ops.reduce_sum(block, axis=0), rows[0]]
    return outputs


@pytest.mark.parametrize("seed", range(12))
def test_random_picks_and_stacks_equal_each_instance_alone(backend, seed):
    """The planner's picked rows (no step) and stacked rows (a read into a block) against each
    instance traced alone, in programs that mix them with each other and with launched steps."""
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal((int(n), 4)).astype(np.float32) for n in rng.integers(1, 6, size=7)]
    with Batch(backend=backend) as batch:
        outputs = [_picks_and_stacks(batch, x, seed) for x in xs]
        values = batch.run([value for out in outputs for value in out])
    per = len(outputs[0])
    for j, x in enumerate(xs):
        expected = traced_alone(lambda tracer, x: _picks_and_stacks(tracer, x, seed), x)
        for got, want in zip(values[j * per:(j + 1) * per], expected, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("settings", [{}, {"alone_when_faster": False, "node_level": False, "whole_plans": 0}])
def test_a_row_picked_by_an_input_index_follows_each_runs_index(backend, settings):
    """A session keeps a plan for its inputs' types: a Gather by an index that is an input is
    never fixed into it (found by a review: the first batch's rows came back for later ones)."""
    session = autobatch.InferenceSession(model("h = Tanh(x)\n y = Gather<axis=0>(h, i)", inputs="float[N, 4] x, int64 i",
                                               outputs="float[4] y"), backend=backend, **settings)
    xs = feeds([3, 5, 2], seed=4)
    for indices in ([0, 1, 1], [2, 4, -1], [-3, 0, 1]):
        assert_equal_alone(session, [{**x, "i": np.array(i, np.int64)} for x, i in zip(xs, indices)])
    lowered = session.plan_model([{**x, "i": np.array(0, np.int64)} for x in xs])
    ort_session = onnxruntime.InferenceSession(lowered.SerializeToString(), providers=["CPUExecutionProvider"])
    given = {"i0/x": xs[0]["x"], "i1/x": xs[1]["x"], "i2/x": xs[2]["x"],
             "i0/i": np.array(2, np.int64), "i1/i": np.array(-1, np.int64), "i2/i": np.array(1, np.int64)}
    got = ort_session.run(None, {i.name: given[i.name] for i in ort_session.get_inputs()})
    for value, x, i in zip(got, xs, (2, -1, 1)):
        np.testing.assert_allclose(value, np.tanh(x["x"])[i], rtol=1e-6)


def test_an_index_outside_its_instance_fails_as_alone_and_never_reads_another_instances_row(backend):
    """Per-instance indices into per-instance data are offset into the batch's rows: one past
    its own instance (or before it) would read another's row. It fails, as alone (the rule sent
    such indices round with a Mod before: a row, where alone raises)."""
    session = autobatch.InferenceSession(model("h = Tanh(x)\n y = Gather<axis=0>(h, i)", inputs="float[N, 4] x, int64 i",
                                               outputs="float[4] y"), backend=backend, alone_when_faster=False)
    xs = feeds([3, 3, 3], seed=5)
    assert_equal_alone(session, [{**x, "i": np.array(i, np.int64)} for x, i in zip(xs, (-3, 2, 0))])
    for bad in (3, -4, 7):
        instances = [{**x, "i": np.array(i, np.int64)} for x, i in zip(xs, (0, bad, 1))]
        with pytest.raises(Exception, match="out of (data )?bounds"):
            session.run(None, instances[1])
        with pytest.raises(Exception, match="out of (data )?bounds"):
            session.run_batch(None, instances)


def test_results_share_no_memory_when_rows_are_picked_or_stacked(backend):
    """A picked row is its block's row and a stack reads its rows at once: results a caller gets
    must still be arrays of their own, as each instance's alone are (found by a review): a row
    beside its block, and one row picked twice, are copies."""
    rng = np.random.default_rng(9)
    xs = [rng.standard_normal((n, 4)).astype(np.float32) for n in (3, 5)]
    with Batch(backend=backend) as batch:
        tanh = [ops.tanh(batch.constant(x)) for x in xs]
        rows = [ops.index(t, 1) for t in tanh]
        exps = [ops.exp(ops.reshape(r, (1, 4))) for r in rows]  # one step's rows side by side: read as a view...
        stacked = [ops.concat([e]) for e in exps]  # ...by this stack of [1, 4] rows, but for its gather
        values = batch.run([*tanh, *rows, *exps, *stacked])
    for j in range(len(xs)):
        assert not np.shares_memory(values[j], values[2 + j])  # a block and its picked row
        assert not np.shares_memory(values[4 + j], values[6 + j])  # rows and their stack
        np.testing.assert_array_equal(values[6 + j], values[4 + j])
    with Batch(backend=backend) as batch:  # rows alone in their block (not wanted): one picked twice, others once
        rows = [ops.index(t, k) for t in [ops.tanh(batch.constant(x)) for x in xs] for k in (0, 1, -2, 2)]
        values = batch.run(rows)  # (1 and -2: the same row of the first)
        assert sum(type(rows) is Copied for _, rows in batch.last_plan.locations.values()) == 2
    for (j, k), value in zip(((j, k) for j in range(len(xs)) for k in (0, 1, -2, 2)), values, strict=True):
        np.testing.assert_allclose(value, np.tanh(xs[j][k]), rtol=1e-6)
    assert not np.shares_memory(values[1], values[2])
    assert not any(np.shares_memory(a, b) for i, a in enumerate(values) for b in values[i + 1:])
    session = autobatch.InferenceSession(model("h = Tanh(x)\n y = Gather<axis=0>(h, one)", outputs="float[N, 4] h, float[4] y",
                                               weights="int64 one = {1}"), backend=backend, alone_when_faster=False)
    results = session.run_batch(None, feeds([3, 5, 2]))
    assert session.stats.report is not None and "Gather" not in session.stats.report.launches_by_op
    for h, y in results:
        assert not np.shares_memory(h, y)
        np.testing.assert_array_equal(y, h[1])


def test_vectors_of_one_length_a_group_run_as_rows_of_their_own_not_as_scalar_rows(backend):
    """A primitive LSTM adds its gates ``[4h]`` and its state ``[h]``: one ragged class of scalar
    rows (Add is row-wise), but each launch holds one of them. Such a group runs as ``[N, d]``
    rows of its own type: no block of ``N * d`` scalar rows for later steps to read one by one.
    Vectors of several lengths in one launch still run ragged."""
    rng = np.random.default_rng(5)
    steps = [3, 1, 4, 2]  # each instance's recurrence length
    gates = [[rng.standard_normal(8).astype(np.float32) for _ in range(n)] for n in steps]
    with Batch(backend=backend) as batch:
        results = []
        for xs in gates:
            c = batch.constant(np.zeros(2, np.float32))
            for x in xs:
                g = ops.tanh(batch.constant(x) + ops.concat([c, c, c, c]))  # an Add of [8]
                c = ops.sigmoid(c + ops.split(g, 4)[0])  # an Add of [2]: the same ragged class
            results.append(c)
        values = batch.run(results)
        plan = batch.last_plan
        mixed = [rng.standard_normal(n).astype(np.float32) for n in (3, 5, 3)]
        sums = batch.run([batch.constant(m) + batch.constant(m) for m in mixed])
    adds = [step for step in plan.steps if step.template is not None and "Add" in
            [node.op_type for node in step.template.graph.nodes.values()]]
    assert len(adds) == 2 * max(steps)
    assert not any(step.groups or isinstance(write, Block) for step in adds for write in step.writes)
    assert not any(isinstance(rows, Pieces) for step in plan.steps for _, rows in step.reads)
    for xs, got in zip(gates, values):
        c = np.zeros(2, np.float32)
        for x in xs:
            c = 1 / (1 + np.exp(-(c + np.tanh(x + np.tile(c, 4))[:2])))
        np.testing.assert_allclose(got, c, rtol=1e-5, atol=1e-6)
    assert batch.last_plan.steps[0].groups  # lengths 3 and 5 in one launch: ragged
    for m, got in zip(mixed, sums):
        np.testing.assert_array_equal(got, m + m)


@pytest.mark.parametrize("op_type", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("opset, shape, axis, launches", [
    (13, "[1, L, 4]", "", 1),  # the last axis by default
    (11, "[1, L, 4]", "", 3),  # axis 1 by default, and every axis from it on: one instance's L * 4 values
    (11, "[1, L, 4]", "<axis = 2>", 1),
    (11, "[L, 4]", "", 1),
])
def test_a_softmax_before_opset_13_is_row_wise_only_over_the_axes_it_flattens(backend, op_type, opset, shape, axis,
                                                                              launches):
    """Before opset 13 a Softmax normalizes over every axis from its ``axis`` on (1 by default):
    over ``[1, L, d]`` that is all of an instance's values, not a row's (rows of several
    instances concatenated were normalized together: wrong results)."""
    session = autobatch.InferenceSession(onnx.parser.parse_model(f"""<ir_version: 7, opset_import: ["" : {opset}]>
        g (float{shape} x) => (float{shape} y) {{ y = {op_type}{axis}(x) }}"""), backend=backend)
    rng = np.random.default_rng(4)
    lengths = [2, 3, 5, 3]
    assert_equal_alone(session, [{"x": rng.standard_normal((1, n, 4) if shape.startswith("[1") else (n, 4))
                                  .astype(np.float32)} for n in lengths])
    assert session.stats.report.launches_by_op[op_type] == launches
