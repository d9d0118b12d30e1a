"""Retrieval training and evaluation: GradCache against the uncached loss (loss and every gradient),
the IR metrics against pytrec_eval (trec_eval), exact search, and a fine-tune on the built-in retrieval
set end to end (sentence-transformers loads the run; the bundle scores what the run scores). The losses
against their formulas: tests/train/test_embedding.py; the BEIR reader: tests/text/test_beir.py."""

from __future__ import annotations

import json
import math
import random
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import PROMPTS, make_base_model, run_export, run_finetune
from hostile import mine
from typer.testing import CliRunner

from mlmkit.cli import app
from mlmkit.errors import DataFormatError, TaskError
from mlmkit.registry import TaskContext, get_task
from mlmkit.retrieval.exact import mean_metrics, query_metrics, search
from mlmkit.text.beir import read_split
from mlmkit.train.finetune import evaluate_base
from mlmkit.train.losses import PairBatch

runner = CliRunner()


# ---- a loss's best metric ----------------------------------------------------------------------------
def test_cosent_is_judged_by_spearman():
    assert get_task("embedding").best_metric(TaskContext(max_length=8,
                                                         options={"loss": "cosent"})) == "spearman"


# ---- GradCache: the same loss and gradients in mini-batches -------------------------------------------
def _colbert_model():
    """A tiny colbert model (16 dimensions, mnrl over MaxSim) on _training_batch's vocabulary."""
    from conftest import tiny_config

    from mlmkit.text.tokenizer import train_tokenizer

    task = get_task("colbert")
    tok = train_tokenizer(iter(["the cat sat on the mat ."]), vocab_size=60)  # its [MASK] and punctuation ids
    torch.manual_seed(0)
    return task.build_model(tiny_config(60),
                            TaskContext(max_length=32, options=task.resolve_options({"dim": 16}),
                                        tokenizer=tok))


