"""Serving: batch concurrent requests whose graphs differ, behind an Open Inference Protocol
(KServe v2 / Triton HTTP) server.

``Engine`` gathers the requests of one model from many callers into batches and hands each
caller its own outputs; ``ModelRegistry`` holds one engine per served model; ``create_app``
is the ASGI application and ``serve`` runs it with uvicorn.
"""

from autobatch.serving.engine import Engine, ModelRegistry
from autobatch.serving.errors import (
    BadRequest, BodyTimeout, InferenceFailed, ModelNotFound, PayloadTooLarge, QueueFull, RequestTimeout, ServingError,
    ShuttingDown,
)
from autobatch.serving.runners import ProgramRunner, Runner, SessionRunner, TensorSpec, load_runner

__all__ = [
    "BadRequest", "BodyTimeout", "Engine", "InferenceFailed", "ModelNotFound", "ModelRegistry", "PayloadTooLarge", "ProgramRunner",
    "QueueFull", "RequestTimeout", "Runner", "ServingError", "SessionRunner", "ShuttingDown", "TensorSpec",
    "load_runner", "Limits", "create_app", "serve", "serve_in_thread",
]


def __getattr__(name: str):  # the HTTP layer needs starlette and uvicorn: import it only when asked
    if name in ("Limits", "create_app", "serve", "serve_in_thread"):
        from autobatch.serving import server

        return getattr(server, name)
    raise AttributeError(name)
