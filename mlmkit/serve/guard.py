"""What stands around every request of `mlmkit serve` (plain ASGI): the API keys, a request id, the
503 while draining, the requests in flight, and a 500 for an exception no handler caught. No torch.
"""

from __future__ import annotations

import hmac
import logging
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, TypedDict

from mlmkit.args import ServeArgs
from mlmkit.errors import ConfigError
from mlmkit.serve.queue import Metrics

log = logging.getLogger("mlmkit")

Scope = MutableMapping[str, Any]
"""An ASGI connection scope (starlette.types.Scope)."""
Message = MutableMapping[str, Any]
"""An ASGI message (starlette.types.Message)."""
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
ErrorReply = Callable[..., ASGIApp]
"""app.py's ``_error``: an error reply (an ASGI app of its own) from its status, message, hint and
request id."""


class ServerState(TypedDict):
    """What the app, its middleware and the server share (app.state.mlmkit): whether it is draining, and
    the requests in flight."""

    draining: bool
    in_flight: int


def api_keys(args: ServeArgs) -> tuple[bytes, ...]:
    """The keys a request may present: --api-key (repeatable), else MLMKIT_API_KEY; none: no check.

    MLMKIT_API_KEY as secret stores give it: set but empty (or only spaces) refuses to start (it would
    serve everyone); spaces or a line break around the key (a secret file's last newline, a CR) are
    taken off, with a warning (kept, no client could ever send them)."""
    import os

    if args.api_key:
        return tuple(k.encode("utf-8") for k in args.api_key)
    raw = os.environ.get("MLMKIT_API_KEY")
    if raw is None:
        return ()
    key = raw.strip()
    if not key:
        raise ConfigError("MLMKIT_API_KEY is set but empty: the server would answer every client",
                          "set it to the key, or unset it to serve without keys")
    if key != raw:
        log.warning("MLMKIT_API_KEY has spaces or a line break around the key: the key without them is used")
    return (key.encode("utf-8"),)


class Guard:
    """Around every request (plain ASGI, lighter than Starlette's BaseHTTPMiddleware, which runs each
    request through extra tasks and streams): a request id (the client's X-Request-ID, else a new one)
    in the response headers and in every error; 503 while draining (but /health and /metrics); the
    requests in flight counted; an exception that escaped a handler becomes a 500 with the id, logged
    with its traceback."""

    def __init__(self, app: ASGIApp, state: ServerState, metrics: Metrics, error: ErrorReply,
                 keys: tuple[bytes, ...] = (), public: tuple[str, ...] = ("/health",)) -> None:
        self.app, self.state, self.metrics, self.error = app, state, metrics, error
        self.keys, self.public = keys, public

    def authorized(self, scope: Scope) -> bool:
        """No keys configured, a public path, or ``Authorization: Bearer KEY`` with one of the keys (each
        compared in constant time, all of them always)."""
        if not self.keys or scope["path"] in self.public:
            return True
        given = dict(scope["headers"]).get(b"authorization", b"")
        scheme, _, token = given.partition(b" ")
        ok = False
        for key in self.keys:
            ok |= hmac.compare_digest(token.strip(), key)
        return ok and scheme.lower() == b"bearer"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        given = dict(scope["headers"]).get(b"x-request-id", b"").decode("latin-1")
        rid = given[:128] or uuid.uuid4().hex[:16]
        scope.setdefault("state", {})["rid"] = rid
        if not self.authorized(scope):
            self.metrics.unauthorized.inc()
            reply = self.error(401, "a valid API key is needed", "send the header Authorization: Bearer KEY",
                               rid, {"WWW-Authenticate": "Bearer"})
            return await reply(scope, receive, send)
        if self.state["draining"] and scope["path"] not in ("/health", "/metrics"):
            reply = self.error(503, "the server is shutting down",
                               "send the request to another replica, or retry later", rid)
            return await reply(scope, receive, send)
        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = list(message.get("headers", []))
                if not any(k.lower() == b"x-request-id" for k, _ in headers):  # error replies have it
                    message["headers"] = [*headers, (b"x-request-id", rid.encode("latin-1"))]
            await send(message)

        self.state["in_flight"] += 1
        self.metrics.in_flight.inc()
        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            log.exception("request %s (%s %s) failed", rid, scope.get("method"), scope.get("path"))
            if not started:
                reply = self.error(500, "internal error",
                                   f"the server log has the traceback under request id {rid}", rid)
                await reply(scope, receive, send)
        finally:
            self.state["in_flight"] -= 1
            self.metrics.in_flight.dec()
