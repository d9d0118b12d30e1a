"""The uvicorn lifecycle of `mlmkit serve`: the listening socket, a header timeout for slow clients,
and draining on shutdown (the uvicorn subclasses for those two: uvicorn_parts.py). No torch.
"""

from __future__ import annotations

import logging
import socket

from mlmkit.args import ServeArgs
from mlmkit.errors import ConfigError
from mlmkit.serve.queue import load_models

log = logging.getLogger("mlmkit")


def serve(args: ServeArgs) -> None:
    """Load the bundles and serve them until SIGTERM or Ctrl-C (the endpoints: app.py's docstring)."""
    try:
        import fastapi  # noqa: F401
        import orjson  # noqa: F401
        import uvicorn
    except ImportError:
        raise ConfigError("`mlmkit serve` needs FastAPI, uvicorn and orjson",
                          "pip install 'mlmkit[serve]'") from None
    # only now: uvicorn_parts subclasses uvicorn's classes at import, the app's request models are
    # pydantic's, and those are the [serve] extra
    from mlmkit.serve.app import api_keys, create_app
    from mlmkit.serve.uvicorn_parts import HEADER_BYTES, DrainingServer, header_timeout_protocol

    keys = api_keys(args)  # before the models load: a bad key, or a busy port, is one line at once
    if not keys and not loopback(args.host):
        log.warning("--host %s without an API key: anyone who reaches this machine on port %d can use every "
                    "model (set --api-key or MLMKIT_API_KEY)", args.host, args.port)
    sock = listen(args.host, args.port)
    try:
        models = load_models(args)
    except BaseException:
        sock.close()
        raise
    app = create_app(models, args, keys)
    tls = {"ssl_keyfile": str(args.ssl_keyfile), "ssl_certfile": str(args.ssl_certfile)} if args.ssl_keyfile \
        else {}
    config = uvicorn.Config(app, host=args.host, port=args.port, access_log=args.access_log, log_level="info",
                            timeout_graceful_shutdown=args.drain_seconds, log_config=None,
                            timeout_keep_alive=args.timeout_keep_alive,
                            h11_max_incomplete_event_size=HEADER_BYTES,
                            limit_concurrency=max_connections(args),
                            http=header_timeout_protocol(args.header_timeout), **tls)
    server = DrainingServer(config, app.state.mlmkit, args.drain_seconds)
    ours = logging.getLogger("mlmkit")
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):  # uvicorn's lines go where mlmkit's go
        logging.getLogger(name).handlers[:] = ours.handlers
        logging.getLogger(name).setLevel(ours.level)
        logging.getLogger(name).propagate = False
    access = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, NoQueryValues) for f in access.filters):
        access.addFilter(NoQueryValues())
    log.info("serving %s on %s://%s:%d (GET /docs for the API)", ", ".join(models),
             "https" if tls else "http", args.host, args.port)
    server.run(sockets=[sock])


class NoQueryValues(logging.Filter):
    """--access-log lines without the values of the query string (``/health?api_key=***``): a client
    that sends a key or a text there must not find it in the log. uvicorn's access record's arguments
    are (client, method, path with its query, HTTP version, status)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) == 5 and isinstance(args[2], str) and "?" in args[2]:
            path, _, query = args[2].partition("?")
            hidden = "&".join(f"{p.partition('=')[0]}=***" if "=" in p else "***"
                              for p in query.split("&") if p)
            record.args = (args[0], args[1], f"{path}?{hidden}", args[3], args[4])
        return True


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


def loopback(host: str) -> bool:
    """Whether ``host`` is reachable from this machine only (127.0.0.0/8, ::1, localhost)."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to any interface
        return False


def listen(host: str, port: int) -> socket.socket:
    """A listening socket on ``host``:``port``, or one line saying why there is none (exit 2)."""
    import errno

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
            raise ConfigError(f"--port {port}: not permitted to listen on {host}:{port}",
                              "use a port above 1023") from None
        raise ConfigError(f"--host {host} --port {port}: cannot listen there ({e.strerror})",
                          "check the address") from None
    sock.set_inheritable(True)
    return sock
