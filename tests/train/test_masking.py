"""Masking statistics of mlmkit.train.masking.mask_tokens over >= 100k tokens (BERT section 3.1)."""

from __future__ import annotations

import numpy as np
import torch

from mlmkit.train.masking import mask_tokens

PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
SPECIAL = torch.tensor([PAD, UNK, CLS, SEP, MASK])
V = 1000


def pair_batch(B: int, T: int, seed: int, low: int = 5, high: int = V) -> torch.Tensor:
    """Rows of [CLS] A [SEP] B [SEP] [PAD]..., random ordinary ids, a few [UNK] sprinkled in."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(low, high, (B, T), generator=g)
    ids[torch.rand(B, T, generator=g) < 0.01] = UNK
    lengths = torch.randint(T // 2, T + 1, (B,), generator=g)
    for r, n in enumerate(lengths.tolist()):
        ids[r, 0] = CLS
        ids[r, n // 2] = SEP
        ids[r, n - 1] = SEP
        ids[r, n:] = PAD
    return ids


def mask(ids: torch.Tensor, seed: int = 0, **kw) -> tuple[torch.Tensor, torch.Tensor]:
    kw.setdefault("vocab_size", V)
    return mask_tokens(ids, mask_id=MASK, special_ids=SPECIAL, generator=torch.Generator().manual_seed(seed),
                       **kw)


def fates(ids: torch.Tensor, out: torch.Tensor, selected: torch.Tensor) -> tuple[float, float, float]:
    """Shares of the selected positions that became [MASK], a random token, or stayed unchanged."""
    n = int(selected.sum())
    to_mask = int((selected & (out == MASK)).sum())
    kept = int((selected & (out == ids)).sum())
    return to_mask / n, (n - to_mask - kept) / n, kept / n


def test_selection_rate_and_80_10_10_split():
    ids = pair_batch(320, 512, seed=1)
    out, labels = mask(ids)
    eligible = ~torch.isin(ids, SPECIAL)
    assert int(eligible.sum()) >= 100_000
    selected = labels != -100
    rate = int(selected.sum()) / int(eligible.sum())
    assert abs(rate - 0.15) <= 0.005, rate
    m, r, k = fates(ids, out, selected)
    assert abs(m - 0.8) <= 0.015, m
    assert abs(r - 0.1) <= 0.015, r
    assert abs(k - 0.1) <= 0.015, k


def test_labels_hold_the_original_ids_on_the_selected_set_only():
    ids = pair_batch(64, 512, seed=2)
    out, labels = mask(ids)
    selected = labels != -100
    assert torch.equal(labels[selected], ids[selected])
    assert (labels[~selected] == -100).all()
    # nothing outside the selected set is touched
    assert torch.equal(out[~selected], ids[~selected])


def test_special_tokens_are_never_selected_nor_drawn():
    ids = pair_batch(256, 512, seed=3)
    out, labels = mask(ids)
    special = torch.isin(ids, SPECIAL)
    assert int(special.sum()) > 1000  # the batch really has [CLS] [SEP] [PAD] [UNK] in it
    assert (labels[special] == -100).all()
    assert torch.equal(out[special], ids[special])
    selected = labels != -100
    random_drawn = out[selected & (out != MASK) & (out != ids)]
    assert len(random_drawn) > 1000
    assert not torch.isin(random_drawn, SPECIAL).any()
    # drawn from the whole ordinary vocabulary, not from the batch or a corner of it
    assert len(random_drawn.unique()) > 0.6 * (V - 5)


def test_random_tokens_come_from_the_vocabulary_not_the_batch():
    ids = pair_batch(128, 512, seed=4, low=5, high=10)  # the batch only uses ids 5..9
    out, labels = mask(ids)
    selected = labels != -100
    replaced = out[selected & (out != MASK) & (out != ids)]
    assert (replaced >= 10).float().mean() > 0.9


def test_at_least_one_selected_per_row():
    # short rows and a tiny mask_prob: most rows would get no selection by chance
    ids = torch.tensor([[CLS, 7, 8, SEP, PAD, PAD]] * 500 + [[CLS, SEP, PAD, PAD, PAD, PAD]] * 10)
    out, labels = mask(ids, mask_prob=0.01)
    per_row = (labels != -100).sum(dim=1)
    assert (per_row[:500] >= 1).all()
    assert (per_row[500:] == 0).all()  # a row with nothing eligible stays untouched
    assert torch.equal(out[500:], ids[500:])
    assert (labels[:, [0, 3, 4, 5]] == -100).all()  # the forced choice is an eligible token too
    # the forced selection is not always the same position
    assert (labels[:500, 1] != -100).any() and (labels[:500, 2] != -100).any()


def test_masking_is_deterministic_per_generator_seed():
    ids = pair_batch(8, 64, seed=5)
    a, la = mask(ids, seed=11)
    b, lb = mask(ids, seed=11)
    c, lc = mask(ids, seed=12)
    assert torch.equal(a, b) and torch.equal(la, lb)
    assert not torch.equal(la, lc)


# ---- whole-word masking ------------------------------------------------------------------------

FIRST = range(5, 500)  # ids of word-initial pieces
CONT = range(500, V)  # ids of '##' continuation pieces


def word_batch(B: int, T: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows [CLS] words... [SEP] [PAD]... of words of 1-4 pieces; returns ids and a word number per
    position (-1 on special tokens)."""
    rng = np.random.default_rng(seed)
    ids = np.full((B, T), PAD)
    word = np.full((B, T), -1)
    w = 0
    for r in range(B):
        n = int(rng.integers(T // 2, T + 1))
        ids[r, 0] = CLS
        i = 1
        for k in rng.integers(1, 5, size=T):
            if i + k >= n - 1:
                break
            ids[r, i] = rng.integers(FIRST.start, FIRST.stop)
            ids[r, i + 1 : i + k] = rng.integers(CONT.start, CONT.stop, size=k - 1)
            word[r, i : i + k] = w
            i, w = i + k, w + 1
        ids[r, i] = SEP
    return torch.from_numpy(ids), torch.from_numpy(word)


def continuation() -> torch.Tensor:
    flags = torch.zeros(V, dtype=torch.bool)
    flags[CONT.start :] = True
    return flags


def test_whole_word_groups_share_selection_and_fate():
    ids, word = word_batch(512, 512, seed=6)
    out, labels = mask(ids, whole_word=True, continuation=continuation())
    assert int((word >= 0).sum()) >= 100_000
    assert torch.equal(word >= 0, ids > MASK)
    w = word[word >= 0]
    per_word = lambda x: torch.bincount(w, weights=x[word >= 0].double()).long()  # noqa: E731
    pieces = per_word(torch.ones_like(ids))
    sel = per_word(labels != -100)
    n_mask = per_word(out == MASK)
    n_kept = per_word(out == ids)
    assert ((sel == 0) | (sel == pieces)).all()  # all pieces of a word or none
    assert (sel == pieces).float().mean() > 0.1
    picked = sel > 0
    assert (n_kept[~picked] == pieces[~picked]).all()  # unselected words untouched
    all_mask = picked & (n_mask == pieces)
    all_kept = picked & (n_kept == pieces)
    # random: no piece became [MASK], and the word changed (a draw equals the original 1 in 995)
    random_ = picked & (n_mask == 0) & (n_kept < pieces)
    assert int(picked.sum()) == int(all_mask.sum() + all_kept.sum() + random_.sum())  # no mixed fates
    n = int(picked.sum())
    assert abs(n / len(pieces) - 0.15) <= 0.005, n / len(pieces)
    # the 80/10/10 split still holds per word (transformers' whole-word collator forces 100% [MASK])
    assert abs(int(all_mask.sum()) / n - 0.8) <= 0.015
    assert abs(int(random_.sum()) / n - 0.1) <= 0.015
    assert abs(int(all_kept.sum()) / n - 0.1) <= 0.015
    assert not torch.isin(out[(labels != -100) & (out != MASK)], SPECIAL).any()
    # token level: about 15% of the ordinary tokens are selected too
    assert abs(int((labels != -100).sum()) / int((word >= 0).sum()) - 0.15) <= 0.01


def test_whole_word_piece_after_a_special_token_starts_its_own_word():
    # a '##' piece right after [CLS] or [SEP] cannot continue the word before the special token
    ids = torch.tensor([[CLS, 600, 601, SEP, 700, SEP]] * 400)
    out, labels = mask(ids, mask_prob=0.3, whole_word=True, continuation=continuation())
    sel = labels != -100
    assert torch.equal(sel[:, 1], sel[:, 2])  # 600 ##601: one word
    assert (sel[:, 1] != sel[:, 4]).any()  # ##700 after [SEP] is a separate word
    assert not sel[:, [0, 3, 5]].any()
