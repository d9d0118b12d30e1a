"""The typed shapes every part of mlmkit shares: the one reader of the JSON files mlmkit writes, and
the one shape of its registries.

Files: a frozen dataclass is the file's shape, and ``from_json`` checks a parsed object against the
dataclass's annotations, field by field. A wrong type or a missing field is one line naming the file
and the field (the caller's error type, exit 2), with the caller's hint on how to re-create the file.
The annotations understood are the ones mlmkit's descriptions use: ``int`` (never a bool), ``float``
(an int too), ``str``, ``bool``, ``None`` and unions with it, ``Literal``, ``tuple[X, ...]`` and
``list[X]`` (a JSON list), ``dict[str, X]`` (a JSON object), ``Any``, and another such dataclass (a
nested object). A field may add a condition of its own: ``field(metadata=rule(predicate, "what"))``.
A file's format version is a field like any other; ``check_version`` refuses another version in one
line saying how to re-create the file.

Registries: ``Registry`` holds named things of one kind (model families, engines, losses, routes),
refuses a second entry under a taken name, and names what it knows when asked for what it does not.
No torch.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar, Union

from mlmkit.errors import ConfigError, MlmkitError
from mlmkit.files import JSONObject

T = TypeVar("T")
RULE = "mlmkit.rule"


def rule(predicate: Callable[[Any], bool], what: str) -> dict[str, object]:
    """A field's own condition, beside its type: ``field(metadata=rule(lambda n: n >= 1, "at least 1"))``."""
    return {RULE: (predicate, what)}


COUNT = rule(lambda n: n >= 0, "a whole number, 0 or more")
"""The condition of a count field (windows, rows, bytes ...), beside its type int."""


@cache
def _hints(cls: type) -> dict[str, object]:
    return typing.get_type_hints(cls)


_PLURAL = {int: "whole numbers", float: "numbers", str: "strings", bool: "true or false values"}


