"""A tokenizer's special tokens by role: pad, unk, cls, sep and mask (``SpecialTokens``, their ids
``SpecialIds``), and bos / eos, which stand in for cls / sep.

Where the names come from:
1. the checkpoint's own files: ``tokenizer_config.json`` and ``special_tokens_map.json`` (the latter
   winning, as transformers reads them) name them (``pad_token``, ``cls_token`` ...).
   text/tokenizer.py's load_tokenizer reads them beside the tokenizer and records them for that
   tokenizer object (``assign``). MPNet's name ``<s> </s> <pad> [UNK] <mask>`` over a WordPiece
   vocabulary that holds BERT's bracket tokens too: only the files tell them apart;
2. else the first convention (CONVENTIONS, data: BERT's brackets, RoBERTa's angles) whose five
   tokens the vocabulary holds whole.

A role the files leave out: cls and sep are the special tokens the tokenizer's own post-processor
puts before and after a text (Qwen3 appends <|endoftext|>; Gemma frames with <bos> and <eos>), else
the named bos / eos; pad, unk and mask are those of a convention the vocabulary holds whole. What is
still missing is None, and what needs it says so where it does (``SpecialIds.need``): filling masks
and pretraining need the mask token, framing a pretraining sequence needs cls and sep. Only a
tokenizer with no padding token is refused outright: every batch pads.

The roles belong to the tokenizer object (a copy made with ``Tokenizer.from_str(tok.to_str())`` has
none and falls back to the conventions); the files written beside a tokenizer.json keep them
(``names``: save_tokenizer's tokenizer_config.json, a bundle's special_tokens_map.json).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields
from pathlib import Path
from weakref import WeakKeyDictionary

from tokenizers import Tokenizer

from mlmkit.errors import ConfigError
from mlmkit.files import JSONObject, parse_json, write_json

ROLES = ("pad", "unk", "cls", "sep", "mask")
STAND_INS = {"cls": "bos", "sep": "eos"}  # the role a missing cls / sep falls back to
KEYS = tuple(f"{r}_token" for r in (*ROLES, "bos", "eos"))  # as tokenizer_config.json names them
FILES = ("tokenizer_config.json", "special_tokens_map.json")  # read in this order, the later winning
MAP_FILE = FILES[1]
PROBE = "a"  # a text to see what the post-processor puts around it
SOFT = ("unk_token", "bos_token", "eos_token")  # named but not in the vocabulary: as if not named


@dataclass(frozen=True)
class Convention:
    """A special-token convention: ``tokens`` the (pad, unk, cls, sep, mask) names; ``id_order`` the
    roles (indices into ``tokens``) in the order a trained vocabulary numbers them; ``double_sep``
    the pair framing, cls A sep sep B sep (else cls A sep B sep with segment ids); ``mask_lstrip``
    whether the mask token takes the space before it; ``cls_is_bos`` whether cls / sep are also the
    bos / eos tokens transformers' tokenizer config names."""

    tokens: tuple[str, str, str, str, str]
    id_order: tuple[int, int, int, int, int] = (0, 1, 2, 3, 4)
    double_sep: bool = False
    mask_lstrip: bool = False
    cls_is_bos: bool = False


BRACKETS = Convention(("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"))  # [PAD] 0 ... [MASK] 4
# <s> 0, <pad> 1, </s> 2, <unk> 3
ANGLES = Convention(("<pad>", "<unk>", "<s>", "</s>", "<mask>"), id_order=(2, 0, 3, 1, 4),
                    double_sep=True, mask_lstrip=True, cls_is_bos=True)
# keyed by the names a family declares; tried in this order
CONVENTIONS = {c.tokens: c for c in (BRACKETS, ANGLES)}


@dataclass(frozen=True)
class SpecialTokens:
    """The special tokens' names by role (None: the tokenizer has none), and the bos / eos its files
    name (kept to be written back)."""

    pad: str
    unk: str | None = None
    cls: str | None = None
    sep: str | None = None
    mask: str | None = None
    bos: str | None = None
    eos: str | None = None

    @classmethod
    def of(cls, conv: Convention) -> SpecialTokens:
        pad, unk, first, last, mask = conv.tokens
        return cls(pad, unk, first, last, mask, *((first, last) if conv.cls_is_bos else (None, None)))

    def names(self) -> dict[str, str]:
        """As tokenizer_config.json names them: pad_token ... eos_token, those the tokenizer has."""
        return {f"{f.name}_token": v for f in fields(self) if (v := getattr(self, f.name)) is not None}


