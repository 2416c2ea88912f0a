"""A cell whose Concat joins stacked operands (the parser's ``concat([s2, s1, s0, b0])``) runs a
template without the Concat, its operands read joined (``batcher.joined_operands``): from the
literals (a lockstep round's values of earlier rounds) or from rows of one arena, in any order,
equal to each instance alone; where they cannot be read so, or no Concat joins them, the step
runs as planned."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from autobatch import Batch, Parameter, cell, ops, run_programs
from autobatch.backends import flat_executor
from autobatch.batcher.joined_operands import joined_operands, joined_step
from autobatch.frontends.tensors import current_batch

RNG = np.random.default_rng(5)
# Frozen: a lockstep round like the last is then made from its plan (``Batch.plan``).
W = Parameter(RNG.standard_normal((12, 3)).astype(np.float32), name="W").freeze()
B = Parameter(RNG.standard_normal(3).astype(np.float32), name="B").freeze()
XS = [RNG.standard_normal(4).astype(np.float32) for _ in range(7)]
TOL = dict(rtol=1e-5, atol=1e-6)


@cell
def scores(a: Any, b: Any, c: Any) -> Any:
    return ops.tanh(ops.affine(ops.concat([a, b, c]), W, B))


def _expected(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    return np.tanh(np.concatenate([a, b, c]) @ W.array + B.array)


class _JoinedReads:
    """Counts the steps read joined (``joined_step`` itself runs: the executor's own)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0

        def counted(step: Any) -> Any:
            joined = joined_step(step)
            self.count += joined is not None
            return joined

        monkeypatch.setattr(flat_executor, "joined_step", counted)


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_operands_in_rows_of_one_arena_in_any_order_are_read_joined(backend: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    joined = _JoinedReads(monkeypatch)

    def traced(batch: Batch, ks: list[int]) -> list[Any]:
        hidden = [ops.tanh(batch.constant(x)) for x in XS]  # one class: rows of one arena
        return [scores(hidden[k], hidden[(k + 3) % 7], hidden[(k + 5) % 7]) for k in ks]

    with Batch(backend=backend) as batch:
        batched = batch.run(traced(batch, list(range(7))))
    assert joined.count == 1
    hidden = [np.tanh(x) for x in XS]
    expected = [_expected(hidden[k], hidden[(k + 3) % 7], hidden[(k + 5) % 7]) for k in range(7)]
    np.testing.assert_allclose(np.stack(batched), np.stack(expected), **TOL)
    alone = []
    for k in range(7):
        with Batch(backend=backend) as one:
            alone.append(one.run(traced(one, [k]))[0])
    np.testing.assert_allclose(np.stack(batched), np.stack(alone), **TOL)


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_a_rounds_values_of_earlier_rounds_are_read_joined_from_the_literals(backend: str,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Each program scores three of its vectors a round, chosen by the last round's scores:
    the parser's way (its vectors are literals from the second round on)."""
    async def program(k: int) -> list[np.ndarray]:
        vectors = [ops.tanh(current_batch().constant(XS[(k + j) % 7])) for j in range(4)]
        picked, out = [0, 1, 2], []
        for _ in range(3 + k % 3):  # programs of other lengths: rounds of other sizes
            value = await scores(*(vectors[j] for j in picked))
            out.append(value)
            picked = [int(np.argmax(value)), (picked[0] + 1) % 4, 3]
        return out

    def expected(k: int) -> list[np.ndarray]:
        vectors = [np.tanh(XS[(k + j) % 7]) for j in range(4)]
        picked, out = [0, 1, 2], []
        for _ in range(3 + k % 3):
            value = _expected(*(vectors[j] for j in picked))
            out.append(value)
            picked = [int(np.argmax(value)), (picked[0] + 1) % 4, 3]
        return out

    joined = _JoinedReads(monkeypatch)
    batch = Batch(backend=backend)
    results = run_programs(program, range(7), batch=batch)
    assert len(batch.reports) == joined.count == 5  # every round (the first computes the vectors too)
    assert batch.reused_rounds  # rounds made from the last one's plan read joined too
    for k, result in enumerate(results):
        alone = run_programs(program, [k], backend=backend)[0]
        assert len(result) == len(alone) == len(expected(k))
        for got, one, want in zip(result, alone, expected(k)):
            np.testing.assert_allclose(got, one, **TOL)
            np.testing.assert_allclose(got, want, **TOL)


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_operands_that_lie_apart_run_the_step_as_planned(backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A literal beside rows of an arena: no joined read (the step's template runs)."""
    joined = _JoinedReads(monkeypatch)
    with Batch(backend=backend) as batch:
        hidden = [ops.tanh(batch.constant(x)) for x in XS]
        values = [scores(batch.constant(XS[k]), hidden[k], hidden[(k + 1) % 7]) for k in range(7)]
        batched = batch.run(values)
    assert joined.count == 0
    expected = [_expected(XS[k], np.tanh(XS[k]), np.tanh(XS[(k + 1) % 7])) for k in range(7)]
    np.testing.assert_allclose(np.stack(batched), np.stack(expected), **TOL)


V = Parameter(RNG.standard_normal(4).astype(np.float32), name="V")


# Each Concat's output is read by an op: a template whose output is the Concat's keeps it anyway.
@cell
def rows_joined(a: Any, b: Any) -> Any:  # matrices along their second axis
    return ops.tanh(ops.concat([a, b], axis=1))


@cell
def lengths_differ(a: Any, b: Any) -> Any:
    return ops.tanh(ops.concat([a, b]))


@cell
def read_twice(a: Any, b: Any) -> Any:
    return ops.concat([a, b]) + ops.concat([b, a])


@cell
def with_a_weight(a: Any, b: Any) -> Any:
    return ops.tanh(ops.concat([a, V, b]))


@pytest.mark.parametrize("fn, shapes, expected", [
    (rows_joined, [(2, 3), (2, 3)], lambda a, b: np.tanh(np.concatenate([a, b], 1))),
    (lengths_differ, [(4,), (5,)], lambda a, b: np.tanh(np.concatenate([a, b]))),
    (read_twice, [(4,), (4,)], lambda a, b: np.concatenate([a, b]) + np.concatenate([b, a])),
    (with_a_weight, [(4,), (4,)], lambda a, b: np.tanh(np.concatenate([a, V.array, b]))),
])
@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_concats_that_do_not_join_whole_rows_of_stacked_operands_keep_their_template(
        fn: Any, shapes: Any, expected: Any, backend: str) -> None:
    args = [[RNG.standard_normal(shape).astype(np.float32) for shape in shapes] for _ in range(5)]
    with Batch(backend=backend) as batch:
        batched = batch.run([fn(*(batch.constant(a) for a in instance)) for instance in args])
    steps = [step for step in batch.last_plan.steps if step.template is not None]  # type: ignore[union-attr]
    assert steps and all(joined_operands(step.template) is None for step in steps)
    for got, instance in zip(batched, args):
        np.testing.assert_allclose(got, expected(*instance), **TOL)


@cell
def unread_and_reordered(a: Any, b: Any, c: Any, d: Any) -> Any:  # d: an argument nothing reads
    return ops.tanh(ops.concat([c, a, b], axis=-2))


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_joined_in_the_concats_order_along_a_negative_axis_beside_an_unread_argument(
        backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Members ``[2, 3]`` joined along axis -2 (their first) in another order than the cell's
    arguments; the template's input that nothing reads stays an input of the joined one (a
    review found onnxruntime refusing the feed of an input the variant had dropped)."""
    joined = _JoinedReads(monkeypatch)
    xs = [RNG.standard_normal((2, 3)).astype(np.float32) for _ in range(5)]
    with Batch(backend=backend) as batch:
        hidden = [ops.tanh(batch.constant(x)) for x in xs]
        values = [unread_and_reordered(hidden[k], hidden[(k + 1) % 5], hidden[(k + 2) % 5], hidden[(k + 3) % 5])
                  for k in range(5)]
        batched = batch.run(values)
    assert joined.count == 1
    h = [np.tanh(x) for x in xs]
    for k, got in enumerate(batched):
        np.testing.assert_allclose(got, np.tanh(np.concatenate([h[(k + 2) % 5], h[k], h[(k + 1) % 5]])), **TOL)