def _embedding_model(tok_size: int = 60, dropout: float = 0.0, **options):
    from conftest import tiny_config

    task = get_task("embedding")
    cfg = tiny_config(tok_size, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    opts = task.resolve_options({"loss": "mnrl", **options})
    torch.manual_seed(0)
    return task.build_model(cfg, TaskContext(max_length=32, options=opts))


def _training_batch(n_examples: int = 7, seed: int = 0) -> dict[str, torch.Tensor]:
    rng = random.Random(seed)
    rows, parts, examples, text_ids = [], [], [], []
    for i in range(n_examples):
        for part in range(2 + (i % 3 == 0)):  # some examples carry a hard negative
            rows.append([2] + [rng.randrange(5, 60) for _ in range(rng.randrange(3, 12))] + [3])
            parts.append(part)
            examples.append(i)
            text_ids.append(len(text_ids))
    width = max(map(len, rows))
    ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    return {"input_ids": ids, "attention_mask": (ids != 0).long(), "token_type_ids": torch.zeros_like(ids),
            "part": torch.tensor(parts), "text_id": torch.tensor(text_ids), "score": torch.zeros(len(rows)),
            "example": torch.tensor(examples)}


def _loss_and_grads(model, batch, scale: float = 1.0):
    model.zero_grad()
    loss = model(**batch)["loss"]
    (loss * scale).backward()  # as the training loop divides by grad_accum
    return float(loss.detach()), {n: p.grad.clone() for n, p in model.named_parameters()
                                  if p.grad is not None}


@pytest.mark.parametrize("mini_batch_size", [1, 3, 5])
def test_cached_mnrl_gives_mnrls_loss_and_every_parameters_gradient(mini_batch_size):
    batch = _training_batch()
    direct = _embedding_model()
    cached = _embedding_model(loss="cached-mnrl", mini_batch_size=mini_batch_size)
    cached.load_state_dict(direct.state_dict())
    l1, g1 = _loss_and_grads(direct, batch, scale=0.5)
    l2, g2 = _loss_and_grads(cached, batch, scale=0.5)
    assert l2 == pytest.approx(l1, abs=1e-5)
    assert g1.keys() == g2.keys() and len(g1) > 10
    for name in g1:
        assert torch.allclose(g1[name], g2[name], atol=1e-5), (name, float((g1[name] - g2[name]).abs().max()))


def test_cached_mnrl_replays_each_mini_batchs_dropout():
    """With dropout, the re-embedding in backward uses the mini-batch's own RNG state: its gradients are
    those of embedding the same mini-batches (the texts sorted by length, cut in fours), in order, with a
    graph."""
    batch = _training_batch(6, seed=1)
    model = _embedding_model(dropout=0.2, loss="cached-mnrl", mini_batch_size=4)
    model.train()
    torch.manual_seed(123)
    l_cached, g_cached = _loss_and_grads(model, batch)

    model.zero_grad()
    torch.manual_seed(123)
    # the mini-batches: by length, 4 texts each
    order = torch.argsort(batch["attention_mask"].sum(1), stable=True)
    E = torch.empty(len(order), model.config.hidden_size)
    for idx in order.split(4):
        width = int(batch["attention_mask"][idx].sum(1).max())
        E[idx] = model.embed(batch["input_ids"][idx, :width], batch["attention_mask"][idx, :width],
                             batch["token_type_ids"][idx, :width])
    pb = PairBatch(batch["example"], batch["part"], batch["text_id"], batch["score"])
    ref = model.objective(E, pb)
    ref.backward()
    assert float(ref.detach()) == pytest.approx(l_cached, abs=1e-5)
    for name, p in model.named_parameters():
        if p.grad is not None:
            assert torch.allclose(p.grad, g_cached[name], atol=1e-5), name


# ---- metrics and search ---------------------------------------------------------------------------------
def test_metrics_equal_trec_eval_through_pytrec_eval():
    pytrec_eval = pytest.importorskip("pytrec_eval")
    rng = random.Random(0)
    qrels, runs = {}, {}
    for q in range(30):
        docs = [f"d{i}" for i in rng.sample(range(300), 150)]
        qrels[f"q{q}"] = {d: rng.choice([0, 1, 1, 2, 3]) for d in rng.sample(docs, rng.randrange(1, 12))}
        if q == 0:  # a query whose relevant documents are all past the cut
            qrels["q0"] = {docs[-1]: 2}
        # distinct scores: no tie order to argue about
        scores = sorted((rng.random() for _ in docs), reverse=True)
        runs[f"q{q}"] = dict(zip(docs, scores))
    ranked = {q: sorted(r, key=r.get, reverse=True) for q, r in runs.items()}
    ours = {q: query_metrics(ranked[q], qrels[q]) for q in qrels}
    ev = pytrec_eval.RelevanceEvaluator(qrels,
                                        {"ndcg_cut_10", "map_cut_100", "recall_10", "recall_100", "P_10"})
    ref = ev.evaluate(runs)
    top10 = {q: {d: runs[q][d] for d in ranked[q][:10]} for q in runs}
    rr = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(top10)
    for q in qrels:
        assert ours[q]["ndcg@10"] == pytest.approx(ref[q]["ndcg_cut_10"], abs=1e-6)
        assert ours[q]["map@100"] == pytest.approx(ref[q]["map_cut_100"], abs=1e-6)
        assert ours[q]["recall@10"] == pytest.approx(ref[q]["recall_10"], abs=1e-6)
        assert ours[q]["recall@100"] == pytest.approx(ref[q]["recall_100"], abs=1e-6)
        assert ours[q]["precision@10"] == pytest.approx(ref[q]["P_10"], abs=1e-6)
        assert ours[q]["mrr@10"] == pytest.approx(rr[q]["recip_rank"], abs=1e-6)
    assert ours["q0"]["ndcg@10"] == 0.0 and ours["q0"]["mrr@10"] == 0.0
    means = mean_metrics(ranked, qrels)
    assert means["ndcg@10"] == pytest.approx(np.mean([ref[q]["ndcg_cut_10"] for q in qrels]), abs=1e-6)


def test_chunked_search_is_exact():
    rng = np.random.default_rng(0)
    q, d = rng.normal(size=(9, 16)), rng.normal(size=(1000, 16))
    idx, scores = search(q, d, 50, chunk=37)  # chunks smaller than k
    full = (q / np.linalg.norm(q, axis=1, keepdims=True)) @ (d / np.linalg.norm(d, axis=1, keepdims=True)).T
    assert (idx == np.argsort(-full, axis=1)[:, :50]).all()
    assert np.allclose(scores, np.sort(full, axis=1)[:, ::-1][:, :50], atol=1e-5)
    assert search(q, d[:3], 10)[0].shape == (9, 3)


# ---- end to end on the built-in retrieval set --------------------------------------------------------------
def test_fine_tuning_on_the_built_in_set_beats_zero_shot(retrieval):
    assert retrieval["counts"]["test_queries"] == 100 and retrieval["counts"]["documents"] == 500
    zero = evaluate_base("embedding", retrieval["base"], retrieval["beir"], max_length=48)
    tuned = retrieval["metrics"]
    assert tuned["eval_ndcg@10"] > zero["ndcg@10"] + 0.05, (zero, tuned)
    assert set(tuned) >= {f"eval_{m}" for m in ("ndcg@10", "mrr@10", "map@100", "recall@10", "recall@100",
                                                "precision@10")}


def test_the_run_is_a_sentence_transformers_directory_with_the_same_vectors(retrieval):
    st = pytest.importorskip("sentence_transformers")
    from mlmkit.text.batching import pad_features
    from mlmkit.train.finetune import load_finetuned

    texts = ["Return the number of items in the queue.", "A Mapping is a container.", "x"]
    model = st.SentenceTransformer(str(retrieval["run"]), device="cpu")
    assert model.prompts == {"query": "query: ", "document": "passage: "}
    task, net, tok, meta = load_finetuned(retrieval["run"])

    def ours(input_type: str) -> np.ndarray:
        ctx = TaskContext(max_length=meta.max_length, options={**meta.options, "input_type": input_type})
        batch = pad_features(task.featurize([{"text": t} for t in texts], tok, ctx, training=False), 0)
        with torch.no_grad():
            return net(**{k: torch.from_numpy(v) for k, v in batch.items()})["embedding"].numpy()

    for prompt, kind in ((None, "none"), ("query", "query"), ("document", "document")):
        theirs = model.encode(texts, convert_to_numpy=True, prompt_name=prompt)
        assert np.abs(ours(kind) - theirs).max() < 1e-5, kind
    assert np.abs(ours("query") - ours("none")).max() > 1e-3  # the prompt is in the text the model saw


def test_the_bundle_scores_what_the_run_scores(retrieval, tmp_path):
    bundle = tmp_path / "bundle"
    run_export(retrieval["run"], bundle)
    r = runner.invoke(app, ["evaluate", str(bundle), "--data", str(retrieval["beir"]), "--json"],
                      env={"COLUMNS": "1000"})
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    assert abs(got["ndcg@10"] - retrieval["metrics"]["eval_ndcg@10"]) < 0.002, (got, retrieval["metrics"])


def test_save_run_writes_the_ranking_trec_eval_scores_and_faiss_finds_nearly_the_same(retrieval, tmp_path):
    pytrec_eval = pytest.importorskip("pytrec_eval")
    pytest.importorskip("faiss")
    bundle = tmp_path / "bundle"
    run_export(retrieval["run"], bundle)
    got = {}
    for index in ("exact", "faiss"):
        trec = tmp_path / f"{index}.trec"
        r = runner.invoke(app, ["evaluate", str(bundle), "--data", str(retrieval["beir"]), "--json",
                                "--index", index,
                                "--save-run", str(trec)], env={"COLUMNS": "1000"})
        assert r.exit_code == 0, r.output
        got[index] = json.loads(r.stdout)
        run: dict[str, dict[str, float]] = {}
        for line in trec.read_text().splitlines():
            qid, q0, did, rank, score, tag = line.split()
            assert q0 == "Q0" and tag == "mlmkit"
            run.setdefault(qid, {})[did] = float(score)
        split = read_split(retrieval["beir"], training=False)
        assert len(run) == len(split.qrels) and all(len(docs) == 100 for docs in run.values())
        per_query = pytrec_eval.RelevanceEvaluator(split.qrels, {"ndcg_cut.10"}).evaluate(run)
        ndcg = sum(v["ndcg_cut_10"] for v in per_query.values()) / len(split.qrels)
        assert ndcg == pytest.approx(got[index]["ndcg@10"], abs=1e-6)
    assert abs(got["faiss"]["ndcg@10"] - got["exact"]["ndcg@10"]) < 0.01, got
    # a setting of one call
    assert "save_run" not in json.loads((bundle / "mlmkit.json").read_text())["options"]


def test_a_sentence_transformers_directorys_prompts_are_read(retrieval, tmp_path):
    import shutil

    from mlmkit.rundir.config import load_config

    task = get_task("embedding")
    assert task.from_hf(load_config(retrieval["run"]), retrieval["run"])["options"] == {
        "normalize": False, "pooling": "mean", **PROMPTS}
    other = shutil.copytree(retrieval["run"], tmp_path / "e5", ignore=shutil.ignore_patterns("*.safetensors"))
    (other / "config_sentence_transformers.json").write_text(json.dumps({"prompts": {"query": "q: ",
                                                                                     "passage": "p: "}}))
    got = task.from_hf(load_config(other), other)["options"]
    assert (got["query_prompt"], got["document_prompt"]) == ("q: ", "p: ")


def test_prompts_reach_embed_and_both_serving_routes(retrieval, tmp_path):
    """The run's prompts travel into the bundle: `mlmkit embed --as query|document`, the OpenAI route's
    input_type and TEI's prompt_name give what the pipeline gives for that input type."""
    from fastapi.testclient import TestClient

    from mlmkit.args import ServeArgs
    from mlmkit.runtime.pipeline import Pipeline
    from mlmkit.serve.app import create_app
    from mlmkit.serve.queue import Metrics, Model

    bundle = tmp_path / "bundle"
    run_export(retrieval["run"], bundle)
    texts = ["Return the number of items in the queue.", "A Mapping is a container."]
    pipe = Pipeline.load(bundle)
    want = {k: np.array([r["embedding"] for r in pipe(texts, input_type=k)])
            for k in ("none", "query", "document")}
    assert np.abs(want["query"] - want["document"]).max() > 1e-3
    r = runner.invoke(app,
                      ["embed", str(bundle), *texts, "--as", "query", "--output", str(tmp_path / "q.npy")])
    assert r.exit_code == 0, r.output
    np.testing.assert_allclose(np.load(tmp_path / "q.npy"), want["query"], atol=1e-6)
    r = runner.invoke(app, ["embed", str(bundle), *texts, "--as", "question"])
    assert r.exit_code == 2 and "query" in r.output and "document" in r.output
    args = ServeArgs(bundles=[str(bundle)])
    model = Model("emb", pipe, args, Metrics())
    with TestClient(create_app({"emb": model}, args)) as http:
        assert model.ready.wait(30)
        for kind in ("query", "document"):
            got = http.post("/v1/embeddings", json={"input": texts, "input_type": kind}).json()
            np.testing.assert_allclose([d["embedding"] for d in got["data"]], want[kind], atol=1e-5)
            got = http.post("/embed", json={"inputs": texts, "prompt_name": kind, "normalize": False}).json()
            np.testing.assert_allclose(got, want[kind], atol=1e-5)
        plain = http.post("/v1/embeddings", json={"input": texts}).json()
        np.testing.assert_allclose([d["embedding"] for d in plain["data"]], want["none"], atol=1e-5)
        bad = http.post("/embed", json={"inputs": texts, "prompt_name": "web"})
        assert bad.status_code == 422 and "no prompt named 'web'" in bad.json()["error"], bad.json()
        bad = http.post("/v1/embeddings", json={"input": texts, "input_type": "passage"})
        assert bad.status_code == 422 and "input_type must be query or document" in bad.json()["error"]


def test_distilling_the_fine_tuned_model_into_its_base_learns_retrieval(retrieval, tmp_path):
    """mse-distill (loss auto with a teacher) from the fine-tuned run's bundle: the base model, trained only
    toward the teacher's vectors, retrieves as the teacher does; a student of another size learns
    through a projection, and its run is still a plain embedding model (the student's own vectors)."""
    teacher = tmp_path / "teacher"
    run_export(retrieval["run"], teacher)
    zero = evaluate_base("embedding", retrieval["base"], retrieval["beir"], max_length=48)["ndcg@10"]
    m = run_finetune("embedding", retrieval["base"], retrieval["beir"], tmp_path / "student",
                     eval_file=retrieval["beir"],
                     steps=40, lr=1e-3, batch_size=64, max_length=48, eval_every=1000, progress=False,
                     options={"teacher": str(teacher), **PROMPTS})
    assert m["eval_ndcg@10"] > zero + 0.06, (zero, m, retrieval["metrics"]["eval_ndcg@10"])
    texts = [json.loads(line)["text"] for line in open(retrieval["beir"] / "corpus.jsonl")]
    small = make_base_model(tmp_path / "small", texts[:200], vocab_size=600, hidden_size=32,
                            intermediate_size=64)
    m = run_finetune("embedding", small, retrieval["beir"], tmp_path / "small-student", steps=30, lr=2e-3,
                     batch_size=64, max_length=48, progress=False,
                     options={"teacher": str(teacher), "loss": "mse-distill"})
    curve = [json.loads(line)["loss"] for line in open(tmp_path / "small-student" / "metrics.jsonl")
             if '"loss"' in line]
    assert curve[-1] < 0.7 * curve[0], curve
    assert json.loads((
        tmp_path / "small-student" / "mlmkit.json").read_text())["task_state"]["teacher_dim"] == 64
    run_export(tmp_path / "small-student", tmp_path / "small-bundle")
    from mlmkit.runtime.pipeline import Pipeline

    assert len(Pipeline.load(tmp_path / "small-bundle")(["a text"])[0]["embedding"]) == 32


def test_margin_mse_trains_on_mined_scores_and_bad_scores_name_their_line(retrieval, tmp_path):
    rows = tmp_path / "mined.jsonl"
    r, got = mine(str(retrieval["beir"]), "--out", str(rows), "--negatives", "3", "--with-scores")
    assert r.exit_code == 0, r.output
    m = run_finetune("embedding", retrieval["base"], rows, tmp_path / "run", steps=4, batch_size=32,
                     max_length=32,
                     progress=False, options={"loss": "margin-mse"})
    assert math.isfinite(m["loss"])
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(got[0]) + "\n" + json.dumps({**got[1], "scores": got[1]["scores"][:2]}) + "\n")
    with pytest.raises(DataFormatError, match=r"bad.jsonl, line 2.*scores.*expected 4 finite numbers"):
        run_finetune("embedding", retrieval["base"], bad, tmp_path / "x", steps=1, progress=False,
                     options={"loss": "margin-mse"})
    plain = tmp_path / "plain.jsonl"
    plain.write_text(json.dumps({"anchor": "a query", "positive": "a document"}) + "\n")
    with pytest.raises(DataFormatError, match=r"plain.jsonl, line 1.*margin-mse needs the teacher's scores"):
        run_finetune("embedding", retrieval["base"], plain, tmp_path / "y", steps=1, progress=False,
                     options={"loss": "margin-mse"})
    with pytest.raises(TaskError, match="mse-distill needs a teacher"):
        run_finetune("embedding", retrieval["base"], plain, tmp_path / "z", steps=1, progress=False,
                     options={"loss": "mse-distill"})


