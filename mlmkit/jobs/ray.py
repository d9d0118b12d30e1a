"""Batch inference on a Ray cluster through Ray Data (`pip install 'mlmkit[ray]'`).

    import ray
    from mlmkit.jobs.ray import predict

    ds = ray.data.read_parquet("shards/")                       # records with the task's fields
    out = predict(ds, "exports/clf", concurrency=4, keep=["id"])  # a ray.data.Dataset
    out.write_parquet("out/")

``map_batches`` over a pool of ``concurrency`` actors, each of which loads the bundle once and
runs it on batches of rows exactly as `mlmkit predict` does locally (the same pipeline, the same
results). A result's fields become columns; nested values (a probability per label, a list of
entities) are JSON text, as in mlmkit's own Parquet output. From the command line:

    mlmkit predict BUNDLE --input 'shards/*.parquet' --output out/ --engine ray [--address auto]
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from mlmkit.errors import ConfigError
from mlmkit.text.records import input_files, parquet_value


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError("--engine ray needs Ray Data", "pip install 'mlmkit[ray]'") from None
    return ray


class _Predictor:
    """One Ray actor: the bundle loaded once, then batch after batch of rows."""

    def __init__(self, bundle: str, options: Mapping[str, Any], batch_size: int, batch_tokens: int | None,
                 threads: int | None,
                 keep: list[str], precision: str | None = None) -> None:
        from mlmkit.runtime.pipeline import Pipeline

        # each actor chooses its precision on its own node (the gate's sample travels in the bundle)
        self.pipe = Pipeline.load(bundle, threads=threads, batch_size=batch_size, batch_tokens=batch_tokens,
                                  precision=precision)
        self.options, self.keep = options, keep

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, list[Any]]:
        columns = list(batch)
        n = len(batch[columns[0]]) if columns else 0
        rows = [{c: _plain(batch[c][i]) for c in columns} for i in range(n)]
        items = [r["text"] if columns == ["text"] else r for r in rows]  # a text file's rows are texts
        results = self.pipe(items, **self.options)
        fields = list(dict.fromkeys(k for r in results for k in r))
        out = {c: [r[c] for r in rows] for c in self.keep}
        out.update({f: [parquet_value(r.get(f)) for r in results] for f in fields if f not in out})
        return out


def _plain(v: Any) -> Any:
    """A numpy scalar or array from a Ray batch as the Python value the pipeline reads."""
    return v.item() if isinstance(v, np.generic) else v.tolist() if isinstance(v, np.ndarray) else v


def predict(dataset: Any, bundle: str | Path, *, options: Mapping[str, Any] | None = None,
            batch_size: int = 32,
            batch_tokens: int | None = None, threads: int | None = None, concurrency: int = 1,
            rows_per_batch: int = 1024,
            keep: list[str] | None = None, precision: str | None = None) -> Any:
    """``dataset`` (a ray.data.Dataset of records with the task's fields, e.g. a "text" column) run
    through ``bundle``: a ray.data.Dataset of results, one row per input row, the ``keep`` columns
    (ids) carried over. ``threads``: onnxruntime threads per actor (default: its share of a node)."""
    ray = _ray()
    # an actor's CPU share leaves one CPU of the cluster to the reads: actors holding every CPU of a small
    # cluster (--workers 2 on 2 cores) left the read tasks none, and the job waited for ever
    cpus = float(ray.cluster_resources().get("CPU", 1)) if ray.is_initialized() else 1.0
    return dataset.map_batches(
        _Predictor, fn_constructor_args=(str(bundle), dict(options or {}), batch_size, batch_tokens, threads,
                                         list(keep or []),
                                         precision),
        batch_size=rows_per_batch, batch_format="numpy", concurrency=concurrency,
        num_cpus=min(1.0, max(0.1, (cpus - 1) / concurrency)),
    )


def embed_in_order(files: list[Path], bundle: str | Path, *, options: Mapping[str, Any],
                   address: str | None = None,
                   workers: int = 1, threads: int | None = None, batch_size: int = 32,
                   rows_per_batch: int = 1024) -> Iterator[Any]:
    """The records of Parquet ``files`` ({id, text}) embedded on the cluster by ``workers`` actors, streamed
    back to this process in the files' order as Arrow batches of ``id`` and ``embedding`` (what
    `mlmkit index --engine ray` writes into its index: the same vectors, in the same order, as a local
    build). Memory here: the batches in flight, never the whole output."""
    ray = init(address)
    ray.data.DataContext.get_current().execution_options.preserve_order = True
    threads = threads or max(1, (os.cpu_count() or 1) // workers)
    out = predict(ray.data.read_parquet([str(f) for f in files]), bundle, options=options,
                  batch_size=batch_size,
                  threads=threads, concurrency=workers, rows_per_batch=rows_per_batch, keep=["id"])
    yield from out.iter_batches(batch_size=rows_per_batch, batch_format="pyarrow")


def read(spec: str | Path) -> Any:
    """The files --input names as one ray.data.Dataset (Parquet, JSON lines, CSV, or text lines as "text")."""
    ray = _ray()
    files = [str(f) for f in input_files(spec)]
    kinds = {Path(f).suffix.lower() for f in files}
    if len(kinds) != 1:
        raise ConfigError(f"--engine ray reads one kind of file at a time, got {', '.join(sorted(kinds))}")
    kind = kinds.pop()
    if kind == ".parquet":
        return ray.data.read_parquet(files)
    if kind == ".jsonl":
        return ray.data.read_json(files, lines=True)
    if kind == ".csv":
        return ray.data.read_csv(files)
    if kind == ".txt":
        return ray.data.read_text(files)
    raise ConfigError(f"--engine ray does not read {kind} files", "use Parquet, JSON lines, CSV or text")


def init(address: str | None) -> Any:
    """Ray, joined to the cluster at ``address`` (e.g. auto), or started here on this machine's cores."""
    ray = _ray()
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False,
                 **({} if address else {"num_cpus": os.cpu_count() or 1}))
    return ray


