"""The Open Inference Protocol v2 HTTP server (KServe v2 / Triton HTTP): a Starlette app
over a ``ModelRegistry``, run by uvicorn.

Routes: ``GET /v2``, ``/v2/health/live``, ``/v2/health/ready``, ``/v2/models/{name}``
(metadata), ``/v2/models/{name}/ready``, ``POST /v2/models/{name}/infer`` (each also under
``/versions/{version}``, which is ignored) and ``GET /metrics`` (Prometheus text). Errors
are ``{"error": "..."}`` with the status of the ``ServingError``. Shutdown is graceful:
uvicorn stops accepting and lets open requests finish, then every engine drains its queue.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from autobatch.serving.engine import ModelRegistry
from autobatch.serving.errors import PayloadTooLarge, ServingError
from autobatch.serving.protocol import HEADER_LENGTH, decode_request, encode_response

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
Handler = Callable[[Request], Awaitable[Response]]


def create_app(registry: ModelRegistry, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> Starlette:
    """The ASGI application; its lifespan starts the engines and drains them at shutdown."""

    async def server_metadata(request: Request) -> Response:
        from autobatch import __version__

        return JSONResponse({"name": "autobatch", "version": __version__, "extensions": ["binary_tensor_data"]})

    async def live(request: Request) -> Response:
        return JSONResponse({"live": True})

    async def ready(request: Request) -> Response:
        is_ready = all(engine.ready for engine in registry.engines.values())
        return JSONResponse({"ready": is_ready}, status_code=200 if is_ready else 503)

    async def model_metadata(request: Request) -> Response:
        engine = registry.get(request.path_params["name"])
        return JSONResponse({
            "name": engine.name, "versions": ["1"], "platform": "autobatch",
            "inputs": [spec.to_json() for spec in engine.runner.inputs],
            "outputs": [spec.to_json() for spec in engine.runner.outputs],
        })

    async def model_ready(request: Request) -> Response:
        engine = registry.get(request.path_params["name"])
        return JSONResponse({"name": engine.name, "ready": engine.ready}, status_code=200 if engine.ready else 503)

    async def infer(request: Request) -> Response:
        engine = registry.get(request.path_params["name"])
        body = await _read_body(request, max_body_bytes)
        parsed = decode_request(body, request.headers.get(HEADER_LENGTH))
        outputs = await engine.infer(parsed.feeds, parsed.outputs)
        content, headers = encode_response(engine.name, parsed, outputs)
        media = "application/octet-stream" if headers else "application/json"
        return Response(content, media_type=media, headers=headers)

    async def metrics(request: Request) -> Response:
        return PlainTextResponse(registry.metrics_text(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await registry.start()
        yield
        await registry.close()

    routes = [Route("/v2", _errors_as_json(server_metadata)),
              Route("/v2/health/live", _errors_as_json(live)),
              Route("/v2/health/ready", _errors_as_json(ready)),
              Route("/metrics", _errors_as_json(metrics))]
    for prefix in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
        routes += [Route(prefix, _errors_as_json(model_metadata)),
                   Route(prefix + "/ready", _errors_as_json(model_ready)),
                   Route(prefix + "/infer", _errors_as_json(infer), methods=["POST"])]
    return Starlette(routes=routes, lifespan=lifespan)


def _errors_as_json(handler: Handler) -> Handler:
    async def wrapped(request: Request) -> Response:
        try:
            return await handler(request)
        except ServingError as error:
            return JSONResponse({"error": str(error)}, status_code=error.status, headers=error.headers)
        except Exception as error:  # never a stack trace to the client; the message is enough
            return JSONResponse({"error": f"internal error: {type(error).__name__}: {error}"}, status_code=500)

    return wrapped


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, refused as soon as it is known to exceed ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"the body of {declared} bytes exceeds the limit of {limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"the body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _config(registry: ModelRegistry, max_body_bytes: int, log_level: str, **uvicorn_options: Any) -> uvicorn.Config:
    return uvicorn.Config(create_app(registry, max_body_bytes), log_level=log_level, lifespan="on",
                          **uvicorn_options)


def serve(registry: ModelRegistry, host: str = "127.0.0.1", port: int = 8000,
          max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, log_level: str = "info") -> None:
    """Serve until SIGINT/SIGTERM, then shut down gracefully."""
    uvicorn.Server(_config(registry, max_body_bytes, log_level, host=host, port=port)).run()


@dataclass
class RunningServer:
    url: str
    port: int
    server: uvicorn.Server


@contextlib.contextmanager
def serve_in_thread(registry: ModelRegistry, host: str = "127.0.0.1", port: int = 0,
                    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, log_level: str = "warning",
                    start_timeout_s: float = 10.0) -> Iterator[RunningServer]:
    """A server in a background thread (tests, benchmarks, notebooks); port 0 picks a free
    one. Leaving the block shuts it down gracefully and joins the thread."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    server = uvicorn.Server(_config(registry, max_body_bytes, log_level))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="autobatch-server", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + start_timeout_s
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.01)
        bound = sock.getsockname()[1]
        yield RunningServer(f"http://{host}:{bound}", bound, server)
    finally:
        server.should_exit = True
        thread.join()
        sock.close()
