"""Late interaction (the colbert task): its losses, a fine-tune on the built-in retrieval set,
sentence-transformers' MultiVectorEncoder on mlmkit's run and mlmkit on theirs (and on PyLate and
Stanford ColBERT layouts), the bundle, `mlmkit embed` and bad input (MaxSim against its formula:
tests/retrieval/test_maxsim.py)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import make_base_model, run_export, run_finetune
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from mlmkit.cli import app
from mlmkit.errors import ConfigError
from mlmkit.quickstart.retrieval_set import write_retrieval_set
from mlmkit.retrieval.maxsim import rank
from mlmkit.retrieval.reranking import maxsim_of
from mlmkit.rundir.meta import read_meta
from mlmkit.text.batching import pad_features
from mlmkit.text.tokenizer import load_tokenizer
from mlmkit.train import losses
from mlmkit.train.finetune import evaluate_base, load_finetuned
from mlmkit.train.losses import PairBatch

runner = CliRunner()
TEXTS = ["Return the number of items in the queue.", "A Mapping is a container, isn't it?", "x"]
SMALL = {"dim": 16, "query_length": 12, "query_expansion": True}  # expansion on: its parity is tested here


def _maxsim_loop(q: np.ndarray, d: np.ndarray) -> float:
    return float(sum(max(float(a @ b) for b in d) for a in q)) if len(d) else 0.0


# ---- the losses, against plain formulas --------------------------------------------------------------------
def _batch(parts: list[list[int]], scores: list[list[float]]) -> PairBatch:
    example = [i for i, ps in enumerate(parts) for _ in ps]
    part = [p for ps in parts for p in ps]
    score = [s for ss in scores for s in ss]
    return PairBatch(torch.tensor(example), torch.tensor(part), torch.arange(len(part)), torch.tensor(score))


def test_kl_distill_is_the_kl_of_the_teachers_softmax_to_the_students_over_each_querys_candidates():
    torch.manual_seed(0)
    b = _batch([[0, 1, 2, 3], [0, 1, 2]], [[0.0, 3.0, 1.0, -1.0], [0.0, 2.0, 2.5]])
    E = torch.randn(len(b.part), 6)
    want = 0.0
    for a, cands in ((0, [1, 2, 3]), (4, [5, 6])):
        s = torch.tensor([float(E[a] @ E[c]) for c in cands]) / 2.0
        t = b.score[cands] / 2.0
        p = torch.softmax(t, 0)
        want += float((p * (torch.log(p) - torch.log_softmax(s, 0))).sum())
    got = losses.DistillKLDivLoss(dot=True, temperature=2.0)(E, b)
    assert float(got) == pytest.approx(want / 2 * 4.0, abs=1e-5)
    # the embedding task's form: the cosine times scale, at temperature 1
    cos = torch.nn.functional.normalize(E, dim=-1)
    want = 0.0
    for a, cands in ((0, [1, 2, 3]), (4, [5, 6])):
        s = torch.tensor([20.0 * float(cos[a] @ cos[c]) for c in cands])
        p = torch.softmax(b.score[cands], 0)
        want += float((p * (torch.log(p) - torch.log_softmax(s, 0))).sum())
    assert float(losses.DistillKLDivLoss(scale=20.0)(E, b)) == pytest.approx(want / 2, rel=1e-5)


def test_margin_mse_with_a_similarity_scores_each_anchor_against_its_own_candidates():
    torch.manual_seed(0)
    b = _batch([[0, 1, 2], [0, 1, 2, 3]], [[0.0, 2.0, 0.5], [0.0, 1.0, 0.0, -1.0]])
    E = torch.randn(len(b.part), 6)
    dot = lambda x, y: x @ y.T  # noqa: E731
    assert float(losses.MarginMSELoss(similarity=dot)(E, b)) == pytest.approx(float(losses.MarginMSELoss()(
        E, b)), rel=1e-6)


# ---- end to end on the built-in retrieval set --------------------------------------------------------------
@pytest.fixture(scope="module")
def colbert(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("colbert")
    beir = tmp / "set"
    write_retrieval_set(beir, max_documents=300)
    texts = [json.loads(line)["text"] for f in ("corpus.jsonl", "queries.jsonl") for line in open(beir / f)]
    base = make_base_model(tmp / "base", texts, vocab_size=1500)
    run = tmp / "run"
    metrics = run_finetune("colbert", base, beir, run, eval_file=beir, steps=24, lr=2e-3, batch_size=64,
                           max_length=48, eval_every=1000, progress=False, options=SMALL)
    return {"tmp": tmp, "beir": beir, "base": base, "run": run, "metrics": metrics}


def test_fine_tuning_learns_retrieval_from_a_random_projection(colbert):
    zero = evaluate_base("colbert", colbert["base"], colbert["beir"], max_length=48, options=SMALL)
    tuned = colbert["metrics"]
    assert tuned["eval_ndcg@10"] > zero["ndcg@10"] + 0.1, (zero, tuned)
    log = [json.loads(line) for line in open(colbert["run"] / "metrics.jsonl") if '"loss"' in line]
    assert log[-1]["loss"] < log[0]["loss"]


def _ours(run: Path, kind: str, texts: list[str] = TEXTS) -> list[np.ndarray]:
    """Each text's token vectors as mlmkit's torch model and the task's postprocess give them."""
    task, net, tok, meta = load_finetuned(run)
    ctx = replace(meta.context({**task.resolve_options(saved=meta.options), "input_type": kind}),
                  tokenizer=tok)
    examples = [{"text": t} for t in texts]
    feats = task.featurize(examples, tok, ctx, training=False)
    with torch.no_grad():
        out = net(**{k: torch.from_numpy(v) for k, v in pad_features(feats, 0).items()})["vectors"].numpy()
    preds = task.postprocess({"vectors": [o[: len(f["input_ids"])] for o, f in zip(out, feats)]}, feats,
                             examples, ctx)
    return [np.asarray(p["vectors"], dtype=np.float32) for p in preds]


