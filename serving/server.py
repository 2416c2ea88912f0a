"""The Open Inference Protocol v2 HTTP server (KServe v2 / Triton HTTP): a Starlette app
over a ``ModelRegistry``, run by uvicorn.

Routes: ``GET /v2``, ``/v2/health/live``, ``/v2/health/ready``, ``/v2/models/{name}``
(metadata), ``/v2/models/{name}/ready``, ``/config`` and ``/stats`` (Triton's model
configuration and statistics extensions), ``POST /v2/models/{name}/infer`` (each also under
``/versions/{version}``, which is ignored), ``/v2/repository/index`` and ``GET /metrics``
(Prometheus text). Errors on every route, unknown ones too, are ``{"error": "..."}`` with the
status of the ``ServingError``. Shutdown is graceful:
uvicorn stops accepting and lets open requests finish, then every engine drains its queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from types import FrameType
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from autobatch.serving.engine import ModelRegistry
from autobatch.serving.errors import BodyTimeout, PayloadTooLarge, ServingError
from autobatch.serving.http_guards import HEAD_TIMEOUT_S, MAX_CONNECTIONS, guarded_protocol
from autobatch.serving.protocol import HEADER_LENGTH, decode_request, encode_response

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
BODY_TIMEOUT_S = 30.0  # to read a request's whole body
DRAIN_S = 1.0  # after SIGTERM, how long new requests still get an answer (503) before the server stops
Handler = Callable[[Request], Awaitable[Response]]


def create_app(registry: ModelRegistry, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
               body_timeout_s: float = BODY_TIMEOUT_S) -> Starlette:
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

    async def repository_index(request: Request) -> Response:
        return JSONResponse([{"name": name, "version": "1", "state": "READY" if engine.ready else "UNAVAILABLE"}
                             for name, engine in sorted(registry.engines.items())])

    async def model_config(request: Request) -> Response:
        engine = registry.get(request.path_params["name"])
        return JSONResponse({
            "name": engine.name, "platform": "autobatch", "backend": "autobatch",
            "max_batch_size": engine.max_batch_size if engine.batching else 0,
            "input": [_config_tensor(spec) for spec in engine.runner.inputs],
            "output": [_config_tensor(spec) for spec in engine.runner.outputs],
            "dynamic_batching": {"max_queue_delay_microseconds": int(engine.batch_wait_timeout_s * 1e6)}
            if engine.batching else {},
        })

    async def model_stats(request: Request) -> Response:
        name = request.path_params.get("name")
        engines = [registry.get(name)] if name is not None else [registry.engines[n] for n in sorted(registry.engines)]
        return JSONResponse({"model_stats": [engine.metrics.stats_json(engine.name) for engine in engines]})

    async def model_ready(request: Request) -> Response:
        engine = registry.get(request.path_params["name"])
        return JSONResponse({"name": engine.name, "ready": engine.ready}, status_code=200 if engine.ready else 503)

    async def infer(request: Request) -> Response:
        engine = registry.get(request.path_params["name"])
        body = await _read_body(request, max_body_bytes, body_timeout_s)
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
              Route("/v2/repository/index", _errors_as_json(repository_index), methods=["GET", "POST"]),
              Route("/v2/models/stats", _errors_as_json(model_stats)),  # before /v2/models/{name}
              Route("/metrics", _errors_as_json(metrics))]
    for prefix in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
        routes += [Route(prefix, _errors_as_json(model_metadata)),
                   Route(prefix + "/ready", _errors_as_json(model_ready)),
                   Route(prefix + "/config", _errors_as_json(model_config)),
                   Route(prefix + "/stats", _errors_as_json(model_stats)),
                   Route(prefix + "/infer", _errors_as_json(infer), methods=["POST"])]
    async def http_error(request: Request, error: Exception) -> Response:  # unknown routes, wrong methods
        assert isinstance(error, HTTPException)
        return JSONResponse({"error": f"{error.detail}: {request.method} {request.url.path}"},
                            status_code=error.status_code, headers=error.headers)

    return Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: http_error})


def _config_tensor(spec: Any) -> dict[str, Any]:
    """An input or output as Triton's model configuration names it (``TYPE_FP32``, dims)."""
    datatype = {"FP16": "TYPE_FP16", "FP32": "TYPE_FP32", "FP64": "TYPE_FP64", "BYTES": "TYPE_STRING"}.get(
        spec.datatype, f"TYPE_{spec.datatype}")
    return {"name": spec.name, "data_type": datatype, "dims": spec.shape}


