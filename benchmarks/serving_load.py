"""Load on the serving layer: many concurrent clients sending requests of varied sizes to
``autobatch serve`` on loopback, batched versus the same server with batching off.

    python -m benchmarks.serving_load [--requests 600] [--clients 32] [--time-limit 60] [--model pooled]

The model (``--model pooled``) is one instance of a pooled encoder: ``x: float[N, 128]`` (N, the
length, differs per request, so concurrent requests have different graphs) -> MatMul, Tanh ->
mean over N -> a 512-2048-512 MLP -> scores. ``--model lstm`` (or ``bert``, any of
``benchmarks.exports``) serves that model as PyTorch or Hugging Face export it for one text
(``ids: int64[1, N]``, N lognormal, median 17, 5..60; width ``--size``); ``bert-mask`` (any
``-mask``) as exported with its attention mask, so that a request sends ``ids`` and ``mask``, as
a tokenizer gives them. The server runs in its
own process; the clients are threads here, each on a keep-alive connection, sending Triton's
binary tensors. Every response is checked against ``InferenceSession.run`` of that instance
alone: none may be lost or differ. ``--warm-every-length`` sends one request of each length and six
a client before timing (a server's steady state: a batched server types the model once for each
length new to it, and measures both ways of running a batch in its first batches).
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from autobatch import arguments
from autobatch import InferenceSession
from autobatch.ir.onnx_io import choose_ir_version

D, E, H, SCORES = 128, 512, 2048, 16
WARM_ROUNDS = 6  # requests a client before timing a steady state: some ten batches


def build_model(seed: int = 0) -> onnx.ModelProto:
    model = onnx.parser.parse_model(f"""
    <ir_version: 9, opset_import: ["" : 18]>
    pooled (float[N, {D}] x) => (float[{SCORES}] scores) <float[{D}, {E}] Emb, float[{E}, {H}] W1, float[{H}, {E}] W2,
                                                         float[{E}, {SCORES}] O, int64[1] axis = {{0}}> {{
        e = MatMul(x, Emb)
        t = Tanh(e)
        pooled = ReduceMean<keepdims=0>(t, axis)
        h = MatMul(pooled, W1)
        r = Relu(h)
        h2 = MatMul(r, W2)
        t2 = Tanh(h2)
        scores = MatMul(t2, O)
    }}""")
    rng = np.random.default_rng(seed)
    for name, shape in (("Emb", (D, E)), ("W1", (E, H)), ("W2", (H, E)), ("O", (E, SCORES))):
        weight = (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)
        model.graph.initializer.append(onnx.numpy_helper.from_array(weight, name))
    model.ir_version = choose_ir_version(model, None)
    onnx.checker.check_model(model)
    return model


@dataclass(frozen=True)
class Served:
    """The model a server loads: its name (the file's), its input and output names."""

    name: str
    inputs: tuple[str, ...]
    output: str


POOLED = Served("pooled", ("x",), "scores")
DATATYPES = {np.dtype(np.float32): "FP32", np.dtype(np.int64): "INT64"}


def binary_request(feeds: dict[str, np.ndarray], served: Served = POOLED) -> tuple[bytes, dict[str, str]]:
    """A v2 request with the inputs and the output as raw bytes (Triton's binary extension: the
    inputs' bytes one after the other, in the header's order)."""
    raws = [feeds[name].tobytes() for name in served.inputs]
    header = json.dumps({"inputs": [{"name": name, "shape": list(feeds[name].shape),
                                     "datatype": DATATYPES[feeds[name].dtype],
                                     "parameters": {"binary_data_size": len(raw)}}
                                    for name, raw in zip(served.inputs, raws)],
                         "outputs": [{"name": served.output, "parameters": {"binary_data": True}}]}).encode()
    return header + b"".join(raws), {"Inference-Header-Content-Length": str(len(header)), "Content-Type": "application/octet-stream"}


def read_scores(body: bytes, header_length: int) -> np.ndarray:
    header = json.loads(body[:header_length])
    [out] = header["outputs"]
    return np.frombuffer(body[header_length:], np.float32).reshape(out["shape"])


@dataclass
class Result:
    latencies: list[float] = field(default_factory=list)
    ok: int = 0
    mismatched: int = 0
    failed: list[str] = field(default_factory=list)
    seconds: float = 0.0


def drive(port: int, xs: list[dict[str, np.ndarray]], expected: list[np.ndarray], clients: int, time_limit: float,
          served: Served = POOLED) -> Result:
    """``clients`` threads send every request once (or until the time limit); every answer is checked."""
    result, lock, cursor = Result(), threading.Lock(), iter(range(len(xs)))
    deadline = time.monotonic() + time_limit

    def client() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        while time.monotonic() < deadline:
            with lock:
                k = next(cursor, None)
            if k is None:
                break
            body, headers = binary_request(xs[k], served)
            start = time.perf_counter()
            try:
                connection.request("POST", f"/v2/models/{served.name}/infer", body, headers)
                response = connection.getresponse()
                data = response.read()
            except OSError as error:
                with lock:
                    result.failed.append(f"request {k}: {error}")
                connection.close()
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                continue
            latency = time.perf_counter() - start
            with lock:
                if response.status != 200:
                    result.failed.append(f"request {k}: {response.status} {data[:200]!r}")
                    continue
                got = read_scores(data, int(response.getheader("Inference-Header-Content-Length")))
                result.latencies.append(latency)
                if got.shape == expected[k].shape and np.allclose(got, expected[k], rtol=1e-4, atol=1e-5):
                    result.ok += 1
                else:
                    result.mismatched += 1
        connection.close()

    threads = [threading.Thread(target=client) for _ in range(clients)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    result.seconds = time.perf_counter() - start
    return result


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def get(port: int, path: str) -> tuple[int, str]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


def run_server(model_path: str, flags: list[str], args: argparse.Namespace, xs, expected,
               served: Served = POOLED) -> tuple[Result, float, float]:
    """Start ``autobatch serve`` with ``flags``, drive it, read the mean batch size and the
    instances the server chose to run alone from /metrics, stop it."""
    port = free_port()
    command = [sys.executable, "-m", "autobatch", "serve", model_path, "--port", str(port),
               "--backend", args.backend, "--max-batch-size", str(args.max_batch_size),
               "--batch-wait-timeout-s", str(args.batch_wait_timeout_s), "--max-queue", str(4 * args.clients),
               "--instances", str(args.instances), "--http", args.http]
    command += flags + (["--threads", str(args.threads)] if args.threads else [])
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if get(port, "/v2/health/ready")[0] == 200:
                    break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start: {process.stderr.read() if process.stderr else ''}")
            time.sleep(0.1)
        warm = list(range(args.clients))
        if args.warm_every_length:  # a server's steady state: each length the run sends seen, and both
            # ways of running a batch measured (``autobatch.ways``: its first batches try each)
            shapes = {tuple(value.shape for value in x.values()): k for k, x in enumerate(xs)}
            warm = list(range(min(len(xs), WARM_ROUNDS * args.clients))) + list(shapes.values())
        drive(port, [xs[k] for k in warm], [expected[k] for k in warm], args.clients, args.time_limit, served)
        result = drive(port, xs, expected, args.clients, args.time_limit, served)
        text = get(port, "/metrics")[1]
        total = float(re.search(rf'^autobatch_batch_size_sum\{{model="{served.name}"\}} (\S+)', text, re.M).group(1))
        count = float(re.search(rf'^autobatch_batch_size_count\{{model="{served.name}"\}} (\S+)', text, re.M).group(1))
        alone = float(re.search(rf'^autobatch_instances_alone_total\{{model="{served.name}"\}} (\S+)', text, re.M).group(1))
        return result, total / max(count, 1), alone / max(total, 1)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def main(argv: list[str] | None = None) -> int:
    parser = arguments.parser("python -m benchmarks.serving_load", __doc__.splitlines()[0])
    parser.add_argument("--requests", type=arguments.integer(1), default=600)
    parser.add_argument("--clients", type=arguments.integer(1), default=32)
    parser.add_argument("--max-length", type=arguments.integer(1), default=32, help="lengths N are drawn from 1..max-length")
    parser.add_argument("--time-limit", type=float, default=60.0, help="seconds per server, at most")
    parser.add_argument("--max-batch-size", type=arguments.integer(1), default=32)
    parser.add_argument("--batch-wait-timeout-s", type=float, default=0.002)
    parser.add_argument("--backend", choices=["numpy", "onnxruntime"], default="numpy")
    parser.add_argument("--model", default="pooled", help="pooled, or one of benchmarks.exports' models (lstm, bert, ...)")
    parser.add_argument("--size", type=arguments.integer(1), default=256, help="an exported model's width")
    parser.add_argument("--instances", type=arguments.integer(1), default=1,
                        help="sessions of the model in every server (``autobatch serve --instances``)")
    parser.add_argument("--threads", type=arguments.integer(1),
                        help="onnxruntime's intra-op threads in every server's session (``autobatch serve --threads``)")
    parser.add_argument("--http", choices=["auto", "h11", "httptools"], default="auto",
                        help="every server's HTTP/1.1 parser (``autobatch serve --http``)")
    parser.add_argument("--worker", choices=["process", "thread"],
                        help="where the batching servers run the model (default: the server's own, a thread); "
                             "batching off runs it in a thread")
    parser.add_argument("--warm-every-length", action="store_true",
                        help="before timing, send one request of each length the run sends and six a client (a "
                             "server's steady state: a batched server types the model once for each length new to "
                             "it, and measures both ways of running a batch in its first batches)")
    args = parser.parse_args(argv)

    rng = np.random.default_rng(1)
    with tempfile.TemporaryDirectory() as folder:
        path = str(Path(folder) / f"{args.model}.onnx")
        if args.model == "pooled":
            served = POOLED
            onnx.save(build_model(), path)
            lengths = rng.integers(1, args.max_length + 1, args.requests)
            xs = [{"x": rng.standard_normal((int(n), D)).astype(np.float32)} for n in lengths]
        else:
            from benchmarks import export_files as exports
            from benchmarks.exported_models import lengths as lognormal, texts

            if args.model not in exports.MODELS:
                parser.error(f"unknown model {args.model!r}: pooled, or one of {', '.join(exports.MODELS)}")
            path = str(exports.exported(args.model, args.size, Path(folder))[0])
            masked = args.model.endswith(exports.MASKED)  # a request: its ids, and its attention mask
            served = Served(Path(path).stem, ("ids", "mask") if masked else ("ids",), "y")
            lengths = np.array(lognormal(args.requests, rng))
            xs = texts(lengths.tolist(), rng, masked)
        session = InferenceSession(path)
        expected = [session.run(None, x)[0] for x in xs]
        print(f"{args.requests} requests to {args.model}, lengths {lengths.min()}..{lengths.max()} "
              f"({len(set(lengths.tolist()))} distinct), {args.clients} concurrent clients, backend {args.backend}, "
              f"max batch {args.max_batch_size}, wait {args.batch_wait_timeout_s * 1e3:g} ms, {args.instances} instance(s), "
              f"onnxruntime threads {args.threads or 'the default'}, batching servers' worker: {args.worker or 'thread (the default)'}, HTTP parser {args.http}")
        print(f"{'server':<16}{'requests/s':>11}{'p50 ms':>9}{'p99 ms':>9}{'mean batch':>12}{'alone':>7}"
              f"{'ok':>6}{'lost':>6}{'wrong':>7}")
        lost_or_wrong = 0
        # "batching on" is the default: each batch batched, or its requests run each alone
        # where the server measured that faster (``autobatch.ways``; "alone": the share of them).
        worker = ["--worker", args.worker] if args.worker else []
        for label, flags in (("batching on", worker), ("always batched", ["--always-batched", *worker]),
                             ("batching off", ["--no-batching"])):
            result, mean_batch, alone = run_server(path, flags, args, xs, expected, served)
            lost = args.requests - result.ok - result.mismatched
            lost_or_wrong += lost + result.mismatched
            p50, p99 = (np.percentile(result.latencies, q) * 1e3 for q in (50, 99)) if result.latencies else (0, 0)
            print(f"{label:<16}{result.ok / result.seconds:>11.1f}{p50:>9.1f}{p99:>9.1f}{mean_batch:>12.1f}"
                  f"{alone:>7.0%}{result.ok:>6}{lost:>6}{result.mismatched:>7}")
            for line in result.failed[:5]:
                print(f"  failed: {line}")
    return 1 if lost_or_wrong else 0


if __name__ == "__main__":
    sys.exit(main())
