"""Train and load tokenizers of every kind (the `tokenizers` library): WordPiece (BERT), byte-level
BPE (RoBERTa, ModernBERT) and Unigram / SentencePiece (XLM-R, DeBERTa-v3).

A tokenizer is a ``tokenizers.Tokenizer`` whose special tokens (the pad, unk, cls, sep and mask
roles: text/specials.py) are those its checkpoint's tokenizer_config.json / special_tokens_map.json
name, read by load_tokenizer, else those of one of two conventions (CONVENTIONS, data: the names the
roles are found under, their ids, how a pair is framed): brackets, ``[PAD] [UNK] [CLS] [SEP] [MASK]``
and ``[CLS] A [SEP] B [SEP]`` with segment ids (BERT's), or angles, ``<pad> <unk> <s> </s> <mask>``
and ``<s> A </s></s> B </s>`` (RoBERTa's). A tokenizer trained here is of a convention: a model
family declares which it trains with (``Family.special_tokens``, its five names); nothing here knows
the families. A checkpoint with only vocab.json + merges.txt (byte-level
BPE) is converted here; one with only a SentencePiece model needs transformers' converter. Padding
and truncation are always set explicitly by the caller: a tokenizer.json can carry a fixed padding
setting (docs/performance.md, "Tokenizer files can carry padding").
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from itertools import islice
from pathlib import Path

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
from mlmkit.files import atomic_write_text, parse_json, write_json
from mlmkit.text.specials import (
    ANGLES,
    BRACKETS,
    CONVENTIONS,
    FILES,
    ROLES,
    Convention,
    SpecialIds,
    SpecialTokens,
    assign,
    convention,
    convention_of,
    mask_token,
    named_tokens,
    special_ids,
    special_tokens,
    token_id,
    write_special_tokens_map,
)

__all__ = [  # the special tokens' roles are text/specials.py's, importable from here as before
    "ANGLES", "BRACKETS", "CONVENTIONS", "Convention", "SpecialIds", "SpecialTokens", "convention_of",
    "mask_token",
    "special_ids", "special_tokens", "token_id", "write_special_tokens_map",
    "PAD", "UNK", "CLS", "SEP", "MASK", "SPECIAL_TOKENS", "ROBERTA_TOKENS", "DEFAULT_VOCAB_SIZE", "KINDS",
    "train_tokenizer", "prepare", "load_tokenizer", "save_tokenizer", "is_lowercase", "is_wordpiece",
    "continuation_flags",
]


PAD, UNK, CLS, SEP, MASK = BRACKETS.tokens
SPECIAL_TOKENS = list(BRACKETS.tokens)
ROBERTA_TOKENS = list(ANGLES.tokens)  # the angle convention's names, as cli/ imports them
DEFAULT_VOCAB_SIZE = 8000  # small corpora (the quickstart's) fill no more; BERT-base used 30522
KINDS = ("wordpiece", "bpe", "unigram")


def _bert_pipeline(tok: Tokenizer, cased: bool) -> Tokenizer:
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None if cased else True, lowercase=not cased
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    return tok


def _frame(tok: Tokenizer, conv: Convention) -> Tokenizer:
    """The post-processor of the convention: cls A sep and cls A sep B sep with segment ids, or (double
    sep) cls A sep sep B sep with offsets without the leading space (transformers' RobertaProcessing)."""
    cls, sep = conv.tokens[2], conv.tokens[3]
    if conv.double_sep:
        tok.post_processor = processors.RobertaProcessing((sep, token_id(tok, sep)),
                                                          (cls, token_id(tok, cls)),
                                                          trim_offsets=True, add_prefix_space=False)
        return tok
    tok.post_processor = processors.TemplateProcessing(
        single=f"{cls}:0 $A:0 {sep}:0", pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
        special_tokens=[(cls, token_id(tok, cls)), (sep, token_id(tok, sep))],
    )
    return tok


def train_tokenizer(texts: Iterable[str], vocab_size: int = DEFAULT_VOCAB_SIZE, cased: bool = False,
                    min_frequency: int = 2,
                    kind: str = "wordpiece", specials: Iterable[str] | None = None) -> Tokenizer:
    """Train a tokenizer on an iterator of texts (sentences or lines).

    ``kind``: "wordpiece" (BERT's normalisation and ## pieces), "bpe" (byte-level, as RoBERTa and
    ModernBERT: every byte representable, spaces kept as Ġ; always cased) or "unigram" (SentencePiece
    style, ▁ for spaces, NFKC). ``specials``: the (pad, unk, cls, sep, mask) names of a convention
    (CONVENTIONS), which also give their ids and the template; brackets by default for wordpiece and
    angles for the others."""
    if kind not in KINDS:
        raise ConfigError(f"--kind {kind} is not a tokenizer kind", f"use one of: {', '.join(KINDS)}")
    if vocab_size < len(BRACKETS.tokens) + 30:
        raise ConfigError(f"--vocab-size {vocab_size} is too small", "use at least a few hundred")
    conv = convention_of(specials or (BRACKETS if kind == "wordpiece" else ANGLES).tokens)
    names = conv.tokens
    order = [names[i] for i in conv.id_order]
    if kind == "wordpiece":
        tok = _bert_pipeline(Tokenizer(models.WordPiece(unk_token=names[1], max_input_chars_per_word=100)),
                             cased)
        tok.model = _train_wordpiece(tok, texts, vocab_size, min_frequency, order, names[1])
        tok.add_special_tokens(order)
    elif kind == "bpe":
        tok = Tokenizer(models.BPE(unk_token=None))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.train_from_iterator(texts, trainer=trainers.BpeTrainer(
            vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=order,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    else:
        tok = Tokenizer(models.Unigram())
        tok.normalizer = normalizers.NFKC()
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        tok.train_from_iterator(texts,
                                trainer=trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=order,
                                                                unk_token=names[1]))
    # a typed mask stays one token (the angles' <mask> takes the space before it, as RoBERTa's)
    tok.add_special_tokens([AddedToken(names[4], special=True, normalized=False, lstrip=conv.mask_lstrip)])
    return prepare(_frame(tok, conv))


# WordPiece and byte-level BPE training are deterministic: the same texts give the same tokenizer.json
# in any process. `tokenizers`' WordPiece trainer is not (its issue #1794): it numbers the continuation pieces
# ("##x") in the order of a hash map, and merges of equal count are then chosen by those numbers.
# So WordPiece is trained as plain BPE over words whose continuation characters are spelled with
# private-use characters (a word's first character stays itself): every symbol is then a character,
# characters are numbered in code-point order, and equal counts are broken the same way each time.
# Words with characters past U+1FFFF or in the private-use planes are left out of that training.
# (Unigram is not made so: its trainer scores the characters it must keep in a hash set's order.)
_CONTINUED = 0xF0000  # "##" + chr(c) is spelled chr(_CONTINUED + c), for c up to U+1FFFD


def _continued(word: str) -> str | None:
    if any(ord(c) >= _CONTINUED for c in word) or any(ord(c) > 0x1FFFD for c in word[1:]):
        return None
    return word[0] + "".join(chr(_CONTINUED + ord(c)) for c in word[1:])


def _piece(symbol: str) -> str:
    plain = "".join(chr(ord(c) - _CONTINUED) if ord(c) >= _CONTINUED else c for c in symbol)
    return "##" + plain if ord(symbol[0]) >= _CONTINUED else plain


def _train_wordpiece(tok: Tokenizer, texts: Iterable[str], vocab_size: int, min_frequency: int,
                     specials: list[str],
                     unk: str) -> models.WordPiece:
    normalize, split = tok.normalizer.normalize_str, tok.pre_tokenizer.pre_tokenize_str
    counts: Counter[str] = Counter()
    it = iter(texts)
    # the normaliser makes the newlines spaces: no word spans two texts
    while chunk := list(islice(it, 1024)):
        counts.update(w for w, _ in split(normalize("\n".join(chunk))))

    spelled = {w: s for w in counts if (s := _continued(w))}

    def words() -> Iterable[str]:  # each distinct word spelled once, as often as it occurs (a few at a time)
        for word, s in spelled.items():
            n = counts[word]
            for start in range(0, n, 4096):
                yield " ".join([s] * min(4096, n - start))

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    alphabet = sorted({c for w in spelled for c in w})  # every character may start a word, as in BERT's
    bpe.train_from_iterator(words(),
                            trainer=trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                                         special_tokens=specials,
                                                        initial_alphabet=alphabet))
    vocab = {(s if s in specials else _piece(s)): i for s, i in bpe.get_vocab().items()}
    return models.WordPiece(vocab, unk_token=unk, max_input_chars_per_word=100)


def prepare(tok: Tokenizer) -> Tokenizer:
    """No padding, no truncation: callers set both per use."""
    tok.no_padding()
    tok.no_truncation()
    return tok


SENTENCEPIECE_FILES = ("sentencepiece.bpe.model", "spm.model", "tokenizer.model")
# a path to one of them reads the special tokens its directory names
CHECKPOINT_FILES = ("tokenizer.json", "vocab.txt")


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Load tokenizer.json, vocab.txt, or a directory holding one of them, or vocab.json + merges.txt
    (byte-level BPE), or a SentencePiece model (converted with transformers' converter). The special
    tokens are those the directory's tokenizer_config.json / special_tokens_map.json name, where they
    do (text/specials.py), else a convention's. A vocabulary of special tokens alone is refused: every
    text would be unknown tokens, and a model would train on them without a word said."""
    p = Path(path)
    tok = _load(p)
    home = p if p.is_dir() else p.parent if p.name in CHECKPOINT_FILES else None
    if home is not None:
        assign(tok, named_tokens(home), f"the tokenizer files of {home} ({' / '.join(FILES)})")
    added = {t.content for t in tok.get_added_tokens_decoder().values() if t.special}
    named = set(special_tokens(tok).names().values())
    words = tok.get_vocab_size(with_added_tokens=True) - len(set(special_ids(tok).all)) - len(added - named)
    if words <= 0:
        raise ConfigError(f"{path}: the vocabulary holds only special tokens "
                          f"({', '.join(sorted(tok.get_vocab()))}): every text "
                          "would be unknown tokens",
                          "train a tokenizer on the corpus (mlmkit tokenizer train), or give the "
                          "model's own")
    return tok


def _load(p: Path) -> Tokenizer:
    if p.is_dir():
        for name in ("tokenizer.json", "vocab.txt"):
            if (p / name).exists():
                return _load(p / name)
        if (p / "vocab.json").is_file() and (p / "merges.txt").is_file():
            return _from_vocab_merges(p)
        for name in SENTENCEPIECE_FILES:
            if (p / name).is_file():
                return _from_sentencepiece(p)
        raise ConfigError(f"no tokenizer in {p} (tokenizer.json, vocab.txt, vocab.json + merges.txt or a "
                          "SentencePiece model)",
                          "a model directory needs one of them beside config.json")
    if not p.exists():
        raise ConfigError(f"tokenizer not found: {p}", "check the path")
    if p.suffix == ".txt":
        vocab: dict[str, int] = {}
        try:
            lines = p.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError as e:
            raise ConfigError(f"{p}: not UTF-8 text (byte {e.start})",
                              "a vocab.txt has one UTF-8 token per line") from None
        for i, line in enumerate(lines):
            vocab.setdefault(line.rstrip("\n"), i)
        return _from_vocab_txt(p, vocab)
    try:
        tok = Tokenizer.from_file(str(p))
    except Exception as e:
        raise ConfigError(f"{p}: not a tokenizers JSON file ({e})",
                          "pass a tokenizer.json or vocab.txt") from None
    return prepare(tok)


def _from_vocab_txt(p: Path, vocab: dict[str, int]) -> Tokenizer:
    """A WordPiece tokenizer of a vocab.txt (BERT's pipeline), its special tokens those the files
    beside it name where they name all five (framed cls A sep B sep), else BERT's brackets."""
    cased = not _lowercase_from_config(p.parent)
    five = tuple(named_tokens(p.parent).get(f"{role}_token") for role in ROLES)
    conv = convention_of(t for t in five if t) if all(five) else BRACKETS
    tok = _bert_pipeline(Tokenizer(models.WordPiece(vocab, unk_token=conv.tokens[1],
                                                    max_input_chars_per_word=100)), cased)
    for t in conv.tokens:
        token_id(tok, t)  # in the vocabulary
    tok.add_special_tokens(list(conv.tokens))  # so a typed "[MASK]" stays one token, as in tokenizer.json
    return prepare(_frame(tok, conv))


def _from_vocab_merges(d: Path) -> Tokenizer:
    """A byte-level BPE tokenizer (RoBERTa / GPT-2 files), framed by the convention its tokens are of."""
    try:
        tok = Tokenizer(models.BPE.from_file(str(d / "vocab.json"), str(d / "merges.txt")))
    except Exception as e:  # tokenizers raises its own exception type for malformed files
        raise ConfigError(f"{d}: vocab.json / merges.txt are not a BPE vocabulary ({e})",
                          "re-create the checkpoint") from None
    space = bool(_tokenizer_config(d).get("add_prefix_space", False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=space)
    tok.decoder = decoders.ByteLevel()
    conv = convention(tok)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False,
                                       lstrip=conv.mask_lstrip and t == conv.tokens[4])
                            for t in conv.tokens])
    return prepare(_frame(tok, conv))


def _from_sentencepiece(d: Path) -> Tokenizer:
    """A SentencePiece-only checkpoint (XLM-R, DeBERTa-v3), converted by transformers (it needs the
    sentencepiece and protobuf packages)."""
    try:
        import transformers
    except ImportError:
        raise ConfigError(f"{d} has only a SentencePiece tokenizer model, and converting it needs "
                          "transformers",
                          "pip install 'mlmkit[convert]' (transformers, sentencepiece, protobuf), or save a "
                          "tokenizer.json") from None
    try:
        fast = transformers.AutoTokenizer.from_pretrained(str(d), use_fast=True)
        tok = Tokenizer.from_str(fast.backend_tokenizer.to_str())
    except Exception as e:  # the converter raises ImportError, ValueError ... depending on what is missing
        # one line: transformers' messages have several
        said = " ".join(str(e).split())[:200] or type(e).__name__
        raise ConfigError(f"{d}: the SentencePiece model could not be converted ({said})",
                          "check the .model file, or pip install 'mlmkit[convert]' (transformers, "
                          "sentencepiece, protobuf), "
                          "or save a tokenizer.json") from None
    return prepare(tok)


def _tokenizer_config(d: Path) -> dict:
    cfg = d / "tokenizer_config.json"
    if cfg.is_file():
        try:
            got = parse_json(cfg.read_text(encoding="utf-8"))
            return got if isinstance(got, dict) else {}
        except (ValueError, UnicodeDecodeError):
            pass
    return {}


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


def is_wordpiece(tok: Tokenizer) -> bool:
    return (json.loads(tok.to_str()).get("model") or {}).get("type") == "WordPiece"


def save_tokenizer(tok: Tokenizer, out_dir: str | Path, max_length: int = 512) -> None:
    """Write tokenizer.json, tokenizer_config.json (naming its special tokens, with bos / eos where
    they have names) and, for WordPiece, vocab.txt (so transformers and BERT tools load it too)."""
    d = Path(out_dir)
    atomic_write_text(d / "tokenizer.json", tok.to_str(pretty=False))
    # transformers reads tokenizer.json itself
    config: dict[str, object] = {"tokenizer_class": "PreTrainedTokenizerFast"}
    if is_wordpiece(tok):
        vocab = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
        atomic_write_text(d / "vocab.txt", "".join(t + "\n" for t, _ in vocab))
        if _framed_as_bert(tok):  # BertTokenizer frames anew from cls / sep: only where it frames the same
            config = {"tokenizer_class": "BertTokenizer", "do_lower_case": is_lowercase(tok)}
    write_json(d / "tokenizer_config.json",
               {**config, "model_max_length": max_length, **special_tokens(tok).names()})


def _framed_as_bert(tok: Tokenizer) -> bool:
    """Whether the tokenizer frames a pair as BERT's cls A sep B sep (transformers' BertTokenizer
    rebuilds that framing from the cls and sep tokens; MPNet's is cls A sep sep B sep)."""
    ids = special_ids(tok)
    enc = tok.encode("a", "a")
    return [i for i, s in zip(enc.ids, enc.special_tokens_mask) if s] == [ids.cls, ids.sep, ids.sep]


def continuation_flags(tok: Tokenizer) -> list[bool]:
    """flags[id] is True when the token continues a word (a WordPiece "##" piece; a BPE / SentencePiece
    piece without the Ġ / ▁ of a word start): whole-word masking groups."""
    flags = [False] * tok.get_vocab_size()
    model = (json.loads(tok.to_str()).get("model") or {}).get("type")
    for t, i in tok.get_vocab().items():
        if i < len(flags):
            if model == "WordPiece":
                flags[i] = t.startswith("##")
            else:  # byte-level BPE and SentencePiece mark a word's start (Ġ / ▁), not its continuation
                flags[i] = not t.startswith(("Ġ", "▁", "<", "[")) and t.isalnum()
    return flags
