"""The documents' metadata in an index, and filters over it (`mlmkit search --where`, ``"where"`` on
``POST /v1/search``). No torch.

Every field of a JSON-lines or Parquet document other than its id, title and text is stored with it:
each shard holds its documents' fields in ``meta.arrow`` (an Arrow IPC file, memory-mapped; a shard
whose documents have none holds none). A field takes one kind of value over the corpus (numbers,
strings or booleans; whole numbers and decimals mix); another kind in a later document is an error
naming its file, line and field. Lists and objects are stored but not filtered on. CSV fields are
strings.

A filter is conditions that must all hold (``--where`` is repeatable):

    FIELD=VALUE  FIELD!=VALUE  FIELD>=V  FIELD<=V  FIELD>V  FIELD<V  "FIELD in A,B,C"  "FIELD in @FILE"

``id`` is the document's id; ``@FILE`` reads the values a line each (a list of ids, say). A number
field compares numbers, a string field strings (=, != and in only), a boolean field true / false. A
document without the field fails every condition on it but ``!=``. The conditions are evaluated over
the stored columns (pyarrow.compute), a shard at a time, into the rows a search may return
(Index.allowed): applied inside the search, never by taking more hits and dropping some.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mlmkit.errors import ConfigError, DataFormatError
from mlmkit.files import JSONObject
from mlmkit.retrieval.index.store import CHUNK, StoredIndex
from mlmkit.text.chunks import SEPARATOR

META = "meta.arrow"
CONDITION = re.compile(r"^\s*([^=!<>\s]+)\s*(>=|<=|!=|=|>|<|\s+in\s+)\s*(.*?)\s*$", re.S)
KINDS = {bool: "boolean", int: "number", float: "number", str: "string"}


@dataclass(frozen=True)
class Condition:
    """One ``--where`` condition: a field, an operator (=, !=, >=, <=, >, <, in) and its values as given."""

    field: str
    op: str
    values: tuple[str, ...]

    @classmethod
    def parse(cls, text: str, *, files: bool = True) -> Condition:
        """One condition as written. ``files``: whether ``FIELD in @FILE`` may read a file (the command
        line's; never a request's to the server, which takes its values inline)."""
        m = CONDITION.match(text)
        if m is None or not m.group(3):
            raise ConfigError(f"--where {text!r}: not FIELD=VALUE, FIELD>=VALUE, FIELD<=VALUE, FIELD>VALUE, "
                              "FIELD<VALUE, FIELD!=VALUE or 'FIELD in A,B'",
                              "e.g. --where lang=en --where 'year>=2020'")
        field, op, value = m.group(1), m.group(2).strip(), m.group(3)
        if op != "in":
            return cls(field, op, (value,))
        if value.startswith("@") and not files:
            raise ConfigError(f"where {text!r}: the values are given inline here, \"FIELD in A,B\"",
                              "a request names no file of the server (no @FILE)")
        if value.startswith("@"):
            values = tuple(v.strip() for v in _values_file(Path(value[1:]), text).splitlines() if v.strip())
        else:
            values = tuple(v.strip() for v in value.split(",") if v.strip())
        if not values:
            raise ConfigError(f"--where {text!r}: no values to match")
        return cls(field, op, values)


VALUES_FILE_BYTES = 1 << 28
"""The largest file ``FIELD in @FILE`` reads (256 MiB: millions of ids), whole, as UTF-8 text."""


def _values_file(path: Path, text: str) -> str:
    """The text of ``--where "FIELD in @FILE"``'s file: a regular file of UTF-8 text, a value a line,
    at most VALUES_FILE_BYTES; else one line saying what it is."""
    hint = "give a text file of the values, one a line"
    try:
        if not path.is_file():
            what = "does not exist" if not path.exists() else "is not a regular file"
            raise ConfigError(f"--where {text!r}: {path} {what}", hint)
        size = path.stat().st_size
        if size > VALUES_FILE_BYTES:
            raise ConfigError(f"--where {text!r}: {path} is {size:,} bytes, over the "
                              f"{VALUES_FILE_BYTES >> 20} MiB a file of values may hold", hint)
        with open(path, "rb") as f:
            data = f.read(VALUES_FILE_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"--where {text!r}: cannot read {path} ({e.strerror})", hint) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"--where {text!r}: {path} is not UTF-8 text (byte {e.start})", hint) from None


def parse(conditions: Sequence[str] | None, *, files: bool = True) -> list[Condition]:
    """``--where``'s conditions, parsed; ``files``: whether ``@FILE`` values may be read (the CLI's)."""
    return [Condition.parse(c, files=files) for c in conditions or ()]


# ---- writing: a shard's meta.arrow, from its corpus -------------------------------------------------------
def extra_fields(rec: Any, id_column: str | None, text_column: str) -> JSONObject:
    """A corpus record's fields other than its id, title and text ({} for a text line)."""
    if isinstance(rec.data, str):
        return {}
    skip = {id_column or "_id", "_id", "id", "title", text_column}
    return {k: v for k, v in rec.fields().items() if k not in skip}


