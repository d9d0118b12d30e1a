"""Training curves (mlmkit/train/plots.py): records no float holds left out, and a pretraining run's
curves and card with the MLM baselines."""

from __future__ import annotations

import json

import pytest
from clf_data import WORDS
from hostile import cli
from plot_helpers import front_matter, png_size

pytest.importorskip("matplotlib")


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
