"""Hard-negative mining (mlmkit/retrieval/mining.py): `mlmkit mine` skips positives and keeps to the
window, leaves the other splits' answers out unless asked, filters by margin, mines with an embedding
bundle, resumes a killed job to the same rows, and mines rows against a corpus file."""

from __future__ import annotations

import json
import math

from conftest import run_export, run_finetune
from hostile import mine
from typer.testing import CliRunner

from mlmkit.cli import app
from mlmkit.text.beir import read_split
from mlmkit.text.readers import numbered

runner = CliRunner()


def _answers(split: str) -> set[str]:
    """The texts of the documents a BEIR split judges relevant."""
    s = read_split(split, training=False)
    return {s.corpus[d] for q in s.qrels for d in s.positives(q)}


def test_mining_skips_positives_and_keeps_to_the_window(retrieval, tmp_path):
    from mlmkit.retrieval.exact import BM25

    beir = retrieval["beir"]
    r, rows = mine(str(beir), "--out", str(tmp_path / "m.jsonl"), "--negatives", "4", "--range", "3:40",
                    "--with-scores")
    assert r.exit_code == 0, r.output
    split = read_split(beir, training=True)
    assert len(rows) == sum(len(split.positives(q))
                            for q in split.qrels) and json.loads(r.stdout)["short"] == {}
    test_answers = _answers(f"{beir}:test")
    assert json.loads(r.stdout)["held_out"] == len(test_answers) == 100
    # the test split's answers are not mined
    docs = [t for t in split.corpus.values() if t not in test_answers]
    bm25 = BM25(docs)
    queries = [row["anchor"] for row in rows[:30]]
    ranked, _ = bm25.search(queries, 60)
    for row, order in zip(rows[:30], ranked):
        qid = next(q for q, t in split.queries.items() if t == row["anchor"])
        positives = {split.corpus[d] for d in split.positives(qid)}
        negs = [row[f"negative_{i}"] for i in range(1, 5)]
        window = [docs[i] for i in order if docs[i] not in positives][3:40]  # ranks count the other documents
        assert not set(negs) & positives and negs == window[:4]  # the best of the window, in rank order
        assert row["scores"][1:] == sorted(row["scores"][1:], reverse=True)


