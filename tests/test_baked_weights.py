"""Weights baked into onnxruntime template sessions (``backends/baked_weights.py``): a weight
that a run launches in several steps is baked from its second run on, and results stay those
of the weights' current values, whether the weights were changed in place or replaced.

Oracle: the same recurrence written in NumPy on the weights' values at the time of the run.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from autobatch import Batch, Parameter, cell, ops
from autobatch.backends.baked_weights import BAKE_MIN_BYTES, WeightSnapshots, is_frozen
from autobatch.batch import TRACED_SNAPSHOTS

STEPS, WIDTH, HIDDEN = 4, 128, 256  # W and U: 128 KiB each, above BAKE_MIN_BYTES
RTOL, ATOL = 1e-5, 1e-5


def make_weights(seed: int) -> tuple[Parameter, Parameter]:
    rng = np.random.default_rng(seed)
    return (Parameter(rng.standard_normal((WIDTH, HIDDEN), dtype=np.float32) * 0.1),
            Parameter(rng.standard_normal((HIDDEN, HIDDEN), dtype=np.float32) * 0.1))


def inputs(instances: int = 3) -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    return [rng.standard_normal((STEPS + k, WIDTH), dtype=np.float32) for k in range(instances)]


def recurrence_in_numpy(xs: np.ndarray, W: Parameter, U: Parameter) -> np.ndarray:
    h = np.zeros(HIDDEN, np.float32)
    for x in xs:
        h = np.tanh(x @ W.array + h @ U.array)
    return h


_CELLS: dict[tuple[int, int], tuple[Parameter, Parameter, Any]] = {}  # one cell per weights (its template too)


def run_batched(sequences: list[np.ndarray], W: Parameter, U: Parameter, cells: bool) -> tuple[list[np.ndarray], Batch]:
    """The last state of ``h = tanh(x W + h U)`` over every sequence, on onnxruntime."""
    def step(x, h):
        return ops.tanh(ops.matmul(x, W) + ops.matmul(h, U))

    step_fn: Any = step
    if cells:  # kept with its weights, so that no later pair of weights takes their ids
        kept = _CELLS.get((id(W), id(U)))
        if kept is None:
            kept = _CELLS[id(W), id(U)] = (W, U, cell(step))
        step_fn = kept[2]
    with Batch(backend="onnxruntime") as batch:
        finals = []
        for xs in sequences:
            h = ops.zeros((HIDDEN,))
            for x in xs:
                h = step_fn(batch.constant(x), h)
            finals.append(h)
        values = [v.copy() for v in batch.run(finals)]
    return values, batch


def assert_current(sequences, values, W, U):
    for xs, got in zip(sequences, values):
        np.testing.assert_allclose(got, recurrence_in_numpy(xs, W, U), rtol=RTOL, atol=ATOL)


def baked_sessions(batch: Batch) -> int:
    return sum(runner.baked_sessions for step in batch.last_plan.steps if step.template is not None
               for runner in step.template.runners.values() if hasattr(runner, "baked_sessions"))


@pytest.mark.parametrize("cells", [False, True])
def test_stable_weights_are_baked_from_the_second_run_on(cells):
    W, U = make_weights(seed=2)
    sequences = inputs()
    values, batch = run_batched(sequences, W, U, cells)
    assert_current(sequences, values, W, U)
    # U is launched once a step, so it was met: its snapshot taken, fed this run. (Op by op, every
    # x W runs in one launch, the first: W is a candidate only inside the cell.)
    assert U.array in TRACED_SNAPSHOTS and (W.array in TRACED_SNAPSHOTS) == cells
    for _ in range(2):
        values, batch = run_batched(sequences, W, U, cells)
        assert_current(sequences, values, W, U)
    assert baked_sessions(batch) >= 1


@pytest.mark.parametrize("cells", [False, True])
def test_a_weight_changed_in_place_after_baking_is_read_as_it_is_now(cells):
    W, U = make_weights(seed=3)
    sequences = inputs()
    for _ in range(2):
        run_batched(sequences, W, U, cells)
    W.array *= -1.5  # in place: same array object, new values
    U.array[0, 0] = 7.0
    for _ in range(2):  # the run that finds the change, and one after (volatile: fed)
        values, _ = run_batched(sequences, W, U, cells)
        assert_current(sequences, values, W, U)


def test_a_replaced_weight_is_read_as_it_is_now():
    W, U = make_weights(seed=4)
    sequences = inputs()
    for _ in range(2):
        run_batched(sequences, W, U, cells=True)
    W.array, U.array = make_weights(seed=5)[0].array, U.array * 2
    for _ in range(2):
        values, _ = run_batched(sequences, W, U, cells=True)
        assert_current(sequences, values, W, U)


def test_a_weight_launched_once_a_run_is_never_snapshot():
    W, U = make_weights(seed=6)
    sequences = [xs[:1] for xs in inputs()]  # one step each: W and U read by one launch
    for _ in range(2):
        values, _ = run_batched(sequences, W, U, cells=True)
        assert_current(sequences, values, W, U)
    assert W.array not in TRACED_SNAPSHOTS


def test_frozen_weights_launched_once_a_run_are_baked_without_a_copy():
    W, U = (p.freeze() for p in make_weights(seed=8))
    sequences = [xs[:1] for xs in inputs()]  # one launch a run reads W and U
    for _ in range(3):
        values, batch = run_batched(sequences, W, U, cells=True)
        assert_current(sequences, values, W, U)
    assert baked_sessions(batch) >= 1
    assert TRACED_SNAPSHOTS.stable(W.array).copy is W.array  # its own snapshot: nothing can change it


def test_freezing_a_parameter_makes_its_values_read_only():
    base = np.ones((4, 4), np.float32)
    view = Parameter(base[1:]).freeze()  # a view is copied first: its base could still change it
    owner = Parameter(np.ones(3, np.float32)).freeze()
    for parameter in (view, owner):
        assert is_frozen(parameter.array)
        with pytest.raises(ValueError, match="read-only"):
            parameter.array[0] = 2.0
    base[1] = 5.0
    assert float(view.array[0, 0]) == 1.0 and base.flags.writeable


def test_an_array_is_frozen_only_when_nothing_can_write_to_it():
    writable = np.zeros(4, np.float32)
    read_only_view = writable[:]
    read_only_view.flags.writeable = False
    assert not is_frozen(writable) and not is_frozen(read_only_view)  # its base still takes writes
    assert is_frozen(np.frombuffer(b"\0" * 16, np.float32))  # over immutable bytes


def test_small_weights_are_never_snapshot():
    rng = np.random.default_rng(7)
    W = Parameter(rng.standard_normal((8, 8), dtype=np.float32))
    assert W.array.nbytes < BAKE_MIN_BYTES
    with Batch(backend="onnxruntime") as batch:
        h = ops.zeros((8,))
        for _ in range(3):
            h = ops.tanh(ops.matmul(h + 1.0, W))
        batch.run([h])
    assert W.array not in TRACED_SNAPSHOTS


def test_snapshots_compare_bits():
    snapshots = WeightSnapshots()
    a = np.zeros(1000, np.float32)
    a[1] = np.nan
    assert snapshots.stable(a) is None  # first meeting: snapshot taken
    assert snapshots.stable(a) is not None  # unchanged (a NaN equals itself bit for bit)
    a[0] = -0.0  # equal to 0.0 as a float, not bit for bit
    assert snapshots.stable(a) is None
    a[0] = 0.0
    assert snapshots.stable(a) is None  # changed once: volatile for good
    assert a in snapshots


def test_snapshots_stay_within_their_budget():
    snapshots = WeightSnapshots(budget=1 << 20)
    arrays = [np.full(32 * 1024, k, np.float32) for k in range(12)]  # 128 KiB each, 256 KiB with its copy
    for array in arrays:
        snapshots.stable(array)
    assert len(snapshots) == 4 and all(array in snapshots for array in arrays[-4:])
    big = np.zeros(128 * 1024, np.float32)  # 512 KiB: above a quarter of the budget
    assert snapshots.stable(big) is None and big not in snapshots
    transposed = np.zeros((64, 64), np.float32).T  # not C-contiguous: never compared
    assert snapshots.stable(transposed) is None and snapshots.stable(transposed) is None


def test_batches_in_threads_share_baked_weights_and_stay_right():
    """Threads running batches at once (a server's engines) share the snapshots and the
    templates' baked sessions; every batch's results are its own weights' (one thread's weights
    change in place meanwhile)."""
    from concurrent.futures import ThreadPoolExecutor

    frozen = tuple(p.freeze() for p in make_weights(seed=9))
    sequences = inputs()

    def work(k: int) -> None:
        W, U = frozen if k % 2 else make_weights(seed=10 + k)  # odd threads share one frozen set
        for round_ in range(4):
            if not k % 2 and round_ == 2:
                W.array *= -1.0  # in place, while the other threads run
            values, _ = run_batched(sequences, W, U, cells=True)
            assert_current(sequences, values, W, U)

    with ThreadPoolExecutor(4) as pool:
        for future in [pool.submit(work, k) for k in range(4)]:
            future.result()


def _lstm_model(hidden: int) -> Any:
    """An ONNX LSTM over ``x [L, 1, 16]`` whose recurrent weight is big enough to bake."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(9)
    weights = {"W": (1, 4 * hidden, 16), "R": (1, 4 * hidden, hidden)}
    initializers = [numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32), name)
                    for name, shape in weights.items()]
    node = helper.make_node("LSTM", ["x", "W", "R"], ["y"], hidden_size=hidden)
    graph = helper.make_graph([node], "lstm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["L", 1, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["L", 1, 1, hidden])], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_sessions_weight_snapshots_are_its_own_and_go_with_it():
    """A session's weights are snapshot (and baked) by the session, not by a module: traced
    batches' snapshots do not see them, and nothing keeps them once the session is gone."""
    import gc
    import weakref

    from autobatch import InferenceSession

    model = _lstm_model(hidden=64)
    rng = np.random.default_rng(10)
    instances = [{"x": rng.standard_normal((int(n), 1, 16)).astype(np.float32)} for n in rng.integers(2, 12, 16)]
    traced = len(TRACED_SNAPSHOTS)
    session = InferenceSession(model, backend="onnxruntime", alone_when_faster=False, node_level=False)
    for _ in range(2):
        got = session.run_batch(None, instances)
    for feeds, outputs in zip(instances, got):
        np.testing.assert_allclose(outputs[0], session.run(None, feeds)[0], rtol=RTOL, atol=ATOL)
    assert len(session.weight_snapshots) >= 1 and len(TRACED_SNAPSHOTS) == traced
    other = InferenceSession(model, backend="onnxruntime", alone_when_faster=False, node_level=False)
    other.run_batch(None, instances)
    assert other.weight_snapshots is not session.weight_snapshots and len(other.weight_snapshots) >= 1
    kept = weakref.ref(session.weight_snapshots)
    del session
    gc.collect()
    assert kept() is None
