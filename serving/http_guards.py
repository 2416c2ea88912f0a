"""uvicorn's HTTP/1.1 protocols with the limits they lack, for ``serving.server``.

Both protocols close a connection past ``max_connections`` at once, and one that has not sent a
whole request head within ``head_timeout_s`` of its start (or of its last response: a body that
still comes after its request was answered, say with 404, counts for nothing), so that clients
sending heads or unread bodies a byte at a time (slowloris) cannot hold sockets. (uvicorn's
``limit_concurrency`` answers 503 to requests past a count, but only once their heads have
arrived, and its ``timeout_keep_alive`` starts only after a first response.) The httptools one,
taken where httptools is installed (its parser is in C: a request costs the event loop less
than h11's; see benchmarks/SERVING.md), also caps a head's size, as h11 does by itself
(``MAX_HEAD_BYTES``): a head sent fast but without end would otherwise grow without bound.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

try:
    import httptools
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # the h11 protocol serves alone
    httptools = None

HEAD_TIMEOUT_S = 10.0  # from a connection's start (or its last response) to a whole request head
MAX_CONNECTIONS = 1024
MAX_HEAD_BYTES = 16 * 1024  # h11's own limit (uvicorn's h11_max_incomplete_event_size)
PROTOCOLS = ("h11", "httptools")

_REFUSED = itertools.count(1)


class _Guarded:
    """The limits, over either protocol (a mixin before it): ``_head_pending`` says whether a
    request head is still awaited."""

    head_timeout_s = HEAD_TIMEOUT_S
    max_connections = MAX_CONNECTIONS
    transport: asyncio.Transport
    connections: set[Any]
    loop: asyncio.AbstractEventLoop
    logger: Any

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)  # type: ignore[misc]
        self._head_timer: asyncio.TimerHandle | None = None
        if len(self.connections) > self.max_connections:
            refused = next(_REFUSED)
            if refused & (refused - 1) == 0:  # the 1st, 2nd, 4th, 8th...: a flood is not a flood of lines
                self.logger.warning("%d connections refused so far: %d open, the limit is %d", refused,
                                    len(self.connections), self.max_connections)
            transport.close()
            return
        self._wait_for_head()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        if not self.transport.is_closing():
            self._wait_for_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._head_arrived()
        super().connection_lost(exc)  # type: ignore[misc]

    def _wait_for_head(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_too_slow)

    def _head_arrived(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_too_slow(self) -> None:
        self._head_timer = None
        if self._head_pending() and not self.transport.is_closing():
            self.transport.close()

    def _head_pending(self) -> bool:
        raise NotImplementedError


class GuardedH11Protocol(_Guarded, H11Protocol):
    """h11's: a head has arrived once the connection's peer is no longer idle, and a request is
    in flight until its response is done."""

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._head_pending():
            if self._head_timer is None:
                self._wait_for_head()
        else:
            self._head_arrived()

    def _head_pending(self) -> bool:  # (answered while its body still comes: no request in flight)
        return self.conn.their_state is h11.IDLE or self.conn.our_state is h11.DONE


if httptools is not None:
    class GuardedHttpToolsProtocol(_Guarded, HttpToolsProtocol):
        """httptools': a head has arrived at its parser's ``on_headers_complete``; a request
        is in flight until its response is complete (a pipelined one's head came earlier). Its
        parser calls a header back only once it is whole, and keeps a header that never ends to
        itself, so a head's size is counted two ways, each at most the head's: its url and
        headers as they complete, and the chunks read wholly within one head."""

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            self._in_head, self._parsed, self._head_bytes, self._chunk_bytes = True, 0, 0, 0
            super().connection_made(transport)

        def data_received(self, data: bytes) -> None:
            before = (self._in_head, self._parsed)  # in a head, and none began or ended in this chunk
            super().data_received(data)
            if self._in_head and (self._in_head, self._parsed) == before:
                self._chunk_bytes += len(data)
                if self._chunk_bytes > MAX_HEAD_BYTES and not self.transport.is_closing():
                    self.send_400_response(f"a request head past {MAX_HEAD_BYTES} bytes")

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._head_bytes = 0

        def on_url(self, url: bytes) -> None:
            self._count(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._count(len(name) + len(value) + 4)  # ": " and the line's end
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._head_arrived()
            self._in_head, self._parsed = False, self._parsed + 1
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._in_head, self._parsed, self._chunk_bytes = True, self._parsed + 1, 0  # the next head's

        def _count(self, size: int) -> None:
            """Raised in a parser callback, the error fails the parse: uvicorn answers 400 and
            closes, as it does for h11's head past its limit."""
            self._head_bytes += size
            if self._head_bytes > MAX_HEAD_BYTES:
                raise ValueError(f"a request head past {MAX_HEAD_BYTES} bytes")

        def _head_pending(self) -> bool:
            return self.cycle is None or self.cycle.response_complete


def guarded_protocol(head_timeout_s: float = HEAD_TIMEOUT_S, max_connections: int = MAX_CONNECTIONS,
                     http: str = "auto") -> type[asyncio.Protocol]:
    """The protocol class to give uvicorn: ``http`` "h11", "httptools", or "auto" (httptools
    where installed, as uvicorn's own "auto")."""
    if http not in ("auto", *PROTOCOLS):
        raise ValueError(f"http must be auto, h11 or httptools, not {http!r}")
    if http == "httptools" and httptools is None:
        raise ValueError("http 'httptools' needs httptools: pip install httptools")
    base: type[_Guarded] = GuardedH11Protocol if http == "h11" or httptools is None else GuardedHttpToolsProtocol
    return type(base.__name__, (base,), {"head_timeout_s": head_timeout_s, "max_connections": max_connections})