def run_cli(pipe: Any, args: Any, options: Mapping[str, Any]) -> None:
    """`mlmkit predict ... --engine ray`: read, map, write Parquet shards into the --output directory."""
    _ray()
    if args.input_file is None:
        raise ConfigError("--engine ray reads files", "give --input FILE, DIRECTORY or 'PATTERN'")
    if args.output.suffix:
        raise ConfigError(f"--engine ray writes a directory of Parquet shards, not {args.output}",
                          "give --output DIRECTORY/")
    init(args.address)
    actors = args.workers or 1
    threads = args.threads or max(1, (os.cpu_count() or 1) // actors)
    with output_directory(Path(args.output)) as into:
        out = predict(read(args.input_file), pipe.path, options=options, batch_size=args.batch_size,
                      batch_tokens=args.batch_tokens, threads=threads,
                      concurrency=actors, rows_per_batch=args.window,
                      keep=[args.id_column] if args.id_column else [],
                      precision=args.precision)
        out.write_parquet(str(into))


@contextmanager
def output_directory(output: Path) -> Iterator[Path]:
    """Where a Ray job writes its shards: a directory beside ``output``, which replaces ``output``
    only when every shard is written (a job that fails or is killed leaves the last output whole,
    and its own shards in .OUTPUT.ray-PID for a look). The job holds ``output``'s job lock
    meanwhile, so a second job on the same output is refused, as local jobs are. Checked before any
    work: ``output`` is a new directory, an empty one, or one of Parquet shards (a previous job's);
    a file, or a directory holding anything else, is refused (replacing it would lose that)."""
    from mlmkit.jobs.batch import job_dir
    from mlmkit.locks import exclusive

    if output.exists() and not output.is_dir():
        raise ConfigError(f"--output {output} is a file; --engine ray writes a directory of Parquet shards",
                          "give a new or empty directory")
    other = next((p.name for p in sorted(output.iterdir()) if p.suffix != ".parquet"),
                 None) if output.is_dir() else None
    if other is not None:
        raise ConfigError(f"--output {output} holds {other}, not only Parquet shards: replacing it would "
                          "lose that",
                          "give a new or empty directory")
    output.parent.mkdir(parents=True, exist_ok=True)
    try:
        with exclusive(job_dir(output)):
            into = output.parent / f".{output.name}.ray-{os.getpid()}"
            shutil.rmtree(into, ignore_errors=True)
            yield into
            if not into.is_dir():  # nothing to write (no rows): an empty directory, as Ray leaves none
                into.mkdir()
            old = output.parent / f".{output.name}.old-{os.getpid()}"
            if output.exists():
                os.replace(output, old)
            os.replace(into, output)
            shutil.rmtree(old, ignore_errors=True)
    except ConfigError as e:
        if "is in use" in e.message:
            raise ConfigError(f"--output {output} is being written by another job: {e.message}",
                              e.hint) from None
        raise
