"""Watching and comparing runs: MLflow and TensorBoard reporting (resumes included), curves, model
cards, fine-tuning data from Parquet and `datasets` directories, and Optuna sweeps."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import make_base_model, run_export, run_finetune
from hostile import cli

from mlmkit.errors import ConfigError, DataFormatError
from mlmkit.registry import get_task
from mlmkit.rundir.cards import MARKER
from mlmkit.train.tracking import RunInfo

pytest.importorskip("mlflow")
pytest.importorskip("tensorboard")

WORDS = "good bad fine poor great awful nice grim".split()
POSITIVE = {"good", "fine", "great", "nice"}


def clf_rows(n: int, seed: int = 0) -> list[dict]:
    import random

    rng = random.Random(seed)
    rows = []
    for i in range(n):
        w = rng.choice(WORDS)
        rows.append({"text": f"the {w} thing number {i % 7}", "label": "pos" if w in POSITIVE else "neg"})
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def clf(tmp_path_factory):
    d = tmp_path_factory.mktemp("clf")
    rows = clf_rows(96)
    base = make_base_model(d / "base", [r["text"] for r in rows] * 2)
    return {"base": base, "train": write_jsonl(d / "train.jsonl", rows),
            "eval": write_jsonl(d / "eval.jsonl", clf_rows(32, 1)),
            "dir": d}


@pytest.fixture
def no_curves(monkeypatch):
    """For runs whose curves no assertion reads (sweeps' trials, the Parquet runs): training ends as where
    matplotlib is not installed, with no curves.png, which costs about half a second a run. The curves
    are checked by the tests of their own below and by the MLflow test (its artifacts)."""
    from mlmkit.train import plots

    def not_installed():
        raise ConfigError("plotting needs matplotlib", "pip install 'mlmkit[plots]'")

    monkeypatch.setattr(plots, "_pyplot", not_installed)


# ---- MLflow and TensorBoard --------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """A real MLflow tracking server on a loopback port, sqlite backend, serving artifacts itself: the
    uvicorn process `mlflow server` starts, with the settings it passes it in the environment (the CLI's
    own process would cost seconds of imports more)."""
    import httpx

    d = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "_MLFLOW_SERVER_FILE_STORE": f"sqlite:///{d}/mlflow.db",
           "_MLFLOW_SERVER_SERVE_ARTIFACTS": "true",
           "_MLFLOW_SERVER_ARTIFACT_DESTINATION": str(d / "artifacts"),
           "_MLFLOW_SERVER_ARTIFACT_ROOT": "mlflow-artifacts:/"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "mlflow.server.fastapi_app:app"],
        stdout=subprocess.DEVNULL, stderr=open(d / "server.log", "wb"), env=env, cwd=d)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:  # up, and its store made (the database's tables are created at the first request that reads it)
            if httpx.post(url + "/api/2.0/mlflow/experiments/search", json={"max_results": 1},
                          timeout=60).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail("the MLflow server did not start:\n" + (d / "server.log").read_text()[-3000:])
        time.sleep(0.1)
    assert (d / "mlflow.db").is_file()  # the sqlite store asked for, not a default one
    yield url
    proc.terminate()
    proc.wait(timeout=30)


class Kill:
    """A reporter that stops the run at ``step`` as a Ctrl-C would, after that step was logged."""

    def __init__(self, step: int) -> None:
        self.step = step

    def start(self, run: RunInfo) -> None:
        pass

    def log(self, step: int, scalars: dict) -> None:
        if step >= self.step:
            raise KeyboardInterrupt

    def finish(self, files, status: str) -> None:
        pass


def tb_steps(run: Path, tag: str) -> list[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    return [e.step for e in acc.Scalars(tag)]


def test_tensorboard_where_it_cannot_write_is_one_line_and_a_failing_close_a_warning(tmp_path, caplog):
    """A run directory tensorboard cannot write (read-only; here its tensorboard/ is a file): refused at
    the start in one line, before the writer's thread exists (it printed a traceback from there); a
    close that fails at the end of a run is a warning, so the run's own error stays the one shown."""
    from mlmkit.train.tracking import RunInfo, TensorBoard

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "tensorboard").write_text("a file where the directory goes")
    with pytest.raises(ConfigError, match=r"--report-to tensorboard: cannot write .*tensorboard"):
        TensorBoard().start(RunInfo(tmp_path / "run", {}))
    tb = TensorBoard()
    tb.start(RunInfo(tmp_path / "ok", {"lr": 0.1}))
    real = tb.writer

    class ReadOnly:
        def close(self):
            real.close()
            raise OSError(30, "Read-only file system")

    tb.writer = ReadOnly()
    with caplog.at_level("WARNING", logger="mlmkit"):
        tb.finish([], "FAILED")
    assert "Read-only file system" in caplog.text