def test_no_training_batch_holds_a_text_twice(retrieval, tmp_path, caplog):
    """A query with several positives (and a positive shared by queries): its rows go to different
    batches, and the log counts the rows that were moved."""
    from mlmkit.text.tokenizer import load_tokenizer
    from mlmkit.train.data import FeatureData

    rng = random.Random(0)
    rows = [{"anchor": f"query {rng.randrange(40)}", "positive": f"document {rng.randrange(300)}",
             "negatives": []}
            for _ in range(400)]
    task = get_task("embedding")
    ctx = TaskContext(max_length=16, options=task.resolve_options({"loss": "mnrl"}), state={"data": "rows"})
    feats = task.featurize(rows, load_tokenizer(retrieval["base"]), ctx, training=True)
    with caplog.at_level("INFO", logger="mlmkit"):
        data = FeatureData(feats, task, 32, 0, seed=1)
        n = data.num_batches(0)
    for i in range(n):
        ids = data.batch(0, i, 0)["text_id"].tolist()
        assert len(ids) == len(set(ids)), i
    assert "examples moved to a later batch" in caplog.text


# ---- SPLADE: sparse-embedding fine-tuning ------------------------------------------------------------------
@pytest.fixture(scope="module")
def splade(retrieval):
    """The same steps twice from the tiny base's (random) masked-LM head: without the FLOPS regulariser,
    and with it (warmed up over 5 steps)."""
    runs = {}
    for name, weight in (("plain", "0"), ("flops", "0.05")):
        out = retrieval["tmp"] / f"splade-{name}"
        m = run_finetune("sparse-embedding", retrieval["base"], retrieval["beir"], out,
                         eval_file=retrieval["beir"],
                         steps=24, lr=1e-3, batch_size=64, max_length=48, eval_every=1000, progress=False,
                         options={"query_flops": weight, "document_flops": weight, "flops_warmup": 4})
        runs[name] = (out, m)
    return runs


