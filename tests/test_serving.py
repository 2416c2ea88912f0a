"""The serving layer against a real uvicorn server on loopback: tritonclient's HTTP client for
the happy path, raw HTTP for every error case; the engine alone (async, blocking, programs)."""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnx
import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from autobatch import InferenceSession, ops  # noqa: E402
from autobatch.frontends.tensors import current_batch  # noqa: E402
from autobatch.examples.ray_serve import MODEL_TEXT  # noqa: E402
from benchmarks.onnx_tagger import build_model  # noqa: E402
from autobatch.serving import (  # noqa: E402
    BadRequest, Engine, InferenceFailed, ModelRegistry, ProgramRunner, QueueFull, RequestTimeout, SessionRunner,
    Limits, ShuttingDown, serve_in_thread,
)

# One instance: x has a length N of its own, so concurrent requests have different graphs.
MODEL = onnx.parser.parse_model(MODEL_TEXT)
POISON = 666.0  # an instance whose x holds this fails to execute (and only it)
# One sentence's BiLSTM tagger (word ids int64[N]): concurrent sentences' LSTMs are packed.
LSTM_TAGGER = build_model(words=30, size=8)
MAX_BODY = 64 * 1024


def instance(n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": (0.1 * rng.standard_normal((n, 4))).astype(np.float32), "b": rng.standard_normal(4).astype(np.float32)}


class FaultyRunner(SessionRunner):
    """The model, failing for poisoned instances (batched: the whole batch) and sleeping
    ``delay`` seconds per call: a fault and a slow model to inject."""

    def __init__(self, delay: float = 0.0) -> None:
        super().__init__(InferenceSession(MODEL))
        self.delay = delay
        self.batched_calls = 0

    def run_batch(self, feeds_list):
        self.batched_calls += 1
        self._maybe_fail(feeds_list)
        return super().run_batch(feeds_list)

    def run(self, feeds):
        self._maybe_fail([feeds])
        return super().run(feeds)

    def _maybe_fail(self, feeds_list) -> None:
        time.sleep(self.delay)
        if any((feeds["x"] == POISON).any() for feeds in feeds_list):
            raise RuntimeError("poisoned instance")


@pytest.fixture(scope="module")
def server():
    registry = ModelRegistry([
        Engine(MODEL, name="tagger", batch_wait_timeout_s=0.05),
        Engine(LSTM_TAGGER, name="lstm", batch_wait_timeout_s=0.1),
        Engine(FaultyRunner(), name="faulty", batch_wait_timeout_s=0.1),
        Engine(FaultyRunner(delay=0.5), name="slow", max_batch_size=1, max_queue=1),
        Engine(FaultyRunner(delay=0.5), name="timeout", request_timeout_s=0.1),
    ])
    with serve_in_thread(registry, limits=Limits(max_body_bytes=MAX_BODY)) as running:
        yield running


def request(server, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
    """Raw HTTP: (status, headers, decoded JSON or text)."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        data = response.read()
        kind = response.getheader("content-type", "")
        return response.status, dict(response.getheaders()), json.loads(data) if "json" in kind else data.decode()
    finally:
        connection.close()


def infer_body(feeds: dict[str, np.ndarray], datatype: str = "FP32", **changes) -> bytes:
    inputs = [{"name": name, "shape": list(v.shape), "datatype": datatype, "data": v.ravel().tolist()}
              for name, v in feeds.items()]
    return json.dumps({"inputs": inputs, **changes}).encode()


def metric(text: str, name: str, model: str) -> float:
    match = re.search(rf'^{name}{{model="{model}"}} (\S+)$', text, re.M)
    assert match, f"{name} for {model} not in metrics"
    return float(match.group(1))


# ----------------------------------------------------------------------------- happy path, tritonclient
def test_tritonclient_concurrent_requests_of_different_lengths_are_batched(server):
    httpclient = pytest.importorskip("tritonclient.http")
    client = httpclient.InferenceServerClient(url=server.url.removeprefix("http://"), concurrency=12)
    try:
        assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("tagger")
        metadata = client.get_model_metadata("tagger")
        assert metadata["inputs"][0] == {"name": "x", "datatype": "FP32", "shape": [-1, 4]}
        instances = [instance(n, seed) for seed, n in enumerate([1, 3, 2, 5, 3, 7, 1, 4, 2, 6, 3, 8])]
        handles = []
        for k, feeds in enumerate(instances):
            binary = k % 2 == 0  # both the binary extension and plain JSON tensors
            inputs = []
            for name, value in feeds.items():
                tensor = httpclient.InferInput(name, list(value.shape), "FP32")
                tensor.set_data_from_numpy(value, binary_data=binary)
                inputs.append(tensor)
            outputs = [httpclient.InferRequestedOutput(name, binary_data=binary) for name in ("y", "s")]
            handles.append(client.async_infer("tagger", inputs, outputs=outputs))
        session = InferenceSession(MODEL)
        for feeds, handle in zip(instances, handles):
            result = handle.get_result()
            for name, alone in zip(("y", "s"), session.run(None, feeds)):
                got = result.as_numpy(name)
                assert got.dtype == alone.dtype and got.shape == alone.shape
                np.testing.assert_allclose(got, alone, rtol=1e-5, atol=1e-6)
    finally:
        client.close()
    text = request(server, "GET", "/metrics")[2]
    batches = metric(text, "autobatch_batch_size_count", "tagger")
    assert metric(text, "autobatch_batch_size_sum", "tagger") == 12 and batches < 12  # some batch held > 1
    assert metric(text, "autobatch_requests_total", "tagger") >= 12


def test_concurrent_sentences_share_one_packed_lstm(server):
    """Requests of different lengths through a model with an LSTM: batched together (the layer
    packed across them), each answer equal to the sentence run alone."""
    rng = np.random.default_rng(7)
    sentences = [{"ids": rng.integers(0, 30, n)} for n in [5, 1, 9, 3, 7, 2, 12, 4, 6, 8]]
    with ThreadPoolExecutor(len(sentences)) as pool:
        answers = list(pool.map(lambda feeds: request(server, "POST", "/v2/models/lstm/infer",
                                                     infer_body(feeds, datatype="INT64")), sentences))
    session = InferenceSession(LSTM_TAGGER)
    for feeds, (status, _, body) in zip(sentences, answers, strict=True):
        assert status == 200, body
        (alone,) = session.run(None, feeds)
        got = np.array(body["outputs"][0]["data"], dtype=np.float32).reshape(body["outputs"][0]["shape"])
        np.testing.assert_allclose(got, alone, rtol=1e-5, atol=1e-6)
    text = request(server, "GET", "/metrics")[2]
    assert metric(text, "autobatch_batch_size_count", "lstm") < len(sentences)  # some batch held > 1


def test_health_metadata_and_metrics(server):
    assert request(server, "GET", "/v2/health/live")[:1] == (200,)
    assert request(server, "GET", "/v2/health/ready")[2] == {"ready": True}
    status, _, body = request(server, "GET", "/v2/models/tagger/versions/1")
    assert status == 200 and [o["name"] for o in body["outputs"]] == ["y", "s"]
    status, headers, text = request(server, "GET", "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    for name in ("autobatch_requests_total", "autobatch_request_errors_total", "autobatch_batch_size_bucket",
                 "autobatch_queue_depth", "autobatch_request_latency_seconds_bucket"):
        assert f"# TYPE {name.removesuffix('_bucket')} " in text


def test_json_request_and_output_selection(server):
    feeds = instance(3, 0)
    status, _, body = request(server, "POST", "/v2/models/tagger/infer",
                              infer_body(feeds, outputs=[{"name": "s"}], id="abc"))
    assert status == 200 and body["id"] == "abc" and body["model_name"] == "tagger"
    [out] = body["outputs"]
    assert out["name"] == "s" and out["shape"] == [3] and out["datatype"] == "FP32"
    np.testing.assert_allclose(out["data"], InferenceSession(MODEL).run(["s"], feeds)[0], rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- errors, raw HTTP
@pytest.mark.parametrize("path, body, status, words", [
    ("/v2/models/nope/infer", infer_body(instance(2, 0)), 404, "unknown model"),
    ("/v2/models/tagger/infer", infer_body({**instance(2, 0), "z": np.zeros(1, np.float32)}), 400, "unknown input"),
    ("/v2/models/tagger/infer", infer_body(instance(2, 0), datatype="FP64"), 400, "dtype float64"),
    ("/v2/models/tagger/infer", infer_body({"x": np.zeros((2, 5), np.float32), "b": np.zeros(4, np.float32)}),
     400, "shape (2, 5)"),
    ("/v2/models/tagger/infer", infer_body({"x": np.zeros((2, 4), np.float32)}), 400, "missing input"),
    ("/v2/models/tagger/infer", b'{"inputs": [', 400, "malformed json"),
    ("/v2/models/tagger/infer", b'{"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [1]}]}',
     400, "1 values for shape [2]"),
    ("/v2/models/tagger/infer", b'{"inputs": [{"name": "x", "shape": [1], "datatype": ["FP32"], "data": [1]}]}',
     400, "datatype"),
    ("/v2/models/tagger/infer", infer_body(instance(2, 0), outputs=[{"name": "q"}]), 400, "unknown output"),
    ("/v2/models/tagger/infer", b" " * (MAX_BODY + 1), 413, "exceeds the limit"),
])
def test_bad_requests_get_their_status_and_an_error(server, path, body, status, words):
    got, _, answer = request(server, "POST", path, body, {"Content-Type": "application/json"})
    assert got == status and words in answer["error"].lower(), answer


def test_bad_and_failing_requests_fail_alone_in_their_batch(server):
    """One batch (0.1 s wait) holding good, malformed and poisoned instances: only the bad fail."""
    good = [instance(n, n) for n in (2, 3, 4)]
    poisoned = instance(3, 9)
    poisoned["x"][0, 0] = POISON
    wrong_shape = {"x": np.zeros((2, 7), np.float32), "b": np.zeros(4, np.float32)}
    bodies = [infer_body(f) for f in (*good, poisoned, wrong_shape)]
    with ThreadPoolExecutor(len(bodies)) as pool:
        answers = list(pool.map(lambda b: request(server, "POST", "/v2/models/faulty/infer", b), bodies))
    statuses = [a[0] for a in answers]
    assert statuses == [200, 200, 200, 500, 400], answers
    assert "poisoned instance" in answers[3][2]["error"] and "shape (2, 7)" in answers[4][2]["error"]
    session = InferenceSession(MODEL)
    for feeds, (_, _, body) in zip(good, answers):
        np.testing.assert_allclose(body["outputs"][0]["data"], session.run(["y"], feeds)[0].ravel(), rtol=1e-5, atol=1e-6)
    text = request(server, "GET", "/metrics")[2]
    assert metric(text, "autobatch_instances_rerun_total", "faulty") >= 2  # the batch failed and was re-run alone


def test_a_full_queue_answers_503_with_retry_after(server):
    body = infer_body(instance(2, 0))
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: request(server, "POST", "/v2/models/slow/infer", body), range(4)))
    statuses = sorted(a[0] for a in answers)
    assert statuses.count(200) >= 1 and 503 in statuses, statuses
    refused = next(a for a in answers if a[0] == 503)
    assert refused[1]["retry-after"] == "1" and "queue is full" in refused[2]["error"]
    text = request(server, "GET", "/metrics")[2]
    assert re.search(r'autobatch_request_errors_total\{model="slow",code="503"\} [1-9]', text)


def test_a_request_past_its_timeout_answers_504(server):
    status, _, body = request(server, "POST", "/v2/models/timeout/infer", infer_body(instance(2, 0)))
    assert status == 504 and "no result within 0.1 s" in body["error"]


# ----------------------------------------------------------------------------- the engine alone
def test_engine_async_and_blocking_callers_get_their_own_outputs():
    engine = Engine(MODEL, name="blocking", max_queue_delay_microseconds=20_000)  # Triton's name for the wait
    assert engine.batch_wait_timeout_s == 0.02
    instances = [instance(n, n) for n in (1, 4, 2, 6, 3)]
    session = InferenceSession(MODEL)
    try:
        with ThreadPoolExecutor(len(instances)) as pool:  # blocking calls from threads: one engine loop
            results = list(pool.map(engine.infer_sync, instances))
        for feeds, outputs in zip(instances, results):
            np.testing.assert_allclose(outputs["y"], session.run(["y"], feeds)[0], rtol=1e-5, atol=1e-6)
        assert engine.metrics.batch_sizes.count < len(instances)
    finally:
        engine.shutdown()
    with pytest.raises(ShuttingDown):
        engine.infer_sync(instances[0])
    assert not any(t.name.startswith(("autobatch-loop-", f"autobatch-{engine.name}")) for t in threading.enumerate())


def test_engine_errors_and_graceful_close():
    async def main() -> None:
        engine = Engine(FaultyRunner(delay=0.05), max_queue=3, batch_wait_timeout_s=0.01)
        bad = instance(2, 0)
        bad["x"] = bad["x"].astype(np.float64)
        tasks = [asyncio.ensure_future(engine.infer(instance(2, k))) for k in range(3)]
        await asyncio.sleep(0)
        with pytest.raises(QueueFull):
            await engine.infer(instance(2, 9))
        await engine.close()  # drains: what was queued still completes
        assert len(await asyncio.gather(*tasks)) == 3
        engine = Engine(FaultyRunner())
        with pytest.raises(BadRequest, match="dtype float64"):
            await engine.infer(bad)
        poisoned = instance(2, 0)
        poisoned["x"][:] = POISON
        with pytest.raises(InferenceFailed, match="poisoned"):
            await engine.infer(poisoned)
        slow = Engine(FaultyRunner(delay=0.3))
        with pytest.raises(RequestTimeout):
            await slow.infer(instance(2, 0), timeout=0.05)
        await asyncio.gather(engine.close(), slow.close())

    asyncio.run(main())


class GatedRunner(SessionRunner):
    """The model, whose first batch waits for the test to open a gate; it records when each
    batch started."""

    def __init__(self) -> None:
        super().__init__(InferenceSession(MODEL))
        self.gate = threading.Event()
        self.started: list[float] = []

    def run_batch(self, feeds_list):
        self._wait()
        return super().run_batch(feeds_list)

    def run(self, feeds):
        self._wait()
        return super().run(feeds)

    def _wait(self) -> None:
        self.started.append(time.monotonic())
        self.gate.wait(10)


def test_requests_that_waited_their_batch_wait_timeout_go_at_once():
    """As Triton's max_queue delay: the wait counts from the oldest request's arrival, so a
    request that queued while the last batch ran does not wait the timeout again."""
    async def main() -> None:
        runner = GatedRunner()
        engine = Engine(runner, name="gated", batch_wait_timeout_s=1.0, max_batch_size=2)
        first = [asyncio.ensure_future(engine.infer(instance(2, k))) for k in range(2)]  # a full batch: at once
        while not runner.started:
            await asyncio.sleep(0.01)
        second = asyncio.ensure_future(engine.infer(instance(3, 2)))  # alone in the queue, waits on the gate
        await asyncio.sleep(1.2)
        opened = time.monotonic()
        runner.gate.set()
        await asyncio.gather(*first, second)
        assert len(runner.started) == 2 and runner.started[1] - opened < 0.5  # not the timeout again
        await engine.close()

    asyncio.run(main())


async def scaled_program(feeds):
    """A program that needs a value mid-way: it fails when its input sums past a bound."""
    x = current_batch().constant(feeds["x"])
    total = await ops.reduce_sum(ops.tanh(x))
    if float(total) > 100:
        raise ValueError("too large")
    return {"total": total, "doubled": await (x * 2.0)}


def test_engine_serves_a_program_and_its_failures_stay_alone():
    engine = Engine(ProgramRunner(scaled_program), name="program", batch_wait_timeout_s=0.05)
    sizes = [2, 5, 3, 500]  # the last sums past the bound
    xs = [np.ones(n, np.float32) for n in sizes]
    try:
        with ThreadPoolExecutor(len(xs)) as pool:
            futures = [pool.submit(engine.infer_sync, {"x": x}) for x in xs]
            for x, future in zip(xs[:-1], futures):
                np.testing.assert_allclose(future.result()["doubled"], 2 * x)
                np.testing.assert_allclose(future.result()["total"], np.tanh(1.0) * len(x), rtol=1e-5)
            with pytest.raises(InferenceFailed, match="too large"):
                futures[-1].result()
    finally:
        engine.shutdown()


def test_tritonclient_repository_config_and_statistics(server):
    """tritonclient's own calls: they failed with 'Parse error' on plain-text 404s."""
    httpclient = pytest.importorskip("tritonclient.http")
    client = httpclient.InferenceServerClient(url=server.url.removeprefix("http://"))
    try:
        index = client.get_model_repository_index()
        assert {entry["name"] for entry in index} >= {"tagger", "lstm"} and index[0]["state"] == "READY"
        config = client.get_model_config("tagger")
        assert config["input"][0] == {"name": "x", "data_type": "TYPE_FP32", "dims": [-1, 4]}
        assert config["max_batch_size"] == 32 and config["dynamic_batching"]["max_queue_delay_microseconds"] == 50_000
        feeds = instance(3, 5)
        inputs = []
        for name, value in feeds.items():
            tensor = httpclient.InferInput(name, list(value.shape), "FP32")
            tensor.set_data_from_numpy(value)
            inputs.append(tensor)
        before = client.get_inference_statistics("tagger")["model_stats"][0]
        client.infer("tagger", inputs)
        stats = client.get_inference_statistics("tagger")["model_stats"][0]
        assert stats["name"] == "tagger" and stats["inference_count"] == before["inference_count"] + 1
        assert stats["inference_stats"]["success"]["ns"] > before["inference_stats"]["success"]["ns"]
        assert stats["execution_count"] >= 1 and stats["batch_stats"][0]["compute_infer"]["count"] >= 1
        every = client.get_inference_statistics()["model_stats"]
        assert {s["name"] for s in every} >= {"tagger", "lstm", "faulty"}
        with pytest.raises(Exception, match="unknown model 'nope'"):
            client.get_model_config("nope")
    finally:
        client.close()


def test_unknown_routes_and_methods_answer_json(server):
    for method, path, status in (("GET", "/v2/nothing/here", 404), ("GET", "/v2/models/tagger/infer", 405)):
        got, _, body = request(server, method, path)
        assert got == status and body["error"].endswith(path), body


@pytest.mark.parametrize("data, datatype", [([2**40 + 5], "INT32"), ([-1], "UINT8"), ([1e6], "FP16"), ([1.5], "INT64")])
def test_a_value_its_datatype_cannot_hold_is_refused_not_changed(data, datatype):
    """2**40 + 5 sent as INT32 arrived as 5, -1 as UINT8 as 255, 1e6 as FP16 as inf."""
    from autobatch.serving.protocol import decode_request

    body = json.dumps({"inputs": [{"name": "x", "shape": [1], "datatype": datatype, "data": data}]}).encode()
    with pytest.raises(BadRequest, match="does not fit"):
        decode_request(body)
