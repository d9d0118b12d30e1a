"""The one error type of serving: an HTTP answer other than 200, raised by the routes, the queue and
the app alike, and written by the app as a JSON body with its status."""

from __future__ import annotations


class HTTPError(Exception):
    """An answer other than 200: its status, a message and how to fix the request."""

    def __init__(self, status: int, message: str, hint: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.hint, self.headers = status, message, hint, dict(headers or {})
