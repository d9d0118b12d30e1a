"""`mlmkit serve` as a user runs it: ``Server`` starts the real server in a subprocess on a free
loopback port (``free_port``), its log in a file, waits until /ready answers, and posts predictions and
reads Prometheus samples over HTTP with httpx (the serve tests skip without it)."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

httpx = pytest.importorskip("httpx")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`mlmkit serve ...` in a subprocess, its log in a file."""

    def __init__(self, tmp: Path, *args: str | Path, verify: str | bool = True) -> None:
        """``verify``: the certificate file of a server started with --ssl-certfile (polled over https)."""
        self.port = free_port()
        self.url = f"{'https' if isinstance(verify, str) else 'http'}://127.0.0.1:{self.port}"
        self.log = tmp / f"serve-{self.port}.log"
        with open(self.log, "w") as f:
            self.proc = subprocess.Popen([sys.executable, "-m", "mlmkit", "serve", *map(str, args), "--port",
                                          str(self.port)],
                                         stdout=f, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError("the server exited with "
                                     f"{self.proc.returncode}:\n{self.log.read_text()}")
            try:
                if httpx.get(self.url + "/ready", verify=verify, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise AssertionError(f"the server did not get ready:\n{self.log.read_text()}")

    def post(self, model: str, body: Any, **kw: Any) -> httpx.Response:
        if isinstance(body, (bytes, str)):
            return httpx.post(f"{self.url}/v1/models/{model}/predict", content=body, timeout=60, **kw)
        return httpx.post(f"{self.url}/v1/models/{model}/predict", json=body, timeout=60, **kw)

    def metric(self, name: str, **labels: str) -> float:
        """The value of one Prometheus sample (0 when absent)."""
        text = httpx.get(self.url + "/metrics", timeout=10).text
        for line in text.splitlines():
            m = re.match(r"^(\w+)(?:\{(.*)\})? (\S+)$", line)
            if m and m.group(1) == name:
                got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
                if all(got.get(k) == v for k, v in labels.items()):
                    return float(m.group(3))
        return 0.0

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