def test_splade_learns_and_the_flops_regulariser_lowers_the_non_zeros(retrieval, splade):
    """From a random masked-LM head the tiny model's contrastive loss falls, but its retrieval does not
    rise in so few steps (docs/retrieval.md, "SPLADE"): what is asserted is the regulariser's effect."""
    zero = evaluate_base("sparse-embedding", retrieval["base"], retrieval["beir"], max_length=48)
    (plain, m), (_, f) = splade["plain"], splade["flops"]
    # evaluation counts the kept terms (at most max_terms, 256); the training log every non-zero
    assert (f["eval_document_terms"] < 0.5 * m["eval_document_terms"] and f["eval_query_terms"] < 0.5
            * m["eval_query_terms"])
    log = [json.loads(line) for line in open(plain / "metrics.jsonl") if '"loss"' in line]
    flog = [json.loads(line) for line in open(splade["flops"][0] / "metrics.jsonl") if '"loss"' in line]
    assert flog[-1]["document_terms"] < 0.2 * log[-1]["document_terms"], (flog[-1], log[-1])
    assert log[-1]["loss"] < log[0]["loss"] and {"query_terms", "document_terms", "flops_loss"} <= set(log[0])
    assert zero["query_terms"] == 256  # the untrained head's vectors: every one of the kept terms non-zero


