"""Tables: Parquet files and `datasets` directories, read a batch of rows at a time as records with the
fields of a JSON-lines file (text/readers.py's ``iter_jsonl`` reads them as it reads JSON lines). Needs
pyarrow (`pip install 'mlmkit[parquet]'`), imported when a table is read. No torch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal, overload

from mlmkit.errors import ConfigError, DataFormatError
from mlmkit.files import MAX_RECORD_BYTES, parse_json
from mlmkit.text.record import Record


def is_table(path: str | Path) -> bool:
    """Whether ``path`` is a Parquet file or a directory saved by `datasets` (``save_to_disk``): record
    sources with the fields of a JSON-lines file, which ``iter_jsonl`` reads as it reads JSON lines."""
    p = Path(path)
    if p.is_dir():
        return (p / "state.json").is_file() or (p / "dataset_dict.json").is_file()
    return p.suffix.lower() == ".parquet"


@overload
def iter_table_rows(path: str | Path, rows: int = ..., *, skip: Literal[False] = ...,
                    max_bytes: int | None = ...,
                    columns: Sequence[str] | None = ..., column_hint: str = ..., ceiling_hint: str = ...,
                    ) -> Iterator[Record]: ...
@overload
def iter_table_rows(path: str | Path, rows: int = ..., *, skip: bool = ..., max_bytes: int | None = ...,
                    columns: Sequence[str] | None = ..., column_hint: str = ..., ceiling_hint: str = ...,
                    ) -> Iterator[Record | DataFormatError]: ...
def iter_table_rows(path: str | Path, rows: int = 1024, *, skip: bool = False,
                    max_bytes: int | None = MAX_RECORD_BYTES,
                    columns: Sequence[str] | None = None, column_hint: str = "check the column names",
                    ceiling_hint: str = "raise --max-record-bytes; --on-error skip steps over it",
                    ) -> Iterator[Record | DataFormatError]:
    """A record {column: value} per row of a Parquet file or `datasets` directory, read a batch of
    ``rows`` at a time (never the whole table); ``line`` is the row number, from 1, and ``schema``
    the table's Arrow schema. A row with a text or binary value of more than ``max_bytes`` is a bad
    record (with ``skip``: its DataFormatError, in its place). ``columns``: read only these (a
    pretraining corpus reads its text column alone); one the table lacks is an error naming the
    columns it has, with ``column_hint``; ``ceiling_hint`` says what to do about a value over the ceiling."""
    p = Path(path)
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError(f"{p}: reading Parquet and datasets directories needs pyarrow",
                          "pip install 'mlmkit[parquet]'") from None
    if p.is_dir():
        sources = _dataset_files(p)
    elif p.is_file():
        sources = [p]
    else:
        raise DataFormatError(p, "file not found", hint="check the path")
    n = 0
    for src in sources:
        try:
            if src.suffix.lower() == ".parquet":
                # pre-buffering kept every row group read, not one at a time
                pf = pq.ParquetFile(src, pre_buffer=False)
                _has_columns(p, pf.schema_arrow.names, columns, column_hint)
                batches = pf.iter_batches(batch_size=rows,
                                          columns=list(columns) if columns is not None else None)
            else:
                batches = _arrow_batches(pa, src)
            for batch in batches:
                if columns is not None and src.suffix.lower() != ".parquet":
                    _has_columns(p, batch.schema.names, columns, column_hint)
                    batch = batch.select(list(columns))
                big = _oversized(pa, batch, max_bytes)
                for i, row in enumerate(batch.to_pylist() if not big else _rows_but(batch, big)):
                    n += 1
                    if i in big:
                        err = DataFormatError(p, f"a value of more than {max_bytes:,} bytes (the record "
                                                 "ceiling)", line=n,
                                              field=big[i], unit="row", hint=ceiling_hint)
                        if not skip:
                            raise err
                        yield err
                        continue
                    yield Record(str(p), n, row, unit="row", schema=batch.schema)
        except (OSError, ValueError, pa.ArrowException) as e:  # ArrowInvalid is a ValueError, not an OSError
            detail = str(e).splitlines()[0][:300] if str(e) else type(e).__name__
            raise DataFormatError(src, "not a readable "
                                       f"{'Parquet' if src.suffix.lower() == '.parquet' else 'Arrow'} "
                                       f"file ({detail})", hint="check the file, or write it again") from None


def _has_columns(p: Path, names: Sequence[str], wanted: Sequence[str] | None, hint: str) -> None:
    for c in wanted or ():
        if c not in names:
            raise DataFormatError(p, f"no column '{c}' (the columns: {', '.join(names)})", hint=hint)


def _oversized(pa: Any, batch: Any, max_bytes: int | None) -> dict[int, str]:
    """{row in the batch: its first column} for rows whose text or binary value exceeds ``max_bytes``
    (found from the Arrow offsets, before any value becomes a Python object)."""
    import pyarrow.compute as pc

    found: dict[int, str] = {}
    if max_bytes is None:
        return found
    for name, col in zip(batch.schema.names, batch.columns):
        t = col.type
        if not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
                or pa.types.is_large_binary(t)):
            continue
        if col.nbytes <= max_bytes:
            continue
        lengths = pc.binary_length(col).to_numpy(zero_copy_only=False)
        for i in (lengths > max_bytes).nonzero()[0].tolist():
            found.setdefault(i, name)
    return found


def _rows_but(batch: Any, left_out: dict[int, str]) -> Iterator[dict[str, Any] | None]:
    """The rows of a batch as dicts, one at a time, None for those ``left_out`` (never made Python
    objects)."""
    for i in range(batch.num_rows):
        yield None if i in left_out else batch.slice(i, 1).to_pylist()[0]


def _arrow_batches(pa: Any, path: Path) -> Iterator[Any]:
    """The record batches of an Arrow file as `datasets` writes them (the IPC stream format; the file
    format too), memory-mapped."""
    source = pa.memory_map(str(path))
    try:
        reader = pa.ipc.open_stream(source)
    except pa.ArrowInvalid:
        file_reader = pa.ipc.open_file(source)
        yield from (file_reader.get_batch(i) for i in range(file_reader.num_record_batches))
        return
    yield from reader


def _dataset_files(d: Path) -> list[Path]:
    """The Arrow files of a directory saved by ``datasets.Dataset.save_to_disk``, in order."""
    if (d / "dataset_dict.json").is_file() and not (d / "state.json").is_file():
        try:
            splits = parse_json((d / "dataset_dict.json").read_text(encoding="utf-8")).get("splits", [])
        except (OSError, ValueError, AttributeError):
            splits = []
        raise DataFormatError(d, f"a DatasetDict directory ({', '.join(map(str, splits)) or 'no splits'}), "
                                 "not one split",
                              hint="pass the split's directory, e.g. "
                              + " or ".join(str(d / s) for s in splits[:2]) if splits
                              else "pass a split's directory")
    try:
        state = parse_json((d / "state.json").read_text(encoding="utf-8"))
        files = [d / f["filename"] for f in state["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DataFormatError(d / "state.json", f"not a datasets state file ({type(e).__name__}: {e})",
                              hint="save the dataset again with save_to_disk") from None
    missing = [f for f in files if not f.is_file()]
    if missing:
        raise DataFormatError(missing[0], "missing: state.json lists it",
                              hint="save the dataset again with save_to_disk")
    return files