def _same(ours: list[np.ndarray], theirs: list, what: str) -> None:
    for a, b in zip(ours, theirs):
        b = np.asarray(b)
        assert a.shape == b.shape and np.abs(a - b).max() < 1e-5, (what, a.shape, b.shape)


def test_sentence_transformers_loads_the_run_with_the_same_token_vectors(colbert):
    st = pytest.importorskip("sentence_transformers")
    model = st.MultiVectorEncoder(str(colbert["run"]), device="cpu")
    _same(_ours(colbert["run"], "query"), model.encode_query(TEXTS, convert_to_numpy=True), "query")
    _same(_ours(colbert["run"], "document"), model.encode_document(TEXTS, convert_to_numpy=True), "document")
    q = _ours(colbert["run"], "query")
    assert all(len(v) == SMALL["query_length"] for v in q)  # expanded with [MASK]s to query_length
    tokens = load_tokenizer(colbert["run"]).encode("[D] " + TEXTS[1]).ids
    assert len(_ours(colbert["run"], "document")[1]) < len(tokens)  # the skiplist's punctuation left out


def test_mlmkit_loads_a_multi_vector_encoder_saved_by_sentence_transformers(colbert, tmp_path):
    st = pytest.importorskip("sentence_transformers")
    torch.manual_seed(3)
    model = st.MultiVectorEncoder(str(colbert["base"]), device="cpu")  # a bare encoder: a fresh projection
    model.save(str(tmp_path / "mve"))
    _same(_ours(tmp_path / "mve", "query"), model.encode_query(TEXTS, convert_to_numpy=True), "query")
    _same(_ours(tmp_path / "mve", "document"), model.encode_document(TEXTS, convert_to_numpy=True),
          "document")
    # and the run loads in mlmkit as it is: a colbert model from `mlmkit export` without --task
    bundle = tmp_path / "bundle"
    assert run_export(tmp_path / "mve", bundle)["task"] == "colbert"


def _tiny_checkpoint(run: Path, out: Path) -> tuple[dict, torch.Tensor]:
    """The run's encoder files copied to ``out``, its config and the projection weight."""
    import shutil

    shutil.copytree(run, out, ignore=shutil.ignore_patterns("*_Dense", "*_MultiVectorMask", "*_Normalize",
                                                            "modules.json",
                                                            "sentence_bert_config.json",
                                                            "config_sentence_transformers.json",
                                                            "mlmkit.json", "metrics.jsonl", "checkpoints"))
    config = json.loads((out / "config.json").read_text())
    return config, load_file(str(run / "1_Dense" / "model.safetensors"))["linear.weight"]