NEEDS = {  # what to do about a tokenizer without the role, where something needs it
    "mask": "use a masked-LM tokenizer (one with a mask token: BERT's [MASK], RoBERTa's <mask>)",
    "cls": "name a cls_token (or bos_token) in the tokenizer's tokenizer_config.json",
    "sep": "name a sep_token (or eos_token) in the tokenizer's tokenizer_config.json",
    "unk": "name an unk_token in the tokenizer's tokenizer_config.json",
}


@dataclass(frozen=True)
class SpecialIds:
    """The ids of the roles; None where the tokenizer has no such token (``need`` refuses it there)."""

    pad: int
    unk: int | None = None
    cls: int | None = None
    sep: int | None = None
    mask: int | None = None

    @property
    def all(self) -> tuple[int, ...]:
        """The ids the tokenizer has, in role order."""
        return tuple(i for i in (self.pad, self.unk, self.cls, self.sep, self.mask) if i is not None)

    def need(self, role: str, use: str) -> int:
        """The id of ``role``, or a ConfigError saying that ``use`` needs it."""
        i = getattr(self, role)
        if i is None:
            raise ConfigError(f"the tokenizer has no {role} token, which {use} needs", NEEDS[role])
        return i


# ---- the roles of a tokenizer ----------------------------------------------------------------------
_ASSIGNED: WeakKeyDictionary[Tokenizer, SpecialTokens] = WeakKeyDictionary()


def convention_of(names: Iterable[str]) -> Convention:
    """The convention of these five names; names of neither are framed as brackets are."""
    given = tuple(names)
    if len(given) != 5:
        raise ConfigError(f"special tokens {' '.join(given) or '(none)'}: expected five names (pad, unk, "
                          "cls, sep, mask)",
                          "name them as one of the conventions: "
                          + "; ".join(" ".join(c) for c in CONVENTIONS))
    five = (given[0], given[1], given[2], given[3], given[4])
    return CONVENTIONS.get(five) or Convention(five)


def found_convention(tok: Tokenizer) -> Convention | None:
    """The first convention whose five tokens the tokenizer has, else None."""
    return next((c for c in CONVENTIONS.values() if all(tok.token_to_id(t) is not None for t in c.tokens)),
                None)


def convention(tok: Tokenizer) -> Convention:
    """The first convention the tokenizer holds whole; a ConfigError naming what it lacks otherwise."""
    conv = found_convention(tok)
    if conv is None:
        missing = [t for t in BRACKETS.tokens if tok.token_to_id(t) is None]
        raise ConfigError(f"tokenizer lacks the special tokens {', '.join(missing)} (nor has it all of "
                          f"{' '.join(ANGLES.tokens)}), "
                          f"and no {' or '.join(FILES)} beside it names its own",
                          "load it from its directory (its tokenizer_config.json names its special tokens), "
                          "or train one with mlmkit tokenizer train")
    return conv


def special_tokens(tok: Tokenizer) -> SpecialTokens:
    """The tokenizer's special tokens: those ``assign`` recorded for it (its files'), else the first
    convention it holds whole."""
    got = _ASSIGNED.get(tok)
    return got if got is not None else SpecialTokens.of(convention(tok))


def token_id(tok: Tokenizer, token: str) -> int:
    """The id of a special token the tokenizer has."""
    i = tok.token_to_id(token)
    if i is None:
        raise ConfigError(f"tokenizer lacks the special token {token}",
                          "train it with mlmkit tokenizer train")
    return i


def special_ids(tok: Tokenizer) -> SpecialIds:
    """The ids of ``special_tokens``."""
    names = special_tokens(tok)

    def of(t: str | None) -> int | None:
        return None if t is None else token_id(tok, t)

    return SpecialIds(token_id(tok, names.pad), of(names.unk), of(names.cls), of(names.sep), of(names.mask))


