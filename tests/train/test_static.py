"""`mlmkit distill --static`: a table of token vectors from an embedding teacher, in a bundle that every
embedding command runs, equal to a plain numpy computation of the same table; training the table on
retrieval data helps; bad requests are one line with nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import make_base_model, run_export
from task_runs import make_task_run
from typer.testing import CliRunner

from mlmkit.args import DistillArgs
from mlmkit.cli import app
from mlmkit.quickstart.retrieval_set import write_retrieval_set
from mlmkit.runtime.pipeline import Pipeline, evaluate_bundle
from mlmkit.runtime.static_bundle import STATIC, read_static_table, static_embeddings
from mlmkit.text.batching import pad_features
from mlmkit.train.distill import distill
from mlmkit.train.finetune import load_finetuned
from mlmkit.train.static import sif_weights, token_rows

TEXTS = ["Return the number of items.", "Open a file and return a stream.", "cats purr", "", "[CLS] [SEP]"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("static")
    beir = tmp / "set"
    write_retrieval_set(beir, max_documents=400)
    texts = [json.loads(line)["text"] for f in ("corpus.jsonl", "queries.jsonl") for line in open(beir / f)]
    base = make_base_model(tmp / "base", texts, vocab_size=800)
    teacher = make_task_run(base, "embedding", tmp / "teacher")
    table = tmp / "table"
    distill(DistillArgs(teacher=teacher, out=table, static=True, dims=16))
    return {"tmp": tmp, "beir": beir, "base": base, "teacher": teacher, "table": table}


def test_the_bundle_is_the_numpy_mean_of_the_pca_of_the_teachers_token_vectors(setup):
    pipe = Pipeline.load(setup["table"], command="embed")
    assert pipe.meta.model.model_type == STATIC and pipe.meta.run["static"]["dims"] == 16
    table, counted = read_static_table(setup["table"])
    # the table, again in plain numpy: each token alone through the teacher, PCA by SVD, the SIF weights
    # (the run's pooled vectors before its normalisation: their norms weigh the tokens)
    task, net, tok, _ = load_finetuned(setup["teacher"])
    net.normalize = False
    ids, _ = token_rows(tok)
    cls, sep = tok.encode("").ids
    with torch.no_grad():
        x = torch.tensor([[cls, i, sep] for i in ids])
        vectors = net(x, torch.ones_like(x))["embedding"].double().numpy()
    assert_table(table[ids], vectors)
    specials = [i for i in range(tok.get_vocab_size()) if i not in set(ids)]
    assert specials and not table[specials].any() and not counted[specials].any() and counted[ids].all()
    # the bundle's embeddings: the normalised mean of the text's rows, specials left out
    encs = [pipe.tokenizer.encode(t) for t in TEXTS]
    want = static_embeddings(table, counted, [e.ids for e in encs])
    got_emb = np.asarray([r["embedding"] for r in pipe(TEXTS)])
    np.testing.assert_allclose(got_emb, want, atol=1e-5)
    mean = table[[i for i in encs[0].ids if counted[i]]].mean(0)
    np.testing.assert_allclose(got_emb[0], mean / np.linalg.norm(mean), atol=1e-5)
    assert not got_emb[3].any()  # a text with no counted token: a zero vector, not NaN


def assert_table(got: np.ndarray, vectors: np.ndarray, dims: int = 16) -> None:
    """``got`` is the PCA (by SVD) of the token vectors to ``dims``, SIF-weighted, up to each component's
    sign."""
    centred = vectors - vectors.mean(0)
    _, _, vt = np.linalg.svd(centred, full_matrices=False)
    ref = (centred @ vt[:dims].T) * sif_weights(len(vectors))[:, None]
    signs = np.sign((ref * got).sum(0))  # a component's sign is a convention
    np.testing.assert_allclose(got, ref * signs, atol=2e-4 * np.abs(ref).max())


def test_a_bundle_teacher_makes_the_table_of_its_graphs_token_vectors(setup, tmp_path):
    bundle = tmp_path / "bundle"
    run_export(setup["teacher"], bundle)
    out = tmp_path / "from-bundle"
    distill(DistillArgs(teacher=bundle, out=out, static=True, dims=16))
    pipe = Pipeline.load(bundle)
    ids, around = token_rows(pipe.tokenizer)
    feats = [{"input_ids": [around[0], i, *around[1:]], "token_type_ids": [0] * 3} for i in ids]
    vectors = pipe.run_batch(pad_features(feats, pipe.pad_id))["embedding"].astype(np.float64)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-4)  # this teacher's graph normalises
    table, _ = read_static_table(out)
    assert_table(table[ids], vectors)


def test_every_embedding_command_runs_the_static_bundle(setup, tmp_path):
    r = CliRunner().invoke(app, ["embed", str(setup["table"]), "cats purr", "--json"])
    assert r.exit_code == 0, r.output
    assert len(json.loads(r.output.strip().splitlines()[-1])["embedding"]) == 16
    metrics = evaluate_bundle(setup["table"], setup["beir"])
    assert 0 < metrics["ndcg@10"] <= 1
    mined = tmp_path / "mined.jsonl"
    r = CliRunner().invoke(app, ["mine", str(setup["beir"]), "--retriever", str(setup["table"]), "--out",
                                 str(mined),
                                 "--negatives", "2"])
    assert r.exit_code == 0, r.output
    assert mined.is_file() and mined.read_text().count("\n") > 10


def test_training_the_table_on_retrieval_pairs_raises_its_ndcg(setup, tmp_path):
    before = evaluate_bundle(setup["table"], setup["beir"])["ndcg@10"]
    out = tmp_path / "tuned"
    args = DistillArgs(teacher=setup["teacher"], out=out, static=True, dims=16, train_file=setup["beir"],
                       batch_size=64)
    args.train.epochs, args.train.lr = 4.0, 3e-2
    distill(args)
    after = evaluate_bundle(out, setup["beir"])["ndcg@10"]
    assert after > before + 0.05, (before, after)
    meta = json.loads((out / "mlmkit.json").read_text())
    assert meta["static"]["trained"]["loss"] == "mnrl" and not (out / "checkpoints").exists()


@pytest.mark.parametrize("extra,match", [
    (["--dims", "65"], "--dims 65 is more than the teacher's 64"),
    (["--layers", "2"], "--layers and --layer-map make a transformer student"),
])
def test_bad_static_requests_are_one_line_and_write_nothing(setup, tmp_path, extra, match):
    out = tmp_path / "out"
    r = CliRunner().invoke(app, ["distill", str(setup["teacher"]), "--static", "--out", str(out), *extra])
    assert r.exit_code == 2 and match in r.output, r.output
    assert not out.exists()


def test_a_static_table_needs_an_embedding_teacher(setup, tmp_path):
    clf = make_task_run(setup["base"], "classification", tmp_path / "clf")
    out = tmp_path / "out"
    r = CliRunner().invoke(app, ["distill", str(clf), "--static", "--out", str(out)])
    assert (r.exit_code == 2
            and "is a classification model: a static table is made from an embedding model" in r.output)
    assert not out.exists()


def test_serve_answers_the_openai_and_tei_routes_with_the_tables_vectors(setup, tmp_path):
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    from serve_process import Server

    want = np.asarray([r["embedding"] for r in Pipeline.load(setup["table"])(TEXTS[:3])])
    server = Server(tmp_path, f"static={setup['table']}")
    try:
        got = httpx.post(server.url + "/v1/embeddings", json={"model": "static", "input": TEXTS[:3]},
                         timeout=30).json()
        np.testing.assert_allclose([d["embedding"] for d in got["data"]], want, atol=1e-6)
        tei = httpx.post(server.url + "/embed", json={"inputs": TEXTS[:3]}, timeout=30).json()
        np.testing.assert_allclose(tei, want, atol=1e-6)
    finally:
        server.stop()
