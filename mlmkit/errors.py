"""The exception types the CLI turns into one red line and exit status 2.

The library raises these; only the CLI (``mlmkit/cli/``) exits. Each carries a hint saying how to fix it, and
data errors carry the file, line and field they are about.
"""

from __future__ import annotations

from pathlib import Path


class MlmkitError(Exception):
    """A user-facing error: ``message`` says what is wrong, ``hint`` how to fix it."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


class ConfigError(MlmkitError):
    """Inconsistent options, configs or run directories."""


class Diverged(ConfigError):
    """Training stopped at a NaN or infinite loss (a sweep records the trial as failed and goes on)."""


class DataFormatError(MlmkitError):
    """A data file that cannot be read: names the file, line and field."""

    def __init__(
        self,
        path: str | Path,
        message: str,
        *,
        line: int | None = None,
        field: str | None = None,
        hint: str | None = None,
        unit: str = "line",
    ) -> None:
        where = str(path)
        if line is not None:
            where += f", {unit} {line}"
        if field is not None:
            where += f", field '{field}'"
        super().__init__(f"{where}: {message}", hint)
        self.path, self.line, self.field, self.detail, self.unit = str(path), line, field, message, unit

    # pickled whole, so that an error raised in a worker process reaches the CLI
    def __reduce__(self) -> tuple:
        return _data_format_error, (self.path, self.detail, self.line, self.field, self.hint, self.unit)


def _data_format_error(path: str, message: str, line: int | None, field: str | None, hint: str | None,
                       unit: str = "line") -> DataFormatError:
    return DataFormatError(path, message, line=line, field=field, hint=hint, unit=unit)


class TaskError(MlmkitError):
    """Unknown, duplicate or broken task plugins."""


class ParityError(MlmkitError):
    """An exported graph whose outputs differ from PyTorch beyond the tolerance."""


class BundleError(MlmkitError):
    """A missing, corrupted or mismatched export bundle."""


def redacted(url: str) -> str:
    """``url`` fit for a message or a file: the password of ``scheme://user:password@host`` as ***."""
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        host = parts.netloc.rsplit("@", 1)[1]
        return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))
    except ValueError:  # not a URL: nothing to find in it
        return url


def scrubbed(text: str, url: str) -> str:
    """``text`` (an error of a library that was given ``url``) with the url's password nowhere in it."""
    from urllib.parse import unquote, urlsplit

    try:
        password = urlsplit(url).password
    except ValueError:
        password = None
    text = text.replace(url, redacted(url))
    for secret in {password, unquote(password)} if password else ():
        text = text.replace(secret, "***")
    return text
