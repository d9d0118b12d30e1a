"""Watching runs: MLflow and TensorBoard reporting (resumes included), and the curves and model cards
of two runs and their bundle (`mlmkit plot`)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from clf_data import clf_fixture  # noqa: F401  (the fixture `clf`)
from conftest import run_export, run_finetune
from hostile import cli
from plot_helpers import front_matter, png_size

from mlmkit.errors import ConfigError
from mlmkit.rundir.cards import MARKER
from mlmkit.train.tracking import RunInfo

pytest.importorskip("mlflow")
pytest.importorskip("tensorboard")


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






def test_tracking_json_is_read_by_the_typed_reader(tmp_path: Path) -> None:
    """A resumed run's tracking.json: a wrong field is one line naming the file and the field; keys of
    another version are kept as written."""
    from mlmkit.errors import ConfigError
    from mlmkit.train.tracking import STATE, TrackingState
    from mlmkit.typed import to_json

    assert TrackingState.read(tmp_path) == TrackingState()  # a run that never tracked
    (tmp_path / STATE).write_text(json.dumps({"mlflow_run_id": "abc", "later_backend": {"id": 1}}))
    state = TrackingState.read(tmp_path)
    assert state.mlflow_run_id == "abc" and to_json(state, rest="other") == {
        "mlflow_run_id": "abc", "mlflow_tracking_uri": None, "later_backend": {"id": 1}}
    (tmp_path / STATE).write_text(json.dumps({"mlflow_run_id": 5}))
    with pytest.raises(ConfigError) as e:
        TrackingState.read(tmp_path)
    assert e.value.message == f"{tmp_path / STATE}: 'mlflow_run_id' is not a string or null (5)"
