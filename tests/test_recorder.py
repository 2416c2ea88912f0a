"""Tracing's hot path, compiled (frontends/_recorder.c) and in Python (frontends/recorder.py):
built where a compiler is, the same records and values either way, no references kept, and the
tracing tests passing with the Python one too."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from autobatch import Batch, Parameter, TraceError, cell, ops
from autobatch.frontends import recorder
from autobatch.frontends.tracing import DISCARDED, Tracer
from tests.compiling import builds_extensions

ROOT = Path(__file__).resolve().parent.parent
PURE = {**os.environ, "AUTOBATCH_PURE_PYTHON": "1"}
COMPILED_ONLY = pytest.mark.skipif(not recorder.COMPILED, reason="the compiled recorder is not built here")
# The tests whose programs go through tracing: run again with the Python recorder.
TRACING_TESTS = ["test_frontends.py", "test_folds.py", "test_examples.py", "test_flat.py", "test_sequences.py",
                 "test_ragged.py", "test_correctness_contract.py", "test_one_node_ops.py"]


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_the_recorder_is_compiled_where_a_compiler_and_python_headers_are():
    """``pip install`` builds it (optional, so a missing compiler does not stop the install)."""
    if not builds_extensions():
        pytest.skip("no C compiler or Python headers here (or the Python recorder asked for): it runs in Python")
    assert recorder.COMPILED, "a compiler is here but frontends/_recorder.c was not built: reinstall with pip"


def test_both_recorders_record_and_compute_the_same():
    """tests/scripts/trace_records.py prints every record and value of small programs (scalars,
    parameters, broadcasting, reused calls, cells, errors) and of the examples' Tree-LSTM and
    tagger in each form; the two recorders print the same lines."""
    compiled = _run(["tests/scripts/trace_records.py"], dict(os.environ))
    python = _run(["tests/scripts/trace_records.py"], PURE)
    assert compiled.returncode == 0, compiled.stderr
    assert python.returncode == 0, python.stderr
    first, *lines = compiled.stdout.splitlines()
    assert first == ("compiled" if recorder.COMPILED else "python")
    python_first, *python_lines = python.stdout.splitlines()
    assert python_first == "python"
    assert len(lines) > 60
    assert lines == python_lines


@pytest.mark.slow  # about 10 s: run by .ci/run beside the fuzzer
@pytest.mark.skipif(bool(os.environ.get("AUTOBATCH_PURE_PYTHON")), reason="this run is the Python recorder's")
def test_the_tracing_tests_pass_with_the_python_recorder():
    result = _run(["-m", "pytest", "-q", "-p", "no:cacheprovider", *(f"tests/{name}" for name in TRACING_TESTS)], PURE)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert " passed" in result.stdout.splitlines()[-1]


def _trace_and_drop(steps: int) -> None:
    W = Parameter(np.eye(4, dtype=np.float32))
    shared = cell(lambda h, c: (ops.tanh(ops.matmul(h, W)) * c, c + 1.0))
    with Tracer() as tracer:
        h = c = tracer.constant(np.ones(4, np.float32))
        for _ in range(steps):
            h = ops.tanh(ops.add(ops.matmul(h, W), 1.0))
            h, c = shared(h, c)
            h = h * 2.0 + h
        tracer.discard()


def _index_ints(steps: int, indices: list[int]) -> list[int]:
    """The int objects a chain's records name their predecessors by (each record ``k + 1``'s
    ``preds[0]`` is ``k``), the batch dropped: the compiled recorder shares those below a bound."""
    with Tracer() as tracer:
        h = tracer.constant(np.ones(4, np.float32))
        for _ in range(steps):
            h = ops.tanh(h)
        found = [tracer._records[k + 1].preds[0] for k in indices]
        tracer.discard()
    assert found == indices
    return found


def test_tracing_keeps_no_references_once_a_batch_is_dropped():
    shape, dtype = (4,), np.dtype(np.float32)
    _trace_and_drop(10)  # cells traced, caches warm
    gc.collect()
    counts = sys.getrefcount(shape), sys.getrefcount(dtype), sys.getrefcount("Tanh")
    # The compiled recorder's record indices made (ints made once below a bound and shared, as
    # Python shares small ints), so that the run measured below allocates none of them.
    _trace_and_drop(20_000)
    shared = _index_ints(1_200, [300, 1_000])
    gc.collect()
    index_counts = [sys.getrefcount(i) for i in shared]
    tracemalloc.start()
    try:
        _trace_and_drop(10)
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        _trace_and_drop(20_000)
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert after - before < 200_000, f"{after - before} bytes kept after tracing 20,000 steps and dropping them"
    assert (sys.getrefcount(shape), sys.getrefcount(dtype), sys.getrefcount("Tanh")) == counts
    assert [sys.getrefcount(i) for i in shared] == index_counts  # no reference kept to a record's index


@COMPILED_ONLY
def test_compiled_and_python_check_a_folds_children_alike():
    """``_recorder.fold_children`` and its twin ``folds.fold_children`` find the same first wrong
    node (children not LEAF twice nor two earlier nodes: a later one, itself, one negative, a
    LEAF beside a node) and count the same leaves, over random trees with and without faults."""
    from autobatch.frontends.folds import fold_children
    from autobatch.ir.records import LEAF
    rng = np.random.default_rng(5)
    faults = 0
    for trial in range(300):
        n = int(rng.integers(1, 40))
        matrix = np.full((n, 2), LEAF, np.int64)
        for k in range(1, n):
            if rng.random() < 0.5:
                matrix[k] = rng.integers(0, k, size=2)
        if trial % 2:
            k = int(rng.integers(0, n))
            matrix[k, int(rng.integers(0, 2))] = rng.choice([k, k + 1 + int(rng.integers(0, 3)), -2, LEAF])
        got = recorder.compiled.fold_children(matrix)
        assert got == fold_children(matrix), (trial, matrix.tolist())
        faults += got[0] >= 0
    assert faults > 50
    with pytest.raises(TypeError, match="int64 array"):
        recorder.compiled.fold_children(np.zeros((3, 2), np.int32))
    with pytest.raises(TypeError, match="int64 array"):
        recorder.compiled.fold_children(np.zeros((3, 3), np.int64))


@COMPILED_ONLY
def test_the_compiled_recorder_refuses_what_is_not_a_tensor():
    with Tracer() as tracer:
        x = tracer.constant(np.ones(2, np.float32))
        with pytest.raises(TypeError, match="must be tensors, got int"):
            tracer.record_one("Tanh", [x, 3], (2,), x.dtype)
        with pytest.raises(TypeError, match="sequence of tensors"):
            tracer.record_one("Tanh", 3, (2,), x.dtype)
        with pytest.raises(TypeError, match="record_one"):
            tracer.record_one("Tanh", [x])
        assert tracer._records == []  # nothing half-recorded
        y = ops.tanh(x)
        assert tracer._records[-1].inputs == [x.name] and y.producer == 0
        tracer.discard()


def test_waiting_lists_the_tensors_held_without_values_in_tracing_order():
    with Tracer() as tracer:
        x = tracer.constant(np.ones(2, np.float32))
        a, b = ops.tanh(x), ops.exp(x)
        c = ops.tanh(b)
        del b  # gone: its record stays, its tensor is not waited for
        assert tracer.waiting() == [a, c]  # the compiled recorder's where it is built
        assert recorder.PyRecorderBase.waiting(tracer) == [a, c]  # its Python twin
        a.value = np.zeros(2, np.float32)
        assert tracer.waiting() == recorder.PyRecorderBase.waiting(tracer) == [c]
        tracer.discard()
        assert c.producer == DISCARDED and tracer.waiting() == []


def test_a_cell_call_out_of_the_common_case_runs_the_python_and_says_what_is_wrong():
    @cell
    def double(x):
        return x * 2.0

    with Batch(backend="numpy") as batch:
        x = batch.constant(np.ones(2, np.float32))
        with Batch(backend="numpy") as other:  # traced into now: x is not its own
            with pytest.raises(TraceError, match="another batch"):
                double(x)
            with pytest.raises(TraceError, match="another batch"):
                ops.add(x, x)
            y = other.constant(np.ones(2, np.float32))
            with pytest.raises(TypeError):
                double(x=y)
            assert double(3.0).numpy() == np.float32(6.0)  # a Python value: a literal of `other`
            assert double(y).numpy().tolist() == [2.0, 2.0]
        assert double(x).numpy().tolist() == [2.0, 2.0]


def test_a_pick_whose_batch_runs_python_midway_reads_no_freed_fields():
    """``ops.pick``'s C path calls the batch's ``constant`` (Python) before it records: were the
    tensor's shape rebound there, the old tuple, freed, must not be read (it was: a review's
    reproducer read freed memory, 'Invalid item in shape')."""
    victim, held = None, []

    class Rebinding(Tracer):
        def constant(self, value, dtype=None):
            if dtype is np.int64 and victim is not None:
                victim.shape = (7, 7)  # drops the only reference to the tensor's old shape
                held.extend(tuple(range(k, k + 3)) for k in range(1000))  # in the memory the old tuple had
            return super().constant(value, dtype)

    with Rebinding() as tracer:
        victim = tracer.constant(np.ones((3, 4), np.float32))
        victim.shape = tuple([3, 4])  # a tuple held only by the tensor
        picked = ops.pick(victim, 1)
        assert picked.shape in ((4,), (7,))  # the shape before the call (C) or after it (Python)
        tracer.discard()


@pytest.mark.parametrize("call", ["add", "concat", "split", "lstm"])
def test_an_op_whose_batch_unbinds_its_operand_midway_raises_and_does_not_crash(call):
    """The C common cases check their operands' batch and dtype, then read them off the first
    operand; making a parameter's tensor runs the batch's Python (``parameter``), which here
    deletes the first operand's batch: that read was of a NULL field (a review's reproducer:
    the process died, signal 11). Now the Python path runs and says what is wrong."""
    rng = np.random.default_rng(0)
    victim = None

    def layer() -> list[Parameter]:  # new parameters each call: the batch makes their tensors
        return [Parameter(rng.standard_normal(shape).astype(np.float32)) for shape in ((1, 12, 4), (1, 12, 3), (1, 24))]

    def weight() -> Parameter:
        return Parameter(np.ones((2, 4), np.float32))

    class Unbinding(Tracer):
        def parameter(self, parameter):
            nonlocal victim
            if victim is not None:
                target, victim = victim, None
                del target.batch
            return super().parameter(parameter)

    calls = {"add": lambda x: ops.add(x, weight()), "concat": lambda x: ops.concat([x, weight()]),
             "split": lambda x: ops.split(x, 2), "lstm": lambda x: ops.lstm(x, *layer())}
    with Unbinding() as tracer:
        x = tracer.constant(np.ones((2, 4), np.float32))
        calls[call](x)  # the common case, its layer checked
        victim = x
        if call == "split":  # no parameter operand: unbound before the call
            del x.batch
        with pytest.raises(AttributeError):
            calls[call](x)
        x.batch = tracer
        tracer.discard()
