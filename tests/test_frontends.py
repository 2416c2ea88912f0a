"""The tracing frontend: lazy batched runs, errors at trace time, cells, lockstep programs."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import autobatch
from autobatch import Batch, Parameter, ProgramFailure, TraceError, cell, ops, run_programs
from autobatch.frontends import ProgramsDidNotFinish

RNG = np.random.default_rng(0)
W = Parameter((RNG.standard_normal((4, 4)) * 0.5).astype(np.float32), name="W")
b = Parameter(RNG.standard_normal(4).astype(np.float32), name="b")


def chain(x: np.ndarray, steps: int):
    h = ops.tanh(ops.affine(current(x), W, b))
    for _ in range(steps - 1):
        h = ops.tanh(ops.affine(h, W, b))
    return h


def current(x):
    return autobatch.frontends.current_batch().constant(x)


def reference_chain(x: np.ndarray, steps: int) -> np.ndarray:
    h = x
    for _ in range(steps):
        h = np.tanh(h @ W.array + b.array)
    return h


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_nothing_runs_until_needed_then_everything_runs_batched(backend):
    inputs = [RNG.standard_normal(4).astype(np.float32) for _ in range(6)]
    lengths = [1, 3, 2, 3, 5, 1]
    with Batch(backend=backend) as batch:
        outputs = [chain(x, n) for x, n in zip(inputs, lengths)]
        assert all(o.value is None for o in outputs) and not batch.reports
        values = batch.run(outputs)
    assert len(batch.reports) == 1
    report = batch.reports[0]
    assert report.launches == report.lower_bound < report.nodes
    for value, x, n in zip(values, inputs, lengths):
        np.testing.assert_allclose(value, reference_chain(x, n), rtol=1e-5, atol=1e-6)


def test_numpy_runs_pending_work_and_values_feed_later_rounds():
    x = RNG.standard_normal(4).astype(np.float32)
    with Batch() as batch:
        first = chain(x, 2)
        mid = first.numpy()  # runs now
        np.testing.assert_allclose(mid, reference_chain(x, 2), rtol=1e-5, atol=1e-6)
        second = ops.tanh(ops.affine(first, W, b))  # a known value used in a new round
        np.testing.assert_allclose(second.numpy(), reference_chain(x, 3), rtol=1e-5, atol=1e-6)
    assert len(batch.reports) == 2


def test_end_of_block_runs_what_is_pending():
    x = RNG.standard_normal(4).astype(np.float32)
    with Batch():
        out = chain(x, 2)
    assert out.value is not None
    np.testing.assert_allclose(out.value, reference_chain(x, 2), rtol=1e-5, atol=1e-6)


def test_ops_match_numpy():
    v = RNG.standard_normal(6).astype(np.float32)
    m = RNG.standard_normal((6, 3)).astype(np.float32)
    with Batch() as batch:
        x, mat = batch.constant(v), batch.constant(m)
        results = {
            "concat": (ops.concat([x, x]), np.concatenate([v, v])),
            "split": (ops.split(x, 3)[1], v[2:4]),
            "slice": (x[1:4], v[1:4]),
            "pick": (x[2], v[2]),
            "softmax": (ops.softmax(x), np.exp(v) / np.exp(v).sum()),
            "nll": (ops.pick_neg_log_softmax(x, 4), -(v[4] - np.log(np.exp(v).sum()))),
            "matmul": (x @ mat, v @ m),
            "transpose": (ops.transpose(mat), m.T),
            "reshape": (ops.reshape(mat, (3, 6)), m.reshape(3, 6)),
            "reduce": (ops.reduce_sum(mat, axis=0), m.sum(axis=0)),
            "esum": (ops.esum([x, x * 2.0, -x]), 2 * v),
            "arith": ((x - 1.0) / 2.0 + ops.square(x), (v - 1) / 2 + v * v),
            "relu-exp-log": (ops.log(ops.exp(ops.relu(x)) + 1.0), np.log(np.exp(np.maximum(v, 0)) + 1)),
        }
        batch.run([t for t, _ in results.values()])
    for name, (tensor, expected) in results.items():
        np.testing.assert_allclose(tensor.numpy(), expected, rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_esum_of_integers_is_valid_onnx_on_every_backend(backend):
    """ONNX's Sum takes floats only (onnxruntime has no int64 kernel): integer sums add pairwise."""
    values = [np.arange(k, k + 3, dtype=np.int64) for k in range(5)]
    with Batch(backend=backend) as batch:
        sums = [ops.esum([batch.constant(v) for v in values[:n]]) for n in (1, 2, 5)]
        got = batch.run(sums)
    for n, value in zip((1, 2, 5), got):
        assert value.dtype == np.int64
        np.testing.assert_array_equal(value, np.sum(values[:n], axis=0))


