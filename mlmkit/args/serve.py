"""The arguments of `mlmkit serve`: the HTTP server of bundles and indexes (see mlmkit.args)."""


from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mlmkit.args.base import Args, Inputs, Runtime, _finite, arg, check_precision, flag
from mlmkit.errors import ConfigError


@dataclass
class ServeArgs(Args):
    """`mlmkit serve`'s settings."""

    bundles: list[str] = arg(help="Bundle directories to serve, each as PATH (named after the directory) or "
                                  "NAME=PATH.",
                             positional=True)
    host: str = arg("127.0.0.1", "Address to listen on (0.0.0.0: every interface).")
    port: int = arg(8000, "Port to listen on.")
    device: str = Runtime.device()
    precision: str | None = Runtime.precision()
    min_agreement: float | None = Runtime.min_agreement()
    threads: int | None = Runtime.threads()
    batch_size: int = Runtime.batch_size()
    batch_tokens: int | None = Runtime.batch_tokens()
    max_batch_size: int = arg(256, "Most inputs merged from queued requests into one call.")
    max_wait_ms: float = arg(2.0, "How long the first queued request waits for others to join its call (ms).")
    max_inputs: int = arg(1024, "Most inputs in one request (more: 413).")
    max_body_bytes: int = arg(8 * 1024 * 1024, "Largest request body (more: 413).")
    drain_seconds: float = arg(30.0, "On SIGTERM, how long requests in flight may take to finish.")
    access_log: bool = arg(False, "Log every request (uvicorn's access log; the query string's values are "
                                  "left out).")
    api_key: list[str] = arg(help="An API key clients must send as 'Authorization: Bearer KEY' (repeatable; "
                                  "default: "
                                  "$MLMKIT_API_KEY; none: no check). The probes /health and /ready never "
                                  "need one.", factory=list)
    public_metrics: bool = arg(False, "Serve /metrics without an API key.")
    index: list[str] = arg(help="An index (mlmkit index) that POST /v1/search answers from, as PATH or "
                                "NAME=PATH (repeatable); its queries are embedded by the served bundle that "
                                "built it.", factory=list, flags=("--search-index",))
    mmap_index: bool = arg(False, "Memory-map the --search-index files instead of reading them into memory "
                                  "(an index larger than memory; a file then rewritten in place under the "
                                  "server can end it).")
    corpus: list[str] = Inputs.corpus(factory=list)
    max_queue: int = arg(0, "Most inputs waiting per model; more: 429 with Retry-After (0: 4 x "
                            "--max-batch-size).")
    request_timeout: float = arg(30.0, "Seconds a request may wait in the queue; then 503, and it leaves the "
                                       "queue.")
    timeout_keep_alive: float = arg(5.0, "Seconds an idle keep-alive connection stays open between requests.")
    header_timeout: float = arg(10.0, "Seconds a client has to send a request's line and headers; then the "
                                      "connection is closed (slow or silent clients cannot hold "
                                      "connections).")
    max_connections: int = arg(0, "Most open connections, idle ones too; more are answered 503 and closed "
                                  "(0: the "
                                  "process's open-file limit less 64, at most 4096).")
    ssl_keyfile: Path | None = arg(None, "TLS: the private key file (with --ssl-certfile: serve https).")
    ssl_certfile: Path | None = arg(None, "TLS: the certificate file (with --ssl-keyfile).")

    def __post_init__(self) -> None:
        if not self.bundles:
            raise ConfigError("no bundles to serve",
                              "give one or more bundle directories, as PATH or NAME=PATH")
        check_precision(self.precision, self.min_agreement)
        for name in ("port", "batch_size", "max_batch_size", "max_inputs", "max_body_bytes"):
            low = 0 if name == "port" else 1
            if getattr(self, name) < low:
                raise ConfigError(f"--{name.replace('_', '-')} must be at least {low}, got "
                                  f"{getattr(self, name)}")
        if self.batch_tokens is not None and self.batch_tokens < 0:
            raise ConfigError(f"--batch-tokens must be 0 (no limit) or more, got {self.batch_tokens}")
        if self.port > 65535:
            raise ConfigError(f"--port must be at most 65535, got {self.port}")
        if not 0 <= self.max_wait_ms <= 10_000 or not 0 <= self.drain_seconds <= 3600:
            raise ConfigError("--max-wait-ms must be 0 to 10000 and --drain-seconds 0 to 3600")
        for name in ("timeout_keep_alive", "header_timeout"):
            value = getattr(self, name)
            if not (_finite(value) and 0 < value <= 3600):
                raise ConfigError(f"{flag(ServeArgs, name)} must be between 0 and 3600 seconds, got {value}")
        if self.max_queue < 0:
            raise ConfigError(f"--max-queue must be 0 (the default size) or more, got {self.max_queue}")
        if self.max_connections < 0:
            raise ConfigError("--max-connections must be 0 (from the open-file limit) or more, got "
                              f"{self.max_connections}")
        if not _finite(self.request_timeout) or not 0 < self.request_timeout <= 3600:
            raise ConfigError("--request-timeout must be more than 0 and at most 3600 seconds, got "
                              f"{self.request_timeout}")
        if (self.ssl_keyfile is None) != (self.ssl_certfile is None):
            raise ConfigError("TLS needs both --ssl-keyfile and --ssl-certfile")
        for f in (self.ssl_keyfile, self.ssl_certfile):
            if f is not None and not Path(f).is_file():
                raise ConfigError(f"{f} is not a file", "give the PEM key and certificate files")
        if any(not k or k != k.strip() for k in self.api_key):
            raise ConfigError("an --api-key is empty or has spaces around it", "give the key itself")
