"""``ops.affine`` and ``ops.pick_neg_log_softmax`` of a vector are one node a call (as DyNet's
affine_transform and pickneglogsoftmax are), computing what their ops compute; of other shapes,
and inside a cell's body, they are their ops."""

from __future__ import annotations

import numpy as np
import pytest

from autobatch import Batch, Parameter, TraceError, cell, ops
from autobatch.frontends.cells import CELL_DOMAIN

RNG = np.random.default_rng(3)
W = Parameter(RNG.standard_normal((6, 5)).astype(np.float32), name="W")
B = Parameter(RNG.standard_normal(5).astype(np.float32), name="B")
XS = [RNG.standard_normal(6).astype(np.float32) for _ in range(7)]
LABELS = [0, 4, 2, -1, 3, 1, -5]


def _losses(batch: Batch, xs: list[np.ndarray], labels: list[int]) -> list:
    return [ops.pick_neg_log_softmax(ops.tanh(ops.affine(batch.constant(x), W, B)), label)
            for x, label in zip(xs, labels)]


def _nll(scores: np.ndarray, label: int) -> np.float32:
    shifted = scores - scores.max()
    return -(shifted - np.log(np.exp(shifted).sum()))[label]


def _op_types(batch: Batch, values: list) -> list[tuple[str, str]]:
    graph = batch.graph_of(values)
    return sorted({(r.domain, r.op_type.split("_")[0] if r.domain else r.op_type) for r in graph.topological_order()})


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_of_vectors_one_node_each_batched_equal_to_each_alone_and_to_numpy(backend: str) -> None:
    with Batch(backend=backend) as batch:
        losses = _losses(batch, XS, LABELS)
        assert _op_types(batch, losses) == [("", "Tanh"), (CELL_DOMAIN, "affine"), (CELL_DOMAIN, "pick")]
        batched = [float(v) for v in batch.run(losses)]
    report = batch.reports[-1]
    assert (report.nodes, report.launches) == (3 * len(XS), 3)  # one node a call, one launch a class
    alone = []
    for x, label in zip(XS, LABELS):
        with Batch(backend=backend) as one:
            alone.append(float(one.run(_losses(one, [x], [label]))[0]))
    np.testing.assert_allclose(batched, alone, rtol=1e-5, atol=1e-6)
    expected = [_nll(np.tanh(x @ W.array + B.array), k) for x, k in zip(XS, LABELS)]
    np.testing.assert_allclose(batched, expected, rtol=1e-5, atol=1e-6)


def test_of_other_shapes_and_indices_they_are_their_ops() -> None:
    """A matrix's affine (rows of other lengths batch across lengths as MatMul and Add, not as
    one function a length), and a loss of a class given as a tensor, are their ops."""
    with Batch() as batch:
        rows = batch.constant(np.stack(XS[:3]))
        label = batch.constant(np.int64(2))
        values = [ops.affine(rows, W, B), ops.pick_neg_log_softmax(ops.affine(batch.constant(XS[0]), W, B), label)]
        assert _op_types(batch, values) == [("", "Add"), ("", "Gather"), ("", "LogSoftmax"), ("", "MatMul"),
                                            ("", "Neg"), (CELL_DOMAIN, "affine")]
        got = batch.run(values)
    np.testing.assert_allclose(got[0], np.stack(XS[:3]) @ W.array + B.array, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[1], _nll(XS[0] @ W.array + B.array, 2), rtol=1e-5, atol=1e-6)


def test_inside_a_cell_they_are_ops_of_its_body() -> None:
    """The body is batched whole: a nested call would hide its MatMul from the body's rules."""
    @cell
    def scored(x):
        return ops.pick_neg_log_softmax(ops.affine(x, W, B), 1)

    with Batch() as batch:
        losses = [scored(batch.constant(x)) for x in XS]
        assert [r.domain for r in batch.graph_of(losses).topological_order()] == [CELL_DOMAIN] * len(XS)
        (function,) = [f for (domain, _), f in batch.functions.items() if f.name.startswith("scored")]
        assert [(n.domain, n.op_type) for n in function.node if n.op_type != "Constant"] == \
            [("", "MatMul"), ("", "Add"), ("", "LogSoftmax"), ("", "Gather"), ("", "Neg")]
        assert not [f for f in batch.functions.values() if f.name.startswith(("affine", "pick"))]
        got = [float(v) for v in batch.run(losses)]
    np.testing.assert_allclose(got, [_nll(x @ W.array + B.array, 1) for x in XS], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64])