def test_shape_mismatch_is_named_at_trace_time():
    with Batch() as batch:
        x = batch.constant(np.zeros(3, np.float32))
        with pytest.raises(TraceError, match=r"MatMul: shapes \(3,\) and \(4, 4\) do not match"):
            ops.matmul(x, W)
        with pytest.raises(TraceError, match=r"Add: shapes \[\(3,\), \(4,\)\] do not broadcast"):
            ops.add(x, b)
        with pytest.raises(TraceError, match="Concat on axis 0"):
            ops.concat([x, batch.constant(np.zeros((2, 2), np.float32))])
        with pytest.raises(TraceError, match="different dtypes"):
            ops.add(x, batch.constant(np.zeros(3, np.int64)))


def test_a_tensor_of_another_batch_is_refused():
    with Batch() as first:
        x = first.constant(np.ones(4, np.float32))
    with Batch():
        with pytest.raises(TraceError, match="belongs to another batch"):
            ops.matmul(x, W)


def test_an_index_of_another_batch_is_refused():
    with Batch() as first:
        i = first.constant(1)
    with Batch():
        with pytest.raises(TraceError, match="belongs to another batch"):
            ops.lookup(W, i)


def test_tracing_outside_a_batch_is_explained():
    with pytest.raises(TraceError, match="inside `with autobatch.Batch"):
        ops.lookup(W, 1)


# ----------------------------------------------------------------------------- cells
@cell
def step(x, h):
    return ops.tanh(ops.affine(x, W, b) + h @ W)


@cell
def two_steps(x, h):  # a cell calling a cell
    return step(x, step(x, h))


