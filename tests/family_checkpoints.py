"""Tiny random transformers checkpoints of every model family, saved as transformers saves them:
``save_checkpoint`` (``FAMILIES``: each family's transformers classes, tokenizer kind and sizes; the
tokenizer of that kind is trained here with the `tokenizers` library on ``sentences()``),
``encode_batch`` and ``hf_out`` to feed the same batch to our tokenizer and to transformers' model, and
``export`` through `mlmkit export --json`, and a sentence-transformers directory of a checkpoint exported
(``sentence_transformers_bundle``). The tests that use them skip without transformers."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tokenizers import (
    AddedToken,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)
from typer.testing import CliRunner

from mlmkit.cli import app
from mlmkit.text.batching import pad_features
from mlmkit.text.tokenizer import load_tokenizer, special_ids

transformers = pytest.importorskip("transformers")  # a dev extra: the oracle
runner = CliRunner()
WORDS = ("the a film movie plot story was is good great fine bad dull poor very not and john paris went "
         "to").split()
BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
ROBERTA_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
MPNET_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]
SIZES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)

# family -> (transformers class prefix, tokenizer kind, config keywords)
FAMILIES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "bert": ("Bert", "wordpiece", dict(SIZES, max_position_embeddings=64)),
    "roberta": ("Roberta", "bpe",
                dict(SIZES, max_position_embeddings=66, type_vocab_size=1, layer_norm_eps=1e-5)),
    "xlm-roberta": ("XLMRoberta", "unigram",
                    dict(SIZES, max_position_embeddings=66, type_vocab_size=1, layer_norm_eps=1e-5)),
    "distilbert": ("DistilBert", "wordpiece",
                   dict(dim=32, n_layers=2, n_heads=2, hidden_dim=64, max_position_embeddings=64)),
    "electra": ("Electra", "wordpiece", dict(SIZES, embedding_size=16, max_position_embeddings=64)),
    "modernbert": ("ModernBert", "bpe-bert",
                   dict(SIZES, num_hidden_layers=3, max_position_embeddings=128, local_attention=8,
                        global_attn_every_n_layers=2)),
    "deberta-v2": ("DebertaV2", "unigram-bert", dict(SIZES, max_position_embeddings=64,
                                                     relative_attention=True, pos_att_type=["p2c", "c2p"],
                                                     position_biased_input=False, share_att_key=True,
                                                     norm_rel_ebd="layer_norm",
                                                     position_buckets=8, max_relative_positions=16,
                                                     type_vocab_size=0)),
    "mpnet": ("MPNet", "wordpiece-mpnet", dict(SIZES, max_position_embeddings=66, layer_norm_eps=1e-5)),
    "gte": ("Gte", "unigram", dict(SIZES, max_position_embeddings=128,
                                   rope_parameters={"rope_type": "default", "rope_theta": 100.0})),
    "nomic_bert": ("NomicBert", "wordpiece", dict(SIZES, max_position_embeddings=128,
                                                  rope_parameters={"rope_type": "default",
                                                                   "rope_theta": 100.0})),
    "jina_embeddings_v3": ("JinaEmbeddingsV3", "unigram",
                           dict(SIZES, max_position_embeddings=128, type_vocab_size=1, layer_norm_eps=1e-5,
                                 rope_parameters={"rope_type": "default",
                                                  "rope_theta": 100.0})),
    # the Llama-style families: grouped-query attention (4 query heads over 2 key / value heads), their
    # released tokenizers' kinds (tests/prenorm_parity.py)
    "qwen3": ("Qwen3", "qwen3", dict(SIZES, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                     max_position_embeddings=128,
                                     rope_parameters={"rope_type": "default", "rope_theta": 100.0})),
    "gemma3_text": ("Gemma3Text", "gemma", dict(SIZES, num_attention_heads=4, num_key_value_heads=2,
                                                head_dim=16, max_position_embeddings=128,
                                                use_bidirectional_attention=True, sliding_window=8,
                                                sliding_window_pattern=2,
                                                query_pre_attn_scalar=16)),
    # (no EuroBERT row: fill-mask reads "[MASK]" as the model's mask token only where that has its
    # length, and <|mask|> has not; tests/models/test_eurobert.py runs its heads end to end)
}


def sentences(n: int = 60, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) for _ in range(n)]


def family_tokenizer(kind: str) -> Any:
    """A transformers fast tokenizer of the family's kind around a `tokenizers` model trained here."""
    texts = sentences(200) + [" ".join(WORDS)] * 5
    if kind in ("qwen3", "gemma"):  # built as the released checkpoints' are
        import prenorm_parity

        return getattr(prenorm_parity, f"{kind}_tokenizer")()
    # MPNet's: <s> <pad> </s> <unk>, then BERT's WordPiece vocabulary and its brackets, <mask> last
    if kind == "wordpiece-mpnet":
        return transformers.MPNetTokenizer(vocab={t: i for i, t in enumerate(MPNET_SPECIALS + BERT_SPECIALS
                                                                             + WORDS + ["<mask>"])})
    if kind == "wordpiece":
        tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(BERT_SPECIALS + WORDS)},
                                         unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        specials = BERT_SPECIALS
    elif kind in ("bpe", "bpe-bert"):
        specials = ROBERTA_SPECIALS if kind == "bpe" else BERT_SPECIALS
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.train_from_iterator(texts,
                                trainers.BpeTrainer(vocab_size=450, special_tokens=specials, min_frequency=1,
                                                    initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    else:  # unigram, SentencePiece style (XLM-R; "unigram-bert": DeBERTa-v3's, with BERT's special tokens)
        specials = ROBERTA_SPECIALS if kind == "unigram" else BERT_SPECIALS
        tok = Tokenizer(models.Unigram())
        tok.normalizer = normalizers.NFKC()
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        tok.train_from_iterator(texts, trainers.UnigramTrainer(vocab_size=120, special_tokens=specials,
                                                               unk_token="<unk>" if kind == "unigram"
                                                               else "[UNK]"))
    if specials is ROBERTA_SPECIALS:
        tok.add_special_tokens([AddedToken("<mask>", lstrip=True, special=True)])
        tok.post_processor = processors.RobertaProcessing(("</s>", tok.token_to_id("</s>")),
                                                          ("<s>", tok.token_to_id("<s>")))
        names = dict(bos_token="<s>", eos_token="</s>", cls_token="<s>", sep_token="</s>", pad_token="<pad>",
                     unk_token="<unk>",
                     mask_token="<mask>")
    else:
        tok.add_special_tokens(["[MASK]"])
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
            special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))])
        names = dict(cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]", unk_token="[UNK]",
                     mask_token="[MASK]")
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, **names)