def test_keywords_scalars_and_traced_weights(dtype: type) -> None:
    """Traced weights and biases: one node; a scalar bias (the ops give it x's dtype): the ops."""
    x_value, w_value, b_value = ((a * 4).astype(dtype) for a in (XS[0], W.array, B.array))
    scalars = [1, np.int64(2), 0.5 if dtype != np.int64 else 3]
    with Batch() as batch:
        x = batch.constant(x_value)
        w = batch.constant(w_value) + batch.constant(np.zeros_like(w_value))  # a traced weight
        values = [ops.affine(x=x, weight=w, bias=batch.constant(b_value))]
        values += [ops.affine(x, w if k else Parameter(w_value), scalar) for k, scalar in enumerate(scalars)]
        assert _op_types(batch, values[:1]) == [("", "Add"), (CELL_DOMAIN, "affine")]
        assert _op_types(batch, values[1:]) == [("", "Add"), ("", "MatMul")]
        got = batch.run(values)
    product = x_value @ w_value
    tolerance = {"rtol": 1e-2, "atol": 0.1} if dtype == np.float16 else {"rtol": 1e-5, "atol": 1e-6}
    for value, bias in zip(got, [b_value, *scalars]):
        assert value.dtype == dtype
        np.testing.assert_allclose(value, product + np.asarray(bias).astype(dtype), **tolerance)


def test_an_index_as_a_numpy_integer_is_the_ops() -> None:
    with Batch() as batch:
        x = batch.constant(XS[0])
        loss = ops.pick_neg_log_softmax(x, np.int64(2))
        assert _op_types(batch, [loss]) == [("", "Gather"), ("", "LogSoftmax"), ("", "Neg")]
        got = batch.run([loss])[0]
    np.testing.assert_allclose(got, _nll(XS[0], 2), rtol=1e-5, atol=1e-6)


def test_a_batch_entered_again_keeps_only_the_functions_its_block_calls() -> None:
    """Vectors of 300 lengths, each a signature of the one-node cell (more than a cell keeps):
    the functions a block's calls add go when it ends, rather than piling up in the batch."""
    batch = Batch()
    for n in range(1, 301):
        with batch:
            loss = ops.pick_neg_log_softmax(batch.constant(np.arange(n, dtype=np.float32)), n - 1)
            assert len(batch.functions) == 1
            got = batch.run([loss])[0]
        assert not batch.functions
        np.testing.assert_allclose(got, _nll(np.arange(n, dtype=np.float32), n - 1), rtol=1e-5, atol=1e-6)


def test_errors_are_named_at_trace_time() -> None:
    with Batch() as batch:
        x = batch.constant(XS[0])
        with pytest.raises(TraceError, match=r"MatMul: shapes \(6,\) and \(5, 5\) do not match"):
            ops.affine(x, np.zeros((5, 5), np.float32), B)
        with pytest.raises(TraceError, match="Gather: index 6 is out of range for shape"):
            ops.pick_neg_log_softmax(x, 6)
        with pytest.raises(TraceError, match="Gather: index -7 is out of range for shape"):
            ops.pick_neg_log_softmax(x, -7)
        with pytest.raises(TraceError, match=r"MatMul: operands have different dtypes \['int64', 'float32'\]"):
            ops.affine(batch.constant(np.arange(6)), W, B)
        batch.discard()


def test_a_parameter_given_to_a_cell_is_the_batchs_one_tensor_of_it() -> None:
    """(The compiled recorder looks it up in the batch's memo, as ``Tracer.parameter`` does.)"""
    @cell
    def shifted(x, w):
        return x + w

    with Batch() as batch:
        x = batch.constant(XS[0][:5])
        values = [shifted(x, B), shifted(x * 2.0, B)]
        (first, second) = [r for r in batch.graph_of(values).topological_order() if r.domain == CELL_DOMAIN]
        assert first.inputs[1] == second.inputs[1] == batch.parameter(B).name
        got = batch.run(values)
    np.testing.assert_allclose(got[1], XS[0][:5] * 2.0 + B.array, rtol=1e-6)
