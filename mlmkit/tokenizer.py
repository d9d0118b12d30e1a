"""Train and load BERT WordPiece tokenizers (the `tokenizers` library).

A tokenizer is a ``tokenizers.Tokenizer`` with BERT normalisation, the five special tokens at ids
0-4 and the ``[CLS] A [SEP] B [SEP]`` template with segment ids. Padding and truncation are always
set explicitly by the caller: a tokenizer.json can carry a fixed padding setting (PERF_NOTES).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from .errors import ConfigError
from .files import atomic_write_text, parse_json, write_json

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS = [PAD, UNK, CLS, SEP, MASK]
DEFAULT_VOCAB_SIZE = 8000  # small corpora (the quickstart's) fill no more; BERT-base used 30522


@dataclass(frozen=True)
class SpecialIds:
    pad: int
    unk: int
    cls: int
    sep: int
    mask: int

    @property
    def all(self) -> tuple[int, ...]:
        return (self.pad, self.unk, self.cls, self.sep, self.mask)


def special_ids(tok: Tokenizer) -> SpecialIds:
    ids = [tok.token_to_id(t) for t in SPECIAL_TOKENS]
    missing = [t for t, i in zip(SPECIAL_TOKENS, ids) if i is None]
    if missing:
        raise ConfigError(f"tokenizer lacks the special tokens {', '.join(missing)}", "train it with mlmkit")
    return SpecialIds(*ids)


def _bert_pipeline(tok: Tokenizer, cased: bool) -> Tokenizer:
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None if cased else True, lowercase=not cased
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    return tok


def _add_template(tok: Tokenizer) -> Tokenizer:
    cls, sep = tok.token_to_id(CLS), tok.token_to_id(SEP)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{CLS}:0 $A:0 {SEP}:0",
        pair=f"{CLS}:0 $A:0 {SEP}:0 $B:1 {SEP}:1",
        special_tokens=[(CLS, cls), (SEP, sep)],
    )
    return tok


def train_tokenizer(texts: Iterable[str], vocab_size: int = DEFAULT_VOCAB_SIZE, cased: bool = False, min_frequency: int = 2) -> Tokenizer:
    """Train a WordPiece tokenizer on an iterator of texts (sentences or lines)."""
    if vocab_size < len(SPECIAL_TOKENS) + 30:
        raise ConfigError(f"--vocab-size {vocab_size} is too small", "use at least a few hundred")
    tok = _bert_pipeline(Tokenizer(models.WordPiece(unk_token=UNK, max_input_chars_per_word=100)), cased)
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=SPECIAL_TOKENS, continuing_subword_prefix="##"
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return prepare(_add_template(tok))


def prepare(tok: Tokenizer) -> Tokenizer:
    """No padding, no truncation: callers set both per use."""
    tok.no_padding()
    tok.no_truncation()
    return tok


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Load tokenizer.json, vocab.txt, or a directory holding either."""
    p = Path(path)
    if p.is_dir():
        for name in ("tokenizer.json", "vocab.txt"):
            if (p / name).exists():
                return load_tokenizer(p / name)
        raise ConfigError(f"no tokenizer.json or vocab.txt in {p}", "a model directory needs one of them beside config.json")
    if not p.exists():
        raise ConfigError(f"tokenizer not found: {p}", "check the path")
    if p.suffix == ".txt":
        vocab = {}
        try:
            lines = p.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError as e:
            raise ConfigError(f"{p}: not UTF-8 text (byte {e.start})", "a vocab.txt has one UTF-8 token per line") from None
        for i, line in enumerate(lines):
            vocab.setdefault(line.rstrip("\n"), i)
        cased = not _lowercase_from_config(p.parent)
        tok = _bert_pipeline(Tokenizer(models.WordPiece(vocab, unk_token=UNK, max_input_chars_per_word=100)), cased)
        special_ids(tok)
        tok.add_special_tokens(SPECIAL_TOKENS)  # so a typed "[MASK]" stays one token, as in tokenizer.json
        return prepare(_add_template(tok))
    try:
        tok = Tokenizer.from_file(str(p))
    except Exception as e:
        raise ConfigError(f"{p}: not a tokenizers JSON file ({e})", "pass a tokenizer.json or vocab.txt") from None
    special_ids(tok)
    return prepare(tok)


def _lowercase_from_config(d: Path) -> bool:
    cfg = d / "tokenizer_config.json"
    if cfg.exists():
        try:
            return bool(parse_json(cfg.read_text(encoding="utf-8")).get("do_lower_case", True))
        except (ValueError, AttributeError):  # unreadable or not an object: BERT's default, lowercase
            pass
    return True


def is_lowercase(tok: Tokenizer) -> bool:
    n = json.loads(tok.to_str()).get("normalizer") or {}
    return bool(n.get("lowercase", False))


def save_tokenizer(tok: Tokenizer, out_dir: str | Path, max_length: int = 512) -> None:
    """Write tokenizer.json, vocab.txt and tokenizer_config.json (so transformers loads it too)."""
    d = Path(out_dir)
    atomic_write_text(d / "tokenizer.json", tok.to_str(pretty=False))
    vocab = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
    atomic_write_text(d / "vocab.txt", "".join(t + "\n" for t, _ in vocab))
    write_json(
        d / "tokenizer_config.json",
        {
            "tokenizer_class": "BertTokenizer",
            "do_lower_case": is_lowercase(tok),
            "model_max_length": max_length,
            "pad_token": PAD, "unk_token": UNK, "cls_token": CLS, "sep_token": SEP, "mask_token": MASK,
        },
    )


def continuation_flags(tok: Tokenizer) -> list[bool]:
    """flags[id] is True when the token continues a word (a '##' piece): whole-word masking groups."""
    flags = [False] * tok.get_vocab_size()
    for t, i in tok.get_vocab().items():
        if i < len(flags):
            flags[i] = t.startswith("##")
    return flags