def test_mlmkit_loads_a_stanford_colbert_checkpoint_as_sentence_transformers_does(colbert, tmp_path):
    st = pytest.importorskip("sentence_transformers")
    d = tmp_path / "stanford"
    config, weight = _tiny_checkpoint(colbert["run"], d)
    (d / "config.json").write_text(json.dumps({**config, "architectures": ["HF_ColBERT"]}))
    sd = load_file(str(d / "model.safetensors"))
    save_file({**sd, "linear.weight": weight.contiguous()}, str(d / "model.safetensors"))
    (d / "artifact.metadata").write_text(json.dumps({"query_token_id": "[unused0]",
                                                     "doc_token_id": "[unused1]",
                                                     "query_maxlen": 10, "doc_maxlen": 40,
                                                     "dim": SMALL["dim"],
                                                     "mask_punctuation": True,
                                                     "attend_to_mask_tokens": False}))
    model = st.MultiVectorEncoder(str(d), device="cpu")
    _same(_ours(d, "query"), model.encode_query(TEXTS, convert_to_numpy=True), "query")
    _same(_ours(d, "document"), model.encode_document(TEXTS, convert_to_numpy=True), "document")


def test_mlmkit_loads_a_pylate_checkpoint_as_sentence_transformers_does(colbert, tmp_path):
    st = pytest.importorskip("sentence_transformers")
    d = tmp_path / "pylate"
    config, weight = _tiny_checkpoint(colbert["run"], d)
    (d / "config.json").write_text(json.dumps({**config, "architectures": ["BertModel"]}))
    (d / "1_Dense").mkdir()
    save_file({"linear.weight": weight.contiguous()}, str(d / "1_Dense" / "model.safetensors"))
    dense = {"in_features": weight.shape[1], "out_features": weight.shape[0], "bias": False,
             "activation_function": "torch.nn.modules.linear.Identity"}
    (d / "1_Dense" / "config.json").write_text(json.dumps(dense))
    (d / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"}]))
    (d / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 40, "do_lower_case": False}))
    (d / "config_sentence_transformers.json").write_text(json.dumps({
        "model_type": "ColBERT", "query_prefix": "[unused0]", "document_prefix": "[unused1]",
        "query_length": 10, "document_length": 40,
        "attend_to_expansion_tokens": False, "skiplist_words": list("!,.?'"),
        "similarity_fn_name": "MaxSim"}))
    model = st.MultiVectorEncoder(str(d), device="cpu")
    _same(_ours(d, "query"), model.encode_query(TEXTS, convert_to_numpy=True), "query")
    _same(_ours(d, "document"), model.encode_document(TEXTS, convert_to_numpy=True), "document")


@pytest.fixture(scope="module")
def bundle(colbert):
    out = colbert["tmp"] / "bundle"
    run_export(colbert["run"], out)
    return out


def test_the_bundle_scores_what_the_run_scores_and_embed_writes_token_vectors(colbert, bundle, tmp_path):
    r = runner.invoke(app, ["evaluate", str(bundle), "--data", str(colbert["beir"]), "--json"],
                      env={"COLUMNS": "1000"})
    assert r.exit_code == 0, r.output
    assert abs(json.loads(r.stdout)["ndcg@10"] - colbert["metrics"]["eval_ndcg@10"]) < 0.002
    inputs = tmp_path / "in.jsonl"
    inputs.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(TEXTS)))
    for kind in ("query", "document"):
        out = tmp_path / f"{kind}.parquet"
        r = runner.invoke(app,
                          ["embed", str(bundle), "--input", str(inputs), "--output", str(out), "--as", kind])
        assert r.exit_code == 0, r.output
        import pyarrow.parquet as pq

        rows = pq.read_table(out).to_pylist()
        _same([np.asarray(row["vectors"], dtype=np.float32) for row in rows], _ours(colbert["run"], kind),
              kind)
    mixed = tmp_path / "mixed.jsonl"  # a record's own input_type sets its kind
    mixed.write_text(json.dumps({"text": TEXTS[0], "input_type": "query"}) + "\n"
                     + json.dumps({"text": TEXTS[0]}) + "\n")
    r = runner.invoke(app, ["embed", str(bundle), "--input", str(mixed), "--json"])
    assert r.exit_code == 0, r.output
    got = [np.asarray(json.loads(line)["vectors"], dtype=np.float32) for line in r.stdout.splitlines()
           if line.startswith("{")]
    _same(got, [_ours(colbert["run"], "query")[0], _ours(colbert["run"], "document")[0]], "mixed")


