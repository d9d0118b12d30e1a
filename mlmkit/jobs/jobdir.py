"""The job directory of a resumable batch job: part files of finished windows, progress.json, and
the output put together from them.

With an output file a job is resumable. Its work lives in OUTPUT's job directory
(``.OUTPUT.job/``): one part file per finished window, then progress.json, written last (the
window count, the records read, and what the job is: its inputs' paths, sizes and times, the
bundle, the options). A killed job leaves finished windows and a progress record that names
them; ``--resume`` reads past the records already done and goes on, and the output appears, by
a rename, only when every window is there: a complete output file always means a complete job.
A symlink's target is the output (the link stays). The job that holds the directory's lock while
it works is mlmkit/jobs/batch.py's ``batch``.

An --id-column is carried with its type: into Parquet output as the input's Arrow type (Parquet
inputs) or the type its values share (JSON lines), checked window by window, so that an id of
another type is caught at the first window that has one (a bad record, naming its file and row),
never at the final join; into JSON lines as files.json_value writes what JSON has no type for
(timestamps and dates ISO 8601, decimals as text, binary base64).

No torch here.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from mlmkit.errors import ConfigError
from mlmkit.files import JSONObject, atomic_open, atomic_write, json_line, read_json, write_json
from mlmkit.jobs.windows import Done, Window
from mlmkit.locks import LOCK
from mlmkit.text.records import carried_array, result_writer, write_table_text
from mlmkit.typed import COUNT, from_json, to_json

log = logging.getLogger("mlmkit")

T = TypeVar("T")

@dataclass(frozen=True)
class Progress:
    """progress.json, typed: what the job is for (its bundle, inputs and options, compared on
    ``--resume``), how many windows, records, results and errors it finished, and the task's counts."""

    windows: int = field(metadata=COUNT)
    records: int = field(metadata=COUNT)
    results: int = field(metadata=COUNT)
    errors: int = field(metadata=COUNT)
    what: JSONObject = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)

    @classmethod
    def read(cls, path: Path, job: Path) -> Progress:
        """progress.json as a Job writes it, or one line naming the field that is not (a damaged or
        hand-edited file)."""
        return from_json(cls, read_json(path), path, fix=f"delete {job} to start over")


