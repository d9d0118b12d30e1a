"""A pretraining corpus built offline from the docstrings of Python's own standard library.

Each docstring of a module, class or function is one document; its paragraphs are split into
sentences, one per line, as the corpus format asks. Files are read with ``ast`` (nothing is
imported) in sorted order, so the corpus is the same on every machine with the same Python.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import os
import re
import sys
import sysconfig
from collections import deque
from collections.abc import Iterator
from pathlib import Path

from mlmkit.files import atomic_open, atomic_write_text, cache_root

_SENT = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
_CODEISH = re.compile(r"(>>>|\.\.\. |::|^\s*[-=*]{3,}|[{}\[\]]{2,})")


def _sentences(doc: str) -> list[str]:
    out = []
    for para in re.split(r"\n\s*\n", doc):
        text = " ".join(para.split())
        if not text or _CODEISH.search(para):
            continue
        for s in _SENT.split(text):
            words = s.split()
            if 4 <= len(words) <= 60 and sum(c.isalpha() for c in s) > 0.7 * len(s.replace(" ", "")):
                out.append(s)
    return out


_BLOCKS = (ast.stmt, ast.excepthandler, ast.match_case)
_OWNERS = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def _definitions(tree: ast.AST) -> Iterator[tuple[ast.AST, str]]:
    """The nodes of ``tree`` in ast.walk's order with the dotted name of the class or function that
    holds them (empty at module level), but only statements and the blocks that hold them: a
    docstring's owner (module, class, function) is never inside an expression, and skipping those
    makes the walk several times faster."""
    todo: deque[tuple[ast.AST, str]] = deque([(tree, "")])
    while todo:
        node, prefix = todo.popleft()
        inner = f"{prefix}.{node.name}".lstrip(".") if isinstance(node, _OWNERS[1:]) else prefix
        todo.extend((c, inner) for c in ast.iter_child_nodes(node) if isinstance(c, _BLOCKS))
        yield node, prefix


def _module_name(rel: tuple[str, ...]) -> str:
    parts = [*rel[:-1], rel[-1].removesuffix(".py")]
    return ".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 1 else parts)


Definition = tuple[str, str, tuple[str, ...]]


@functools.cache
def definitions() -> tuple[Definition, ...]:
    """Every documented module, class and function of the standard library as (module, name,
    sentences), in the corpus's order: ``name`` is the dotted name inside the module ("" for the
    module itself, "Path.read_text" for a method). Parsed once per Python (about 4 s), then read from
    $MLMKIT_CACHE/stdlib-docstrings (keyed by the Python and its files' sizes and times)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = _files(root)
    cached = cached_definitions(cache_root(), root, files)
    try:
        return tuple((m, n, tuple(s)) for m, n, s in json.loads(cached.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        pass  # not there yet, or unreadable: parsed again
    found = tuple(_parsed(root, files))
    try:
        atomic_write_text(cached, json.dumps(found))
    except OSError:
        pass  # a read-only cache: parsed again next time
    return found


def cached_definitions(cache: Path, root: Path | None = None, files: list[Path] | None = None) -> Path:
    """The file under the cache directory ``cache`` that keeps this Python's definitions()."""
    root = root or Path(sysconfig.get_paths()["stdlib"])
    stamps = [(str(p), *_stamp(p)) for p in (files if files is not None else _files(root))]
    key = hashlib.sha256(repr((sys.version, str(root), stamps)).encode()).hexdigest()[:16]
    return cache / "stdlib-docstrings" / f"{key}.json"


def _files(root: Path) -> list[Path]:
    """The standard library's .py files, in sorted order, without its tests, IDLE, lib2to3, turtledemo
    and site-packages (not walked into: a virtual environment's can hold a hundred thousand files)."""
    out = []
    for d, subdirs, names in os.walk(root):
        top = Path(d) == root
        subdirs[:] = [s for s in subdirs if s != "tests" and not (top and s in _SKIPPED)]
        out += [Path(d) / n for n in names if n.endswith(".py")]
    return sorted(out)


_SKIPPED = ("test", "idlelib", "lib2to3", "site-packages", "turtledemo")


def _stamp(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_size, st.st_mtime_ns


def _parsed(root: Path, files: list[Path]) -> Iterator[Definition]:
    for path in files:
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        rel = path.relative_to(root).parts
        for node, prefix in _definitions(tree):
            if isinstance(node, _OWNERS):
                doc = ast.get_docstring(node)
                sents = _sentences(doc) if doc else []
                if sents:
                    name = "" if isinstance(node, ast.Module) else f"{prefix}.{node.name}".lstrip(".")
                    yield _module_name(rel), name, tuple(sents)


def docstring_documents(max_chars: int = 3_000_000) -> Iterator[list[str]]:
    """The docstrings of two or more sentences, each a list of its sentences, until ``max_chars``."""
    total = 0
    for _, _, sents in definitions():
        if len(sents) >= 2:
            yield list(sents)
            total += sum(map(len, sents))
            if total >= max_chars:
                return


def write_corpus(path: str | Path, max_chars: int = 3_000_000) -> dict[str, int]:
    """Write the corpus file (one sentence per line, blank line between documents), atomically."""
    docs = sents = chars = 0
    with atomic_open(path) as f:
        for doc in docstring_documents(max_chars):
            f.write("\n".join(doc) + "\n\n")
            docs, sents, chars = docs + 1, sents + len(doc), chars + sum(map(len, doc))
    return {"documents": docs, "sentences": sents, "characters": chars}
