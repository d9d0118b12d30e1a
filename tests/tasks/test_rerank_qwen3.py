"""The rerank task's yes/no judge (Qwen3-Reranker's scoring): a tiny random transformers Qwen3ForCausalLM
with grouped-query attention, beside a byte-level BPE tokenizer that holds "yes", "no" and the chat tokens,
is read as a reranker (`mlmkit export` without --task); its bundle scores pairs of mixed lengths (one cut
to the max length, one not ASCII) as Qwen3-Reranker's model card computes them with transformers (the
texts written with its prefix and suffix, left padding, the last position's "no" and "yes" logits,
log-softmax, exp of yes); a short fine-tune starts from the LM head's answer rows and its run is a
Qwen3ForSequenceClassification transformers loads with the bundle's scores. Then the template's cut and
the options' bad values."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import run_export, run_finetune
from family_checkpoints import sentences
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from typer.testing import CliRunner

from mlmkit.cli import app
from mlmkit.errors import ConfigError
from mlmkit.registry import TRUNCATED, TaskContext, get_task

transformers = pytest.importorskip("transformers")
runner = CliRunner()

# Qwen3-Reranker's model card, written out here (not read from the task) so that the task's template is
# checked
PREFIX = ("<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
          "Instruct "
          "provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n")
SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
MAX_LENGTH = 160  # the positions of the model, and so the bundle's max length
PAIRS = [("where did john go", "john went to paris"), ("where did john go", "a"),
         ("what was the film like", "the plot was very dull and the story was not good"),
         ("what was the film like", "café déjà vu: the film was great"),
         # cut to the max length
         ("where did john go", " ".join(["the film was good and john went to paris"] * 20))]


def judge_tokenizer(*, append_eot: bool = False) -> Any:
    """Byte-level BPE with <|endoftext|> (the padding token), <|im_start|> and <|im_end|>, trained on words,
    the chat template's text and "yes" / "no" lines, so that "yes" and "no" are single tokens as in Qwen's
    vocabulary; ``append_eot``: <|endoftext|> after every text (Qwen3-Embedding's post-processor)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    texts = (sentences(200) + [PREFIX, SUFFIX, f"<Instruct>: {INSTRUCTION}\n<Query>: q\n<Document>: d"] * 5
             + ["yes", "no"] * 20)
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=500,
                                                       special_tokens=["<|endoftext|>", "<|im_start|>",
                                                                       "<|im_end|>"],
                                                       min_frequency=1,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    if append_eot:
        tok.post_processor = processors.TemplateProcessing(single="$A:0 <|endoftext|>:0",
                                                           pair="$A:0 <|endoftext|>:0 $B:1 <|endoftext|>:1",
                                                           special_tokens=[("<|endoftext|>", tok.token_to_id(
                                                               "<|endoftext|>"))])
    assert tok.token_to_id("yes") is not None and tok.token_to_id("no") is not None
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<|endoftext|>",
                                                eos_token="<|im_end|>")


def save_judge(d: Path, *, tied: bool, seed: int = 0) -> Path:
    """A random Qwen3ForCausalLM (4 query heads over 2 key / value heads), perturbed beyond its init,
    saved by save_pretrained with the judge tokenizer; ``tied``: its LM head is the token embeddings
    (Qwen3-Reranker-0.6B's), else a matrix of its own (8B's)."""
    from family_parity import perturb

    tok = judge_tokenizer()
    config = transformers.Qwen3Config(
        vocab_size=len(tok), hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=MAX_LENGTH, pad_token_id=tok.pad_token_id,
        rope_parameters={"rope_type": "default", "rope_theta": 1000.0}, tie_word_embeddings=tied)
    torch.manual_seed(seed)
    model = transformers.Qwen3ForCausalLM(config)
    perturb(model, seed)
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return d


def model_card_inputs(d: Path, pairs: list[tuple[str, str]],
                      instruction: str = INSTRUCTION) -> dict[str, torch.Tensor]:
    """The model card's process_inputs: each pair's body tokenized and cut to what the prefix and suffix
    leave of the max length, between their tokens, the batch padded on the left."""
    tok = transformers.AutoTokenizer.from_pretrained(d, padding_side="left")
    prefix, suffix = (tok.encode(t, add_special_tokens=False) for t in (PREFIX, SUFFIX))
    bodies = [f"<Instruct>: {instruction}\n<Query>: {q}\n<Document>: {doc}" for q, doc in pairs]
    enc = tok(bodies, padding=False, truncation="longest_first", return_attention_mask=False,
              max_length=MAX_LENGTH - len(prefix) - len(suffix))
    enc["input_ids"] = [prefix + ids + suffix for ids in enc["input_ids"]]
    # (the card also gives max_length, which padding=True ignores)
    return tok.pad(enc, padding=True, return_tensors="pt")


