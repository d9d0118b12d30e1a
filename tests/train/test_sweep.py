"""Optuna sweeps (mlmkit/train/sweep.py): the best trial, resumes, shared and read-only studies, a
search space or a setting refused, a diverging trial."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from clf_data import clf_fixture, no_curves_fixture  # noqa: F401  (the fixtures `clf`, `no_curves`)

from mlmkit.errors import ConfigError

pytest.importorskip("optuna")


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