def test_a_tracking_server_answering_500_costs_seconds_not_minutes(tmp_path, monkeypatch, caplog):
    """MLflow retries a 500 seven times at a back-off factor of 2 (a run stalled 258 s at its first
    failing call): mlmkit sets 2 retries at a factor of 1 unless the environment says otherwise. The
    back-offs urllib3 asks for are counted into the cost, not slept."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from mlflow.tracking import MlflowClient
    from urllib3.util.retry import Retry

    from mlmkit.train.tracking import MLflow, RunInfo

    class Broken(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(500)
            self.end_headers()

        do_POST = do_GET

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Broken)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    for k in MLflow.RETRIES:  # restored after the test: start sets them for the process
        monkeypatch.setenv(k, "0")
        monkeypatch.delenv(k)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", url)
    # attach: a GET, which MLflow retries (3.18 retries no POST that creates a run)
    monkeypatch.setenv("MLFLOW_RUN_ID", "r1")
    # each back-off, with MLflow's jitter: MLflow's defaults ask for 0 + 4 + 8 + ... + 120
    waits: list[float] = []
    monkeypatch.setattr(Retry, "_sleep_backoff", lambda self: waits.append(self.get_backoff_time()))
    try:
        t0 = time.perf_counter()
        with pytest.raises(ConfigError, match="cannot use the tracking store"):
            MLflow().start(RunInfo(tmp_path, {"lr": 0.1}))
        assert waits and time.perf_counter() - t0 + sum(waits) < 20, waits
        assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "2"
        rep = MLflow()  # a run whose server starts failing mid-run
        rep.client, rep.run_id, rep.done, rep.failed = MlflowClient(url), "0" * 32, {}, False
        waits.clear()
        t0 = time.perf_counter()
        with caplog.at_level("WARNING", logger="mlmkit"):
            rep.log(1, {"loss": 1.0})
            rep.log(2, {"loss": 0.5})  # after the first failure: no more calls
        assert waits and time.perf_counter() - t0 + sum(waits) < 20, waits
        assert caplog.text.count("no more MLflow logging") == 1
    finally:
        server.shutdown()


def test_mlflow_server_and_tensorboard_get_the_run_and_a_resume_adds_no_duplicate_steps(
    clf, mlflow_server, tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    from mlmkit.args import FinetuneArgs
    from mlmkit.train.finetune import finetune

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "mlmkit-tests")
    out = tmp_path / "run"
    kw = dict(task="classification", model=clf["base"], train_file=clf["train"], eval_file=clf["eval"],
              out=out, steps=24,
              eval_every=8, log_every=4, lr=1e-3, batch_size=16, report_to="tensorboard,mlflow")
    with pytest.raises(KeyboardInterrupt):  # killed after step 20 was logged; the last checkpoint is step 16
        finetune(FinetuneArgs.from_flat(**kw), reporters=[Kill(20)])
    run_id = json.loads((out / "tracking.json").read_text())["mlflow_run_id"]
    client = MlflowClient(mlflow_server)
    assert client.get_run(run_id).info.status == "KILLED"
    assert [m.step for m in client.get_metric_history(run_id, "loss")] == [4, 8, 12, 16, 20]

    result = finetune(FinetuneArgs.from_flat(**kw, resume=True))
    run = client.get_run(run_id)
    assert (run.info.status == "FINISHED" and run.info.experiment_id
            == client.get_experiment_by_name("mlmkit-tests").experiment_id)
    assert run.data.params["lr"] == "0.001" and run.data.params["task"] == "classification"
    assert run.data.params["batch_size"] == "16" and run.data.params["report_to"] == "tensorboard,mlflow"
    loss = client.get_metric_history(run_id, "loss")
    assert [m.step for m in loss] == [4, 8, 12, 16, 20, 24]  # each step once, across the kill
    assert [m.step for m in client.get_metric_history(run_id, "eval_accuracy")] == [8, 16, 24]
    assert {m.key for m in client.get_metric_history(run_id, "lr")} == {"lr"}
    logged = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m.value for m in loss] == pytest.approx([r["loss"] for r in logged if "loss" in r])
    assert result["eval_accuracy"] == max(m.value for m in client.get_metric_history(run_id, "eval_accuracy"))
    artifacts = {a.path for a in client.list_artifacts(run_id)}
    assert {"mlmkit.json", "config.json", "metrics.jsonl", "README.md", "curves.png"} <= artifacts
    assert "model.safetensors" not in artifacts  # only with --log-model

    assert tb_steps(out, "train/loss") == [4, 8, 12, 16, 20, 24]
    assert tb_steps(out, "eval/accuracy") == [8, 16, 24]


def test_report_to_errors_are_one_line(clf, tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="unknown backend wandbx.*tensorboard, mlflow"):
        run_finetune("classification", clf["base"], clf["train"], tmp_path / "a", steps=2, report_to="wandbx")
    # an unreachable or unusable store: test_a_tracking_store_fails_in_seconds_and_its_password_is_never_shown


def test_a_tracking_store_fails_in_seconds_and_its_password_is_never_shown(clf, tmp_path, monkeypatch):
    import time

    from mlmkit.errors import redacted, scrubbed

    port = free_port()  # nothing listens: MLflow's own retries would take minutes
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://alice:hunter%402@127.0.0.1:{port}/")
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match="cannot use the tracking store") as e:
        run_finetune("classification", clf["base"], clf["train"], tmp_path / "a", steps=2, report_to="mlflow")
    assert time.monotonic() - t0 < 30 and not (tmp_path / "a" / "model.safetensors").exists()
    assert "hunter" not in str(e.value) and f"http://alice:***@127.0.0.1:{port}/" in str(e.value)
    (tmp_path / "file").write_text("x")  # a store that cannot be made: a file where its directory goes
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"file://{tmp_path}/file/mlruns")
    with pytest.raises(ConfigError, match="cannot use the tracking store"):
        run_finetune("classification", clf["base"], clf["train"], tmp_path / "b", steps=2, report_to="mlflow")
    assert redacted("postgresql://bob:s3cr%40t@db:5432/optuna") == "postgresql://bob:***@db:5432/optuna"
    assert redacted("sqlite:///runs/sweep.db") == "sqlite:///runs/sweep.db"
    assert scrubbed("could not log in as bob with s3cr@t to postgresql://bob:s3cr%40t@db/x",
                    "postgresql://bob:s3cr%40t@db/x") \
        == "could not log in as bob with *** to postgresql://bob:***@db/x"


# ---- curves and cards --------------------------------------------------------------------------
def png_size(path: Path) -> tuple[int, int]:
    from PIL import Image

    with Image.open(path) as im:
        im.verify()
    with Image.open(path) as im:
        return im.size


def front_matter(text: str) -> dict:
    assert text.startswith("---\n")
    return yaml.safe_load(text.split("---\n", 2)[1])


def test_plot_two_runs_cards_and_bundle_card(clf, tmp_path):
    runs = []
    for lr in (1e-3, 1e-4):
        out = tmp_path / f"lr{lr}"
        run_finetune("classification", clf["base"], clf["train"], out, eval_file=clf["eval"], steps=12,
                     eval_every=6,
                     log_every=3, lr=lr, batch_size=16)
        assert png_size(out / "curves.png")[0] > 300  # each run draws its own curves at the end
        runs.append(out)
    r = cli("plot", *runs, "--out", tmp_path / "both.png")  # `mlmkit plot`, in this process
    assert r.exit_code == 0, (r.output, r.exception)
    w, h = png_size(tmp_path / "both.png")
    assert w > 1000 and h > 300  # loss, lr and three evaluation panels

    card = (runs[0] / "README.md").read_text()
    meta = json.loads((runs[0] / "mlmkit.json").read_text())
    fm = front_matter(card)
    assert fm["library_name"] == "mlmkit" and fm["pipeline_tag"] == "text-classification"
    got = {m["type"]: m["value"] for m in fm["model-index"][0]["results"][0]["metrics"]}
    assert got["accuracy"] == pytest.approx(meta["best_metrics"]["accuracy"], abs=1e-6)
    assert set(got) == {"accuracy", "macro_f1", "mcc"}
    assert ("BertForSequenceClassification.from_pretrained" in card
            and "![training curves](curves.png)" in card)

    bundle = tmp_path / "bundle"
    run_export(runs[0], bundle)
    bcard = (bundle / "README.md").read_text()
    bfm = front_matter(bcard)
    assert "onnx" in bfm["tags"] and bfm["pipeline_tag"] == "text-classification"
    assert ("| opset | 17 |" in bcard and "SkipLayerNormalization" in bcard
            and "mlmkit classify bundle" in bcard)
    assert (bundle / "curves.png").exists()

    (bundle / "README.md").write_text("# my own notes\n")  # not mlmkit's: kept on the next export
    run_export(runs[0], bundle)
    assert (bundle / "README.md").read_text() == "# my own notes\n"
    # still carries the marker: rewritten
    (bundle / "README.md").write_text(bcard.replace("# bundle", "# bundle (edited)"))
    run_export(runs[0], bundle)
    assert (MARKER in (bundle / "README.md").read_text()
            and "(edited)" not in (bundle / "README.md").read_text())
    r = cli("plot", runs[0], "--out", tmp_path / "x.gif")
    assert r.exit_code == 2 and "unknown picture format" in r.stderr


def test_plot_leaves_out_records_whose_step_or_value_no_float_holds(tmp_path, caplog):
    """A metrics.jsonl edited by hand (a 401-digit step, a 401-digit loss, a step of true): plotted
    without them, a warning naming the lines, never an OverflowError."""
    pytest.importorskip("matplotlib")
    from mlmkit.train.plots import plot_runs, read_metrics, series

    run = tmp_path / "run"
    run.mkdir()
    lines = [{"step": 1, "loss": 2.0}, {"step": 10**400, "loss": 1.0}, {"step": 2, "loss": 10**400},
             {"step": True, "loss": 1.5},
             {"step": 3, "loss": 1.2}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    with caplog.at_level("WARNING", logger="mlmkit"):
        assert series(read_metrics(run)) == {"loss": [(1, 2.0), (3, 1.2)]}
    assert "line 2, 4" in caplog.text
    r = cli("plot", run, "--out", tmp_path / "c.png")  # `mlmkit plot`, in this process
    assert r.exit_code == 0 and r.exception is None and "Traceback" not in r.stderr, (r.stderr, r.exception)
    assert png_size(tmp_path / "c.png")[0] > 100
    plot_runs([run], tmp_path / "d.svg")


def test_pretraining_card_and_curves_show_mlm_baselines(tmp_path):
    from conftest import run_pretrain

    from mlmkit.train.plots import panels, read_metrics, series

    corpus = tmp_path / "c.txt"
    corpus.write_text("".join(f"the {w} cat sat on the mat number {i}.\n" + ("\n" if i % 5 == 4 else "")
                              for i, w in enumerate(WORDS * 12)))
    out = tmp_path / "pre"
    run_pretrain([corpus], out, steps=6, eval_every=3, log_every=3, batch_size=8, seq_len=32, vocab_size=200)
    fm = front_matter((out / "README.md").read_text())
    assert fm["pipeline_tag"] == "fill-mask"
    assert "mlm_accuracy" in {m["type"] for m in fm["model-index"][0]["results"][0]["metrics"]}
    s = series(read_metrics(out))
    assert "eval_mlm_accuracy" in panels({"pre": s}) and "eval_mlm_uniform_baseline" not in panels({"pre": s})
    assert png_size(out / "curves.png")[0] > 300


# ---- Parquet and datasets directories ----------------------------------------------------------
def tag_rows(n: int) -> list[dict]:
    rows = []
    for i in range(n):
        w = WORDS[i % len(WORDS)]
        rows.append({"tokens": ["the", w, "cat", str(i % 5)],
                     "tags": ["O", "B-ADJ" if w in POSITIVE else "O", "B-N", "O"]})
    return rows


def qa_rows(n: int) -> list[dict]:
    rows = []
    for i in range(n):
        w = WORDS[i % len(WORDS)]
        context = f"the cat was {w} and the dog was calm number {i % 5}"
        rows.append({"id": str(i), "question": "how was the cat?", "context": context,
                     "answers": {"text": [w], "answer_start": [context.index(w)]}})
    return rows


def save_forms(d: Path, rows: list[dict]) -> dict[str, Path]:
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    d.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), d / "data.parquet", row_group_size=7)  # several row groups
    datasets.Dataset.from_list(rows).save_to_disk(str(d / "hf"), num_shards=3)  # several Arrow files
    return {"jsonl": write_jsonl(d / "data.jsonl", rows), "parquet": d / "data.parquet", "datasets": d / "hf"}


def strip(examples: list[dict]) -> list[dict]:
    return [{k: v for k, v in ex.items() if k not in ("source", "line", "format")} for ex in examples]


@pytest.mark.parametrize("task,rows",
                         [("classification", clf_rows(40)), ("tagging", tag_rows(40)), ("qa", qa_rows(40))])
@pytest.mark.usefixtures("no_curves")
def test_every_task_trains_from_parquet_and_datasets_as_from_jsonl(task, rows, tmp_path):
    forms = save_forms(tmp_path / "data", rows)
    assert len(list((forms["datasets"]).glob("*.arrow"))) > 1
    t = get_task(task)
    opts = t.resolve_options({})
    want = strip(t.read(forms["jsonl"], opts))
    texts = [r.get("text") or r.get("context") or " ".join(r["tokens"]) for r in rows]
    base = make_base_model(tmp_path / "base", texts * 2)
    losses = {}
    for name, path in forms.items():
        assert strip(t.read(path, opts)) == want, name
        out = tmp_path / name
        run_finetune(task, base, path, out, eval_file=path, steps=4, log_every=1, batch_size=8, lr=1e-3)
        losses[name] = [json.loads(x)["loss"] for x in (out / "metrics.jsonl").read_text().splitlines()
                        if '"loss"' in x]
    assert losses["parquet"] == losses["jsonl"] and losses["datasets"] == losses["jsonl"]


def test_table_errors_name_file_row_and_field(tmp_path):
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    t = get_task("classification")
    opts = t.resolve_options({})
    rows = clf_rows(5)
    rows[3]["label"] = None
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "bad.parquet")
    with pytest.raises(DataFormatError, match=r"bad\.parquet, row 4, field 'label'"):
        t.read(tmp_path / "bad.parquet", opts)
    (tmp_path / "broken.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(DataFormatError, match=r"broken\.parquet: not a readable Parquet file"):
        t.read(tmp_path / "broken.parquet", opts)
    datasets.DatasetDict({"train": datasets.Dataset.from_list(clf_rows(4)),
                          "validation": datasets.Dataset.from_list(clf_rows(4))}).save_to_disk(str(
                              tmp_path / "dd"))
    with pytest.raises(DataFormatError, match=r"DatasetDict directory \(train, validation\)") as e:
        t.read(tmp_path / "dd", opts)
    assert str(tmp_path / "dd" / "train") in e.value.hint
    assert len(t.read(tmp_path / "dd" / "validation", opts)) == 4


# ---- sweeps ------------------------------------------------------------------------------------
def sweep_cmd(clf, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "mlmkit", "sweep", "classification", "--model", str(clf["base"]), "--train",
            str(clf["train"]),
            "--eval", str(clf["eval"]), "--out", str(out), "--steps", "6", "--eval-every", "3",
            "--batch-size", "16",
            "--search", "lr=1e-4:3e-3:log", "--search", "warmup_ratio=0,0.2", "--json", *extra]


def run_sweep(clf, out: Path, trials: int, *search: str, seed: int = 0, storage: str | None = None, **kw):
    """The sweep sweep_cmd runs, in this process."""
    from mlmkit.args import SweepArgs
    from mlmkit.train.sweep import sweep

    return sweep(SweepArgs.from_flat(task="classification", model=clf["base"], train_file=clf["train"],
                                     eval_file=clf["eval"],
                                     out=out, steps=6, eval_every=3, batch_size=16, trials=trials, seed=seed,
                                     storage=storage,
                                     search=["lr=1e-4:3e-3:log", "warmup_ratio=0,0.2", *search], **kw))


@pytest.mark.usefixtures("no_curves")
def test_a_sweep_takes_a_64_bit_seed(clf, tmp_path):
    """optuna's sampler takes 32-bit seeds: a larger --seed was refused as a bad --storage."""
    best = run_sweep(clf, tmp_path / "sweep", 1, seed=2**64 - 1)
    assert len(best["trials"]) == 1