def describe(kind: Any) -> str:
    """How a message names what a value of annotation ``kind`` must be."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind is bool:
        return "true or false"
    if kind is int:
        return "a whole number"
    if kind is float:
        return "a number"
    if kind is str:
        return "a string"
    if kind is type(None):
        return "null"
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin in (Union, types.UnionType):
        return " or ".join(describe(a) for a in args)
    if origin in (tuple, list):
        return f"a list of {_PLURAL.get(args[0], 'values')}" if args and args[0] is not Any else "a list"
    if origin is dict or kind is dict or dataclasses.is_dataclass(kind):
        return "an object"
    return "a value"


def _fits(value: Any, kind: Any) -> bool:
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind is Any:
        return True
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is str:
        return isinstance(value, str)
    if kind is type(None):
        return value is None
    if origin is Literal:
        return value in args
    if origin in (Union, types.UnionType):
        return any(_fits(value, a) for a in args)
    if origin in (tuple, list):
        return isinstance(value, list) and (not args or all(_fits(v, args[0]) for v in value))
    if origin is dict or kind is dict:
        return isinstance(value, dict) and (len(args) < 2 or all(_fits(v, args[1]) for v in value.values()))
    if dataclasses.is_dataclass(kind):
        return isinstance(value, dict)
    raise TypeError(f"mlmkit.typed cannot check the annotation {kind!r}")


def _build(value: Any, kind: Any, path: Path | str, name: str, error: type[MlmkitError], fix: str) -> Any:
    """``value`` (checked) as the field holds it: lists as tuples where the annotation says tuple,
    nested dataclasses built (a list's too, each named ``name[k]``)."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (Union, types.UnionType):
        kind = next(a for a in args if _fits(value, a))
        origin, args = typing.get_origin(kind), typing.get_args(kind)
    if dataclasses.is_dataclass(kind) and isinstance(kind, type):
        return from_json(kind, value, path, error=error, fix=fix, within=f"{name}.")
    if origin in (tuple, list) and args and dataclasses.is_dataclass(args[0]) and isinstance(args[0], type):
        built = [from_json(args[0], v, path, error=error, fix=fix, within=f"{name}[{k}].")
                 for k, v in enumerate(value)]
        return tuple(built) if origin is tuple else built
    if origin is tuple:
        return tuple(value)
    return value


def from_json(cls: type[T], data: Any, path: Path | str, *, error: type[MlmkitError] = ConfigError,
              fix: str, rest: str | None = None, within: str = "") -> T:
    """``data`` (the parsed file at ``path``) as a ``cls``, checked field by field against its
    annotations; a field without a default is required. ``rest`` names a field that keeps the keys
    ``cls`` does not know (written back as read); without one they are refused."""
    if not isinstance(data, dict):
        where = f"'{within[:-1]}'" if within else "it"
        raise error(f"{path}: {where} is not a JSON object", fix)
    hints: dict[str, object] = _hints(cls)  # type: ignore[arg-type]
    typed: JSONObject = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name == rest:
            continue
        name = within + f.name
        if f.name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise error(f"{path}: it has no '{name}'", fix)
            continue
        value, kind = data[f.name], hints[f.name]
        ok, what = f.metadata.get(RULE, (None, None))
        if not _fits(value, kind):
            name, value, kind = _first_wrong(name, value, kind)
            raise error(f"{path}: '{name}' is not {what or describe(kind)} ({_shown(value)})", fix)
        if ok is not None and not ok(value):
            raise error(f"{path}: '{name}' is not {what} ({_shown(value)})", fix)
        typed[f.name] = _build(value, kind, path, name, error, fix)
    unknown = {k: v for k, v in data.items() if k not in typed and k not in _names(cls)}
    if rest is not None:
        typed[rest] = unknown
    elif unknown:
        raise error(f"{path}: '{within}{sorted(unknown)[0]}' is not a field this mlmkit knows", fix)
    return cls(**typed)


def _first_wrong(name: str, value: Any, kind: Any) -> tuple[str, Any, Any]:
    """Where in a wrong value the message points: an object's first wrong entry, or the value."""
    args = typing.get_args(kind)
    if typing.get_origin(kind) is dict and isinstance(value, dict) and len(args) == 2:
        for k, v in value.items():
            if not _fits(v, args[1]):
                return f"{name}.{k}", v, args[1]
    return name, value, kind


def _names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def to_json(obj: Any, rest: str | None = None) -> JSONObject:
    """A typed description as its JSON object: tuples as lists, nested dataclasses as objects, the
    ``rest`` field's keys written back beside the known ones."""
    out: JSONObject = {}
    for f in dataclasses.fields(obj):
        if f.name != rest:
            out[f.name] = _plain(getattr(obj, f.name))
    return {**out, **(getattr(obj, rest) if rest else {})}


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_json(value)
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


def check_version(data: Any, path: Path | str, *, key: str, reads: int, what: str, fix: str,
                  error: type[MlmkitError] = ConfigError) -> None:
    """Refuse a file whose format version (``data[key]``) is not the one this mlmkit reads, in one
    line saying how to re-create it."""
    found = data.get(key) if isinstance(data, dict) else None
    if found != reads:
        raise error(f"{path}: {what} of format {found}; this mlmkit reads format {reads}", fix)


class Registry(Generic[T]):
    """Named things of one kind (families by model type, engines, losses, routes ...): the one shape
    every registry of mlmkit has. ``add`` refuses a name taken by another entry; ``get`` is one line
    naming what is known. Iterating gives the names, sorted."""

    def __init__(self, kind: str, hint: str = "") -> None:
        self.kind, self.hint = kind, hint
        self._entries: dict[str, T] = {}

    def add(self, name: str, entry: T) -> T:
        have = self._entries.get(name)
        if have is not None and have is not entry:
            raise ValueError(f"a {self.kind} named {name!r} is registered already")
        self._entries[name] = entry
        return entry

    def remove(self, name: str) -> None:
        """Take ``name`` out (a test's or a plugin's own entry, for the time it is needed)."""
        del self._entries[name]

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            known = ", ".join(sorted(self._entries)) or "none"
            raise ConfigError(f"{self.kind} {name!r} is not one mlmkit knows (known: {known})",
                              self.hint or None) from None

    def __getitem__(self, name: str) -> T:
        return self._entries[name]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def items(self) -> list[tuple[str, T]]:
        return sorted(self._entries.items())

    def values(self) -> list[T]:
        return [v for _, v in self.items()]

    def in_order(self) -> dict[str, T]:
        """The entries in the order they were added (where that order is shown: a loss option's choices)."""
        return dict(self._entries)