def test_colbert_reranks_bm25s_candidates_and_mlmkit_rerank_ranks_by_maxsim(colbert, bundle):
    pytest.importorskip("bm25s")
    args = ["evaluate", str(bundle), "--data", str(colbert["beir"]), "--json"]
    exact = json.loads(runner.invoke(app, args).stdout)
    r = runner.invoke(app, [*args, "--first-stage", "bm25", "--rerank-top", "20"])
    assert r.exit_code == 0, r.output
    reranked = json.loads(r.stdout)
    bm25 = reranked.pop("first_stage")
    assert reranked["recall@100"] == bm25["recall@100"]  # the same 20 candidates a query, reordered by MaxSim
    assert reranked["ndcg@10"] != bm25["ndcg@10"] and exact["ndcg@10"] > 0
    docs = [json.loads(line)["text"] for line in open(colbert["beir"] / "corpus.jsonl")][:8]
    query = json.loads(open(colbert["beir"] / "queries.jsonl").readline())["text"]
    r = runner.invoke(app, ["rerank", str(bundle), *docs, "--query", query, "--json"])
    assert r.exit_code == 0, r.output
    got = [json.loads(line) for line in r.stdout.splitlines()]
    q = _ours(colbert["run"], "query", [query])[0]
    want = [_maxsim_loop(q, d) for d in _ours(colbert["run"], "document", docs)]
    assert [g["index"] for g in got] == sorted(range(len(docs)), key=lambda i: -want[i])
    assert np.allclose([g["score"] for g in got], sorted(want, reverse=True), atol=1e-3)


# ---- the multi-vector index --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def colbert_index(colbert, bundle):
    out = colbert["tmp"] / "index"
    r = runner.invoke(app, ["index", str(bundle), "--corpus", str(colbert["beir"] / "corpus.jsonl"), "--out",
                            str(out), "--json"])
    assert r.exit_code == 0, r.output
    return out, json.loads(r.stdout)


def _corpus_texts(beir: Path) -> list[str]:
    return [f"{d['title']} {d['text']}".strip() for d in map(json.loads, open(beir / "corpus.jsonl"))]