def test_the_splade_run_is_a_sparse_encoder_and_its_bundle_serves_its_vectors(splade, tmp_path):
    st = pytest.importorskip("sentence_transformers")
    from mlmkit.runtime.pipeline import Pipeline
    from mlmkit.train.finetune import load_finetuned

    run = splade["plain"][0]  # every vocabulary entry still in play: more than the bundle's 256 kept terms
    texts = ["Return the number of items in the queue.", "A Mapping is a container."]
    theirs = st.SparseEncoder(str(run), device="cpu").encode(texts, convert_to_tensor=True).to_dense().numpy()
    task, net, tok, meta = load_finetuned(run)
    ctx = TaskContext(max_length=meta.max_length, options=meta.options)
    from mlmkit.text.batching import pad_features

    batch = pad_features(task.featurize([{"text": t} for t in texts], tok, ctx, training=False), 0)
    with torch.no_grad():
        full = net.vectors(*(torch.from_numpy(batch[k])
                             for k in ("input_ids", "attention_mask", "token_type_ids"))).numpy()
    assert np.abs(full - theirs).max() < 1e-5
    bundle = tmp_path / "bundle"
    run_export(run, bundle)
    for got, want in zip(Pipeline.load(bundle)(texts), full):  # the 256 largest terms, with the run's weights
        assert len(got["indices"]) == 256 and np.abs(np.asarray(got["values"])
                                                     - want[got["indices"]]).max() < 1e-4
        rest = np.delete(want, got["indices"])
        assert min(got["values"]) >= rest.max() - 1e-4


