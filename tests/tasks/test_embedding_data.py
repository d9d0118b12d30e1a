"""sentence-transformers directories read whole: each family's tiny random checkpoint wrapped as
sentence-transformers wraps the real releases (a pooling mode, Dense layers, Normalize, named prompts,
a max length) exports and embeds as sentence-transformers encodes; ``--prompt-name`` and
``--dimensions`` give what ``encode(prompt_name=..., truncate_dim=...)`` gives; a fine-tune from such a
directory keeps its modules and loads back in sentence-transformers with its bundle's vectors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import run_export, run_finetune
from family_checkpoints import runner, save_checkpoint

from mlmkit.cli import app
from mlmkit.runtime.pipeline import Pipeline

st = pytest.importorskip("sentence_transformers")
from sentence_transformers.base.modules import Dense, Normalize, Transformer  # noqa: E402
from sentence_transformers.sentence_transformer.modules import Pooling  # noqa: E402

PROMPTS = {"query": "search_query: ", "document": "search_document: ",
           "Clustering": "task: clustering | query: "}
TEXTS = ["the film was good", "john went to paris and the plot was very dull and the story too", "a",
         "not bad at all",
         "very very poor plot and a dull story to the end of the film"]
# family -> (pooling mode, Dense layers (out, bias, activation), normalised): the shapes of the releases
WRAPS: dict[str, tuple[str, list[tuple[int, bool, Any]], bool]] = {
    # EmbeddingGemma's
    "bert": ("mean", [(48, False, torch.nn.Identity()), (32, False, torch.nn.Identity())], True),
    "roberta": ("weightedmean", [(16, True, torch.nn.Tanh())], False),
    "modernbert": ("cls", [], True),
    "distilbert": ("lasttoken", [], True),  # Qwen3-Embedding's pooling
    "electra": ("max", [], False),
    "mpnet": ("mean", [], True),  # all-mpnet-base-v2's
    "nomic_bert": ("mean", [], True),  # nomic-embed-text-v1.5's
    "gte": ("cls", [], True),  # gte-base-en-v1.5's
    "jina_embeddings_v3": ("mean", [], True),  # jina-embeddings-v3's
}


def wrap(tmp: Path, family: str, **model_config: Any) -> tuple[Any, Path]:
    """A sentence-transformers model over a tiny random ``family`` checkpoint, saved; (model, its folder)."""
    src = tmp / "hf"
    save_checkpoint(src, family, "Model", **model_config)
    mode, dense, normalize = WRAPS[family]
    modules: list[Any] = [Transformer(str(src), max_seq_length=48)]
    width = modules[0].get_embedding_dimension()
    modules.append(Pooling(width, pooling_mode=mode))
    for out, bias, act in dense:
        torch.manual_seed(out)
        modules.append(Dense(width, out, bias=bias, activation_function=act))
        width = out
    if normalize:
        modules.append(Normalize())
    model = st.SentenceTransformer(modules=modules, prompts=PROMPTS, device="cpu")
    model.save(str(tmp / "st"))
    return st.SentenceTransformer(str(tmp / "st"), device="cpu"), tmp / "st"


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.mark.parametrize("family", WRAPS)
def test_a_sentence_transformers_folder_embeds_as_sentence_transformers_does(tmp_path: Path,
                                                                             family: str) -> None:
    model, folder = wrap(tmp_path, family)
    meta = run_export(folder, tmp_path / "b")
    assert meta["options"]["pooling"] == WRAPS[family][0]
    pipe = Pipeline.load(tmp_path / "b")
    for name in (None, "query", "document", "Clustering"):
        ours = np.array([r["embedding"] for r in pipe(TEXTS, prompt_name=name or "")])
        theirs = model.encode(TEXTS, prompt_name=name, convert_to_numpy=True)
        assert ours.shape == theirs.shape
        assert (cosines(ours, theirs).min() >= 0.9999 and np.abs(ours - theirs).max()
                < 1e-4), (name, np.abs(ours - theirs).max())
    # `--as query` is the prompt named query
    query = np.array([r["embedding"] for r in pipe(TEXTS, input_type="query")])
    np.testing.assert_allclose(query, model.encode_query(TEXTS, convert_to_numpy=True), atol=1e-4)
    dims = 8
    theirs = model.encode(TEXTS, prompt_name="Clustering", truncate_dim=dims,
                          normalize_embeddings=WRAPS[family][2])
    ours = np.array([r["embedding"] for r in pipe(TEXTS, prompt_name="Clustering", dimensions=dims)])
    np.testing.assert_allclose(ours, theirs, atol=1e-4)


def test_prompt_name_and_dimensions_on_the_command_line(tmp_path: Path) -> None:
    model, folder = wrap(tmp_path, "bert")
    run_export(folder, tmp_path / "b")
    r = runner.invoke(app, ["embed", str(tmp_path / "b"), *TEXTS, "--prompt-name", "Clustering",
                            "--dimensions", "16",
                            "--output", str(tmp_path / "v.npy")])
    assert r.exit_code == 0, r.output
    want = model.encode(TEXTS, prompt_name="Clustering", truncate_dim=16, normalize_embeddings=True)
    np.testing.assert_allclose(np.load(tmp_path / "v.npy"), want, atol=1e-4)
    r = runner.invoke(app, ["embed", str(tmp_path / "b"), "a text", "--prompt-name", "Retrieval"])
    assert (r.exit_code == 2 and "no prompt named 'Retrieval'" in r.output
            and "Clustering" in r.output), r.output
    r = runner.invoke(app, ["embed", str(tmp_path / "b"), "a text", "--dimensions", "999"])
    assert r.exit_code == 2 and "more than the model's 32" in r.output, r.output


def test_the_servers_prompt_name_reaches_the_named_prompts(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from mlmkit.args import ServeArgs
    from mlmkit.serve.app import create_app
    from mlmkit.serve.queue import Metrics, Model

    model, folder = wrap(tmp_path, "bert")
    run_export(folder, tmp_path / "b")
    args = ServeArgs(bundles=[str(tmp_path / "b")])
    served = Model("emb", Pipeline.load(tmp_path / "b"), args, Metrics())
    with TestClient(create_app({"emb": served}, args)) as http:
        assert served.ready.wait(30)
        got = http.post("/embed", json={"inputs": TEXTS, "prompt_name": "Clustering", "dimensions": 8}).json()
        want = model.encode(TEXTS, prompt_name="Clustering", truncate_dim=8, normalize_embeddings=True)
        np.testing.assert_allclose(got, want, atol=1e-4)
        bad = http.post("/embed", json={"inputs": TEXTS, "prompt_name": "Retrieval"})
        assert bad.status_code == 422 and "Clustering" in bad.json()["error"] + bad.json().get("hint",
                                                                                               ""), bad.json()


def test_a_fine_tune_keeps_the_modules_and_loads_back_with_its_bundles_vectors(tmp_path: Path) -> None:
    _, folder = wrap(tmp_path, "bert")
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"anchor": a, "positive": b}) + "\n"
                            for a, b in zip(TEXTS, TEXTS[1:] + TEXTS[:1])))
    run = tmp_path / "run"
    run_finetune("embedding", folder, rows, run, steps=3, lr=1e-3, batch_size=4, progress=False)
    before = {k: v for k, v in st.SentenceTransformer(str(folder), device="cpu").state_dict().items()
              if k.startswith("2.")}
    after = st.SentenceTransformer(str(run), device="cpu")
    assert [type(m).__name__ for m in after] == ["Transformer", "Pooling", "Dense", "Dense", "Normalize"]
    assert after.prompts["Clustering"] == PROMPTS["Clustering"]
    moved = max((after.state_dict()[k] - v).abs().max().item() for k, v in before.items())
    assert 0 < moved < 0.1  # the Dense layers carried over and trained, not started afresh
    run_export(run, tmp_path / "b")
    ours = np.array([r["embedding"] for r in Pipeline.load(tmp_path / "b")(TEXTS, prompt_name="Clustering")])
    np.testing.assert_allclose(ours, after.encode(TEXTS, prompt_name="Clustering"), atol=1e-4)


def test_an_index_of_leading_dimensions_searched_with_a_named_prompt(tmp_path: Path) -> None:
    model, folder = wrap(tmp_path, "bert")
    run_export(folder, tmp_path / "b")
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"_id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(TEXTS)))
    ix = tmp_path / "ix"
    r = runner.invoke(app, ["index", str(tmp_path / "b"), "--corpus", str(corpus), "--out", str(ix),
                            "--dimensions", "8"])
    assert r.exit_code == 0, r.output
    assert json.loads((ix / "manifest.json").read_text())["dimensions"] == 8
    r = runner.invoke(app, ["search", str(ix), "plot of the film", "--prompt-name", "Clustering", "--top-k",
                            "5", "--json"])
    assert r.exit_code == 0, r.output
    hits = json.loads(r.stdout.splitlines()[0])["hits"]
    docs = model.encode_document(TEXTS, truncate_dim=8, normalize_embeddings=True)
    query = model.encode(["plot of the film"], prompt_name="Clustering", truncate_dim=8,
                         normalize_embeddings=True)[0]
    want = sorted(((f"d{i}", float(s)) for i, s in enumerate(docs @ query)), key=lambda x: -x[1])
    assert [h["id"] for h in hits] == [d for d, _ in want]
    np.testing.assert_allclose([h["score"] for h in hits], [s for _, s in want], atol=1e-4)
    r = runner.invoke(app,
                      ["index", str(tmp_path / "b"), "--corpus", str(corpus), "--out", str(ix), "--append",
                       "--dimensions", "16"])
    assert r.exit_code == 2 and "--dimensions 8" in r.output, r.output


@pytest.mark.parametrize("edit, words", [
    (lambda d: _json(d / "2_Dense" / "config.json",
                     activation_function="torch.nn.modules.activation.Softmax"),
     "activation torch.nn.modules.activation.Softmax is not supported"),
    (lambda d: _json(d / "2_Dense" / "config.json", in_features=7), "dense_layers"),
    (lambda d: _json(d / "1_Pooling" / "config.json", include_prompt=False), "include_prompt false"),
    (lambda d: _json(d / "config_sentence_transformers.json", prompts={"query": 3}),
     "prompts must map names to texts"),
    (lambda d: _json(d / "config_sentence_transformers.json", default_prompt_name="web"),
     "default_prompt_name 'web'"),
    (lambda d: (d / "modules.json").write_text(json.dumps(json.loads((d / "modules.json").read_text())
                                                          + [{"idx": 9, "name": "9", "path": "",
                                                              "type": "x.Asym"}])),
     "module Asym is not one mlmkit runs"),
])
def test_what_a_sentence_transformers_folder_cannot_run_is_one_line(tmp_path: Path, edit: Any,
                                                                    words: str) -> None:
    _, folder = wrap(tmp_path, "bert")
    edit(folder)
    r = runner.invoke(app, ["export", str(folder), "--out", str(tmp_path / "b")])
    said = " ".join(r.output.split())
    assert r.exit_code == 2 and words in said and "Traceback" not in r.output, r.output
    assert not (tmp_path / "b" / "model.onnx").exists()


def _json(path: Path, **changes: Any) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def test_a_prompts_option_that_is_not_names_and_texts_is_one_line(tmp_path: Path) -> None:
    _, folder = wrap(tmp_path, "bert")
    r = runner.invoke(app, ["export", str(folder), "--out", str(tmp_path / "b"), "--task", "embedding",
                            "--option", "prompts=[1, 2]"])
    assert r.exit_code == 2 and "prompts option must be a JSON object" in " ".join(r.output.split()), r.output


@pytest.mark.parametrize("family", ["qwen3", "gemma3_text"])
def test_a_decoders_and_embeddinggemmas_folder_fine_tunes_with_cached_mnrl(tmp_path: Path,
                                                                           family: str) -> None:
    """Qwen3-Embedding's layout (a causal decoder, last-token pooling) and EmbeddingGemma's (bidirectional,
    mean pooling, two Dense layers) fine-tune through the embedding task with GradCache's loss; the run
    loads in sentence-transformers with its bundle's vectors."""
    import transformers
    from prenorm_parity import gemma_tokenizer, qwen3_tokenizer, save_hf, sentence_transformers_bundle

    fast = qwen3_tokenizer() if family == "qwen3" else gemma_tokenizer()
    sizes = dict(vocab_size=len(fast), hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                 num_attention_heads=4,
                 num_key_value_heads=2, head_dim=8, pad_token_id=fast.pad_token_id,
                 max_position_embeddings=64)
    if family == "qwen3":
        save_hf(tmp_path / "hf", "Qwen3Model", transformers.Qwen3Config(**sizes), tokenizer=fast)
    else:
        save_hf(tmp_path / "hf", "Gemma3TextModel",
                transformers.Gemma3TextConfig(**sizes, use_bidirectional_attention=True,
                                              sliding_window=4,
                                              query_pre_attn_scalar=8),
                tokenizer=fast)
    sentence_transformers_bundle(tmp_path, tmp_path / "hf", "lasttoken" if family == "qwen3" else "mean",
                                 dense=() if family == "qwen3" else (48,))
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"anchor": a, "positive": b}) + "\n"
                            for a, b in zip(TEXTS, TEXTS[1:] + TEXTS[:1])))
    run = tmp_path / "run"
    run_finetune("embedding", tmp_path / "st", rows, run, steps=3, lr=1e-3, batch_size=4, progress=False,
                 options={"loss": "cached-mnrl", "mini_batch_size": 2})
    after = st.SentenceTransformer(str(run), device="cpu")
    assert [type(m).__name__
            for m in after][1:] == ["Pooling", *(["Dense"] * (2 if family != "qwen3" else 0)), "Normalize"]
    run_export(run, tmp_path / "b")
    ours = np.array([r["embedding"] for r in Pipeline.load(tmp_path / "b")(TEXTS)])
    np.testing.assert_allclose(ours, after.encode(TEXTS), atol=1e-4)
    before = st.SentenceTransformer(str(tmp_path / "st"), device="cpu").encode(TEXTS)
    assert np.abs(ours - before).max() > 1e-3  # the three steps moved it
