"""The uvicorn subclasses of `mlmkit serve`: the HTTP protocol with a header timeout for slow clients,
and the server that drains on shutdown. No torch.

uvicorn is imported at module level, and it is an optional extra (``pip install 'mlmkit[serve]'``):
server.serve() imports this module only once it has checked that uvicorn is installed, so a missing
extra is its one clear error, never an ImportError from here. This module never imports server.py
(the import-cycle check counts function-level imports too).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import uvicorn

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _HttpProtocol
except ImportError:  # httptools is optional for uvicorn too: its pure-Python h11 protocol then
    from uvicorn.protocols.http.h11_impl import H11Protocol as _HttpProtocol

if TYPE_CHECKING:
    from mlmkit.serve.app import ServerState

log = logging.getLogger("mlmkit")

HEADER_BYTES = 64 * 1024
"""Largest request head (request line and headers) a client may send; more is a 431 and the
connection closed (h11 has the limit built in, httptools does not: HeadTimeout counts)."""


class HeadTimeout(_HttpProtocol):
    """uvicorn's HTTP protocol (httptools when installed, else h11) closing a connection whose client
    takes more than ``header_timeout`` seconds to send a request's head: on a new connection, and when the
    next request on a kept-alive one begins. uvicorn's own keep-alive timeout covers idle connections."""

    _timer: Any = None
    _armed_for: Any = None
    _head: int | None = None  # bytes of the request head so far; None once it is complete
    _tail = b""  # the last bytes read of it

    def __init__(self, *args: Any, header_timeout: float, **kwargs: Any) -> None:
        """uvicorn's protocol, with the seconds a client has for each request head."""
        self.header_timeout = header_timeout  # before uvicorn's __init__: nothing it starts may miss it
        super().__init__(*args, **kwargs)

    def connection_made(self, transport: Any) -> None:
        """A new connection: its first request head is timed from now."""
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        """Count the request head's bytes (a 431 past HEADER_BYTES); its timer stops once it is complete."""
        if self._timer is None and (self.cycle is None or self.cycle.response_complete):
            self._arm()  # the next request's head begins
        if self._head is not None:  # its bytes up to the blank line that ends it (which two reads may split)
            seen = self._tail + data
            end = seen.find(b"\r\n\r\n")
            self._head += len(data) if end < 0 else end + 4 - len(self._tail)
            self._tail = seen[-3:]
            if self._head > HEADER_BYTES:
                self._disarm()
                self.transport.write(b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n"
                                     b"connection: close\r\n\r\n")
                self.transport.close()
                return
            if end >= 0:
                self._head = None
        super().data_received(data)
        if self._timer is not None and self.cycle is not None and self.cycle is not self._armed_for:
            self._disarm()  # its head is complete: a request cycle has begun

    def connection_lost(self, exc: Exception | None) -> None:
        """The connection is gone: its timer with it."""
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        """Start timing a request head."""
        self._head, self._tail = 0, b""
        self._armed_for = self.cycle
        self._timer = self.loop.call_later(self.header_timeout, self._expire)

    def _disarm(self) -> None:
        """Stop timing (the head is complete, or the connection closes)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        """The client took too long to send its request head: close its connection."""
        self._timer = None
        if self.cycle is self._armed_for and not self.transport.is_closing():
            log.debug("closing a connection that sent no complete request head in %.0f s",
                      self.header_timeout)
            self.transport.close()


def header_timeout_protocol(seconds: float) -> Callable[..., HeadTimeout]:
    """The protocol factory for uvicorn.Config's ``http``: HeadTimeout with ``seconds`` for each request head
    (uvicorn only calls it, with its own keyword arguments)."""
    return functools.partial(HeadTimeout, header_timeout=seconds)


class DrainingServer(uvicorn.Server):
    """uvicorn's server, draining first: on the first signal new requests get 503 and those in flight
    finish (up to ``drain`` seconds), then uvicorn's own shutdown; a second signal stops it at once."""

    def __init__(self, config: uvicorn.Config, state: ServerState, drain: float) -> None:
        """``state``: the app's {"draining", "in_flight"} (app.state.mlmkit), shared with its middleware."""
        super().__init__(config)
        self.mlmkit_state, self.drain_seconds = state, drain

    def handle_exit(self, sig: int, frame: Any) -> None:
        """The first signal starts draining; a second one stops the server at once."""
        state = self.mlmkit_state
        if state["draining"]:
            self.should_exit = self.force_exit = True
            return
        state["draining"] = True
        log.info("shutting down: new requests get 503; %d in flight may finish", state["in_flight"])
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        """Wait for the requests in flight (up to the drain seconds), then let uvicorn shut down."""
        deadline = time.monotonic() + self.drain_seconds
        while self.mlmkit_state["in_flight"] > 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        self.should_exit = True