@pytest.mark.usefixtures("no_curves")
def test_sweep_finds_its_best_trial_and_resumes(clf, tmp_path):
    import optuna

    out = tmp_path / "sweep"
    best = run_sweep(clf, out, 3)
    study = optuna.load_study(study_name="mlmkit-sweep", storage=f"sqlite:///{out / 'sweep.db'}")
    done = [t for t in study.trials if t.state.name in ("COMPLETE", "PRUNED")]
    assert len(done) == 3 and len(best["trials"]) == 3
    complete = [t for t in done if t.state.name == "COMPLETE"]
    assert best["best_value"] == max(t.value for t in complete)
    winner = next(t for t in complete if t.value == best["best_value"])
    assert (best["best_params"] == winner.params and Path(best["best_run"])
            == out / f"trial-{winner.number:03d}")
    meta = json.loads((Path(best["best_run"]) / "mlmkit.json").read_text())
    assert meta["best_metrics"]["accuracy"] == best["best_value"]
    assert meta["train_args"]["lr"] == best["best_params"]["lr"]

    run_sweep(clf, out, 4)  # the same study, one trial more
    assert len(optuna.load_study(study_name="mlmkit-sweep",
                                 storage=f"sqlite:///{out / 'sweep.db'}").trials) == 4
    with pytest.raises(ConfigError, match="was made for"):
        run_sweep(clf, out, 5, "seed=1,2")
    with pytest.raises(ConfigError, match="unknown setting 'colour'"):
        run_sweep(clf, tmp_path / "s2", 2, "colour=1:2")
    with pytest.raises(ConfigError, match="LOW must be below HIGH"):
        run_sweep(clf, tmp_path / "s2", 2, "weight_decay=0.1:0.01")


