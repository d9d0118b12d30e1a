"""Dynamic masking for MLM, as in BERT section 3.1.

Each eligible token is selected with probability ``mask_prob`` (0.15); of the selected, 80% become
[MASK], 10% a random ordinary token, 10% stay unchanged. Special tokens ([PAD] [UNK] [CLS] [SEP]
[MASK]) are never selected and never drawn as the random token. Every sequence with at least one
eligible token gets at least one selected position, so no batch row is wasted.

With ``whole_word`` the draw is made per word (a word is a start piece and the '##' pieces after it)
and the 80/10/10 decision is made per word too: all pieces of a word share their fate. Unlike
transformers' whole-word collator, the 80/10/10 split still applies (it forces 100% [MASK]).
"""

from __future__ import annotations

import torch


def mask_tokens(
    input_ids: torch.Tensor,
    *,
    mask_id: int,
    special_ids: torch.Tensor,
    vocab_size: int,
    mask_prob: float = 0.15,
    generator: torch.Generator | None = None,
    continuation: torch.Tensor | None = None,
    whole_word: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (masked input_ids, labels): labels hold the original id where selected, -100 elsewhere.

    input_ids: (B, T) long. special_ids: 1-D long tensor of ids never selected nor drawn.
    continuation: (V,) bool, True for '##' pieces; required with ``whole_word``.
    """
    if not 0.0 < mask_prob < 1.0:
        raise ValueError(f"mask_prob must be in (0, 1), got {mask_prob}")
    B, T = input_ids.shape
    g = generator
    eligible = ~torch.isin(input_ids, special_ids)  # (B, T)

    if whole_word:
        if continuation is None:
            raise ValueError("whole_word masking needs the continuation flags of the vocabulary")
        prev_eligible = torch.cat([torch.zeros(B, 1, dtype=torch.bool), eligible[:, :-1]], dim=1)
        start = eligible & (~continuation[input_ids] | ~prev_eligible)  # (B, T) first piece of each word
    else:
        start = eligible
    # index of the word start each position belongs to: the last start at or before it
    pos = torch.arange(T).expand(B, T)
    owner = torch.cummax(torch.where(start, pos, torch.full_like(pos, -1)), dim=1).values.clamp(min=0)

    # draw per start (= per word, or per token without whole_word)
    chosen = (torch.rand(B, T, generator=g) < mask_prob) & start
    # at least one selection per row that has something to select
    empty = ~chosen.any(dim=1) & start.any(dim=1)
    if empty.any():
        score = torch.rand(B, T, generator=g).masked_fill(~start, -1.0)
        forced = torch.zeros_like(chosen)
        forced[torch.arange(B), score.argmax(dim=1)] = True
        chosen |= forced & empty[:, None]
    fate = torch.rand(B, T, generator=g)  # < 0.8: [MASK]; < 0.9: random token; else unchanged

    selected = chosen.gather(1, owner) & eligible
    fate = fate.gather(1, owner)
    labels = torch.where(selected, input_ids, torch.full_like(input_ids, -100))

    out = input_ids.clone()
    out[selected & (fate < 0.8)] = mask_id
    to_random = selected & (fate >= 0.8) & (fate < 0.9)
    n = int(to_random.sum())
    if n:
        allowed = torch.ones(vocab_size, dtype=torch.bool)
        allowed[special_ids] = False
        choices = allowed.nonzero().squeeze(1)
        out[to_random] = choices[torch.randint(len(choices), (n,), generator=g)]
    return out, labels
