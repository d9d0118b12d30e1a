"""A record of a data file: its data, and its file and first line (or row), so that
``record.error("...", field="label")`` names both. Every reader (text/readers.py, text/tables.py) makes
them. No torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, overload

from mlmkit.errors import DataFormatError


@dataclass(frozen=True)
class Record:
    """One record of a data file: a dict (JSON object, CSV/TSV row) or a str (text line, JSON string)."""

    source: str
    line: int | None
    """The record's first line in its file, counting from 1 (None for an input that has no file)."""
    data: Any
    columns: tuple[str, ...] | None = None
    """The header of a CSV/TSV file."""
    header_line: int | None = None

    unit: str = "line"
    """What ``line`` counts: "line" in text files, "row" in Parquet files and `datasets` directories."""
    schema: Any = field(default=None, compare=False, repr=False)
    """The Arrow schema of the table a Parquet or `datasets` row comes from: the types of its values."""

    def error(self, message: str, field: str | None = None, hint: str | None = None) -> DataFormatError:
        return DataFormatError(self.source, message, line=self.line, field=field, hint=hint, unit=self.unit)

    def fields(self) -> dict[str, Any]:
        """The record as a dict; anything else (a JSON list, a bare text) is an error."""
        if not isinstance(self.data, dict):
            raise self.error(f"expected a JSON object, got {type(self.data).__name__}",
                             hint="one JSON object per line")
        return self.data

    @overload
    def text(self, key: str, *, required: Literal[True] = ..., flag: str | None = ...) -> str: ...
    @overload
    def text(self, key: str, *, required: bool = ..., flag: str | None = ...) -> str | None: ...
    def text(self, key: str, *, required: bool = True, flag: str | None = None) -> str | None:
        """The non-empty string field ``key``; None when it is absent (or null) and not ``required``.
        ``flag`` is the option that renames the field, named in the hint."""
        data = self.fields()
        value = data.get(key)
        if value is None:
            if not required:
                return None
            hint = f"name it with {flag}" if flag else None
            if key in data:  # there, and null (a Parquet or datasets row, JSON's null)
                raise self.error("its value is null", key, "give it a value, or leave the record out")
            if self.columns is None:
                raise self.error(f"no field '{key}'; the record has: {', '.join(data) or 'nothing'}", key,
                                 hint)
            if key in self.columns:
                raise self.error(f"the row has {len(data)} fields and ends before this column", key,
                                 "every row needs as many fields as the header")
            raise DataFormatError(self.source, f"no column '{key}'; the header has: "
                                               f"{', '.join(self.columns) or 'nothing'}",
                                  line=self.header_line, field=key, hint=hint)
        if not isinstance(value, str):
            raise self.error(f"must be a string, not {type(value).__name__}", key)
        if not value.strip():
            raise self.error("empty text", key, "remove the record or fill in its text")
        return value

    def line_text(self, key: str) -> str:
        """A text file's line as it is (one text a line), or a record's non-empty string field ``key``."""
        if isinstance(self.data, str):
            if not self.data.strip():
                raise self.error("empty text", hint="remove the line or fill in its text")
            return self.data
        return self.text(key)
