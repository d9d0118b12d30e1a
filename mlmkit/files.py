"""Atomic, umask-respecting file writes and JSON / JSON-lines I/O. No torch: everything uses these.

Every write goes to a temporary name in the target's directory and is renamed over the target, so
a process killed mid-write leaves the previous file intact and a reader never sees half a file.
``tempfile.mkstemp`` creates its file with mode 0600 whatever the umask; the file gets the mode an
ordinary ``open(path, "w")`` would have given it (0666 minus the umask) before it is renamed into
place, so an exported bundle is as readable as any other file the user writes.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import errno
import json
import os
import re
import stat
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Protocol, TypedDict

from mlmkit.errors import ConfigError

JSONObject = dict[str, Any]
"""A JSON object whose keys this code does not fix: a file's or a request's content as parsed (before
any field of it is checked), or what is written out as JSON as it is."""

# a write that failed, whatever the file object
_WRITE_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO}


def _umask() -> int:
    mask = os.umask(0)  # the only portable way to read the umask is to set it; put it straight back
    os.umask(mask)
    return mask


def is_stream(path: str | Path) -> bool:
    """Whether ``path`` is written as a stream, never replaced by a file: "-" (stdout), a FIFO, a
    character device (/dev/null, a terminal), a socket, or a descriptor of this process
    (/dev/stdout, /dev/fd/N, /proc/self/fd/N, whatever it is open on). A symlink is what it points to."""
    if str(path) == "-":
        return True
    given = os.path.abspath(path)
    if given.startswith(("/proc/", "/dev/fd/")) or given in ("/dev/stdin", "/dev/stdout", "/dev/stderr"):
        return True
    try:
        mode = os.stat(path).st_mode  # follows links
    except OSError:
        return False  # a new path (or a dangling link: a new file where it points)
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


@contextmanager
def open_stream(path: str | Path) -> Iterator[IO[str]]:
    """A UTF-8 text stream written through to ``path`` (see is_stream): stdout for "-", appended to
    otherwise (a descriptor of a file the shell opened for appending keeps what it had)."""
    if str(path) == "-":
        yield sys.stdout
        sys.stdout.flush()
        return
    with open(path, "a", encoding="utf-8") as f:
        yield f


def _target(path: Path) -> Path:
    """What a write to ``path`` replaces: a symlink's target (the link stays a link), else ``path``."""
    return Path(os.path.realpath(path)) if path.is_symlink() else path


@contextmanager
def _replacing(path: Path) -> Iterator[str]:
    """A temporary path beside ``path`` that replaces it when the block completes (never on an error).
    An OS error (a full disk, no permission) names ``path``, never the temporary file. A symlink's
    target is replaced, not the link; a FIFO or a device is never replaced by a file (refused)."""
    if is_stream(path):
        raise ConfigError(f"{path} is not a regular file (a FIFO, a device or a descriptor)",
                          "write JSON lines to it, or give a file name")
    path = _target(path)
    if path.is_dir():
        raise ConfigError(f"{path} is a directory", "give a file name to write to")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
    except OSError as e:
        raise OSError(e.errno, e.strerror, str(path)) from e
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e,
                      OSError) and (e.filename == tmp or (e.filename is None and e.errno in _WRITE_ERRORS)):
            raise OSError(e.errno, e.strerror, str(path)) from e
        raise


def cache_root() -> Path:
    """Where mlmkit keeps what it computed once (token shards, a teacher's outputs): $MLMKIT_CACHE, or
    ~/.cache/mlmkit."""
    return Path(os.environ.get("MLMKIT_CACHE", Path.home() / ".cache" / "mlmkit"))


def atomic_write(path: str | Path, write: Callable[[str], object]) -> None:
    """Call ``write(tmp_path)`` (what it returns is not used), then rename tmp_path over ``path``; on any
    failure ``path`` is untouched and the temporary file is removed."""
    with _replacing(Path(path)) as tmp:
        write(tmp)