class Job:
    """The job directory of an output file: part files of finished windows, and progress.json."""

    def __init__(self, output: Path, what: JSONObject, *, resume: bool, errors: Path | None) -> None:
        """Call with the job directory's lock held (batch does): this reads, and may discard, what is
        there."""
        self.output, self.what, self.errors = Path(output), json.loads(json.dumps(what, default=str)), errors
        self.dir = job_dir(self.output)
        self.suffix = self.output.suffix.lower() if self.output.suffix.lower() in (".npy",
                                                                                   ".parquet") else ".jsonl"
        self.done = self.read = self.written = self.failed = 0
        self.counts: dict[str, int] = {}
        self.id_column: str | None = self.what.get("id_column")
        self.schema: Any = None  # Parquet: the parts' schemas unified, and the id column's type in it
        self.id_type: Any = None
        progress = self.dir / "progress.json"
        if progress.exists() and not resume and Progress.read(progress, self.dir).windows == 0:
            self.discard()  # a job that finished nothing has nothing to keep
        if progress.exists():
            if not resume:
                raise ConfigError(f"an unfinished job for {self.output} is in {self.dir}",
                                  "pass --resume to continue it, or delete that directory to start over")
            p = Progress.read(progress, self.dir)
            changed = [k for k in sorted({*p.what, *self.what}) if p.what.get(k) != self.what.get(k)]
            if changed:
                raise ConfigError(f"--resume: the job in {self.dir} was for other {', '.join(changed)}",
                                  "resume with the same bundle, inputs and options, or delete that directory "
                                  "to start over")
            self.done, self.read, self.written, self.failed = p.windows, p.records, p.results, p.errors
            self.counts = dict(p.counts)
            log.info("resuming %s after %d records (%d windows)", self.output, self.read, self.done)
            if self.suffix == ".parquet":
                self._known_schema()
        elif resume:
            raise ConfigError(f"--resume: no unfinished job for {self.output}", "drop --resume")
        else:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._save()

    def _save(self) -> None:
        progress = Progress(windows=self.done, records=self.read, results=self.written, errors=self.failed,
                            what=self.what, counts=self.counts)
        write_json(self.dir / "progress.json", to_json(progress))

    def discard(self) -> None:
        """Everything in the job directory but its lock (the directory goes when the lock is let go)."""
        for f in self.dir.iterdir() if self.dir.is_dir() else ():
            if f.is_dir():
                shutil.rmtree(f, ignore_errors=True)
            elif f.name != LOCK:
                f.unlink(missing_ok=True)

    def _known_schema(self) -> None:
        """A resumed Parquet job: the schema its finished parts have, and the id column's type in it."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        schemas = [pq.read_schema(self._part(k)) for k in range(self.done)]
        if schemas:
            self.schema = pa.unify_schemas(schemas, promote_options="permissive")
            if self.id_column in self.schema.names:
                self.id_type = self.schema.field(self.id_column).type

    def _part(self, k: int, kind: str = "") -> Path:
        return self.dir / f"part-{k:06d}{kind}{self.suffix if not kind else '.jsonl'}"

    def add(self, w: Window[T], done: Done) -> Done:
        """A finished window: its part files, then the progress record that counts them (last). A
        Parquet part is checked against those before it (see typed_ids); returns what was written."""
        types = None
        if self.suffix == ".parquet" and self.id_column is not None:
            done = self.typed_ids(w, done)
            types = {self.id_column: self.id_type}
        with result_writer(self._part(w.index), types) as write:
            write(done.results)
        if self.suffix == ".parquet":
            self._check_schema(w)
        if done.errors:
            with atomic_open(self._part(w.index, ".errors")) as f:
                f.writelines(map(json_line, done.errors))
        self.done, self.read = w.index + 1, self.read + len(w.items)
        self.written, self.failed = self.written + len(done.results), self.failed + len(done.errors)
        for k, n in done.counts.items():
            self.counts[k] = self.counts.get(k, 0) + n
        self._save()
        return done

    def typed_ids(self, w: Window[T], done: Done) -> Done:
        """The window's ids as one Arrow type with the ids before it: the input's type (Parquet) or
        the one their values share (JSON), widened as Parquet widens (int64 to double, a wider
        decimal). An id that has none in common with those before is a bad record: with --on-error
        skip an error entry, else a DataFormatError naming its file and row."""
        import pyarrow as pa

        col, skip = str(self.id_column), self.what.get("on_error") == "skip"
        records = [w.records[i] for i in done.kept]
        sources = [r.schema.field(col).type if r.schema is not None and col in r.schema.names else None
                   for r in records]
        one = sources[0] if sources else None
        if len(set(sources)) <= 1 and self._id_type_of(pa, [r[col] for r in done.results], one) is not None:
            return done  # the whole window at once: the usual case
        keep: list[int] = []
        errors = list(done.errors)
        for j, (res, rec, source) in enumerate(zip(done.results, records, sources)):
            got = self._id_type_of(pa, [res[col]], source)
            if got is not None:
                keep.append(j)
                continue
            v = res[col]
            err = rec.error(f"an id of type {type(v).__name__} ({str(v)[:40]!r}) where the ids before it are "
                            f"{self.id_type}: "
                            "a Parquet column holds one type", col,
                            f"give the ids one type, or write .jsonl; to start over delete {self.dir}")
            if not skip:
                raise err
            errors.append({"source": rec.source, "line": rec.line, "error": str(err)})
        if len(keep) == len(done.results):
            return done
        return replace(done, results=[done.results[j] for j in keep], kept=[done.kept[j] for j in keep],
                       errors=errors)

    def _id_type_of(self, pa: Any, values: list[Any], source: Any) -> Any:
        """The id type once ``values`` (of Arrow type ``source``, None: from JSON) are among the ids,
        or None when they cannot be."""
        try:
            t = carried_array(values, source).type
            if self.id_type is not None and t != self.id_type:
                t = pa.unify_schemas([pa.schema([("id", self.id_type)]), pa.schema([("id", t)])],
                                     promote_options="permissive").field("id").type
        except (pa.ArrowException, OverflowError, TypeError, ValueError):
            return None
        if not pa.types.is_null(t):
            self.id_type = t
        return t

    def _check_schema(self, w: Window[T]) -> None:
        """A Parquet part whose columns cannot join those of the parts before: an error now, at the
        window that differs, not at the final join (which --resume would repeat forever)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        part = self._part(w.index)
        schema = pq.read_schema(part)
        try:
            self.schema = schema if self.schema is None else pa.unify_schemas([self.schema, schema],
                                                                               promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
            part.unlink(missing_ok=True)
            first = w.records[0] if w.records else None
            where = (f"{first.source}, {first.unit} {first.line} on" if first is not None
                     else f"records {w.first} on")
            raise ConfigError(f"{where}: results of other types than those before ({str(e).splitlines()[0]})",
                              f"write .jsonl instead; to start over delete {self.dir}") from None

    def finish(self) -> None:
        """Every window is there: the output (and the errors file) put together and renamed into place."""
        parts = [self._part(k) for k in range(self.done)]
        _concatenate(parts, self.output, self.suffix)
        if self.errors is not None and self.failed:
            with atomic_open(self.errors) as f:  # written through when it is a stream (/dev/stderr)
                for k in range(self.done):
                    e = self._part(k, ".errors")
                    if e.exists():
                        f.write(e.read_text(encoding="utf-8"))
        self.discard()


def _concatenate(parts: Sequence[Path], out: Path, suffix: str) -> None:
    if suffix == ".npy":
        arrays = [np.load(p, mmap_mode="r") for p in parts]
        arrays = [a for a in arrays if a.size]
        rows = sum(len(a) for a in arrays)
        dims = arrays[0].shape[1] if arrays else 0

        def write_npy(tmp: str) -> None:
            m = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(rows, dims))
            at = 0
            for a in arrays:
                m[at : at + len(a)] = a
                at += len(a)
            m.flush()
            del m

        atomic_write(out, write_npy)
    elif suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        schemas = [pq.read_schema(p) for p in parts]
        # a field some windows lack (a "truncated" flag, an "error"): a column of nulls there
        schema = pa.unify_schemas(schemas, promote_options="permissive") if schemas else pa.schema([])

        def write_parquet(tmp: str) -> None:
            with pq.ParquetWriter(tmp, schema) as w:
                for p in parts:  # one window's table at a time
                    t = pq.read_table(p)
                    if t.num_rows:
                        w.write_table(pa.table({f.name: t[f.name].cast(f.type) if f.name in t.column_names
                                                else pa.nulls(t.num_rows, f.type) for f in schema},
                                               schema=schema))

        atomic_write(out, write_parquet)
    elif out.suffix.lower() in (".csv", ".tsv"):
        atomic_write(out,
                     lambda tmp: write_table_text(parts, tmp, "\t" if out.suffix.lower() == ".tsv" else ","))
    else:
        def write_jsonl(tmp: str) -> None:
            with open(tmp, "wb") as f:
                for p in parts:
                    with open(p, "rb") as part:
                        shutil.copyfileobj(part, f)

        atomic_write(out, write_jsonl)


def job_dir(output: Path) -> Path:
    """The job directory of an output file: ``.OUTPUT.job`` beside it."""
    return output.parent / f".{output.name}.job"


def owned_output(output: Path) -> Path:
    """The file a job with --output ``output`` writes: a symlink's target (the link stays a link),
    else ``output``; a directory is refused before any work (not at the final rename)."""
    target = Path(os.path.realpath(output)) if output.is_symlink() else output
    if target.is_dir():
        raise ConfigError(f"--output {output} is a directory",
                          "give a file name: .jsonl, .parquet, .csv, .tsv or .npy")
    return target


def remove_empty(d: Path) -> None:
    """Remove a job directory that holds nothing (its lock let go); leave one that holds work."""
    try:
        d.rmdir()
    except OSError:  # not empty (an unfinished job), gone, or taken by the next job
        pass