def test_a_colbert_index_codes_the_token_vectors_searches_as_exact_maxsim_and_evaluates_as_the_bundle(colbert,
                                                                                                      bundle,
                                                                                                     colbert_index):
    from mlmkit.retrieval.index import Index, evaluate_index, query_vectors, search_vectors
    from mlmkit.retrieval.index.multivector import documents
    from mlmkit.runtime.pipeline import Pipeline

    out, summary = colbert_index
    ix = Index.open(out)
    assert ix.kind == "multivector" and summary["count"] == ix.count == 300 and ix.codec is not None
    # a uint16 code and 2 bits a dimension
    assert summary["bytes_per_token_vector"] == 2 + SMALL["dim"] * 2 / 8
    true = [np.asarray(r["vectors"], dtype=np.float32)
            for r in Pipeline.load(bundle)(_corpus_texts(colbert["beir"]),
                                               input_type="document")]
    decoded = documents(ix, np.arange(ix.count))
    assert [len(d) for d in decoded] == [len(t) for t in true] and summary["tokens"] == sum(map(len, true))
    cosines = np.concatenate([(d * t).sum(1) for d, t in zip(decoded, true)])
    assert cosines.mean() > 0.9, cosines.mean()
    # every document rescored: the hits are exact MaxSim over the decoded vectors
    queries = [json.loads(line)["text"] for line in open(colbert["beir"] / "queries.jsonl")][:16]
    q = query_vectors(ix, queries)
    rows, scores = search_vectors(ix, q, 10, rescore=ix.count)
    want = rank(q, decoded, 10)
    assert [list(r) for r in rows] == [[j for j, _ in w] for w in want]
    assert np.allclose(scores, [[s for _, s in w] for w in want], atol=1e-4)
    # the default three stages keep what exact MaxSim over every decoded document finds (the coding's own loss
    # on this 16-dimension model is measured on all-MiniLM-L6-v2 in benchmarks/late_interaction.py)
    r = runner.invoke(app, ["evaluate", str(out), "--data", str(colbert["beir"]), "--json"])
    assert r.exit_code == 0, r.output
    everything = evaluate_index(out, colbert["beir"], rescore=ix.count)
    assert abs(json.loads(r.stdout)["ndcg@10"] - everything["ndcg@10"]) < 0.01, (r.stdout, everything)
    pruned = search_vectors(ix, q, 10)[0]
    assert np.mean([len(set(a) & set(b)) / 10 for a, b in zip(pruned, rows)]) > 0.9
    from mlmkit.retrieval.index import IndexRetriever

    ids = [json.loads(line)["_id"] for line in open(colbert["beir"] / "corpus.jsonl")]
    miner = IndexRetriever(out, {i: n for n, i in enumerate(ids)})  # mlmkit mine --retriever INDEX
    places, found = miner.search(queries[:4], 5)
    want_rows, want_scores = search_vectors(ix, q[:4], 5)  # the index's rows are the corpus's places
    assert (places == want_rows).all() and np.allclose(found, want_scores, atol=1e-5)
    assert np.allclose(miner.pair_scores(queries[:4], list(rows[:4, 0])), scores[:4, 0], atol=1e-4)
    r = runner.invoke(app, ["search", str(out), queries[0], "--json", "--top-k", "3"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout.splitlines()[0])["hits"]
    assert [h["id"] for h in got] == ix.ids(search_vectors(ix, q[:1], 3)[0][0])
    export = colbert["tmp"] / "index.parquet"
    r = runner.invoke(app, ["search", str(out), "--export", str(export)])
    assert r.exit_code == 0, r.output
    import pyarrow.parquet as pq

    table = pq.read_table(export).to_pylist()
    assert len(table) == ix.count and np.allclose(np.asarray(table[3]["vectors"], dtype=np.float32),
                                                  decoded[3])


def test_a_colbert_index_deletes_and_compacts_to_the_same_coded_vectors_and_hits(colbert, colbert_index,
                                                                                 tmp_path):
    import shutil

    from mlmkit.retrieval.index import Index, query_vectors, search_vectors
    from mlmkit.retrieval.index.multivector import documents

    out = tmp_path / "live"
    shutil.copytree(colbert_index[0], out)
    ids = [json.loads(line)["_id"] for line in open(colbert["beir"] / "corpus.jsonl")]
    (tmp_path / "gone.txt").write_text("".join(i + "\n" for i in ids[:100]))
    before = Index.open(out)
    decoded = documents(before, np.arange(before.count))
    q = query_vectors(before,
                      [json.loads(line)["text"] for line in open(colbert["beir"] / "queries.jsonl")][:8])
    assert runner.invoke(app, ["index", str(out), "--delete", str(tmp_path / "gone.txt")]).exit_code == 0
    deleted = Index.open(out)
    rows, scores = search_vectors(deleted, q, 10, rescore=deleted.count)
    assert (rows >= 100).all()  # never a deleted document: exact MaxSim over the 200 left
    want = rank(q, decoded[100:], 10)
    assert [list(r - 100) for r in rows] == [[j for j, _ in w] for w in want]
    r = runner.invoke(app, ["index", str(out), "--compact", "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["count"] == 200, r.output
    compacted = Index.open(out)
    assert compacted.manifest["tokens"] == sum(len(d) for d in decoded[100:])
    assert all(np.array_equal(a, b) for a, b in zip(documents(compacted, np.arange(200)), decoded[100:]))
    rows2, scores2 = search_vectors(compacted, q, 10, rescore=200)
    assert (rows2 == rows - 100).all() and np.allclose(scores2, scores)
    assert [compacted.ids(r) for r in search_vectors(compacted, q, 10)[0]] == [deleted.ids(
        r) for r in search_vectors(deleted, q, 10)[0]]


def test_a_killed_colbert_build_resumes_to_a_straight_ones_files_and_an_append_codes_with_the_index_codec(
        colbert, bundle, tmp_path, monkeypatch):
    from mlmkit.retrieval.index import BuildArgs, Index, build
    from mlmkit.retrieval.index import multivector as mv

    # the centroids trained on the first documents, in every build
    monkeypatch.setattr(mv, "SAMPLE_TOKENS", 2000)
    docs = open(colbert["beir"] / "corpus.jsonl").readlines()
    corpus, first, rest = tmp_path / "all.jsonl", tmp_path / "first.jsonl", tmp_path / "rest.jsonl"
    corpus.write_text("".join(docs))
    first.write_text("".join(docs[:200]))
    rest.write_text("".join(docs[200:]))
    build(BuildArgs(bundle, corpus, tmp_path / "straight", window=32))
    seen = [0]

    def kill(n: int) -> None:
        seen[0] += n
        if seen[0] >= 160:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        build(BuildArgs(bundle, corpus, tmp_path / "killed", window=32), kill)
    assert ((tmp_path / "killed" / ".pending" / mv.CODEC).is_file()
            and not (tmp_path / "killed" / "manifest.json").exists())
    build(BuildArgs(bundle, corpus, tmp_path / "killed", window=32, resume=True))
    build(BuildArgs(bundle, first, tmp_path / "appended", window=32))
    build(BuildArgs(bundle, rest, tmp_path / "appended", window=32, append=True))
    for name in ("shard-000000/lengths.bin", "shard-000000/codes.bin", "shard-000000/residuals.bin",
                 "shard-000000/offsets.bin", "shard-000000/rows.bin", mv.CODEC):
        assert (tmp_path / "killed" / name).read_bytes() == (tmp_path / "straight" / name).read_bytes(), name
    a, b = Index.open(tmp_path / "straight"), Index.open(tmp_path / "appended")
    assert len(b.shards) == 2 and b.count == a.count and b.manifest["tokens"] == a.manifest["tokens"]
    assert all(np.array_equal(x, y)
               for x, y in zip(mv.documents(a, np.arange(a.count)), mv.documents(b, np.arange(b.count))))
    r = runner.invoke(app, ["index", str(bundle), "--corpus", str(rest), "--out", str(tmp_path / "appended"),
                            "--append",
                            "--bits", "1"])
    assert r.exit_code == 2 and "--bits 2" in r.output, r.output


def test_bad_input_to_a_colbert_index_is_one_line_and_changes_nothing(colbert, bundle, colbert_index,
                                                                      tmp_path):
    import shutil

    out, _ = colbert_index
    corpus = str(colbert["beir"] / "corpus.jsonl")
    for argv, match in ((["--quantization", "int8"], "takes no --quantization"),
                        (["--bits", "3"], "--bits 3: use 1 or 2"),
                        (["--ann", "hnsw"], "takes no --quantization, --ann")):
        r = runner.invoke(app,
                          ["index", str(bundle), "--corpus", corpus, "--out", str(tmp_path / "x"), *argv])
        assert r.exit_code == 2 and match in r.output and "Traceback" not in r.output, r.output
    for name, damage in (("shard-000000/codes.bin", lambda f: f.write_bytes(f.read_bytes()[:-6])),
                         ("codec.npz", lambda f: f.write_bytes(b"not a codec")),
                         ("codec.npz", lambda f: f.write_bytes(f.read_bytes()[:200])),  # a truncated zip
                         ("shard-000000/residuals.bin", lambda f: f.write_bytes(b"")),
                         ("manifest.json",
                          lambda f: f.write_text(f.read_text().replace('"nprobe": 4', '"nprobe": "four"')))):
        broken = tmp_path / f"{name.replace('/', '-')}-{len(list(tmp_path.iterdir()))}"
        shutil.copytree(out, broken)
        damage(broken / name)
        r = runner.invoke(app, ["search", str(broken), "a query"])
        assert r.exit_code == 2 and name.split("/")[-1] in r.output and "Traceback" not in r.output, r.output
    r = runner.invoke(app, ["search", str(out), "a query", "--rescore", "2", "--top-k", "5"])
    assert r.exit_code == 2 and "--rescore 2 is below --top-k 5" in r.output, r.output
    # an embedding bundle on the colbert index, and the colbert bundle on an embedding index
    from task_runs import make_task_run

    emb = tmp_path / "emb-bundle"
    run_export(make_task_run(colbert["base"], "embedding", tmp_path / "emb-run"), emb)
    dense = tmp_path / "dense"
    r = runner.invoke(app, ["index", str(emb), "--corpus", corpus, "--out", str(dense)])
    assert r.exit_code == 0, r.output
    for index, other in ((out, emb), (dense, bundle)):
        r = runner.invoke(app, ["search", str(index), "a query", "--bundle", str(other)])
        assert (r.exit_code == 2 and "was built with the bundle" in r.output
                and "Traceback" not in r.output), r.output


def test_cached_mnrl_gives_mnrls_loss(colbert):
    from mlmkit.registry import get_task

    task, net, tok, meta = load_finetuned(colbert["run"])
    rows = [{"anchor": f"query {i}", "positive": f"the document {i} .", "negatives": [f"other {i}"]}
            for i in range(6)]
    got = []
    for loss in ("mnrl", "cached-mnrl"):
        opts = task.resolve_options({**SMALL, "loss": loss, "mini_batch_size": 4})
        ctx = replace(meta.context(opts), tokenizer=tok)
        model = get_task("colbert").build_model(load_finetuned(colbert["run"])[1].config, ctx)
        model.load_state_dict(net.state_dict(), strict=False)
        feats = task.featurize(rows, tok, ctx, training=True)
        batch = pad_features(feats, 0, extra=task.label_names)
        out = model(**{k: torch.from_numpy(v) for k, v in batch.items()})
        out["loss"].backward()
        got.append((float(out["loss"].detach()), model.linear.weight.grad.clone()))
    assert got[0][0] == pytest.approx(got[1][0], rel=1e-5) and torch.allclose(got[0][1], got[1][1], atol=1e-5)


def test_kl_distill_trains_on_rows_with_teacher_scores(colbert, tmp_path):
    rows = tmp_path / "rows.jsonl"
    corpus = [json.loads(line) for line in open(colbert["beir"] / "corpus.jsonl")][:40]
    # the teacher prefers the first negative, against what the model starts with: learning it is the loss
    # falling
    rows.write_text("".join(json.dumps({"anchor": d["text"][:40], "positive": d["text"],
                                        "negative_1": corpus[i - 1]["text"],
                                        "negative_2": corpus[i - 2]["text"], "scores": [0.0, 5.0, 0.0]})
                            + "\n"
                            for i, d in enumerate(corpus)))
    out = tmp_path / "kl"
    run_finetune("colbert", colbert["run"], rows, out, steps=12, lr=1e-3, batch_size=24, max_length=48,
                 progress=False,
                 log_every=1, options={"loss": "kl-distill"})
    # a fresh projection trains at the task's own head learning rate; one carried over, at --lr
    assert read_meta(colbert["run"]).train_args["head_lr"] == 1e-3
    assert read_meta(out).train_args["head_lr"] is None
    log = [json.loads(line)["loss"] for line in open(out / "metrics.jsonl") if '"loss"' in line]
    assert len(log) == 12 and np.mean(log[-3:]) < 0.75 * np.mean(log[:3]) and all(map(math.isfinite,
                                                                                      log)), log
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"anchor": "a", "positive": "b", "negative_1": "c"}) + "\n")
    r = runner.invoke(app, ["finetune", "colbert", "--model", str(colbert["run"]), "--train", str(bad),
                            "--out", str(tmp_path / "x"),
                            "--option", "loss=kl-distill"])
    assert (r.exit_code == 2 and "kl-distill needs the teacher's scores" in r.output
            and "bad.jsonl" in r.output)


