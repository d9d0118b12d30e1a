"""Special-token roles (mlmkit/text/specials.py): read from a checkpoint's tokenizer_config.json /
special_tokens_map.json where they name them, else a convention the vocabulary holds whole; the roles
they leave out from the tokenizer's own framing; what a missing role means where it is needed; and the
roles kept through the files mlmkit writes beside a tokenizer.json.

Three tokenizers of the kinds that need the files, built here with the `tokenizers` library: MPNet's
(WordPiece whose vocabulary holds BERT's bracket tokens too, its roles named <s> </s> <pad> [UNK]
<mask>), Qwen3's (byte-level BPE, <|endoftext|> appended and the padding token, no cls, mask or unk
token) and Gemma's (<pad> <eos> <bos> <unk> <mask>, <bos> A <eos>)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
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

from mlmkit.errors import ConfigError
from mlmkit.runtime.bundle import tokenizer_fingerprint
from mlmkit.runtime.precision import sample_batch
from mlmkit.text.specials import SpecialIds, framing, named_tokens
from mlmkit.text.tokenizer import (
    BRACKETS,
    load_tokenizer,
    mask_token,
    save_tokenizer,
    special_ids,
    special_tokens,
    write_special_tokens_map,
)

WORDS = ("the a film movie plot story was is good great fine bad dull poor very not and john paris went "
         "to").split()
MPNET_NAMES = {"bos_token": "<s>", "eos_token": "</s>", "cls_token": "<s>", "sep_token": "</s>",
               "pad_token": "<pad>",
               "unk_token": "[UNK]", "mask_token": "<mask>"}


def mpnet_tokenizer() -> Tokenizer:
    """<s> 0, <pad> 1, </s> 2, <unk> 3, BERT's [PAD] [UNK] [CLS] [SEP] [MASK], the words, <mask> last;
    <s> A </s></s> B </s>."""
    vocab = ["<s>", "<pad>", "</s>", "<unk>", *BRACKETS.tokens, *WORDS, "<mask>"]
    tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.add_special_tokens(["<s>", "<pad>", "</s>", "[UNK]", AddedToken("<mask>", lstrip=True, special=True)])
    tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    return tok


def qwen3_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    texts = [" ".join(WORDS[i:] + WORDS[:i]) for i in range(len(WORDS))]
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=300,
                                                       special_tokens=["<|endoftext|>", "<|im_start|>",
                                                                       "<|im_end|>"],
                                                       min_frequency=1,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    eot = ("<|endoftext|>", tok.token_to_id("<|endoftext|>"))
    tok.post_processor = processors.TemplateProcessing(single="$A:0 <|endoftext|>:0",
                                                       pair="$A:0 <|endoftext|>:0 $B:1 <|endoftext|>:1",
                                                       special_tokens=[eot])
    return tok


def gemma_tokenizer() -> Tokenizer:
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(specials + WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(specials)
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A <eos>",
                                                       pair="<bos> $A <eos> $B <eos>",
                                                       special_tokens=[("<bos>", 2), ("<eos>", 1)])
    return tok


def checkpoint(d: Path, tok: Tokenizer, names: dict[str, Any], file: str = "tokenizer_config.json") -> Path:
    """``tok`` saved as transformers saves a tokenizer: tokenizer.json and ``names`` in ``file``."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "tokenizer.json").write_text(tok.to_str())
    (d / file).write_text(json.dumps({"model_max_length": 512, **names}))
    return d


# ---- where the roles come from -------------------------------------------------------------------
def test_mpnet_roles_come_from_its_files_not_the_brackets_it_also_holds(tmp_path):
    tok = mpnet_tokenizer()
    assert special_ids(tok) == SpecialIds(4, 5, 6, 7, 8)  # no files: the brackets, found whole first (wrong)
    d = checkpoint(tmp_path / "mpnet", tok,
                   {**MPNET_NAMES, "tokenizer_class": "MPNetTokenizer", "do_lower_case": True})
    for path in (d, d / "tokenizer.json"):  # the directory, or its tokenizer.json
        loaded = load_tokenizer(path)
        assert special_ids(loaded) == SpecialIds(pad=1, unk=5, cls=0, sep=2, mask=len(WORDS) + 9)
        assert special_tokens(loaded).names() == MPNET_NAMES
        assert mask_token(loaded) == "<mask>"
    assert load_tokenizer(d).encode("john went", "to paris").tokens == ["<s>", "john", "went", "</s>", "</s>",
                                                                        "to", "paris", "</s>"]


def test_special_tokens_map_wins_and_added_token_objects_are_read(tmp_path):
    """transformers reads special_tokens_map.json after tokenizer_config.json; older files hold
    AddedToken objects ({"content": ...}); null names none."""
    d = checkpoint(tmp_path / "m", mpnet_tokenizer(),
                   {**MPNET_NAMES, "mask_token": "[MASK]", "unk_token": "<unk>"})
    (d / "special_tokens_map.json").write_text(json.dumps({
        "mask_token": {"content": "<mask>", "lstrip": True, "__type": "AddedToken"}, "unk_token": None}))
    named = named_tokens(d)
    assert named["mask_token"] == "<mask>" and "unk_token" not in named
    tok = load_tokenizer(d)
    assert special_tokens(tok).mask == "<mask>"
    # unnamed: the convention the vocabulary holds whole (its brackets)
    assert special_tokens(tok).unk == "[UNK]"