@contextmanager
def atomic_open(path: str | Path) -> Iterator[IO[str]]:
    """A UTF-8 text stream that replaces ``path`` when the block completes: output can be written as it
    is produced, yet an error midway leaves the previous file as it was. A stream (is_stream: "-",
    a FIFO, /dev/stderr) is written through instead: it has no previous file to keep."""
    if is_stream(path):
        with open_stream(path) as f:
            yield f
        return
    with _replacing(Path(path)) as tmp, open(tmp, "w", encoding="utf-8") as f:
        yield f


def atomic_write_text(path: str | Path, text: str) -> None:
    with atomic_open(path) as f:
        f.write(text)


def write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


class JSONDataError(json.JSONDecodeError):
    """JSON that parses but holds what is no data: a lone surrogate, an integer of thousands of
    digits. A json.JSONDecodeError (a ValueError), so that what handles malformed JSON handles it."""


_ESCAPED_SURROGATE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_SURROGATE = re.compile("[\ud800-\udfff]")
_DIGITS = re.compile(r"value has (\d+) digits")


def parse_json(text: str, *, strict: bool = False) -> Any:
    """json.loads, where what is no data is malformed JSON like any other (json.JSONDecodeError, a
    ValueError, with the position): a document nested too deeply for Python's parser ("[[[[..."),
    and, as JSONDataError, a lone surrogate ("\\ud800": no character, so no UTF-8 can hold it; a
    pair such as "\\ud83d\\ude00" is one character and fine) and an integer longer than Python
    converts (sys.get_int_max_str_digits(), 4300 digits by default). ``strict`` (a request body):
    NaN / Infinity, which JSON does not have, and a key twice in one object (which one would count?)
    are JSONDataError too."""
    kw: _Hooks = {} if sys.get_int_max_str_digits() else {"parse_int": _bounded_int}
    if strict:
        kw.update({"parse_constant": lambda name: _not_json(f"{name} is not a JSON number", text, name),
                   "object_pairs_hook": lambda pairs: _unique_keys(pairs, text)})
    try:
        value = json.loads(text, **kw)
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply", text[:100], 0) from None
    except json.JSONDecodeError:
        raise
    except ValueError as e:  # int("1" * 5000): Python's own limit, hit inside the scanner
        digits = _DIGITS.search(str(e))
        n = int(digits.group(1)) if digits else None
        at = re.search(rf"\d{{{n or 4301},}}", text)
        raise JSONDataError(f"integer of {n or 'too many'} digits", text, at.start() if at else 0) from None
    if not text.isascii() and (raw := _SURROGATE.search(text)) is not None:  # from errors="surrogateescape"
        raise JSONDataError(f"lone surrogate \\u{ord(raw.group()):04x} in a string", text, raw.start())
    if "\\u" in text:
        lone = _lone_surrogate(text)
        if lone is not None:
            raise JSONDataError(f"lone surrogate {text[lone:lone + 6].lower()} in a string", text, lone)
    return value


class _Hooks(TypedDict, total=False):
    """The hooks parse_json gives json.loads."""

    parse_int: Callable[[str], Any]
    parse_constant: Callable[[str], Any]
    object_pairs_hook: Callable[[list[tuple[str, Any]]], Any]


def _not_json(message: str, text: str, near: str) -> Any:
    raise JSONDataError(message, text, max(0, text.find(near)))


def _unique_keys(pairs: list[tuple[str, Any]], text: str) -> JSONObject:
    out: JSONObject = {}
    for k, v in pairs:
        if k in out:
            _not_json(f"the key {k!r} twice in one object", text, json.dumps(k))
        out[k] = v
    return out


def _bounded_int(digits: str) -> int:
    """int() for a JSON parser when Python's own limit on digits is off: the default limit anyway."""
    if len(digits) > 4300 + digits.startswith("-"):
        raise ValueError(f"value has {len(digits) - digits.startswith('-')} digits")
    return int(digits)


def _lone_surrogate(text: str) -> int | None:
    """The position of the first \\uD800-\\uDFFF escape in a JSON text that is not half of a pair
    (a high one followed at once by a low one), or None."""
    skip_to = -1
    for m in _ESCAPED_SURROGATE.finditer(text):
        start = m.start()
        if start < skip_to:
            continue
        k = start
        while k and text[k - 1] == "\\":
            k -= 1
        if (start - k) % 2:  # "\\\\ud800": an escaped backslash, then the letters "ud800"
            continue
        if m.group()[3].lower() in "89ab":  # a high one: a low one must follow
            low = _ESCAPED_SURROGATE.match(text, m.end())
            if low is not None and low.group()[3].lower() in "cdef":
                skip_to = low.end()
                continue
        return start
    return None


