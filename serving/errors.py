"""What can go wrong with one request, each with the HTTP status it maps to."""

from __future__ import annotations


class ServingError(Exception):
    """A request failed; ``status`` is its HTTP status, the message is the client's error text."""

    status = 500
    headers: dict[str, str] = {}


class BadRequest(ServingError):
    """The request itself is wrong (unknown input, dtype, shape, malformed body)."""

    status = 400


class ModelNotFound(ServingError):
    status = 404


class BodyTimeout(ServingError):
    """The request's body took too long to arrive: the connection is closed after the answer
    (the rest of that body would be read as the next request)."""

    status = 408
    headers = {"Connection": "close"}


class PayloadTooLarge(ServingError):
    status = 413


class QueueFull(ServingError):
    """Overload: the model's queue is full. Clients should retry after ``retry_after`` seconds."""

    status = 503

    def __init__(self, message: str, retry_after: int = 1) -> None:
        super().__init__(message)
        self.headers = {"Retry-After": str(retry_after)}


class ShuttingDown(ServingError):
    """The server is draining: retry elsewhere, on a new connection."""

    status = 503
    headers = {"Retry-After": "1", "Connection": "close"}


class RequestTimeout(ServingError):
    status = 504


class InferenceFailed(ServingError):
    """The instance itself failed to run (alone, so it was not a neighbour's fault)."""

    status = 500