def test_qwen3_roles_without_cls_mask_or_unk(tmp_path):
    """pad <|endoftext|> named; sep the <|endoftext|> its post-processor appends (not the eos_token
    <|im_end|>); no cls, mask or unk token: what needs one refuses it where it does."""
    d = checkpoint(tmp_path / "qwen3", qwen3_tokenizer(),
                   {"pad_token": "<|endoftext|>", "eos_token": "<|im_end|>", "bos_token": None,
                    "unk_token": None,
                    "tokenizer_class": "Qwen2Tokenizer"})
    tok = load_tokenizer(d)
    eot = tok.token_to_id("<|endoftext|>")
    assert framing(tok) == (None, "<|endoftext|>")
    ids = special_ids(tok)
    assert ids == SpecialIds(pad=eot, unk=None, cls=None, sep=eot, mask=None) and ids.all == (eot, eot)
    with pytest.raises(ConfigError,
                       match="the tokenizer has no mask token, which filling masks and pretraining need"):
        mask_token(tok)
    with pytest.raises(ConfigError, match="no cls token, which pretraining needs"):
        ids.need("cls", "pretraining")
    # export's sample batch: texts framed as the tokenizer frames them, no masks
    batch = sample_batch(tok.get_vocab_size(), ids, 16)
    real = batch["attention_mask"].astype(bool)
    assert (batch["input_ids"][:, 0] != eot).all() and (batch["input_ids"][real] == eot).sum() >= len(real)
    assert tokenizer_fingerprint(tok).mask_id is None and tokenizer_fingerprint(tok).pad_id == eot


def test_gemma_roles_frame_with_bos_and_eos(tmp_path):
    d = checkpoint(tmp_path / "gemma", gemma_tokenizer(),
                   {"pad_token": "<pad>", "eos_token": "<eos>", "bos_token": "<bos>",
                    "unk_token": "<unk>", "mask_token": "<mask>"})
    tok = load_tokenizer(d)
    assert special_ids(tok) == SpecialIds(pad=0, unk=3, cls=2, sep=1, mask=4)
    assert tok.encode("the film").tokens == ["<bos>", "the", "film", "<eos>"]


def test_without_files_the_conventions_and_their_message(tmp_path):
    (tmp_path / "q").mkdir()
    qwen3_tokenizer().save(str(tmp_path / "q" / "tokenizer.json"))
    with pytest.raises(ConfigError,
                       match="tokenizer lacks the special tokens .* and no tokenizer_config.json or "
                             "special_tokens_map.json beside it names its own"):
        load_tokenizer(tmp_path / "q")
    # names nothing: the conventions
    d = checkpoint(tmp_path / "bert-like", mpnet_tokenizer(), {"do_lower_case": True})
    assert special_ids(load_tokenizer(d)).pad == 4


@pytest.mark.parametrize("names, words", [
    ({"pad_token": "<nothing>"}, "names pad_token '<nothing>', which the tokenizer does not have"),
    ({"eos_token": "<|im_end|>"}, "names no pad_token"),
])
def test_files_that_do_not_fit_the_tokenizer_are_refused(tmp_path, names, words):
    d = checkpoint(tmp_path / "q", qwen3_tokenizer(), names)
    with pytest.raises(ConfigError, match=words):
        load_tokenizer(d)


def test_an_unk_bos_or_eos_the_vocabulary_lacks_names_none(tmp_path):
    d = checkpoint(tmp_path / "q", qwen3_tokenizer(),
                   {"pad_token": "<|endoftext|>", "unk_token": "<unk>", "bos_token": "<s>"})
    assert special_tokens(load_tokenizer(d)).names() == {"pad_token": "<|endoftext|>",
                                                         "sep_token": "<|endoftext|>"}


# ---- the roles kept beside the files mlmkit writes ---------------------------------------------
@pytest.mark.parametrize("make, names", [
    (mpnet_tokenizer, MPNET_NAMES),
    (qwen3_tokenizer, {"pad_token": "<|endoftext|>", "eos_token": "<|im_end|>"}),
])
def test_roles_survive_save_and_a_bundles_map(tmp_path, make, names):
    tok = load_tokenizer(checkpoint(tmp_path / "src", make(), names))
    save_tokenizer(tok, tmp_path / "run")  # a run's tokenizer files
    again = load_tokenizer(tmp_path / "run")
    assert special_tokens(again) == special_tokens(tok)
    config = json.loads((tmp_path / "run" / "tokenizer_config.json").read_text())
    assert {k: config[k] for k in special_tokens(tok).names()} == special_tokens(tok).names()
    # not BertTokenizer, even for MPNet's WordPiece: transformers would frame its pairs anew, as BERT's
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    (tmp_path / "bundle").mkdir()  # a bundle's: tokenizer.json and special_tokens_map.json
    (tmp_path / "bundle" / "tokenizer.json").write_text(tok.to_str())
    write_special_tokens_map(tok, tmp_path / "bundle")
    assert special_ids(load_tokenizer(tmp_path / "bundle" / "tokenizer.json")) == special_ids(tok)


def test_convention_tokenizers_are_unchanged(tmp_path):
    """A tokenizer of a convention, with or without files naming the same tokens, has its roles as
    before, and save_tokenizer's config names bos / eos only for the angles (RoBERTa's)."""
    from mlmkit.text.tokenizer import train_tokenizer

    texts = [" ".join(WORDS[i:] + WORDS[:i]) for i in range(len(WORDS))] * 3
    for kind, bos in (("wordpiece", False), ("bpe", True)):
        tok = train_tokenizer(texts, vocab_size=200, min_frequency=1, kind=kind)
        before = special_ids(tok)
        save_tokenizer(tok, tmp_path / kind)
        config = json.loads((tmp_path / kind / "tokenizer_config.json").read_text())
        assert ("bos_token" in config) == bos
        assert config["tokenizer_class"] == ("PreTrainedTokenizerFast" if bos else "BertTokenizer")
        assert special_ids(load_tokenizer(tmp_path / kind)) == before
        assert np.array_equal(special_ids(load_tokenizer(tmp_path / kind / "tokenizer.json")).all, before.all)