def read_json(path: str | Path) -> JSONObject:
    """A JSON object from ``path``; a missing, unreadable or non-object file is a ConfigError naming it."""
    p = Path(path)
    try:
        obj = parse_json(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{p} not found", "is this a run directory or bundle written by mlmkit?") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{p}: corrupted JSON ({e})", "re-create it with mlmkit") from None
    if not isinstance(obj, dict):
        raise ConfigError(f"{p}: expected a JSON object, found {type(obj).__name__}",
                          "re-create it with mlmkit")
    return obj


def json_line(record: JSONObject) -> str:
    """One JSON-lines row: UTF-8 kept as is (no \\u escapes), newline-terminated. Values JSON has no
    type for (an id column read from Parquet) in the form json_value gives them."""
    return json.dumps(record, ensure_ascii=False, default=json_value) + "\n"


def json_value(v: Any) -> Any:
    """A JSON form of what Parquet holds and JSON has no type for: timestamps, dates and times as ISO
    8601 text (2024-05-01T12:00:00+00:00), durations as ISO 8601 seconds (PT90.5S), decimals as their
    exact text ("12.50"), binary as base64 text (RFC 4648, with padding); anything else as str()."""
    if isinstance(v, (datetime.datetime, datetime.date, datetime.time)):
        return v.isoformat()
    if isinstance(v, datetime.timedelta):
        return f"PT{v.total_seconds():g}S"
    if isinstance(v, decimal.Decimal):
        return str(v)
    if isinstance(v, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(v)).decode("ascii")
    return str(v)


def write_jsonl(path: str | Path, rows: Iterable[JSONObject]) -> None:
    """JSON lines, written atomically: the file appears complete or not at all."""
    with atomic_open(path) as f:
        for r in rows:
            f.write(json_line(r))


# ---- reading ---------------------------------------------------------------------------------------
MAX_RECORD_BYTES = 64 << 20
"""The default record ceiling: a longer line (a record, a field) is a bad record, never read whole.
64 MB is far above any text a model reads (a 512-token input is a few KB; clip_text keeps that much)
and leaves room for a whole book per JSON line, yet a reader holds at most a few times this much."""


class ByteLines(Protocol):
    """A binary stream read by lines: a file opened "rb", a gzip stream, sys.stdin.buffer."""

    def readline(self, size: int = ..., /) -> bytes: ...
    def __iter__(self) -> Iterator[bytes]: ...


def bounded_lines(f: ByteLines, max_bytes: int | None) -> Iterator[bytes | bytearray | None]:
    """The lines of a binary stream (a file, a gzip stream), each with its line end, read a line at
    a time; a line of more than ``max_bytes`` (None: no ceiling) comes as None instead, and is read
    past in 1 MB chunks when the next line is asked for (never held whole). A line longer than 1 MB
    is gathered a MB at a time into one buffer (a bytearray), so that memory holds the ceiling at
    most, once: readline(ceiling) held it twice (its pieces, then their join), and a 200 MB line
    peaked at 130 MB over the process for a 64 MB ceiling."""
    if max_bytes is None:
        yield from f
        return
    step = min(max_bytes + 1, LINE_STEP)
    while True:
        line: bytes | bytearray = f.readline(step)
        if not line:
            return
        if len(line) == step and not line.endswith(b"\n") and step <= max_bytes:  # a long line
            line = bytearray(line)
            while len(line) <= max_bytes and not line.endswith(b"\n"):
                more = f.readline(min(LINE_STEP, max_bytes + 1 - len(line)))
                if not more:
                    break
                line += more
        if len(line) > max_bytes and not line.endswith(b"\n"):
            line = b""
            yield None
            while True:
                rest = f.readline(LINE_STEP)
                if not rest or rest.endswith(b"\n"):
                    break
            continue
        yield line


LINE_STEP = 1 << 20
"""bounded_lines reads a long line this many bytes at a time."""