def test_bad_options_are_one_line(colbert, tmp_path):
    for option, match in (("query_length=4096", "query_length 4096 exceeds the model's 512 positions"),
                          ("dim=0", "dim")):
        r = runner.invoke(app, ["finetune", "colbert", "--model", str(colbert["base"]), "--train",
                                str(colbert["beir"]),
                                "--out", str(tmp_path / "x"), "--option", option])
        assert r.exit_code == 2 and match in r.output and "Traceback" not in r.output, r.output
    with pytest.raises(ConfigError, match="query_length"):
        evaluate_base("colbert", colbert["base"], colbert["beir"], options={"query_length": 4096})


def test_serve_answers_token_vectors_on_predict_and_refuses_them_on_the_embedding_routes(colbert, bundle,
                                                                                         colbert_index,
                                                                                         tmp_path):
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    from serve_process import Server

    s = Server(tmp_path, f"colbert={bundle}", "--search-index", f"docs={colbert_index[0]}")
    try:
        query = json.loads(open(colbert["beir"] / "queries.jsonl").readline())["text"]
        r = httpx.post(s.url + "/v1/search", json={"query": query, "top_k": 3}, timeout=30)
        want = runner.invoke(app, ["search", str(colbert_index[0]), query, "--json", "--top-k", "3"]).stdout
        assert r.status_code == 200 and r.json()["results"][0]["hits"] == json.loads(want)["hits"], r.text
        r = httpx.post(s.url + "/v1/search", json={"vector": [0.0] * SMALL["dim"]}, timeout=30)
        assert r.status_code == 422 and "multi-vector" in r.text, r.text
        r = s.post("colbert", {"inputs": TEXTS, "options": {"input_type": "query"}})
        assert r.status_code == 200, r.text
        _same([np.asarray(x["vectors"], dtype=np.float32) for x in r.json()["results"]],
              _ours(colbert["run"], "query"),
              "served")
        r = httpx.post(s.url + "/v1/embeddings", json={"model": "colbert", "input": TEXTS}, timeout=30)
        assert r.status_code == 422 and "'embedding'" in r.json()["error"], r.text
        # reranking by MaxSim: Cohere's and TEI's shapes give the order and scores `mlmkit rerank` gives
        query, docs = "the number of items", TEXTS
        want = maxsim_of({"vectors": _ours(colbert["run"], "query", [query])[0]},
                         [{"vectors": v} for v in _ours(colbert["run"], "document", docs)])
        order = sorted(range(len(docs)), key=lambda i: -want[i])
        r = httpx.post(s.url + "/v1/rerank", json={"query": query, "documents": docs, "top_n": 2}, timeout=30)
        assert r.status_code == 200, r.text
        got = r.json()["results"]
        assert [x["index"] for x in got] == order[:2] and np.allclose([x["relevance_score"] for x in got],
                                                                      [want[i] for i in order[:2]], atol=1e-3)
        r = httpx.post(s.url + "/rerank", json={"query": query, "texts": docs}, timeout=30)
        assert r.status_code == 200 and [x["index"] for x in r.json()] == order, r.text
        r = s.post("colbert", {"inputs": [{"text": "a", "input_type": "both"}]})
        assert r.status_code == 422 and "input_type must be query or document" in r.text, r.text
    finally:
        s.stop()


