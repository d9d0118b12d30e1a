"""Windows of a batch job: the input cut into windows of ``window`` records, each one call of the
pipeline, and what a window produced (``Done``: results in input order, error entries, the
records the results are for).

Bad records (with ``--on-error skip``) keep their place in their window; a pipeline's error about
"input N" is told as the file and line (or row) of that record. The job around the windows (worker
processes, the output, --resume) is mlmkit/jobs/batch.py's. No torch here.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from mlmkit.errors import DataFormatError, MlmkitError
from mlmkit.files import JSONObject
from mlmkit.runtime.prediction import truncations_counted
from mlmkit.text.record import Record
from mlmkit.text.records import Item

WINDOW = 4096  # records per window: enough for good length buckets, little enough memory
T = TypeVar("T")


@dataclass
class Window(Generic[T]):
    """Records k*window .. (k+1)*window - 1 of the input (1-based ``first``), good and bad: the items
    of a batch job (Window[Item]), or what another job works on (mining's (query, positive) pairs)."""

    index: int
    first: int
    items: list[T]

    @property
    def records(self) -> list[Record]:
        return [x for x in self.items if isinstance(x, Record)]


def windows(items: Iterable[Item], size: int, skip: int = 0) -> Iterator[Window[Item]]:
    """Windows of ``size`` items, after passing over the first ``skip`` windows (read, not kept)."""
    it, k = iter(items), 0
    while True:
        chunk: list[Item] = []
        for x in it:
            chunk.append(x)
            if len(chunk) == size:
                break
        if not chunk:
            return
        if k >= skip:
            yield Window(k, k * size + 1, chunk)
        k += 1


@dataclass
class Done:
    """What one window produced: results (in input order, bad records left out) and errors."""

    results: list[JSONObject]
    """What the job writes for them (a pipeline's predictions, with the id carried; mined rows)."""
    errors: list[JSONObject] = field(default_factory=list)
    """The lines of --errors: {"source", "line", "error"} each."""
    kept: list[int] = field(default_factory=list)
    """The positions, among the window's records, of those the results are for."""
    truncated: int = 0
    """Inputs longer than the bundle's max length, truncated (the results say so too)."""
    counts: dict[str, int] = field(default_factory=dict)
    """Tallies the job keeps across --resume (Job.counts), e.g. mining's short rows by reason."""


def run_window(pipe: Any, w: Window[Item], options: Mapping[str, Any], *, skip: bool,
               id_column: str | None) -> Done:
    """One window through the pipeline. ``skip``: a bad record becomes an error entry (where it is,
    what is wrong) instead of stopping the job; ``id_column``: the record's id comes along."""
    errors = [_error(x) for x in w.items if not isinstance(x, Record)]
    recs = w.records
    items = [r.data for r in recs]
    if id_column is not None:
        for r in recs:
            if not isinstance(r.data, dict) or id_column not in r.data:
                raise r.error(f"no id column '{id_column}'", id_column,
                              "--id-column needs records (JSONL, CSV, TSV or Parquet) that have it")
    bad: dict[int, MlmkitError] = {}
    with truncations_counted() as cut:  # said once for the whole job
        try:
            got = pipe(items, first=w.first, errors=bad if skip else None, **options)
        except DataFormatError as e:
            at = _position(e, w.first, len(recs))
            raise (_located(e, recs[at]) if at is not None else e) from None
    results, kept = [], []
    for i, (r, res) in enumerate(zip(recs, got)):
        if i in bad:
            errors.append({"source": r.source, "line": r.line, "error": str(_located(bad[i], r))})
        elif res is not None:
            # the carried id goes first and wins over a result's own field of that name (qa's "id", a string)
            results.append({id_column: r.data[id_column], **{k: v for k, v in res.items() if k != id_column}}
                           if id_column is not None else res)
            kept.append(i)
    return Done(results, errors, kept, cut[0])


def _position(e: DataFormatError, first: int, n: int) -> int | None:
    """The window position of the record a pipeline's error names as "input N" (it knows no files)."""
    if e.path.startswith("input ") and e.path[6:].isdigit() and 0 <= int(e.path[6:]) - first < n:
        return int(e.path[6:]) - first
    return None


def _located(e: MlmkitError, r: Record) -> MlmkitError:
    """A pipeline's "input N" error about record ``r``, naming its file and line (or row) instead."""
    # <arguments>, <stdin>: "input N" says it
    if isinstance(e, DataFormatError) and e.path.startswith("input ") and not r.source.startswith("<"):
        return DataFormatError(r.source, e.detail, line=r.line, field=e.field, hint=e.hint, unit=r.unit)
    return e


def _error(e: Exception) -> JSONObject:
    return {"source": getattr(e, "path", None), "line": getattr(e, "line", None), "error": str(e)}