def save_checkpoint(d: Path, family: str, head: str, *, perturb: bool = True, **config: Any) -> Any:
    """A randomly initialised transformers model of ``family`` + ``head`` saved as transformers saves it,
    its weights drawn wider than init so that every parameter shows in the outputs (``perturb``)."""
    prefix, kind, kw = FAMILIES[family]
    fast = family_tokenizer(kind)
    cfg_cls = getattr(transformers, f"{prefix}Config")
    ids = {"pad_token_id": fast.pad_token_id}
    if family != "distilbert":
        ids.update(bos_token_id=fast.cls_token_id, eos_token_id=fast.sep_token_id)
    if family == "modernbert":
        ids.update(cls_token_id=fast.cls_token_id, sep_token_id=fast.sep_token_id)
    cfg = cfg_cls(vocab_size=len(fast), **kw, **ids, **config)
    torch.manual_seed(0)
    cls = getattr(transformers, prefix + head, None)
    if cls is None:  # a head transformers does not have for the family (GTE's question answering)
        pytest.skip(f"transformers has no {prefix}{head}")
    model = cls(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(torch.randn_like(p) * (0.1 if "norm" in name.lower() else 0.3) * perturb)
    model.save_pretrained(d)
    fast.save_pretrained(d)
    return model


def encode_batch(d: Path, texts: list[Any]) -> dict[str, np.ndarray]:
    tok = load_tokenizer(d)
    feats = [{"input_ids": e.ids, "token_type_ids": e.type_ids} for e in tok.encode_batch(texts)]
    return pad_features(feats, special_ids(tok).pad)


def hf_out(model: Any, b: dict[str, np.ndarray], family: str) -> Any:
    keys = ["input_ids",
            "attention_mask"] + (["token_type_ids"] if family in ("bert", "electra", "nomic_bert") else [])
    with torch.no_grad():
        return model(**{k: torch.from_numpy(b[k]) for k in keys})


def export(src: Path, out: Path, *extra: str) -> dict[str, Any]:
    r = runner.invoke(app, ["export", str(src), "--out", str(out), "--json", *extra])
    assert r.exit_code == 0, r.output
    return json.loads((out / "mlmkit.json").read_text())


def sentence_transformers_bundle(tmp: Path, hf: Path, pooling: str, dense: tuple[int, ...] = (),
                                 max_seq_length: int | None = None) -> tuple[Any, Path]:
    """A sentence-transformers directory of the transformers model ``hf`` (``pooling``, Dense layers
    without bias to ``dense``'s sizes and back, as EmbeddingGemma's, then Normalize), and `mlmkit
    export` of it. Returns (the SentenceTransformer, the bundle)."""
    pytest.importorskip("sentence_transformers")
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer import modules as st_models

    torch.manual_seed(0)
    body = st_models.Transformer(str(hf), max_seq_length=max_seq_length)
    H = body.get_embedding_dimension()
    sizes = [H, *dense, H] if dense else []
    layers = [st_models.Dense(a, b, bias=False, activation_function=torch.nn.Identity())
              for a, b in zip(sizes, sizes[1:])]
    st = SentenceTransformer(modules=[body, st_models.Pooling(H, pooling_mode=pooling), *layers,
                                      st_models.Normalize()], device="cpu")
    st.save(str(tmp / "st"))
    meta = export(tmp / "st", tmp / "bundle")
    assert (meta["task"] == "embedding" and meta["options"]["pooling"] == pooling
            and meta["options"]["normalize"]), meta["options"]
    return st, tmp / "bundle"


def bundle_embeddings(bundle: Path, texts: list[str]) -> np.ndarray:
    from mlmkit.runtime.pipeline import Pipeline

    return np.array([r["embedding"] if isinstance(r, dict) else r for r in Pipeline.load(bundle)(texts)])
