"""The uvicorn lifecycle of `mlmkit serve`: the listening socket, a header timeout for slow clients,
and draining on shutdown. No torch.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from mlmkit.args import ServeArgs
from mlmkit.errors import ConfigError
from mlmkit.infer.serve.app import api_keys, create_app
from mlmkit.infer.serve.queue import load_models

log = logging.getLogger("mlmkit")


def serve(args: ServeArgs) -> None:
    """Load the bundles and serve them until SIGTERM or Ctrl-C (the endpoints: app.py's docstring)."""
    try:
        import orjson  # noqa: F401
        import uvicorn
    except ImportError:
        raise ConfigError("`mlmkit serve` needs FastAPI, uvicorn and orjson", "pip install 'mlmkit[serve]'") from None
    keys = api_keys(args)  # before the models load: a bad key, or a busy port, is one line at once
    sock = listen(args.host, args.port)
    try:
        models = load_models(args)
    except BaseException:
        sock.close()
        raise
    app = create_app(models, args, keys)
    tls = {"ssl_keyfile": str(args.ssl_keyfile), "ssl_certfile": str(args.ssl_certfile)} if args.ssl_keyfile else {}
    config = uvicorn.Config(app, host=args.host, port=args.port, access_log=args.access_log, log_level="info",
                            timeout_graceful_shutdown=args.drain_seconds, log_config=None,
                            timeout_keep_alive=args.timeout_keep_alive, h11_max_incomplete_event_size=HEADER_BYTES,
                            limit_concurrency=max_connections(args), http=header_timeout_protocol(args.header_timeout),
                            **tls)
    server = _draining_server(config, app.state.mlmkit, args.drain_seconds)
    ours = logging.getLogger("mlmkit")
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):  # uvicorn's lines go where mlmkit's go
        logging.getLogger(name).handlers[:] = ours.handlers
        logging.getLogger(name).setLevel(ours.level)
        logging.getLogger(name).propagate = False
    log.info("serving %s on %s://%s:%d (GET /docs for the API)", ", ".join(models), "https" if tls else "http",
             args.host, args.port)
    server.run(sockets=[sock])


HEADER_BYTES = 64 * 1024
"""Largest request head (request line and headers) a client may send; more is a 431 and the
connection closed (h11 has the limit built in, httptools does not: the protocol below counts)."""


def max_connections(args: ServeArgs) -> int:
    """--max-connections, or the open-file limit less 64 (the models', logs' and sockets' own files),
    at most 4096: past it a connection is answered 503 and closed, never an accept() that fails for
    want of a file descriptor."""
    if args.max_connections:
        return args.max_connections
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        soft = 1024
    return max(16, min(4096, (soft if soft > 0 else 4096 + 64) - 64))


def header_timeout_protocol(seconds: float) -> type:
    """uvicorn's HTTP protocol (httptools when installed, else h11) closing a connection whose client
    takes more than ``seconds`` to send a request's head: on a new connection, and when the next
    request on a kept-alive one begins. uvicorn's own keep-alive timeout covers idle connections."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as base
    except ImportError:
        from uvicorn.protocols.http.h11_impl import H11Protocol as base

    class HeadTimeout(base):  # type: ignore[misc, valid-type]
        _timer: Any = None
        _armed_for: Any = None
        _head: int | None = None  # bytes of the request head so far; None once it is complete
        _tail = b""  # the last bytes read of it

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
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
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._head, self._tail = 0, b""
            self._armed_for = self.cycle
            self._timer = self.loop.call_later(seconds, self._expire)

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _expire(self) -> None:
            self._timer = None
            if self.cycle is self._armed_for and not self.transport.is_closing():
                log.debug("closing a connection that sent no complete request head in %.0f s", seconds)
                self.transport.close()

    return HeadTimeout


def listen(host: str, port: int) -> Any:
    """A listening socket on ``host``:``port``, or one line saying why there is none (exit 2)."""
    import errno
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise ConfigError(f"--port {port}: {host}:{port} is already in use (another server?)",
                              "choose another --port, or stop what listens there") from None
        if e.errno in (errno.EACCES, errno.EPERM):
            raise ConfigError(f"--port {port}: not permitted to listen on {host}:{port}", "use a port above 1023") from None
        raise ConfigError(f"--host {host} --port {port}: cannot listen there ({e.strerror})", "check the address") from None
    sock.set_inheritable(True)
    return sock


def _draining_server(config: Any, state: dict[str, Any], drain: float) -> Any:
    """uvicorn's server, draining first: on the first signal new requests get 503 and those in flight
    finish (up to ``drain`` seconds), then uvicorn's own shutdown; a second signal stops it at once."""
    import uvicorn

    class DrainingServer(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            if state["draining"]:
                self.should_exit = self.force_exit = True
                return
            state["draining"] = True
            log.info("shutting down: new requests get 503; %d in flight may finish", state["in_flight"])
            threading.Thread(target=self._drain, daemon=True).start()

        def _drain(self) -> None:
            deadline = time.monotonic() + drain
            while state["in_flight"] > 0 and time.monotonic() < deadline:
                time.sleep(0.02)
            self.should_exit = True

    return DrainingServer(config)