def test_a_distilled_colbert_student_learns_the_teachers_vectors_and_loads_in_sentence_transformers(colbert,
                                                                                                    tmp_path):
    st = pytest.importorskip("sentence_transformers")
    from mlmkit.args import DistillArgs
    from mlmkit.train.distill import distill

    texts = tmp_path / "texts.jsonl"
    texts.write_text("".join(json.dumps({"text": json.loads(line)["text"]}) + "\n"
                             for line in list(open(colbert["beir"] / "corpus.jsonl"))[:48]))
    out = tmp_path / "student"
    m = distill(DistillArgs.from_flat(teacher=colbert["run"], train_file=texts, out=out, layers=1, steps=12,
                                      batch_size=16, lr=1e-3, log_every=1))
    log = [json.loads(line)["loss"] for line in open(out / "metrics.jsonl") if '"loss"' in line]
    assert np.mean(log[-3:]) < np.mean(log[:3]) and 0 < m["agreement_cosine"] <= 1, (log, m)
    model = st.MultiVectorEncoder(str(out), device="cpu")  # the projection written as 1_Dense here too
    _same(_ours(out, "document"), model.encode_document(TEXTS, convert_to_numpy=True), "student")


@pytest.mark.slow  # ~30 s: starts a Ray cluster
def test_a_ray_built_colbert_index_holds_the_documents_of_a_local_one(colbert, bundle, colbert_index,
                                                                      tmp_path):
    """`mlmkit index COLBERT --engine ray`: the same documents, in order, with as many token vectors each,
    coded as a local build codes them (Ray's batches pad otherwise: equal within rounding)."""
    ray = pytest.importorskip("ray")
    from mlmkit.retrieval.index import Index
    from mlmkit.retrieval.index.multivector import documents

    try:
        r = runner.invoke(app,
                          ["index", str(bundle), "--corpus", str(colbert["beir"] / "corpus.jsonl"), "--out",
                           str(tmp_path / "ray"), "--engine", "ray", "--workers", "2", "--threads", "2",
                           "--window", "100",
                           "--json"])
        assert r.exit_code == 0, (r.output, r.exception)
    finally:
        ray.shutdown()
    local, got = Index.open(colbert_index[0]), Index.open(tmp_path / "ray")
    rows = np.arange(local.count)
    assert (got.count == local.count and got.ids(rows) == local.ids(rows) and got.manifest["tokens"]
            == local.manifest["tokens"])
    a, b = documents(local, rows), documents(got, rows)
    assert [len(x) for x in a] == [len(y) for y in b]
    assert np.concatenate([(x * y).sum(1) for x, y in zip(a, b)]).mean() > 0.99


def test_a_token_vector_wider_than_the_ceiling_is_refused_before_anything_is_built():
    from mlmkit.registry import get_task

    with pytest.raises(ConfigError, match="dim=VALUE must be at most 8192, got 1000000000"):
        get_task("colbert").resolve_options({"dim": "1000000000"})
