"""The serving engine under Ray Serve: one deployment, several replicas, each replica with its
own ``Engine`` that batches the requests routed to it even when their graphs differ.

    pip install "ray[serve]"
    python -m autobatch.examples.ray_serve [--replicas 2] [--requests 64] [--port 8123]

Ray Serve's own ``@serve.batch`` hands a replica a list of requests and leaves batching them
to the model, which for tensors means identical shapes; here each replica's ``Engine`` does
the batching instead (``max_batch_size`` / ``batch_wait_timeout_s``, Ray Serve's names), so
instances of different lengths run as one batched plan. Requests and responses are Open
Inference Protocol v2 bodies, as for ``autobatch serve``. The demo serves a model with a
symbolic length, sends concurrent requests of different lengths over loopback, and checks
every answer against ``InferenceSession.run`` of that instance alone.
"""

from __future__ import annotations

import http.client
import json
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from autobatch import arguments

MODEL_TEXT = """
<ir_version: 9, opset_import: ["" : 18]>
tagger (float[N, 4] x, float[4] b) => (float[N, 3] y, float[N] s) <float[4,3] W = {1,2,3,4,5,6,7,8,9,10,11,12}> {
  one = Constant<value_ints=[1]>()
  xb = Add(x, b)
  h = MatMul(xb, W)
  t = Tanh(h)
  y = Softmax<axis=-1>(t)
  s = ReduceSum<keepdims=0>(y, one)
}
"""


def build_app(model: str, replicas: int = 2, max_batch_size: int = 32, batch_wait_timeout_s: float = 0.01,
              backend: str = "numpy") -> Any:
    """A Ray Serve application: ``replicas`` copies of the model, each batching its own requests."""
    from ray import serve
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response

    from autobatch.serving import Engine, ServingError
    from autobatch.serving.protocol import HEADER_LENGTH, decode_request, encode_response

    @serve.deployment(num_replicas=replicas, max_ongoing_requests=4 * max_batch_size)
    class AutobatchModel:
        def __init__(self) -> None:
            # Created inside the replica's process; bound to its event loop by the first request.
            self.engine = Engine(model, max_batch_size=max_batch_size, batch_wait_timeout_s=batch_wait_timeout_s,
                                 backend=backend)
            self.replica = serve.get_replica_context().replica_tag

        async def __call__(self, request: Request) -> Response:
            try:
                parsed = decode_request(await request.body(), request.headers.get(HEADER_LENGTH))
                outputs = await self.engine.infer(parsed.feeds, parsed.outputs)
            except ServingError as error:
                return JSONResponse({"error": str(error)}, status_code=error.status, headers=error.headers)
            content, headers = encode_response(self.engine.name, parsed, outputs)
            headers["X-Replica"] = self.replica
            return Response(content, headers=headers, media_type="application/json")

        def batch_sizes(self) -> tuple[float, int]:
            """(instances, batches) this replica ran."""
            return self.engine.metrics.batch_sizes.sum, self.engine.metrics.batch_sizes.count

    return AutobatchModel.bind()


def post(port: int, body: bytes) -> tuple[int, dict[str, Any], str]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request("POST", "/", body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, json.loads(response.read()), response.getheader("X-Replica", "")
    finally:
        connection.close()


def main(argv: list[str] | None = None) -> int:
    parser = arguments.parser("python -m autobatch.examples.ray_serve", "autobatch under Ray Serve (needs: pip install "
                              "'ray[serve]')", ["python -m autobatch.examples.ray_serve --replicas 2 --requests 64"])
    parser.add_argument("--replicas", type=arguments.integer(1), default=2, help="Ray Serve replicas of the engine")
    parser.add_argument("--requests", type=arguments.integer(1), default=64, help="concurrent requests sent")
    parser.add_argument("--port", type=arguments.integer(1, 65535), default=8123, help="Ray Serve's HTTP port")
    args = parser.parse_args(argv)
    try:
        import ray
        from ray import serve
    except ImportError:
        raise SystemExit("this example needs Ray Serve: pip install 'ray[serve]'") from None

    from autobatch import InferenceSession

    rng = np.random.default_rng(0)
    instances = [{"x": rng.standard_normal((int(n), 4)).astype(np.float32), "b": rng.standard_normal(4).astype(np.float32)}
                 for n in rng.integers(1, 9, args.requests)]
    bodies = [json.dumps({"inputs": [{"name": k, "shape": list(v.shape), "datatype": "FP32", "data": v.ravel().tolist()}
                                     for k, v in feeds.items()]}).encode() for feeds in instances]
    with tempfile.TemporaryDirectory() as folder:
        path = str(Path(folder) / "tagger.onnx")
        model = onnx.parser.parse_model(MODEL_TEXT)
        onnx.save(model, path)
        ray.init(num_cpus=max(2, args.replicas), include_dashboard=False, log_to_driver=False)
        try:
            serve.start(http_options={"host": "127.0.0.1", "port": args.port})
            handle = serve.run(build_app(path, args.replicas), name="autobatch", route_prefix="/")
            with ThreadPoolExecutor(32) as pool:
                answers = list(pool.map(lambda body: post(args.port, body), bodies))
            session = InferenceSession(model)
            wrong = 0
            for feeds, (status, body, _) in zip(instances, answers):
                expected = session.run(["y"], feeds)[0]
                got = np.asarray(body["outputs"][0]["data"], np.float32).reshape(expected.shape) if status == 200 else None
                wrong += got is None or not np.allclose(got, expected, rtol=1e-5, atol=1e-6)
            replicas = sorted({replica for _, _, replica in answers})
            sizes = [handle.batch_sizes.remote().result() for _ in range(4 * args.replicas)]
            print(f"{len(answers)} requests answered by replicas {replicas}; {wrong} wrong or failed")
            print("instances/batches seen by the replicas asked:", sorted(set(sizes)))
            return 1 if wrong else 0
        finally:
            serve.shutdown()
            ray.shutdown()


if __name__ == "__main__":
    raise SystemExit(main())