@torch.no_grad()
def model_card_scores(d: Path, pairs: list[tuple[str, str]]) -> np.ndarray:
    """P(yes) as the model card computes it: the last position's logits of "no" and "yes", log-softmax,
    exp."""
    tok = transformers.AutoTokenizer.from_pretrained(d)
    yes, no = tok.convert_tokens_to_ids("yes"), tok.convert_tokens_to_ids("no")
    model = transformers.Qwen3ForCausalLM.from_pretrained(d).eval()
    logits = model(**model_card_inputs(d, pairs)).logits[:, -1, :]
    two = torch.stack([logits[:, no], logits[:, yes]], dim=1)
    return torch.nn.functional.log_softmax(two, dim=1)[:, 1].exp().numpy()


@pytest.fixture(scope="module")
def judges(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("judge")
    return {"tied": save_judge(tmp / "tied", tied=True),
            "untied": save_judge(tmp / "untied", tied=False, seed=1)}


def test_qwen3_reranker_bundle_scores_as_the_model_card(judges: dict[str, Path], tmp_path: Path) -> None:
    """`mlmkit export` reads the causal LM as a yes/no reranker with its chat template; Pipeline and
    `mlmkit rerank` give the model card's P(yes) on pairs of mixed lengths, one cut to the max length."""
    ckpt, bundle = judges["tied"], tmp_path / "bundle"
    want = model_card_scores(ckpt, PAIRS)
    assert want.std() > 0.01  # the scores differ from pair to pair: the comparison means something
    r = runner.invoke(app, ["export", str(ckpt), "--out", str(bundle), "--json"])
    assert r.exit_code == 0, r.output
    meta = json.loads((bundle / "mlmkit.json").read_text())
    assert meta["task"] == "rerank" and meta["labels"] == ["score"] and meta["max_length"] == MAX_LENGTH
    opts = meta["options"]
    assert opts["answer_tokens"] == "yes,no" and opts["instruction"] == INSTRUCTION
    assert (opts["template"] == PREFIX + "<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}"
            + SUFFIX)
    from mlmkit.runtime.pipeline import Pipeline
    from mlmkit.text.tokenizer import load_tokenizer

    task = get_task("rerank")
    feats = task.featurize([{"query": q, "docs": [doc]} for q, doc in PAIRS],
                           load_tokenizer(bundle / "tokenizer.json"),
                           TaskContext(max_length=MAX_LENGTH, options=task.resolve_options(opts)),
                           training=False)
    card = model_card_inputs(ckpt, PAIRS)
    assert [f["input_ids"] for f in feats] == [row[m.bool()].tolist()
                                               for row, m in zip(card["input_ids"], card["attention_mask"])]
    assert [TRUNCATED in f for f in feats] == [False] * 4 + [True]
    got = [p["score"] for p in Pipeline.load(bundle)([{"text": q, "text_pair": doc} for q, doc in PAIRS])]
    np.testing.assert_allclose(got, want, atol=1e-4)
    docs = tmp_path / "docs.txt"
    docs.write_text("".join(doc + "\n" for q, doc in PAIRS if q == PAIRS[0][0]))
    r = runner.invoke(app, ["rerank", str(bundle), "--query", PAIRS[0][0], "--input", str(docs), "--json"])
    assert r.exit_code == 0, r.output
    ranked = [json.loads(line) for line in r.stdout.splitlines() if line.strip()]
    firsts = [i for i, (q, _) in enumerate(PAIRS) if q == PAIRS[0][0]]
    np.testing.assert_allclose([x["score"] for x in sorted(ranked, key=lambda x: x["index"])], want[firsts],
                               atol=1e-4)


def test_qwen3_reranker_fine_tunes_from_its_answer_rows_into_a_sequence_classifier(judges: dict[str, Path],
                                                                                   tmp_path: Path) -> None:
    """The head starts as the LM head's "yes" row less its "no" row (an LM head of its own: untied), in
    evaluation and fine-tuning; the fine-tuned run is a Qwen3ForSequenceClassification that transformers
    loads with the scores of the run's bundle."""
    from safetensors.torch import load_file

    from mlmkit.train.finetune import load_finetuned

    ckpt = judges["untied"]
    tok = transformers.AutoTokenizer.from_pretrained(ckpt)
    yes, no = tok.convert_tokens_to_ids("yes"), tok.convert_tokens_to_ids("no")
    head = load_file(str(ckpt / "model.safetensors"))["lm_head.weight"]
    rows = head[yes] - head[no]
    task, net, _, meta = load_finetuned(ckpt)  # what `mlmkit evaluate CHECKPOINT` builds
    assert task.name == "rerank" and torch.equal(net.classifier.weight[0], rows)
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"query": q, "document": doc, "label": int(i % 2 == 0)}) + "\n"
                            for i, (q, doc) in enumerate(PAIRS)))
    run = tmp_path / "run"
    run_finetune("rerank", ckpt, data, run, steps=2, batch_size=4, lr=1e-3, max_length=MAX_LENGTH,
                 progress=False)
    score = load_file(str(run / "model.safetensors"))["score.weight"][0]
    # two Adam steps of 1e-3 from the answer rows
    assert (score - rows).abs().max() < 3e-3 < rows.abs().max() / 10
    saved = json.loads((run / "mlmkit.json").read_text())["options"]
    assert saved["answer_tokens"] == "yes,no" and saved["template"].startswith(PREFIX)
    assert json.loads((run / "config.json").read_text())["architectures"] == [
        "Qwen3ForSequenceClassification"]
    with torch.no_grad():
        theirs = transformers.Qwen3ForSequenceClassification.from_pretrained(run).eval()
        want = torch.sigmoid(theirs(**model_card_inputs(ckpt, PAIRS)).logits[:, 0]).numpy()
    bundle = tmp_path / "bundle"
    run_export(run, bundle)
    from mlmkit.runtime.pipeline import Pipeline

    got = [p["score"] for p in Pipeline.load(bundle)([{"text": q, "text_pair": doc} for q, doc in PAIRS])]
    np.testing.assert_allclose(got, want, atol=1e-4)