def _errors_as_json(handler: Handler) -> Handler:
    async def wrapped(request: Request) -> Response:
        try:
            return await handler(request)
        except ServingError as error:
            return JSONResponse({"error": str(error)}, status_code=error.status, headers=error.headers)
        except Exception as error:  # never a stack trace to the client; the message is enough
            return JSONResponse({"error": f"internal error: {type(error).__name__}: {error}"}, status_code=500)

    return wrapped


async def _read_body(request: Request, limit: int, timeout_s: float) -> bytes:
    """The body, refused as soon as it is known to exceed ``limit`` bytes, or to take longer
    than ``timeout_s`` to arrive (a client trickling it in would hold a connection forever)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"the body of {declared} bytes exceeds the limit of {limit}")
    chunks, size = [], 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise PayloadTooLarge(f"the body exceeds the limit of {limit} bytes")
                chunks.append(chunk)
    except TimeoutError:
        raise BodyTimeout(f"the body did not arrive within {timeout_s} s ({size} bytes read)") from None
    return b"".join(chunks)


class DrainingServer(uvicorn.Server):
    """On SIGTERM or SIGINT: readiness goes false and every engine refuses new requests with
    503 while it answers what is queued and running; ``drain_s`` later the server stops, and
    the process exits 0 (uvicorn would re-raise the signal it caught, ending the process by it,
    so the signal is not recorded for that). A second signal stops at once."""

    def __init__(self, config: uvicorn.Config, registry: ModelRegistry, drain_s: float = DRAIN_S) -> None:
        super().__init__(config)
        self.registry = registry
        self.drain_s = drain_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain: asyncio.Task[None] | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._drain is not None or self._loop is None:
            self.should_exit = self.force_exit = True
            return
        self._loop.call_soon_threadsafe(self._start_draining)

    def _start_draining(self) -> None:
        if self._drain is None:
            self._drain = asyncio.get_running_loop().create_task(self._drained())

    async def _drained(self) -> None:
        try:
            await self.registry.close()
            await asyncio.sleep(self.drain_s)
        finally:
            self.should_exit = True


@dataclass(frozen=True)
class Limits:
    """What a client cannot push past, besides the engines' queues and request timeouts."""

    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    body_timeout_s: float = BODY_TIMEOUT_S
    head_timeout_s: float = HEAD_TIMEOUT_S
    max_connections: int = MAX_CONNECTIONS
    http: str = "auto"  # the HTTP/1.1 parser: h11, httptools, or auto (httptools where installed)


def _config(registry: ModelRegistry, limits: Limits, log_level: str, access_log: bool = False,
            **uvicorn_options: Any) -> uvicorn.Config:
    return uvicorn.Config(create_app(registry, limits.max_body_bytes, limits.body_timeout_s), log_level=log_level,
                          access_log=access_log,
                          lifespan="on", http=guarded_protocol(limits.head_timeout_s, limits.max_connections, limits.http),
                          **uvicorn_options)


def serve(registry: ModelRegistry, host: str = "127.0.0.1", port: int = 8000, limits: Limits = Limits(),
          log_level: str = "info", drain_s: float = DRAIN_S, access_log: bool = False) -> None:
    """Serve until SIGINT/SIGTERM, then drain (``DrainingServer``) and return. ``access_log``:
    a line a request (off: under load it is most of what a server prints)."""
    logging.getLogger("autobatch").setLevel(log_level.upper())
    DrainingServer(_config(registry, limits, log_level, access_log, host=host, port=port), registry, drain_s).run()


@dataclass
class RunningServer:
    url: str
    port: int
    server: uvicorn.Server


@contextlib.contextmanager
def serve_in_thread(registry: ModelRegistry, host: str = "127.0.0.1", port: int = 0, limits: Limits = Limits(),
                    log_level: str = "warning", start_timeout_s: float = 10.0) -> Iterator[RunningServer]:
    """A server in a background thread (tests, benchmarks, notebooks); port 0 picks a free
    one. Leaving the block shuts it down gracefully and joins the thread."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    server = uvicorn.Server(_config(registry, limits, log_level))
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