def write_meta(shard: Path, corpus: Path, id_column: str | None, text_column: str, count: int,
               repeat: np.ndarray | None = None, known: Mapping[str, str] | None = None) -> None:
    """The corpus's documents' fields into ``shard``'s meta.arrow: one pass for each field's kind (an
    error names the first document whose value is of another), one to write CHUNK documents at a time.
    None written when no document has a field. The documents are the shard's, in order (``count``
    rows); ``repeat``: a chunked shard's chunks a document, each a row with its document's fields;
    ``known``: the kinds the index's other shards give its fields (an append or an upsert keeps them)."""
    import pyarrow as pa

    from mlmkit.text.records import iter_inputs

    kinds: dict[str, str] = {}
    for rec in iter_inputs(corpus):
        for k, v in extra_fields(rec, id_column, text_column).items():
            kind = "null" if v is None else KINDS.get(type(v), "list or object")
            if isinstance(v, int) and not isinstance(v, bool) and not _float_holds(v):
                raise rec.error(f"field {k!r} is a number no float holds ({len(str(abs(v)))} digits)", k,
                                hint="give it as a string, or as a number within 1e308")
            was = (known or {}).get(k, "null")
            if "null" not in (kind, was) and kind != was:
                raise rec.error(f"field {k!r} is a {kind} here and a {was} in the index's other documents", k,
                                hint="give a field one kind of value in every document (numbers, strings or "
                                     "booleans)")
            seen = kinds.setdefault(k, kind)
            if kind != seen and "null" not in (kind, seen):
                raise rec.error(f"field {k!r} is a {kind} here and a {seen} before", k,
                                hint="give a field one kind of value in every document (numbers, strings or "
                                     "booleans)")
            if seen == "null":
                kinds[k] = kind
    if not kinds:
        return
    types = {"boolean": pa.bool_(), "number": pa.float64(), "string": pa.string(), "null": pa.null()}
    schema = pa.schema([pa.field(k, types.get(kind, pa.string()),
                                 metadata=None if kind in types else {"mlmkit": "json"})
                        for k, kind in kinds.items()])
    rows: list[JSONObject] = []
    written = 0
    with pa.ipc.new_file(str(shard / META), schema) as w:
        for n, rec in enumerate(iter_inputs(corpus)):
            fields = extra_fields(rec, id_column, text_column)
            rows += [{k: _stored(fields.get(k), kinds[k]) for k in kinds}] * (int(repeat[n])
                                                                              if repeat is not None else 1)
            if len(rows) >= CHUNK:
                w.write_table(pa.Table.from_pylist(rows, schema=schema))
                written, rows = written + len(rows), []
        if rows:
            w.write_table(pa.Table.from_pylist(rows, schema=schema))
            written += len(rows)
    if written != count:
        raise DataFormatError(corpus, f"read {written:,} documents for their fields; {count:,} were indexed: "
                                      "the corpus "
                              "changed while the index was built",
                              hint="build again from a corpus that stays as it is")


def _float_holds(n: int) -> bool:
    try:
        return math.isfinite(float(n))
    except OverflowError:
        return False


def _stored(value: Any, kind: str) -> Any:
    if value is None or kind in ("boolean", "number", "string", "null"):
        return float(value) if kind == "number" and value is not None else value
    import json

    return json.dumps(value, ensure_ascii=False)  # a list or an object: kept as its JSON text


ARROW_KINDS = {"bool": "boolean", "double": "number", "string": "string", "json": "list or object",
               "null": "null"}
"""A stored field's Arrow type (fields()) -> the kind write_meta gave it."""


def field_kinds(ix: StoredIndex) -> dict[str, str]:
    """The kinds of the index's fields (write_meta's names), over its shards: what a new shard keeps."""
    return {k: ARROW_KINDS.get(v, "list or object") for k, v in fields(ix).items() if k != "id"}


def read_meta(shard: Path, count: int) -> Any:
    """A shard's meta.arrow (memory-mapped), None when it has none; checked against its count."""
    import pyarrow as pa

    f = shard / META
    if not f.is_file():
        return None
    try:
        table = pa.ipc.open_file(pa.memory_map(str(f))).read_all()
    except (OSError, pa.ArrowInvalid) as e:
        raise ConfigError(f"{f}: not a readable metadata file ({str(e).splitlines()[0]})",
                          "rebuild the index") from None
    if table.num_rows != count:
        raise ConfigError(f"{f} holds {table.num_rows:,} documents; the manifest says {count:,}",
                          "rebuild the index")
    return table