# ---- the template's cut and bad values -------------------------------------------------------------------
def _features(tok: Any, pairs: list[tuple[str, str]], max_length: int,
              **options: Any) -> list[dict[str, Any]]:
    from mlmkit_tasks.rerank_template import JUDGE_TEMPLATE

    task = get_task("rerank")
    ctx = TaskContext(max_length=max_length,
                      options=task.resolve_options({"template": JUDGE_TEMPLATE, **options}))
    return task.featurize([{"query": q, "docs": [doc]} for q, doc in pairs], tok, ctx, training=False)


def test_a_written_pair_loses_its_documents_end_and_keeps_the_suffix_and_special_tokens() -> None:
    """With a tokenizer that appends <|endoftext|>: a pair that fits is the whole text and it; a long
    document is cut at its end, the suffix and <|endoftext|> kept; a long query goes once the document
    is gone; a max length the template's fixed text fills is refused in one line."""
    tok = judge_tokenizer(append_eot=True).backend_tokenizer
    eot = tok.token_to_id("<|endoftext|>")
    whole = tok.encode(PREFIX + f"<Instruct>: {INSTRUCTION}\n<Query>: q\n<Document>: d" + SUFFIX).ids
    short, = _features(tok, [("q", "d")], 120)
    assert short["input_ids"] == whole and whole[-1] == eot and TRUNCATED not in short
    fixed = len(whole) - 2  # all but the query and the document
    suffix = tok.encode(SUFFIX, add_special_tokens=False).ids
    long_doc = "the film was good and john went to paris " * 10
    cut, = _features(tok, [("q", long_doc)], fixed + 12)
    assert len(cut["input_ids"]) == fixed + 12 and cut[TRUNCATED]
    assert cut["input_ids"][-len(suffix) - 1:] == suffix + [eot]
    kept = tok.decode(cut["input_ids"][:-len(suffix) - 1], skip_special_tokens=False).split("\n<Document>: ")
    assert (len(kept) == 2 and kept[0].endswith("<Query>: q") and 0 < len(kept[1]) < len(long_doc)
            and long_doc.startswith(kept[1]))
    query_cut, = _features(tok, [(long_doc, "d")], fixed + 3)
    text = tok.decode(query_cut["input_ids"], skip_special_tokens=False)
    assert (len(query_cut["input_ids"]) == fixed + 3 and "<Document>: " not in text
            and text.endswith(SUFFIX + "<|endoftext|>"))
    with pytest.raises(ConfigError, match="fixed text and instruction take more than the max length of 20"):
        _features(tok, [("q", "d")], 20)


def test_bad_answer_tokens_and_templates_are_one_line(judges: dict[str, Path], tmp_path: Path) -> None:
    task = get_task("rerank")
    bad = {"answer_tokens=yes": "answer_tokens must be two different tokens",
           "answer_tokens=yes,yes": "two different",
           "template={query}": "must hold {document} once",
           "template={query}{document}{query}": "must hold {query} once",
           "template={query}{document}{title}": "has {title}",
           "template={query!r}{document}": r"has {query!r}",
           "template={query}{document": "is not a template"}
    for option, message in bad.items():
        r = runner.invoke(app,
                          ["export", str(judges["tied"]), "--out", str(tmp_path / "b"), "--option", option])
        text = " ".join(r.stderr.split())
        assert (r.exit_code == 2 and "Traceback" not in r.output and text.count("error:") == 1
                and message in text), (option, r.output)
    tok = judge_tokenizer().backend_tokenizer
    from mlmkit.models.config import ModelConfig

    qwen = ModelConfig.from_dict(json.loads((judges["tied"] / "config.json").read_text()))
    with pytest.raises(ConfigError, match="'maybe' is not a token of the model's tokenizer"):
        task.build_model(qwen, TaskContext(max_length=8,
                                           options=task.resolve_options({"answer_tokens": "maybe,no"}),
                                           tokenizer=tok))
    bert = ModelConfig(vocab_size=600, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                       intermediate_size=64)
    with pytest.raises(ConfigError, match="the bert sequence head pools 'cls'"):
        task.build_model(bert, TaskContext(max_length=8,
                                           options=task.resolve_options({"answer_tokens": "yes,no"}),
                                           tokenizer=tok))