class _NoBackOff:
    """The ``time`` of optuna's RDB storage module without its sleeps: it retries a failed trial
    creation 5 times, sleeping up to 2 s before each retry (random, ~4 s in all)."""

    @staticmethod
    def sleep(seconds: float) -> None:
        pass

    def __getattr__(self, name: str):
        return getattr(time, name)


@pytest.mark.usefixtures("no_curves")
def test_a_read_only_study_is_reported_when_finished_and_refused_in_one_line_when_it_needs_a_write(clf,
                                                                                                   tmp_path,
                                                                                                   monkeypatch):
    """A study in a database that can be read, not written (SQLite's mode=ro: root ignores file
    permissions): a finished sweep reports its best trial (it was refused before it was read), one
    that needs another trial is one line naming the storage, and nothing in the database changes."""
    from optuna.storages._rdb import storage as optuna_rdb

    # the refusal after optuna's retries, without their waits
    monkeypatch.setattr(optuna_rdb, "time", _NoBackOff())
    out = tmp_path / "sweep"
    best = run_sweep(clf, out, 2)
    db = out / "sweep.db"
    before = db.read_bytes()
    ro = f"sqlite:///file:{db}?mode=ro&uri=true"
    assert run_sweep(clf, out, 2, storage=ro)["best_value"] == best["best_value"]
    with pytest.raises(ConfigError, match="readonly database") as e:
        run_sweep(clf, out, 3, storage=ro)
    assert "can be read, not written" in e.value.hint and not (out / "trial-002").exists()
    assert db.read_bytes() == before


