"""With every arena filled with garbage before a plan runs (tests/poison.py), batched results
still equal each instance run alone: no plan reads a row that no step wrote. Random ONNX
programs (the fuzzer's, planned by mix and once per node), the seed paper's examples in every
form, the parser's lockstep rounds with frozen weights, and a traced minibatch whose arenas
come from the pool, on both backends. ``pytest --poison-arenas`` runs any other test so."""

from __future__ import annotations

import numpy as np
import pytest

from autobatch import Batch, Parameter, ops, run_programs
from autobatch import batch as batch_module
from autobatch.backends import flat_executor
from autobatch.backends.arena_pool import ArenaPool
from autobatch.examples import parser
from tests import fuzz
from tests.example_models import model
from tests.poison import poisoned_arenas
from tests.test_examples import CASES, MODULES, _parser_params, _sentences, alone, assert_close, batched

BACKENDS = ["numpy", "onnxruntime"]


@pytest.fixture
def poisoned():
    with poisoned_arenas():
        yield


def test_a_poisoned_arena_reads_garbage_until_a_step_writes_it(poisoned):
    with Batch(backend="numpy") as batch:
        ys = [ops.tanh(batch.constant(np.full((1, 4), k, np.float32))) for k in range(3)]
        plan = batch.plan(ys)
        arenas, _ = flat_executor._arenas(plan, None)
        assert arenas and all(np.isnan(arena).all() for arena in arenas if arena is not None)
        got = batch.run(ys)
    for k, y in enumerate(got):  # every row the plan reads was written first
        np.testing.assert_allclose(y, np.tanh(np.full((1, 4), k, np.float32)), rtol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kinds, seeds", [(None, range(0, 30)), (fuzz.NODE_LEVEL, range(500_000, 500_030))],
                         ids=["by mix", "once per node"])
def test_random_programs_batched_equal_alone(poisoned, backend, kinds, seeds):
    outcome = fuzz.fuzz(seeds, [backend], kinds=kinds)[backend]
    assert outcome.programs >= 20, fuzz.report({backend: outcome})
    assert not outcome.mismatches and not outcome.errors, fuzz.report({backend: outcome})


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name,form", CASES)
def test_examples_batched_equal_alone(poisoned, name, form, backend):
    module, instances, params = model(name)
    loss = MODULES[name].LOSSES[form]
    (together, _), (one_by_one, _) = batched(loss, instances, params, backend), alone(loss, instances, params, backend)
    assert all(np.isfinite(v) for v in one_by_one)
    assert_close(together, one_by_one)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("form", list(parser.PARSERS))
def test_lockstep_parses_equal_alone(poisoned, form, backend):
    sentences = _sentences()
    params = _parser_params(sentences).freeze()  # rounds planned with what the rounds before learnt
    fn = parser.PARSERS[form]
    alone_parses = [run_programs(lambda s: fn(s, params), [s], backend=backend)[0] for s in sentences]
    assert run_programs(lambda s: fn(s, params), sentences, backend=backend) == alone_parses


@pytest.mark.parametrize("backend", BACKENDS)
def test_pooled_arenas_hold_garbage_and_later_batches_still_equal_alone(poisoned, backend, monkeypatch):
    """Every arena pooled (the pool's bound lowered), so that each batch runs in memory an
    earlier one wrote, poisoned again: a batch of chains of different lengths and a product of
    two per-instance values, kept across batches."""
    pool = ArenaPool()
    monkeypatch.setattr(batch_module, "TRACED_ARENAS", pool)
    monkeypatch.setattr(flat_executor, "MIN_POOLED_BYTES", 1)
    rng = np.random.default_rng(3)
    W = Parameter(rng.standard_normal((6, 6)).astype(np.float32)).freeze()

    def program(x: np.ndarray, steps: int, batch: Batch):
        h = batch.constant(x)
        for _ in range(steps):
            h = ops.tanh(ops.matmul(h, W)) + h
        return ops.matmul(h, ops.transpose(h))

    kept, expected = [], []
    for round_ in range(3):
        xs = [rng.standard_normal((int(n), 6)).astype(np.float32) for n in rng.integers(1, 5, 6)]
        steps = [int(s) for s in rng.integers(1, 4, 6)]
        with Batch(backend=backend) as batch:
            kept += batch.run([program(x, s, batch) for x, s in zip(xs, steps)])
        for x, s in zip(xs, steps):
            with Batch(backend=backend) as one:
                expected.append(one.run([program(x, s, one)])[0])
        assert round_ == 0 or pool.kept_bytes > 0, "the runs gave arenas back to the pool"
    for got, want in zip(kept, expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
