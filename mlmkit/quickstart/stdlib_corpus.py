"""A pretraining corpus built offline from the docstrings of Python's own standard library.

Each docstring of a module, class or function is one document; its paragraphs are split into
sentences, one per line, as the corpus format asks. Files are read with ``ast`` (nothing is
imported) in sorted order, so the corpus is the same on every machine with the same Python.
"""

from __future__ import annotations

import ast
import functools
import re
import sysconfig
from collections import deque
from collections.abc import Iterator
from pathlib import Path

from mlmkit.files import atomic_open

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


@functools.cache
def definitions() -> tuple[tuple[str, str, tuple[str, ...]], ...]:
    """Every documented module, class and function of the standard library as (module, name,
    sentences), in the corpus's order: ``name`` is the dotted name inside the module ("" for the
    module itself, "Path.read_text" for a method). Read once per process (about 4 s)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).parts
        if rel[0] in ("test", "idlelib", "lib2to3", "site-packages", "turtledemo") or "tests" in rel:
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node, prefix in _definitions(tree):
            if isinstance(node, _OWNERS):
                doc = ast.get_docstring(node)
                sents = _sentences(doc) if doc else []
                if sents:
                    name = "" if isinstance(node, ast.Module) else f"{prefix}.{node.name}".lstrip(".")
                    found.append((_module_name(rel), name, tuple(sents)))
    return tuple(found)


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