def test_a_splade_base_needs_a_masked_lm_head(retrieval, tmp_path):
    emb = retrieval["run"]  # an embedding run: an encoder without the MLM head
    with pytest.raises(TaskError,
                       match="has no cls.predictions weights, which the sparse-embedding task starts from"):
        run_finetune("sparse-embedding", emb, retrieval["beir"], tmp_path / "x", steps=1, progress=False)


def test_a_loss_on_the_wrong_kind_of_data_is_one_line(retrieval, tmp_path):
    with pytest.raises(TaskError, match="the cosent loss trains on scored pairs, and the data are rows"):
        run_finetune("embedding", retrieval["base"], retrieval["beir"], tmp_path / "x", steps=1,
                     options={"loss": "cosent"}, progress=False)
    with pytest.raises(TaskError, match="matryoshka_dims '64,9999'"):
        run_finetune("embedding", retrieval["base"], retrieval["beir"], tmp_path / "y", steps=1,
                     options={"matryoshka_dims": "64,9999"}, progress=False)


# ---- torchrun: in-batch negatives from every rank ----------------------------------------------------------
def _half(batch: dict[str, torch.Tensor], rank: int, examples: int) -> dict[str, torch.Tensor]:
    """Rank ``rank``'s share of a batch: its examples, numbered from 0."""
    keep = (batch["example"] >= rank * examples) & (batch["example"] < (rank + 1) * examples)
    half = {k: v[keep] for k, v in batch.items()}
    half["example"] = half["example"] - rank * examples
    return half