# ---- filtering ---------------------------------------------------------------------------------------------
def fields(ix: StoredIndex, tables: Sequence[Any] | None = None) -> dict[str, str]:
    """The index's fields and their Arrow types, over its shards (``id`` among them); ``tables``: the
    shards' meta.arrow already read (read_meta), else they are read here."""
    out = {"id": "string"}
    for table in tables if tables is not None else [read_meta(ix.path / s.name, s.count)
                                                    for s in ix.manifest.shards]:
        for f in table.schema if table is not None else ():
            out.setdefault(f.name, "json" if (f.metadata or {}).get(b"mlmkit") == b"json" else str(f.type))
    return out


def rows(ix: StoredIndex, conditions: Sequence[Condition]) -> np.ndarray | None:
    """The rows that pass every condition, (count,) bool; None for no conditions. An unknown field, or
    an operator its kind has no meaning for, is one line naming them."""
    if not conditions:
        return None
    tables = [read_meta(ix.path / s.name, s.count) for s in ix.manifest.shards]  # memory-mapped, read once
    known = fields(ix, tables)
    for c in conditions:
        if c.field not in known:
            raise ConfigError(f"--where {c.field}: the index has no field {c.field!r}",
                              f"its fields: {', '.join(known)}")
        if known[c.field] == "json":
            raise ConfigError(f"--where {c.field}: {c.field} holds lists or objects (kept as their JSON "
                              "text), which a "
                              "filter does not compare",
                              "give the documents a field of numbers, strings or booleans")
    out = np.ones(ix.count, dtype=np.bool_)
    start = 0
    for k, (s, table) in enumerate(zip(ix.manifest.shards, tables)):
        for c in conditions:
            has = table is not None and c.field in table.column_names
            column = _ids(ix, k) if c.field == "id" else table.column(c.field) if has else None
            out[start:start + s.count] &= _passes(column, c, s.count)
        start += s.count
    return out


def _ids(ix: StoredIndex, k: int) -> Any:
    """Shard ``k``'s documents' ids, a row each (a chunked index's rows without their chunk's number)."""
    import pyarrow.compute as pc

    ids = ix.shards[k][1]
    return pc.replace_substring_regex(ids, pattern=f"{SEPARATOR}[0-9]+$",
                                      replacement="") if ix.chunked else ids


def _passes(column: Any, c: Condition, n: int) -> np.ndarray:
    """Whether each of a shard's ``n`` documents passes ``c`` (a missing column, or one of no values:
    only != passes)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if column is None or pa.types.is_null(column.type):
        return np.full(n, c.op == "!=", dtype=np.bool_)
    values = [_value(v, str(column.type), c) for v in c.values]
    if c.op == "in":
        got = pc.is_in(column, value_set=pa.array(values, type=column.type))
    else:
        fn = {"=": pc.equal, "!=": pc.not_equal, ">=": pc.greater_equal, "<=": pc.less_equal, ">": pc.greater,
              "<": pc.less}[c.op]
        got = fn(column, pa.scalar(values[0], type=column.type))
        if c.op == "!=":
            got = pc.or_kleene(got, pc.is_null(column))
    got = pc.fill_null(got, False)
    got = got.combine_chunks() if isinstance(got, pa.ChunkedArray) else got
    return np.asarray(got.to_numpy(zero_copy_only=False), dtype=np.bool_)


def _value(text: str, kind: str, c: Condition) -> Any:
    """A condition's value as the field's kind: a number, a boolean or a string (ordered operators need
    numbers)."""
    if kind in ("double", "int64", "float"):
        try:
            return float(text)
        except ValueError:
            raise ConfigError(f"--where {c.field}{c.op}{text}: {c.field} holds numbers; {text!r} is not "
                              "one") from None
    if c.op in (">=", "<=", ">", "<"):
        raise ConfigError(f"--where {c.field}{c.op}{text}: {c.field} holds {kind} values; {c.op} compares "
                          "numbers",
                          "use =, != or in")
    if kind == "bool":
        if text.lower() not in ("true", "false"):
            raise ConfigError(f"--where {c.field}={text}: {c.field} holds booleans: give true or false")
        return text.lower() == "true"
    if kind != "string":
        raise ConfigError(f"--where {c.field}: {c.field} holds {kind} values, which a filter does not "
                          "compare")
    return text