def mask_token(tok: Tokenizer) -> str:
    """The mask token's name; a ConfigError for a tokenizer without one (nothing to fill, nothing to
    pretrain)."""
    mask = special_tokens(tok).mask
    if mask is None:
        raise ConfigError("the tokenizer has no mask token, which filling masks and pretraining need",
                          NEEDS["mask"])
    return mask


# ---- the checkpoint's files ------------------------------------------------------------------------
def named_tokens(d: Path) -> dict[str, str]:
    """The special tokens that ``d``'s tokenizer_config.json and special_tokens_map.json name:
    pad_token ... eos_token -> the token (transformers' AddedToken objects by their content). An entry
    set to null names none (it undoes the first file's); a file that is unreadable or not an object
    names nothing."""
    named: dict[str, str] = {}
    for name in FILES:
        data = _json_object(d / name)
        for key in KEYS:
            if key not in data:
                continue
            v = data[key]
            v = v.get("content") if isinstance(v, dict) else v
            if isinstance(v, str) and v:
                named[key] = v
            elif v is None:
                named.pop(key, None)
    return named


def _json_object(p: Path) -> JSONObject:
    if not p.is_file():
        return {}
    try:
        got = parse_json(p.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError, OSError):
        return {}
    return got if isinstance(got, dict) else {}


def framing(tok: Tokenizer) -> tuple[str | None, str | None]:
    """The special tokens the tokenizer's post-processor puts before and after a text: (the first,
    the last), None where it puts none (padding, if the tokenizer pads, is not counted)."""
    enc = tok.encode(PROBE, add_special_tokens=True)
    kept = [(t, s) for t, s, m in zip(enc.tokens, enc.special_tokens_mask, enc.attention_mask) if m]
    words = [i for i, (_, s) in enumerate(kept) if not s]
    if not words:
        return None, None
    first = kept[0][0] if words[0] > 0 else None
    last = kept[-1][0] if words[-1] < len(kept) - 1 else None
    return first, last


def assign(tok: Tokenizer, named: dict[str, str], where: str) -> None:
    """Record the special tokens ``named`` (named_tokens, read from ``where``) as ``tok``'s, the roles
    they leave out found as the module says. Nothing named: nothing recorded (the conventions apply).
    A ConfigError where a named pad, cls, sep or mask token is not in the vocabulary (the model would
    be fed, or searched for, a token the tokenizer never makes), or where no padding token is found;
    a named unk, bos or eos the vocabulary lacks names none (transformers would add it as a new token,
    which no model has)."""
    if not named:
        return
    named = dict(named)
    for key, t in list(named.items()):
        if tok.token_to_id(t) is None:
            if key in SOFT:
                del named[key]
                continue
            raise ConfigError(f"{where} names {key} {t!r}, which the tokenizer does not have",
                              "fix the file, or give the tokenizer it was written for")
    base, frame = found_convention(tok), dict(zip(("cls", "sep"), framing(tok)))

    def pick(role: str) -> str | None:
        t = named.get(f"{role}_token")
        if t is None and role in STAND_INS:
            t = frame[role] or named.get(f"{STAND_INS[role]}_token")
        if t is None and base is not None:
            t = base.tokens[ROLES.index(role)]
        return t

    roles = {role: pick(role) for role in ROLES}
    pad = roles.pop("pad")
    if pad is None:
        raise ConfigError(f"{where} names no pad_token, and the tokenizer has none of the conventions' "
                          f"({', '.join(c.tokens[0] for c in CONVENTIONS.values())})",
                          "name the padding token (pad_token) in the tokenizer's tokenizer_config.json")
    _ASSIGNED[tok] = SpecialTokens(pad, **roles, bos=named.get("bos_token"), eos=named.get("eos_token"))


def write_special_tokens_map(tok: Tokenizer, d: str | Path) -> None:
    """special_tokens_map.json in ``d``: the roles of ``tok`` as transformers names them, which
    load_tokenizer reads back (a bundle's tokenizer.json keeps its roles so)."""
    write_json(Path(d) / MAP_FILE, special_tokens(tok).names())