def _ddp_rank(out: str, run: str, data: str) -> None:
    """The ranks of the torchrun tests below (run by torch.distributed.run), in one process group, one
    launch: "mnrl" under DistributedDataParallel; "cached-mnrl" as the Trainer runs it, without DDP's
    reducer (its gradients averaged once, after its own backward passes); "evaluate": the Trainer's
    evaluation of ``run`` on ``data``, its batches spread over the ranks. Rank 0 saves each one's result."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    results = {name: _ddp_step(rank, name) for name in ("mnrl", "cached-mnrl", "colbert")}
    metrics, predictions, share = _evaluate_run(Path(run), Path(data))
    results["evaluate"] = {"metrics": metrics, "predictions": predictions, "share": share}
    if rank == 0:
        torch.save(results, out)
    dist.barrier()  # as the Trainer ends: no rank tears gloo down while another still talks to it
    dist.destroy_process_group()


def _ddp_step(rank: int, loss_name: str) -> dict:
    """One training step's loss and gradients (after their averaging over the ranks) on this rank's half of a
    batch."""
    from mlmkit.train.devices import average_gradients, broadcast_parameters, syncs_own_gradients

    if loss_name in ("mnrl", "colbert"):
        model = torch.nn.parallel.DistributedDataParallel(_embedding_model() if loss_name == "mnrl"
                                                          else _colbert_model())
    else:
        model = _embedding_model(loss="cached-mnrl", mini_batch_size=3)
        assert syncs_own_gradients(model)
        if rank == 1:  # rank 0's weights reach every rank
            torch.nn.init.normal_(model.bert.embeddings.word_embeddings.weight)
        broadcast_parameters(model)
    loss = model(**_half(_training_batch(8), rank, 4))["loss"]
    loss.backward()
    if loss_name == "cached-mnrl":
        average_gradients(model)
    return {"loss": float(loss.detach()),
            "grads": {n.removeprefix("module."): p.grad for n, p in model.named_parameters()
                       if p.grad is not None}}


@pytest.fixture(scope="module")
def torchrun_rank0(retrieval, tmp_path_factory) -> dict:
    """Rank 0's results of _ddp_rank: two processes started as torchrun starts its workers (RANK,
    WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT; without the launcher's own process, which
    tests/train/test_ddp.py runs) serve the four tests below."""
    import os
    import socket
    import subprocess

    out = tmp_path_factory.mktemp("torchrun") / "rank0.pt"
    tests = str(Path(__file__).resolve().parents[1])  # conftest's directory, for the script's imports
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")])),
           "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    # files, not pipes: neither rank blocks on a full one
    logs = [out.with_name(f"rank{r}.err") for r in (0, 1)]
    ranks = []
    for r, log in enumerate(logs):
        with open(log, "w") as err:
            ranks.append(subprocess.Popen([sys.executable, str(Path(__file__).resolve()), str(out),
                                           str(retrieval["run"]),
                                           str(retrieval["beir"])],
                                          env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                                          stdout=subprocess.DEVNULL, stderr=err))
    try:
        for p in ranks:
            p.wait(timeout=180)
    finally:
        for p in ranks:
            p.kill()
    assert all(p.returncode == 0 for p in ranks), [log.read_text()[-3000:] for log in logs]
    return torch.load(out)


def test_mnrl_under_torchrun_sees_every_ranks_negatives(torchrun_rank0):
    """Two gloo processes, each with half of a batch: the loss and every gradient (after DDP's
    averaging) equal one process's over the whole batch, so each anchor met the other rank's texts."""
    _equals_one_process(torchrun_rank0["mnrl"], _embedding_model, halves=True)


def _equals_one_process(got: dict, make_model, halves: bool = False) -> None:
    """``got`` (rank 0's loss and gradients, after their averaging over the ranks) equal one process's
    over the whole batch, with a model from ``make_model``; ``halves``: and not a half batch's loss alone."""
    model = make_model()
    loss = model(**_training_batch(8))["loss"]
    loss.backward()
    assert got["loss"] == pytest.approx(float(loss.detach()), abs=1e-5)
    if halves:
        half = make_model()
        assert float(half(**_half(_training_batch(8), 0, 4))["loss"].detach()) != pytest.approx(got["loss"],
                                                                                                abs=1e-3)
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert got["grads"].keys() == grads.keys() and len(grads) > 10
    for name, g in grads.items():
        assert torch.allclose(got["grads"][name], g, atol=1e-5), (name,
                                                                  float((got["grads"][name] - g).abs().max()))


def _evaluate_run(run: Path, data: Path) -> tuple[dict, list, int]:
    """The Trainer's evaluation (TaskEvaluator, batches of 16) of ``run`` on ``data``: its metrics, its
    predictions, and how many of the batches this process ran."""
    from mlmkit.runtime import prediction
    from mlmkit.train.finetune import TaskEvaluator, load_finetuned

    task, net, tok, meta = load_finetuned(run)
    ctx = TaskContext(max_length=meta.max_length, options=meta.options)
    calls = []
    real = prediction.run_features

    def counted(features, forward, *a, **kw):
        return real(features, lambda b: calls.append(1) or forward(b), *a, **kw)

    prediction.run_features = counted
    try:
        ev = TaskEvaluator(task, task.read(data, meta.options), tok, ctx, batch_size=16)
        metrics = ev(net)
    finally:
        prediction.run_features = real
    return metrics, ev.predictions, len(calls)


def test_evaluation_under_torchrun_is_spread_and_equals_one_process(retrieval, torchrun_rank0):
    """The Trainer's evaluation in two gloo processes: each rank runs about half of the batches, and
    the metrics and predictions are one process's."""
    got = torchrun_rank0["evaluate"]
    metrics, predictions, batches = _evaluate_run(retrieval["run"], retrieval["beir"])
    assert batches >= 4 and abs(got["share"] - batches / 2) <= 1, (got["share"], batches)
    assert got["metrics"].keys() == metrics.keys()
    for k, v in metrics.items():
        assert got["metrics"][k] == pytest.approx(v, abs=1e-6), k
    assert got["predictions"] == predictions


def test_cached_mnrl_under_torchrun_equals_one_process(torchrun_rank0):
    """cached-mnrl in two gloo processes (mini-batches of 3, no DDP reducer, one gradient all-reduce):
    the loss and every gradient equal one process's mnrl over the whole batch."""
    _equals_one_process(torchrun_rank0["cached-mnrl"], _embedding_model)


def test_colbert_under_torchrun_sees_every_ranks_negatives(torchrun_rank0):
    """The colbert task's mnrl (MaxSim) in two gloo processes under DistributedDataParallel: the loss and
    every gradient equal one process's over the whole batch, so each query met the other rank's documents."""
    _equals_one_process(torchrun_rank0["colbert"], _colbert_model, halves=True)


if __name__ == "__main__":
    _ddp_rank(*sys.argv[1:])