def test_cells_batch_as_units_and_equal_primitives():
    xs = [RNG.standard_normal(4).astype(np.float32) for _ in range(5)]
    with Batch() as batch:
        via_cells = []
        for x in xs:
            h = batch.constant(np.zeros(4, np.float32))
            for _ in range(3):
                h = step(batch.constant(x), h)
            via_cells.append(h)
        batch.run(via_cells)
    report = batch.reports[0]
    assert report.nodes == 15 and report.launches == 3  # one node a call, one launch a step
    assert step.traced_signatures() == 1
    for x, h in zip(xs, via_cells):
        expected = np.zeros(4, np.float32)
        for _ in range(3):
            expected = np.tanh(x @ W.array + b.array + expected @ W.array)
        np.testing.assert_allclose(h.numpy(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_nested_cells(backend):
    x = RNG.standard_normal(4).astype(np.float32)
    with Batch(backend=backend) as batch:
        outs = [two_steps(batch.constant(x * k), batch.constant(np.zeros(4, np.float32))) for k in range(3)]
        batch.run(outs)
    for k, out in enumerate(outs):
        h = np.zeros(4, np.float32)
        for _ in range(2):
            h = np.tanh(x * k @ W.array + b.array + h @ W.array)
        np.testing.assert_allclose(out.numpy(), h, rtol=1e-5, atol=1e-6)


def test_cell_from_onnx_model():
    model = onnx.parser.parse_model("""
    <ir_version: 9, opset_import: ["" : 18]>
    rnn_step (float[4] x, float[4] h) => (float[4] y) <float[4, 4] U = {1,0,0,0, 0,1,0,0, 0,0,1,0, 0,0,0,1}> {
        xu = MatMul(x, U)
        s = Add(xu, h)
        y = Tanh(s)
    }
    """)
    onnx_step = cell.from_onnx(model)
    xs = [RNG.standard_normal(4).astype(np.float32) for _ in range(4)]
    with Batch() as batch:
        outs = [onnx_step(batch.constant(x), batch.constant(x)) for x in xs]
        batch.run(outs)
    assert batch.reports[0].launches == 1
    for x, out in zip(xs, outs):
        np.testing.assert_allclose(out.numpy(), np.tanh(2 * x), rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- programs
async def walk(x0):
    """Applies a step until the sum passes a threshold: how long depends on the values."""
    h = autobatch.frontends.current_batch().constant(x0)
    for steps in range(1, 20):
        h = ops.tanh(ops.affine(h, W, b))
        if await ops.reduce_sum(h) > 0.5:
            return steps
    return 20


def walk_reference(x0):
    h = x0
    for steps in range(1, 20):
        h = np.tanh(h @ W.array + b.array)
        if h.sum() > 0.5:
            return steps
    return 20


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_programs_run_in_lockstep_and_decide_on_values(backend):
    inputs = [RNG.standard_normal(4).astype(np.float32) for _ in range(8)]
    assert run_programs(walk, inputs, backend=backend) == [walk_reference(x) for x in inputs]


def test_a_failing_program_fails_alone():
    async def fragile(x):
        h = await ops.reduce_sum(autobatch.frontends.current_batch().constant(x))
        if x[0] < 0:
            raise ValueError("negative start")
        return float(h)

    results = run_programs(fragile, [np.array([1.0, 2.0], np.float32), np.array([-1.0, 2.0], np.float32)])
    assert results[0] == 3.0
    assert isinstance(results[1], ProgramFailure) and "negative start" in str(results[1])
    assert "Traceback" in results[1].traceback


def test_a_program_that_never_ends_is_stopped():
    async def forever(x):
        h = autobatch.frontends.current_batch().constant(x)
        while True:
            h = ops.tanh(h)
            await h

    (result,) = run_programs(forever, [np.ones(2, np.float32)], max_rounds=5)
    assert isinstance(result, ProgramFailure) and isinstance(result.error, ProgramsDidNotFinish)


def test_awaiting_something_else_is_an_error():
    async def odd(x):
        import asyncio
        await asyncio.sleep(0)

    (result,) = run_programs(odd, [1])
    assert isinstance(result, ProgramFailure) and "only autobatch tensors can be awaited" in str(result)


def test_concat_with_a_shared_parameter_batches():
    pad = Parameter(np.arange(4, dtype=np.float32), name="pad")
    table = Parameter(RNG.standard_normal((10, 4)).astype(np.float32), name="table")
    with Batch() as batch:
        rows = [ops.concat([ops.lookup(table, i), pad]) for i in (3, 1, 7)]
        batch.run(rows)
    report = batch.reports[0]
    assert report.fallback_nodes == 0 and report.launches == 1  # one Concat (the lookups are known rows)
    for i, row in zip((3, 1, 7), rows):
        np.testing.assert_array_equal(row.numpy(), np.concatenate([table.array[i], pad.array]))


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_a_lookup_by_a_python_int_is_a_known_row_not_a_traced_op(backend):
    table = Parameter(RNG.standard_normal((10, 4)).astype(np.float32), name="table")
    with Batch(backend=backend) as batch:
        first, again, last = ops.lookup(table, 3), ops.lookup(table, 3), ops.lookup(table, -1)
        assert first is again  # equal lookups share one tensor
        assert first.value is not None and np.shares_memory(first.value, table.array)  # a view, no copy
        with pytest.raises(TraceError, match=r"index 10 is out of range for shape \(10, 4\)"):
            ops.lookup(table, 10)
        hidden = [ops.tanh(ops.lookup(table, i)) for i in (3, 1, 7)]
        batch.run(hidden)
    report = batch.reports[0]
    assert report.nodes == 3 and report.launches == 1  # the Tanh only: nothing traced for the lookups
    np.testing.assert_array_equal(last.numpy(), table.array[-1])
    for i, h in zip((3, 1, 7), hidden):
        np.testing.assert_allclose(h.numpy(), np.tanh(table.array[i]), rtol=1e-6)


@pytest.mark.parametrize("bad", [2.7, "1", [1, 2], np.array([1, 2]), None])
def test_an_index_that_is_not_an_integer_is_refused(bad):
    table = Parameter(RNG.standard_normal((5, 3)).astype(np.float32), name="table")
    with Batch() as batch:
        for source in (table, batch.constant(table.array)):  # a parameter, and a tensor
            refused = f"an index must be an integer or an integer tensor, not {type(bad).__name__}"
            with pytest.raises(TraceError, match=refused):
                ops.pick(source, bad)
        np.testing.assert_array_equal(ops.lookup(table, np.int64(2)).numpy(), table.array[2])  # NumPy integers are ints


def test_a_cell_reads_its_lookups_from_the_parameter_not_from_a_copy():
    table = Parameter(RNG.standard_normal((10, 4)).astype(np.float32), name="table")

    @cell
    def shifted(x):
        return x + ops.lookup(table, 2)

    x = RNG.standard_normal(4).astype(np.float32)
    with Batch() as batch:
        first = shifted(batch.constant(x))
        assert first.numpy() == pytest.approx(x + table.array[2])
    table.array[2] += 1.0  # the traced cell is reused: it must read the table, not a row copied when traced
    with Batch() as batch:
        second = shifted(batch.constant(x))
        assert second.numpy() == pytest.approx(x + table.array[2])


def _prefix_rnn(words, table, W, reuse_calls):
    """A character RNN (as a cell) over each word; words that share a prefix share its steps."""
    @cell
    def step(x, h):
        return ops.tanh(ops.matmul(x, W) + h)

    with Batch(reuse_calls=reuse_calls) as batch:
        finals = []
        for word in words:
            h = ops.zeros((4,))
            states = [h := step(ops.lookup(table, ord(ch) - ord("a")), h) for ch in word]
            finals.append(states[-1])
            del states  # the intermediate states are dropped, as a model would: their calls are still reused
        values = [np.array(v) for v in batch.run(finals)]
    return values, batch


def test_reused_calls_are_traced_and_run_once_with_the_same_results():
    table = Parameter(RNG.standard_normal((26, 4)).astype(np.float32), name="chars")
    W = Parameter(RNG.standard_normal((4, 4)).astype(np.float32), name="W")
    words = ["cat", "car", "cat", "act", "dog", "do"]  # "act": the same letters after other states
    shared, batch = _prefix_rnn(words, table, W, reuse_calls=True)
    apart, unshared = _prefix_rnn(words, table, W, reuse_calls=False)
    # steps traced: c, ca, cat | car | (cat again) | a, ac, act | d, do, dog | (do again): 10 of 17
    assert batch.reused_calls == 7 and batch.reports[0].nodes == 10
    assert unshared.reused_calls == 0 and unshared.reports[0].nodes == 17
    for word, got, want in zip(words, shared, apart):
        h = np.zeros(4, np.float32)
        for ch in word:
            h = np.tanh(table.array[ord(ch) - ord("a")] @ W.array + h)
        np.testing.assert_allclose(got, h, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(got, want)


def test_calls_differing_in_attributes_or_runs_are_not_reused():
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    with Batch() as batch:
        t = batch.constant(x)
        rows, columns = ops.softmax(t, axis=1), ops.softmax(t, axis=0)
        assert rows.name != columns.name and ops.softmax(t, axis=1).name == rows.name  # one record
        np.testing.assert_allclose(columns.numpy(), np.exp(x) / np.exp(x).sum(0), rtol=1e-5)
        again = ops.softmax(t, axis=1)  # after a run: traced anew, not an output of the run before
        assert again.name != rows.name and again.value is None
        np.testing.assert_allclose(again.numpy(), rows.numpy(), rtol=1e-6)
        pending = ops.tanh(t)
        batch.discard()
        fresh = ops.tanh(t)  # a discarded call is forgotten
        assert fresh.name != pending.name
        np.testing.assert_allclose(fresh.numpy(), np.tanh(x), rtol=1e-6)
    assert batch.reused_calls == 1


def test_a_cell_keeps_its_most_recent_signatures_and_names_each_trace_anew(monkeypatch):
    monkeypatch.setattr("autobatch.frontends.cells.SIGNATURES_KEPT", 2)

    @cell
    def double(x):
        return x + x

    names = set()
    # 1 is evicted by 3; in the second batch 1 is traced again and evicts 2, traced again too
    for lengths in ([1, 2, 3], [1, 2]):
        with Batch() as batch:
            xs = [RNG.standard_normal(n).astype(np.float32) for n in lengths]
            outs = [double(batch.constant(x)) for x in xs]
            for x, out in zip(xs, outs):
                np.testing.assert_allclose(out.numpy(), 2 * x, rtol=1e-6)
            names |= {name for _, name in batch.functions}
        assert double.traced_signatures() <= 2
    assert len(names) == 5  # five traces, five names: none reused for another signature


def test_the_graph_of_a_reused_call_has_one_output():
    x = RNG.standard_normal(3).astype(np.float32)
    with Batch() as batch:
        t = batch.constant(x)
        first, again = ops.tanh(t), ops.tanh(t)  # a reused call: two tensors of one value
        graph = batch.graph_of([first, again, first])
        assert list(graph.outputs) == [first.name]
        onnx.checker.check_model(autobatch.ir.to_onnx(graph))
        np.testing.assert_allclose(again.numpy(), np.tanh(x), rtol=1e-6)


def test_run_programs_into_a_batch_of_ones_own():
    batch = Batch()
    inputs = [RNG.standard_normal(4).astype(np.float32) for _ in range(3)]
    assert run_programs(walk, inputs, batch=batch) == [walk_reference(x) for x in inputs]
    assert batch.reports and all(r.launches >= r.lower_bound for r in batch.reports)


def test_equal_python_scalars_share_one_literal_and_keep_their_type_and_sign() -> None:
    with Batch() as batch:
        labels = [batch.constant(k % 3) for k in range(9)]
        assert labels[0] is labels[3] and labels[0] is not labels[1]
        zero, negative_zero = batch.constant(0.0), batch.constant(-0.0)
        assert zero is not negative_zero and np.signbit(negative_zero.value)
        assert batch.constant(1) is not batch.constant(True) and batch.constant(True).dtype == np.bool_
        assert batch.constant(1.0).dtype == np.float32 and batch.constant(1).dtype == np.int64
        table = Parameter(np.arange(12, dtype=np.float32).reshape(3, 4))
        picked = [ops.lookup(table, label) for label in labels]
        signs = [ops.div(np.float32(1.0), x) for x in (zero, negative_zero)]  # +inf and -inf
        values = batch.run(picked + signs)
    for k, value in enumerate(values[:9]):
        np.testing.assert_array_equal(value, table.array[k % 3])
    assert values[9] == np.inf and values[10] == -np.inf


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_reshape_to_a_shape_with_a_zero_dimension(backend: str) -> None:
    with Batch(backend=backend) as batch:
        empties = [ops.reshape(batch.constant(np.zeros(0, np.float32)), (3, 0)) for _ in range(2)]
        full = ops.reshape(batch.constant(np.arange(6, dtype=np.float32)), (2, 3))
        values = batch.run([*empties, full])
    assert all(v.shape == (3, 0) for v in values[:2])
    np.testing.assert_array_equal(values[2], np.arange(6, dtype=np.float32).reshape(2, 3))


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_weights_changed_in_place_between_runs_of_one_block_are_read_fresh(backend: str) -> None:
    """Each run of a batch plans anew what its ops read: a small weight (which a template may
    hold by value) and an LSTM's initial state (zeros: packed as if none) changed in place
    between two runs inside one ``with`` block give the second run their new values."""
    W = Parameter(RNG.standard_normal((4, 4)).astype(np.float32))
    bias = Parameter(RNG.standard_normal(4).astype(np.float32))
    hidden = 3
    lstm = [Parameter(RNG.standard_normal(shape).astype(np.float32) * 0.5)
            for shape in ((1, 4 * hidden, 4), (1, 4 * hidden, hidden), (1, 8 * hidden))]
    start = Parameter(np.zeros((1, 1, hidden), np.float32))
    xs = [RNG.standard_normal((n, 4)).astype(np.float32) for n in (2, 5)]

    def last_state(batch: Batch, x: np.ndarray) -> autobatch.Tensor:
        inputs = [batch.constant(x[:, None]), *map(batch.parameter, lstm), None, batch.parameter(start)]
        return batch.record("LSTM", inputs, [(len(x), 1, 1, hidden), (1, 1, hidden)], [np.dtype(np.float32)] * 2,
                            autobatch.frontends.tensors.attributes(hidden_size=hidden))[1]

    with Batch(backend=backend) as batch:
        for _ in range(2):
            dense = [ops.tanh(ops.add(ops.matmul(batch.constant(x), W), bias)).numpy() for x in xs]
            for got, x in zip(dense, xs):
                np.testing.assert_allclose(got, np.tanh(x @ W.array + bias.array), rtol=1e-5, atol=1e-6)
            ends = [last_state(batch, x) for x in xs]
            with Batch(backend=backend) as alone:  # each sequence alone, in a batch of its own
                want = [last_state(alone, x).numpy() for x in xs]
            np.testing.assert_allclose([end.numpy() for end in ends], want, rtol=1e-5, atol=1e-6)
            W.array *= 2
            bias.array += 1
            start.array += 0.5


def _counting_kinds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many records' kinds the planner works out (``Classing._kind``, which still runs)."""
    from autobatch.batcher.classing import Classing
    worked_out = [0]
    kind = Classing._kind

    def counted(self, record):  # type: ignore[no-untyped-def]
        worked_out[0] += 1
        return kind(self, record)

    monkeypatch.setattr(Classing, "_kind", counted)
    return worked_out


@pytest.mark.parametrize("frozen", [True, False])
@pytest.mark.parametrize("same_batch", [True, False])
@pytest.mark.parametrize("as_cell", [False, True])
def test_a_plan_uses_what_earlier_plans_learnt_only_while_the_weights_are_frozen(
        monkeypatch: pytest.MonkeyPatch, frozen: bool, same_batch: bool, as_cell: bool) -> None:
    """Plans one after another, of a block entered again or of a ``Batch`` each (minibatch
    after minibatch), op by op or a cell call each: with every weight read-only, a record key
    seen by an earlier plan over those weights is not worked out again (``Batch._known_keys``;
    a cell call's key is its prepared call, shared by batches); with a weight that may change in
    place, every plan works out its own (``test_weights_changed_in_place...`` shows why)."""
    weight = Parameter(RNG.standard_normal((4, 4)).astype(np.float32))
    bias = Parameter(RNG.standard_normal(4).astype(np.float32))
    if frozen:
        weight.freeze(), bias.freeze()
    worked_out = _counting_kinds(monkeypatch)
    xs = [RNG.standard_normal(4).astype(np.float32) for _ in range(3)]
    layer = (lambda x: ops.tanh(ops.add(ops.matmul(x, weight), bias)))
    layer = cell(layer) if as_cell else layer
    rounds, batch = [], Batch()
    for _ in range(2):
        before = worked_out[0]
        with batch if same_batch else Batch() as block:
            got = [layer(block.constant(x)).numpy() for x in xs]
        rounds.append(worked_out[0] - before)
        np.testing.assert_allclose(got, np.tanh(np.array(xs) @ weight.array + bias.array), rtol=1e-5, atol=1e-6)
    assert rounds[0] > 0
    assert rounds[1] == (0 if frozen else rounds[0])


@pytest.mark.parametrize("same_batch", [True, False])
def test_a_block_does_not_read_what_was_learnt_of_another_weight_of_that_name(same_batch: bool) -> None:
    """A parameter's value in a batch is named by its name and its order in the block: a block
    entered again, or a new batch, may give that name to another (frozen) weight, whose values
    its plans read (a small bias, held by value in the templates)."""
    first, second = (Parameter(RNG.standard_normal(4).astype(np.float32), name="bias").freeze() for _ in range(2))
    x = RNG.standard_normal(4).astype(np.float32)
    batch = Batch()
    for bias in (first, second):
        with batch if same_batch else Batch() as block:
            got = ops.add(block.constant(x), bias).numpy()
        np.testing.assert_array_equal(got, x + bias.array)


def test_new_batches_over_new_weights_of_one_name_read_their_own_values() -> None:
    """Fifty biases, each made, frozen, read by a batch of its own and dropped: CPython gives
    new arrays the ids of dead ones, and what was learnt of a dead one's key (a template that
    holds its values) must not serve the next (``Batch._known_keys``' weak references)."""
    x = RNG.standard_normal(4).astype(np.float32)
    ids = set()
    for k in range(50):
        bias = Parameter(np.full(4, float(k), np.float32), name="bias").freeze()
        ids.add(id(bias.array))
        with Batch() as batch:
            got = ops.add(batch.constant(x), bias).numpy()
        np.testing.assert_array_equal(got, x + k, err_msg=f"bias {k}")
        del bias
    assert len(ids) < 50  # ids were taken again: the case is met


def test_new_batches_read_their_own_shared_constants() -> None:
    """A shared constant is named by its order in the batch (``k0``): two batches reshaping to
    other shapes name other values ``k0``; and two float8 kinds whose dtypes print alike
    (``<V1``) over the same bytes are other values."""
    import ml_dtypes
    from onnx import TensorProto
    from autobatch.frontends.tensors import attributes
    x = np.arange(4, dtype=np.float32)
    for target in ((2, 2), (4, 1)):
        with Batch() as batch:
            got = ops.tanh(ops.reshape(batch.constant(x), target)).numpy()
        np.testing.assert_allclose(got, np.tanh(x.reshape(target)), rtol=1e-6)
    to_float = attributes(to=TensorProto.FLOAT)
    for kind in (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e4m3fnuz):
        bits = np.frombuffer(b"\x40\x38", dtype=kind)
        with Batch() as batch:
            value = batch.record("Cast", [batch.shared_constant(bits, dtype=kind)], [(2,)], [np.dtype(np.float32)],
                                 to_float)[0]
            got = ops.add(value, batch.constant(np.zeros(2, np.float32))).numpy()
        np.testing.assert_array_equal(got, bits.astype(np.float32), err_msg=np.dtype(kind).name)


def test_what_was_learnt_of_a_dead_weight_is_not_read_by_one_that_takes_its_id() -> None:
    """What plans learnt is kept by the identities of the weights that keys name; an array that
    died may give its id to a new one, which the weak references kept with it find out."""
    import weakref
    from autobatch import batch as batch_module
    bias = Parameter(RNG.standard_normal(4).astype(np.float32), name="bias").freeze()
    x = RNG.standard_normal(4).astype(np.float32)
    with Batch() as batch:
        ops.add(batch.constant(x), bias).numpy()
        binding, arrays = batch.weights_binding()
        learnt = batch._known_keys()
        assert len(learnt) > 0 and batch._known_keys() is learnt
        dead = np.zeros(1)
        batch_module._KNOWN_BY_BINDING[binding] = ([weakref.ref(dead)], learnt)  # as if ``dead`` had held that id
        del dead
        assert batch._known_keys() is not learnt


def test_a_block_learns_nothing_of_attributes_gone_whose_id_others_take() -> None:
    """A traced record's key holds its attributes by id. What a block's plans learnt of a key
    keeps those attributes alive, so that attributes made later (here, ``axis`` 1 after
    ``axis`` 0, each a dict of its own, freed once run) never take the id of what was learnt."""
    from onnx import helper
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    with Batch() as batch:
        for axis in (0, 1) * 3:  # without the learnt keeping them alive, CPython gave each dict the last one's id
            attrs = {"axis": helper.make_attribute("axis", axis)}
            result = batch.record("Softmax", [batch.constant(x)], [x.shape], [np.dtype(np.float32)], attrs)[0]
            del attrs
            want = np.exp(x) / np.exp(x).sum(axis=axis, keepdims=True)
            np.testing.assert_allclose(result.numpy(), want, rtol=1e-5, atol=1e-6, err_msg=f"axis {axis}")


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
@pytest.mark.parametrize("seed", range(6))
def test_lockstep_rounds_over_frozen_weights_equal_each_instance_alone(backend: str, seed: int) -> None:
    """Random lockstep programs over frozen weights, small (held by value in templates) and
    large: each round an instance picks its next op by its own last value, so rounds mix ops,
    widths and attributes, and each round plans with what the rounds before learnt
    (``Batch.plan``). Every instance's values equal its program run alone."""
    rng = np.random.default_rng(seed)
    widths = (3, 6)  # a concat of two 3-wide values is 6 wide
    weights = {(a, b): Parameter(rng.standard_normal((a, b)).astype(np.float32) * 0.5).freeze()
               for a in widths for b in widths}
    biases = {w: Parameter(rng.standard_normal(w).astype(np.float32)).freeze() for w in widths}
    moves = ["matmul", "bias", "tanh", "softmax", "scale", "concat"]

    async def program(start: np.ndarray) -> list[np.ndarray]:
        x, seen = ops.add(start, np.float32(0.0)), []
        for step in range(int(start[0] * 3) % 4 + 3):
            value = await x
            seen.append(value)
            move = moves[int(abs(value.sum()) * 1000 + step) % len(moves)]
            width = value.shape[0]
            if move == "matmul":
                x = ops.matmul(x, weights[width, widths[int(value[0] > 0)]])
            elif move == "bias":
                x = ops.add(x, biases[width])
            elif move == "tanh":
                x = ops.tanh(x)
            elif move == "softmax":
                x = ops.softmax(ops.reshape(x, (1, width)), axis=-1 if value[-1] > 0 else 0)
                x = ops.reshape(x, (width,))
            elif move == "scale":
                x = ops.mul(x, np.float32(1.5))
            else:
                x = ops.concat([x, x]) if width == 3 else ops.matmul(x, weights[width, 3])
        seen.append(await x)
        return seen

    starts = [rng.standard_normal(widths[k % 2]).astype(np.float32) for k in range(7)]
    together = run_programs(program, starts, backend=backend)
    assert not any(isinstance(got, ProgramFailure) for got in together), [str(got) for got in together]
    for start, got in zip(starts, together):
        alone = run_programs(program, [start], backend=backend)[0]
        assert len(got) == len(alone)
        for a, b in zip(got, alone):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_an_attributes_dict_changed_in_place_between_runs_of_one_block(backend: str) -> None:
    """What a block's plans learnt of a record key (its attributes by id) holds only while the
    attributes say what they said: one dict told another axis between runs is read anew."""
    from onnx import helper
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    attrs = {"axis": helper.make_attribute("axis", 0)}
    with Batch(backend=backend) as batch:
        for axis in (0, 1):
            attrs["axis"] = helper.make_attribute("axis", axis)
            got = batch.record("Softmax", [batch.constant(x)], [x.shape], [np.dtype(np.float32)], attrs)[0].numpy()
            want = np.exp(x) / np.exp(x).sum(axis=axis, keepdims=True)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=f"axis {axis}")


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_a_view_made_before_freezing_does_not_write_the_frozen_weight(backend: str) -> None:
    """``Parameter.freeze`` keeps a copy of its own: a view of the array made before cannot
    change what a frozen weight's plans read (nor go stale in what they learnt)."""
    array = np.arange(4, dtype=np.float32)
    alias = array[:]
    bias = Parameter(array).freeze()
    x = np.ones(4, np.float32)
    with Batch(backend=backend) as batch:
        first = ops.add(batch.constant(x), bias).numpy()
        alias += 10
        second = ops.add(batch.constant(x), bias).numpy()
    np.testing.assert_array_equal(first, x + np.arange(4))
    np.testing.assert_array_equal(second, x + np.arange(4))
    np.testing.assert_array_equal(bias.array, np.arange(4))


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_a_template_baked_from_one_weight_serves_another_of_those_values_after_the_first_changes(
        backend: str) -> None:
    """Templates are kept by the bytes of the small weights they bake (across batches): two
    biases start at zeros, the first is trained in place after its block, and a block reading
    the second (still zeros) adds zeros (a reviewer's case: the template held the first's array)."""
    first, second = (Parameter(np.zeros(4, np.float32)) for _ in range(2))
    x = np.ones(4, np.float32)
    with Batch(backend=backend) as batch:
        np.testing.assert_array_equal(ops.add(batch.constant(x), first).numpy(), x)
    first.array += 5
    with Batch(backend=backend) as batch:
        np.testing.assert_array_equal(ops.add(batch.constant(x), second).numpy(), x)


def _shifted_by(bias: Parameter) -> autobatch.frontends.cells.Cell:
    return cell(lambda x: ops.add(x, bias))


@pytest.mark.parametrize("frozen", [False, True])
def test_a_cell_reads_a_parameter_assigned_between_blocks_of_one_batch(frozen: bool) -> None:
    """A cell's calls name its parameters' values in their block: entered again, the batch reads
    the array the parameter has then (``freeze``: "assign ``array`` to change it")."""
    bias = Parameter(RNG.standard_normal(4).astype(np.float32))
    shifted, x, batch = _shifted_by(bias), RNG.standard_normal(4).astype(np.float32), Batch()
    with batch:
        shifted(batch.constant(x)).numpy()
    bias.array = bias.array + 1
    if frozen:
        bias.freeze()
    with batch:
        got = shifted(batch.constant(x)).numpy()
    np.testing.assert_allclose(got, x + bias.array, rtol=1e-6)


def test_a_cell_call_in_a_block_entered_again_reads_its_own_parameter() -> None:
    """Entered again, the block may give a cell's parameter's old name to another parameter."""
    mine, other = (Parameter(RNG.standard_normal(4).astype(np.float32), name="bias") for _ in range(2))
    shifted, x, batch = _shifted_by(mine), RNG.standard_normal(4).astype(np.float32), Batch()
    with batch:
        np.testing.assert_allclose(shifted(batch.constant(x)).numpy(), x + mine.array, rtol=1e-6)
    with batch:
        theirs = ops.add(batch.constant(x), other)  # named first in this block
        got = shifted(batch.constant(x)).numpy()
        theirs.numpy()
    np.testing.assert_allclose(got, x + mine.array, rtol=1e-6)


def test_attributes_made_once_keep_ints_and_floats_apart():
    """Attributes are cached (records share them by id); 1 == 1.0 must not hand a FLOAT
    attribute an INT proto made before it."""
    from autobatch.frontends.tensors import attributes
    assert attributes(alpha=1) is attributes(alpha=1)
    assert attributes(alpha=1)["alpha"].type == onnx.AttributeProto.INT
    assert attributes(alpha=1.0)["alpha"].type == onnx.AttributeProto.FLOAT


def test_shared_constants_are_one_tensor_a_value_and_dtype():
    """Found by their ints without an array made first; a dtype, or a float's sign, apart."""
    with Batch() as batch:
        one = batch.shared_constant([1])
        assert batch.shared_constant([1]) is one and batch.shared_constant(np.array([1])) is one
        assert batch.shared_constant([1], np.float32).name != one.name
        assert batch.shared_constant([0.0], np.float32).name != batch.shared_constant([-0.0], np.float32).name
        assert batch.shared_constant([2, 3]).value.tolist() == [2, 3] and batch.shared_constant([2, 3]).name != one.name
