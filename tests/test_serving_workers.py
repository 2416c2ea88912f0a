"""Where an engine runs its model: in a worker process of its own (``worker="process"``), whose
answers are each instance's own and where a run that crashes the process, or hangs past its
deadline, costs that run only (the process is started again, the batch's other requests are
answered, the restart logged and counted); and as several instances taking batches from one
queue (``instances``), two batches running at once."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time

import numpy as np
import onnx
import pytest

pytest.importorskip("uvicorn")

from autobatch import InferenceSession  # noqa: E402
from autobatch.session import usable_cores  # noqa: E402
from autobatch.serving import Engine, InferenceFailed, RequestTimeout  # noqa: E402
from autobatch.serving import worker_process  # noqa: E402
from autobatch.serving.metrics import render  # noqa: E402
from tests.test_serving import MODEL, instance  # noqa: E402

PROGRAM = '''
import os
import time

async def faulty_double(feeds):
    rows = feeds["x"].shape[0]
    if rows == 7:
        os._exit(3)  # a crash of the process: a fault in a kernel, the OOM killer
    if rows == 9:
        time.sleep(600)  # stuck where no deadline is checked
    return {"y": feeds["x"] * 2}
'''


def double(rows: int) -> dict[str, np.ndarray]:
    return {"x": np.arange(rows, dtype=np.float32)}


@pytest.fixture
def program(tmp_path) -> str:
    (tmp_path / "programs.py").write_text(PROGRAM)
    return f"{tmp_path}/programs.py:faulty_double"


def test_a_model_in_a_worker_process_answers_each_instance_as_run_alone(tmp_path):
    onnx.save(MODEL, tmp_path / "model.onnx")
    alone = InferenceSession(MODEL)
    instances = [instance(n, seed) for seed, n in enumerate([3, 1, 6, 2, 6, 4])]

    async def main() -> list:
        engine = Engine(str(tmp_path / "model.onnx"), worker="process", batch_wait_timeout_s=0.05)
        assert engine.name == "model" and engine.runner.alive
        try:
            return await asyncio.gather(*(engine.infer(feeds) for feeds in instances))
        finally:
            await engine.close()
            assert not engine.runner.alive  # stopped with the engine

    results = asyncio.run(main())
    for feeds, outputs in zip(instances, results):
        for name, want in zip(alone.graph.outputs, alone.run(None, feeds)):
            np.testing.assert_allclose(outputs[name], want, rtol=1e-5, atol=1e-6)


def test_a_crash_fails_its_own_request_and_the_batch_mates_are_answered(program, caplog):
    async def main() -> tuple[list, Engine]:
        engine = Engine(program, worker="process", batch_wait_timeout_s=0.2)
        try:
            first = engine.runner.pid
            results = await asyncio.gather(*(engine.infer(double(n)) for n in (2, 7, 4)), return_exceptions=True)
            assert engine.runner.pid != first
            again = await engine.infer(double(5))  # the new process serves on
            np.testing.assert_array_equal(again["y"], 2 * double(5)["x"])
            return results, engine
        finally:
            await engine.close()

    with caplog.at_level(logging.WARNING, logger="autobatch"):
        results, engine = asyncio.run(main())
    np.testing.assert_array_equal(results[0]["y"], 2 * double(2)["x"])
    np.testing.assert_array_equal(results[2]["y"], 2 * double(4)["x"])
    assert isinstance(results[1], InferenceFailed) and "exited with code 3" in str(results[1])
    # the batch crashed it, then its guilty instance alone did: two restarts, one batch run again alone
    assert engine.metrics.worker_restarts == 2 and engine.metrics.batches_failed == 1
    assert 'autobatch_worker_restarts_total{model="faulty_double"} 2' in render([("faulty_double", engine.metrics, 0)])
    warnings = [r.message for r in caplog.records if "; restart " in r.message]
    assert len(warnings) == 2 and all("exited with code 3 during a run" in w for w in warnings)


def test_a_run_stuck_past_its_deadline_is_killed_and_the_model_serves_on(program, monkeypatch):
    monkeypatch.setattr(worker_process, "GRACE_S", 0.5)

    async def main() -> None:
        engine = Engine(program, worker="process", request_timeout_s=1.0)
        try:
            stuck = engine.runner.pid
            with pytest.raises(RequestTimeout):
                await engine.infer(double(9))
            # Answered once the stuck run is killed (half a second later) and a new child has
            # started (about a second on this 2-core host, its imports): a deadline of its own.
            answer = await engine.infer(double(3), timeout=30.0)
            np.testing.assert_array_equal(answer["y"], 2 * double(3)["x"])
            assert engine.metrics.worker_restarts == 1 and engine.runner.pid != stuck
        finally:
            await engine.close()

    asyncio.run(main())


def test_a_worker_process_killed_between_batches_is_started_again(tmp_path):
    onnx.save(MODEL, tmp_path / "model.onnx")
    feeds = instance(3, 0)
    want = InferenceSession(MODEL).run(None, feeds)

    async def main() -> None:
        engine = Engine(str(tmp_path / "model.onnx"), worker="process")
        try:
            await engine.infer(feeds)
            killed(engine.runner)
            assert engine.ready  # the next call starts another: a load balancer keeps sending calls
            got = await engine.infer(feeds)
            np.testing.assert_allclose(got[MODEL.graph.output[0].name], want[0], rtol=1e-6)
            assert engine.metrics.worker_restarts == 1
        finally:
            await engine.close()

    asyncio.run(main())


def killed(runner) -> None:
    """The runner's worker process killed, and gone (a batch taken as it dies fails: not here)."""
    os.kill(runner.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while runner.alive and time.monotonic() < deadline:
        time.sleep(0.01)


FLAKY = '''
import os

if os.path.exists({flag!r}):
    raise ImportError("cannot load while the flag is there")

async def doubled(feeds):
    return {{"y": feeds["x"] * 2}}
'''


FAILED_START = "no worker process (ImportError: cannot load while the flag is there); trying again in 0.3 s"


def test_a_worker_process_that_cannot_start_is_tried_again_while_its_requests_wait(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(worker_process, "RETRY_S", 0.3)
    flag = tmp_path / "broken"
    (tmp_path / "flaky.py").write_text(FLAKY.format(flag=str(flag)))

    async def main() -> None:
        engine = Engine(f"{tmp_path}/flaky.py:doubled", worker="process")
        try:
            flag.touch()  # the next start fails
            killed(engine.runner)
            pending = asyncio.ensure_future(engine.infer(double(3)))
            # Tried and failed (a child's start, its imports, takes about a second on a slow host):
            for _ in range(300):
                if any(FAILED_START in r.message for r in caplog.records):
                    break
                await asyncio.sleep(0.1)
            assert not pending.done()  # waiting to try again
            flag.unlink()
            answer = await asyncio.wait_for(pending, 30)
            np.testing.assert_array_equal(answer["y"], 2 * double(3)["x"])
        finally:
            await engine.close()

    with caplog.at_level(logging.ERROR, logger="autobatch"):
        asyncio.run(main())
    assert any(FAILED_START in r.message for r in caplog.records)


def test_an_engine_never_started_stops_its_worker_processes(tmp_path):
    onnx.save(MODEL, tmp_path / "model.onnx")
    engine = Engine(str(tmp_path / "model.onnx"), worker="process", instances=2)
    assert all(runner.alive for runner in engine.runners)
    assert engine.runners[1].checker is engine.runners[0].checker  # one copy of the model checks feeds
    asyncio.run(engine.close())
    assert not any(runner.alive for runner in engine.runners)


@pytest.mark.parametrize("model, error", [
    (MODEL, "a worker process loads its model itself: give a path"),
    ("missing.onnx", "missing.onnx: no such model file"),
])
def test_a_worker_process_needs_a_model_it_can_load(model, error):
    with pytest.raises((ValueError, FileNotFoundError), match=error):
        Engine(model, worker="process")


def test_a_model_the_worker_process_cannot_load_is_said_at_once(tmp_path, monkeypatch):
    """Checked here on a NumPy copy, the model loads; the child's backend is asked for one
    onnxruntime cannot make (a CUDA-only provider is not needed: an unknown backend name)."""
    onnx.save(MODEL, tmp_path / "model.onnx")
    with pytest.raises(ValueError, match="backend"):
        Engine(str(tmp_path / "model.onnx"), worker="process", backend="no-such-backend")


MEETING = '''
import threading

BARRIER = threading.Barrier(2, timeout=10)

async def meet(feeds):
    BARRIER.wait()  # passes only while two runs are in flight at once
    return {"y": feeds["x"] * 2}
'''


def test_two_instances_run_two_batches_at_once(tmp_path, monkeypatch):
    (tmp_path / "meeting.py").write_text(MEETING)
    monkeypatch.syspath_prepend(str(tmp_path))  # one module, one barrier, for both instances

    async def main() -> list:
        engine = Engine("meeting:meet", instances=2, max_batch_size=1)
        try:
            return await asyncio.gather(*(engine.infer(double(n)) for n in (2, 3)))
        finally:
            await engine.close()
            assert not engine.ready

    for n, answer in zip((2, 3), asyncio.run(main())):
        np.testing.assert_array_equal(answer["y"], 2 * double(n)["x"])


def test_instances_of_a_model_share_the_cores_and_answer_as_alone(tmp_path):
    onnx.save(MODEL, tmp_path / "model.onnx")
    alone = InferenceSession(MODEL)
    instances = [instance(n, seed) for seed, n in enumerate([3, 1, 6, 2, 6, 4, 5, 2])]

    async def main() -> tuple[list, Engine]:
        engine = Engine(str(tmp_path / "model.onnx"), backend="onnxruntime", instances=2, max_batch_size=3)
        try:
            return await asyncio.gather(*(engine.infer(feeds) for feeds in instances)), engine
        finally:
            await engine.close()

    results, engine = asyncio.run(main())
    assert len(engine.runners) == 2 and engine.runners[0].session is not engine.runners[1].session
    assert all(runner.session.ort_settings.options.intra_op_num_threads == max(1, usable_cores() // 2)
               for runner in engine.runners)
    for feeds, outputs in zip(instances, results):
        for name, want in zip(alone.graph.outputs, alone.run(None, feeds)):
            np.testing.assert_allclose(outputs[name], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("instances", [1, 2])
def test_threads_from_the_command_line_reach_every_session(tmp_path, instances):
    from autobatch.cli import build_parser
    from autobatch.serving.cli import registry_from_args

    onnx.save(MODEL, tmp_path / "model.onnx")
    args = build_parser().parse_args(["serve", str(tmp_path / "model.onnx"), "--backend", "onnxruntime",
                                      "--instances", str(instances), "--threads", "3"])  # no default's number
    (engine,) = registry_from_args(args).engines.values()
    assert len(engine.runners) == instances
    assert all(runner.session.ort_settings.options.intra_op_num_threads == 3 for runner in engine.runners)
    with pytest.raises(ValueError, match="threads must be positive"):
        Engine(str(tmp_path / "model.onnx"), backend="onnxruntime", threads=0)


def test_one_instance_leaves_the_event_loop_a_core(tmp_path):
    onnx.save(MODEL, tmp_path / "model.onnx")
    engine = Engine(str(tmp_path / "model.onnx"), backend="onnxruntime")
    assert engine.runner.session.ort_settings.options.intra_op_num_threads == max(1, usable_cores() - 1)


def test_instances_need_a_model_each_can_load():
    with pytest.raises(ValueError, match="2 instances need a model each loads"):
        Engine(InferenceSession(MODEL), instances=2)