def test_a_query_with_many_positives_still_gets_its_negatives_from_a_narrow_window(tmp_path):
    """Ranks count the documents that are not the query's positives: eight positives at the top of
    the ranking leave a window of 3 its 3 negatives (sentence-transformers' faiss path returned too few)."""
    beir = tmp_path / "beir"
    (beir / "qrels").mkdir(parents=True)
    docs = [{"_id": f"p{i}", "text": f"red apple pie recipe number {i}"} for i in range(8)]
    docs += [{"_id": f"n{i}", "text": f"red apple {w}"}
             for i, w in enumerate(["tart", "juice", "cake", "jam", "tree"])]
    docs += [{"_id": f"o{i}", "text": f"blue river stone {i}"} for i in range(20)]
    (beir / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (beir / "queries.jsonl").write_text(json.dumps({"_id": "q", "text": "red apple pie recipe"}) + "\n")
    (beir / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\n"
                                              + "".join(f"q\tp{i}\t1\n" for i in range(8)))
    r, rows = mine(str(beir), "--out", str(tmp_path / "m.jsonl"), "--negatives", "3", "--range", "0:3")
    assert r.exit_code == 0, r.output
    assert len(rows) == 8 and json.loads(r.stdout)["short"] == {}, r.stdout
    for row in rows:
        negs = [row[f"negative_{i}"] for i in range(1, 4)]
        assert len(set(negs)) == 3 and all(n.startswith("red apple") and "pie" not in n for n in negs), negs


def test_mining_leaves_the_other_splits_answers_out_unless_asked(retrieval, tmp_path):
    beir = retrieval["beir"]
    answers = _answers(f"{beir}:test")
    negatives = lambda rows: {row[k] for row in rows for k in numbered(row, "negative")}  # noqa: E731
    r, rows = mine(str(beir), "--out", str(tmp_path / "m.jsonl"), "--negatives", "5")
    assert r.exit_code == 0, r.output
    assert not negatives(rows) & answers and json.loads(r.stdout)["documents"] == 500 - len(answers)
    r, kept = mine(str(beir), "--out", str(tmp_path / "k.jsonl"), "--negatives", "5", "--keep-other-splits")
    assert r.exit_code == 0, r.output
    assert len(negatives(kept) & answers) > 20 and json.loads(r.stdout)["held_out"] == 0
    # mined for the test split, the training answers are the ones left out; a text that is an answer
    # of both splits stays
    r, rows = mine(f"{beir}:test", "--out", str(tmp_path / "t.jsonl"), "--negatives", "5", "--range", "0:50")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["documents"] == len(answers) and negatives(rows) <= answers


def test_mining_filters_by_margin_and_counts_the_short_rows(retrieval, tmp_path):
    r, rows = mine(str(retrieval["beir"]), "--out", str(tmp_path / "m.jsonl"), "--negatives", "3",
                    "--margin", "1.0",
                    "--with-scores")
    assert r.exit_code == 0, r.output
    short = json.loads(r.stdout)["short"]
    for row in rows:
        assert all(s <= row["scores"][0] - 1.0 + 1e-5 for s in row["scores"][1:])
    assert short.get("the margin or score-ratio filter",
                     0) == sum(1 for row in rows if len(row["scores"]) < 4) > 0


def test_mining_with_an_embedding_bundle_then_training_on_the_rows(retrieval, tmp_path):
    bundle = tmp_path / "bundle"
    run_export(retrieval["run"], bundle)
    r, rows = mine(str(retrieval["beir"]), "--out", str(tmp_path / "m.jsonl"), "--retriever", str(bundle),
                    "--negatives", "2")
    assert r.exit_code == 0, r.output
    assert rows and all("negative_2" in row and row["negative_1"] != row["positive"] for row in rows)
    r, approx = mine(str(retrieval["beir"]), "--out", str(tmp_path / "f.jsonl"), "--retriever", str(bundle),
                      "--negatives",
                      "2", "--index", "faiss")
    assert r.exit_code == 0, r.output
    same = sum(a["negative_1"] == b["negative_1"] for a, b in zip(rows, approx))
    assert len(approx) == len(rows) and same >= 0.9 * len(rows), same
    m = run_finetune("embedding", retrieval["base"], tmp_path / "m.jsonl", tmp_path / "run", steps=3,
                     batch_size=12,
                     max_length=32, progress=False)
    assert math.isfinite(m["loss"])


def test_a_killed_mining_job_resumes_to_the_same_rows(retrieval, tmp_path, monkeypatch):
    from mlmkit.retrieval import mining

    args = [str(retrieval["beir"]), "--negatives", "3", "--batch", "50", "--with-scores"]
    r, straight = mine(*args, "--out", str(tmp_path / "straight.jsonl"))
    assert r.exit_code == 0, r.output
    out = tmp_path / "m.jsonl"
    real, calls = mining._mine_batch, []

    def dies_on_the_third(*a, **kw):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt  # a kill between batches
        return real(*a, **kw)

    monkeypatch.setattr(mining, "_mine_batch", dies_on_the_third)
    r = runner.invoke(app, ["mine", *args, "--out", str(out)])
    assert r.exit_code != 0 and not out.exists()
    monkeypatch.setattr(mining, "_mine_batch", real)
    r, _ = mine(*args, "--out", str(out))
    assert r.exit_code == 2 and "pass --resume to continue it" in r.output
    r, _ = mine(*args[:-1], "--out", str(out), "--resume")  # without --with-scores: another job
    assert r.exit_code == 2 and "with_scores" in r.output
    r, resumed = mine(*args, "--out", str(out), "--resume")
    assert r.exit_code == 0, r.output
    assert resumed == straight and json.loads(r.stdout)["rows"] == len(straight)
    assert not (tmp_path / ".m.jsonl.job").exists()


def test_mining_rows_against_a_corpus_file_and_bad_input(tmp_path):
    rows = tmp_path / "pairs.jsonl"
    rows.write_text("\n".join(json.dumps({"anchor": a, "positive": p}) for a, p in [
        ("red fruit", "apples are red fruit"), ("yellow fruit", "bananas are yellow"),
        ("sour fruit", "lemons are sour")]))
    corpus = tmp_path / "docs.txt"
    corpus.write_text("apples are red fruit\ncherries are red fruit too\nbananas are yellow\nsour lemons and "
                      "limes\n"
                      "fruit salad\n")
    r, got = mine(str(rows), "--out", str(tmp_path / "m.jsonl"), "--corpus", str(corpus), "--negatives", "2")
    assert r.exit_code == 0, r.output
    assert got[0]["anchor"] == "red fruit" and got[0]["negative_1"] == "cherries are red fruit too"
    assert all(row["positive"] not in (row.get("negative_1"), row.get("negative_2")) for row in got)
    r, _ = mine(str(rows), "--out", str(tmp_path / "x.jsonl"), "--range", "50:60")
    assert r.exit_code == 2 and "--range 50:60 starts past the corpus's 3 documents" in r.output
    r, _ = mine(str(rows), "--out", str(tmp_path / "x.jsonl"), "--range", "9:3")
    assert r.exit_code == 2 and "--range 9:3 is not A:B" in r.output
    rows.write_text('{"anchor": "a", "positive": "b"}\n{"anchor": "c"}\n')
    r, _ = mine(str(rows), "--out", str(tmp_path / "x.jsonl"))
    assert r.exit_code == 2 and "pairs.jsonl, line 2" in r.output and "positive" in r.output