@pytest.mark.parametrize("search, words", [
    ("weight_decay=1e-5:inf:log", "inf is not a finite number"),
    ("max_grad_norm=-inf:1e-3", "-inf is not a finite number"),
    ("seed=1e30,1e31", "is past 64 bits"), ("batch_size=1.5:3", "1.5 is not a whole number"),
    ("batch_size=0,0", "batch_size=0: 0 is refused"), ("weight_decay=nan:1", "nan is not a finite number"),
])
def test_a_search_space_fine_tuning_would_refuse_is_one_error_before_any_trial(clf, tmp_path, search, words):
    with pytest.raises(ConfigError, match="--search") as e:
        run_sweep(clf, tmp_path / "s", 2, search)
    assert words in str(e.value) and not (tmp_path / "s" / "trial-000").exists(), str(e.value)


@pytest.mark.usefixtures("no_curves")
def test_a_diverging_trial_is_failed_and_the_sweep_goes_on_in_an_in_memory_study(clf, tmp_path, capfd,
                                                                                 monkeypatch):
    """A trial whose loss turns NaN (the first, here, whatever the sampler picks) is recorded as failed
    and the sweep goes on to its trials; --storage sqlite:// is Optuna's in-memory storage (its heartbeat
    thread printed tracebacks). A setting that every trial would meet ends the sweep with its one error."""
    from mlmkit.args import SweepArgs
    from mlmkit.errors import Diverged
    from mlmkit.train import finetune as finetune_module
    from mlmkit.train.sweep import sweep

    real, calls = finetune_module.finetune, []

    def first_diverges(args, **kw):
        calls.append(args.out)
        if len(calls) == 1:
            raise Diverged("the training loss became nan at step 4: training diverged")
        return real(args, **kw)

    monkeypatch.setattr(finetune_module, "finetune", first_diverges)
    settings = dict(task="classification", model=clf["base"], train_file=clf["train"], eval_file=clf["eval"],
                    steps=6,
                    eval_every=3, batch_size=16, trials=2, storage="sqlite://", search=["lr=1e-4:1e-3:log"])
    best = sweep(SweepArgs.from_flat(out=tmp_path / "s", **settings))
    states = [t["state"] for t in best["trials"]]
    assert states == ["FAIL", "COMPLETE", "COMPLETE"] and best["trial"] in (1, 2), states
    assert "Traceback" not in capfd.readouterr().err and not (tmp_path / "s" / "sweep.db").exists()
    # every trial diverging: the sweep stops after as many failures as trials, with one error
    monkeypatch.setattr(finetune_module, "finetune", lambda args,
                        **kw: (_ for _ in ()).throw(Diverged("nan")))
    with pytest.raises(ConfigError, match="no complete trial"):
        sweep(SweepArgs.from_flat(out=tmp_path / "t", **settings))
    # an error that is not the trial's settings' (here the model is gone): the sweep stops at once with it
    monkeypatch.setattr(finetune_module, "finetune", lambda args,
                        **kw: (_ for _ in ()).throw(ConfigError("no such model")))
    with pytest.raises(ConfigError, match="no such model"):
        sweep(SweepArgs.from_flat(out=tmp_path / "u", **settings))


def test_two_processes_share_one_sqlite_study(clf, tmp_path):
    """`mlmkit sweep` in a process of its own and the same sweep in this one (a second `mlmkit sweep`
    would cost seconds of imports more): this one joins the study once the other trains its first trial."""
    import optuna

    db = f"sqlite:///{tmp_path / 'shared.db'}"
    cmd = sweep_cmd(clf, tmp_path / "m0", "--trials", "3", "--storage", db, "--study", "shared")
    with open(tmp_path / "out.txt", "w") as out, open(tmp_path / "err.txt", "w") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True)
        try:
            deadline = time.monotonic() + 300
            while not list((tmp_path / "m0").glob("trial-*")):  # the other process trains a trial: join it
                assert proc.poll() is None and time.monotonic() < deadline, (
                    tmp_path / "err.txt").read_text()[-3000:]
                time.sleep(0.05)
            here = run_sweep(clf, tmp_path / "m1", 3, storage=db, study="shared")
            proc.wait(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 0, (tmp_path / "err.txt").read_text()[-3000:]
    study = optuna.load_study(study_name="shared", storage=db)
    done = [t for t in study.trials if t.state.name in ("COMPLETE", "PRUNED")]
    assert 3 <= len(done) <= 4  # each process checks the count after its trial: one may start a last one
    assert len({t.number for t in study.trials}) == len(study.trials)
    assert len({t.user_attrs["host"] for t in done}) == 2  # both processes ran trials of the one study
    there = json.loads((tmp_path / "out.txt").read_text().strip().splitlines()[-1])
    assert there["best_value"] == here["best_value"] == study.best_value


def test_a_setting_the_model_refuses_stops_the_sweep_at_its_first_trial_in_one_line(clf, tmp_path, capfd):
    """A --search value only the model can refuse (max_length past its positions, known once the
    checkpoint is read) stops the sweep in the first trial with fine-tuning's own line, not Optuna's
    traceback, and no trial trains."""
    with pytest.raises(ConfigError, match="--max-length 100000 exceeds the model's 512 positions"):
        run_sweep(clf, tmp_path / "s", 2, "max_length=100000,200000")
    assert not list((tmp_path / "s").glob("trial-*/model.safetensors"))
    assert "Traceback" not in capfd.readouterr().err
