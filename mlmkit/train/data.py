"""The training loop's data sources: what train/loop.py asks for batches, and the two it is given.

A source is deterministic per (epoch, batch index, seed), so a resumed run seeks straight to the batch
it stopped at and never replays data:

    DataSource    the protocol: num_batches(epoch), batch(epoch, index, seed)
    FeatureData   fine-tuning: a task's features in length buckets, a new order each epoch
    PretrainData  pretraining: NSP pairs or packed windows made per batch from token shards, then masked
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import torch
from tokenizers import Tokenizer

from mlmkit.errors import MlmkitError
from mlmkit.registry import DISTINCT, EXAMPLE, Feature, Plugin
from mlmkit.text.batching import pad_features, shuffled_buckets, shuffled_groups
from mlmkit.text.tokenizer import SpecialIds, continuation_flags, special_ids
from mlmkit.train.corpus.instances import Instance, check_nsp, instance_units, nsp_instance, packed_instance
from mlmkit.train.corpus.shards import TokenizedCorpus
from mlmkit.train.masking import mask_tokens

log = logging.getLogger("mlmkit")


class DataSource(Protocol):
    def num_batches(self, epoch: int) -> int:
        """Micro-batches in ``epoch`` (across all ranks)."""

    def batch(self, epoch: int, index: int, seed: int) -> dict[str, torch.Tensor]:
        """Micro-batch ``index`` of ``epoch``; ``seed`` drives any per-batch randomness (masking)."""


def batch_seed(seed: int, epoch: int, index: int) -> int:
    return (seed * 1_000_003 + epoch * 100_003 + index) % (2**63)


class FeatureData:
    """Training data source over task features: length-bucketed batches, a new order each epoch."""

    def __init__(self, features: list[Feature], task: Plugin, batch_size: int, pad_id: int, seed: int,
                 extra: Sequence[str] | None = None) -> None:
        """``extra``: the feature keys batched beside the inputs (default: the task's label_names)."""
        if not features:
            raise MlmkitError("the training data has no examples", "check the --train file")
        self.features, self.task, self.batch_size, self.pad_id, self.seed = (features, task, batch_size,
                                                                             pad_id, seed)
        self.extra = tuple(task.label_names if extra is None else extra)
        self.lengths = [len(f["input_ids"]) for f in features]
        self.groups: list[list[int]] | None = None
        self.keys: list[frozenset[Any]] | None = None
        if task.group_features:  # an example's features stay together, in their order
            by_example: dict[Any, list[int]] = {}
            for i, f in enumerate(features):
                by_example.setdefault(f[EXAMPLE], []).append(i)
            self.groups = list(by_example.values())
            # and no value of theirs twice in a batch (the embedding task's texts)
            if DISTINCT in features[0]:
                self.keys = [frozenset(features[i][DISTINCT] for i in g) for g in self.groups]
        self._plans: dict[int, list[list[int]]] = {}

    def plan(self, epoch: int) -> list[list[int]]:
        if epoch not in self._plans:
            rng = random.Random(self.seed * 7919 + epoch)
            if self.groups is None:
                self._plans = {epoch: shuffled_buckets(self.lengths, self.batch_size, rng)}
            else:
                moved: set[int] = set()
                self._plans = {epoch: shuffled_groups(self.groups, self.lengths, self.batch_size, rng,
                                                      keys=self.keys,
                                                      moved=moved)}
                if moved:
                    log.info("epoch %d: %d of %d examples moved to a later batch, which holds none of their "
                             "texts yet",
                             epoch + 1, len(moved), len(self.groups))
        return self._plans[epoch]

    def num_batches(self, epoch: int) -> int:
        return len(self.plan(epoch))

    def batch(self, epoch: int, index: int, seed: int) -> dict[str, torch.Tensor]:
        plan = self.plan(epoch)
        feats = [self.features[i] for i in plan[index % len(plan)]]
        arrays = pad_features(feats, self.pad_id, extra=self.extra)
        if self.groups is not None:  # the example of each feature, numbered from 0 within the batch
            number: dict[Any, int] = {}
            arrays[EXAMPLE] = np.array([number.setdefault(f[EXAMPLE], len(number)) for f in feats],
                                       dtype=np.int64)
        return {k: torch.from_numpy(v) for k, v in arrays.items()}


class PretrainData:
    """The training loop's data source for pretraining: deterministic per (seed, epoch, batch).

    Nothing is built per epoch but a permutation of the units (instance_units): batch k of an epoch
    takes units k*B .. k*B+B-1 of that permutation and makes their instances then, each from a
    generator seeded with (seed, epoch, unit), so every epoch has new NSP pairings and short targets.
    Masks are drawn per step from a generator seeded with (seed, step, rank). Memory does not grow
    with the corpus (a memory-mapped shard, 12 bytes per unit), and resuming at batch k needs no
    saved data state and no replay: the loop asks for batch k directly.
    """

    def __init__(
        self,
        corpus: TokenizedCorpus,
        tok: Tokenizer,
        *,
        max_len: int = 128,
        batch_size: int = 32,
        nsp: bool = True,
        mask_prob: float = 0.15,
        whole_word: bool = False,
        seed: int = 0,
        held_out: bool = False,
    ) -> None:
        """``held_out``: evaluation data (a few fixed batches): a batch size over its sequences is no news."""
        if max_len < 8:
            raise MlmkitError(f"--seq-len {max_len} is too short", "use at least 8")
        self.corpus, self.max_len, self.batch_size, self.nsp = corpus, max_len, batch_size, nsp
        self.mask_prob, self.whole_word, self.seed = mask_prob, whole_word, seed
        self.ids: SpecialIds = special_ids(tok)
        # a pretraining sequence is cls A sep (B sep), masked with the mask token
        self.cls, self.sep, self.mask_id = (self.ids.need(role, "pretraining")
                                            for role in ("cls", "sep", "mask"))
        self.vocab_size = tok.get_vocab_size()
        self.special = torch.tensor(self.ids.all, dtype=torch.long)
        self.continuation = torch.tensor(continuation_flags(tok), dtype=torch.bool)
        if nsp:
            check_nsp(corpus)
        self.units = instance_units(corpus, max_len, nsp)
        self.num_units = len(self.units) - 1
        if self.num_units < 1:
            raise MlmkitError("the corpus yields no training sequences", "give it more text")
        if batch_size > self.num_units and not held_out:
            log.warning("--batch-size %d is more than the %d sequences of the corpus: each batch holds %d",
                        batch_size, self.num_units, self.num_units)
        self._epoch: int | None = None
        self._order = np.zeros(0, np.int64)

    def order(self, epoch: int) -> np.ndarray:
        """The units in the order ``epoch`` visits them."""
        if self._epoch != epoch:
            self._order = np.arange(self.num_units, dtype=np.int32 if self.num_units < 1 << 31 else np.int64)
            np.random.default_rng([self.seed % (1 << 32), epoch]).shuffle(self._order)  # in place: one array
            self._epoch = epoch
        return self._order

    def instance(self, epoch: int, u: int) -> Instance | None:
        if not self.nsp:
            return packed_instance(self.corpus, self.units, u)
        rng = random.Random(f"{self.seed}/{epoch}/{u}")
        return nsp_instance(self.corpus, self.units, u, self.max_len - 3, rng)

    def num_batches(self, epoch: int) -> int:
        return max(1, self.num_units // self.batch_size)

    def batch(self, epoch: int, index: int, seed: int) -> dict[str, torch.Tensor]:
        order, U = self.order(epoch), self.num_units
        n, start = min(self.batch_size, U), (index * self.batch_size) % U
        chosen: list[Instance] = []
        j = 0
        while len(chosen) < n and j < U:  # a unit whose A or B came out empty: the next one instead
            x = self.instance(epoch, int(order[(start + j) % U]))
            j += 1
            if x is not None:
                chosen.append(x)
        if not chosen:
            raise MlmkitError("the corpus yields no training sequences", "give it more text")
        return self.collate(chosen, torch.Generator().manual_seed(seed))

    def collate(self, chosen: Sequence[Instance], gen: torch.Generator) -> dict[str, torch.Tensor]:
        """[CLS] A [SEP] (B [SEP]), padded to the longest in the batch, then masked."""
        rows, segs = [], []
        for x in chosen:
            ids = [self.cls, *x.a.tolist(), self.sep]
            seg = [0] * len(ids)
            if x.b is not None:
                ids += [*x.b.tolist(), self.sep]
                seg += [1] * (len(x.b) + 1)
            rows.append(ids)
            segs.append(seg)
        T = max(map(len, rows))
        input_ids = torch.full((len(rows), T), self.ids.pad, dtype=torch.long)
        token_type_ids = torch.zeros_like(input_ids)
        attention_mask = torch.zeros_like(input_ids)
        for r, (ids, seg) in enumerate(zip(rows, segs)):
            input_ids[r, : len(ids)] = torch.tensor(ids)
            token_type_ids[r, : len(ids)] = torch.tensor(seg)
            attention_mask[r, : len(ids)] = 1
        masked, labels = mask_tokens(
            input_ids,
            mask_id=self.mask_id,
            special_ids=self.special,
            vocab_size=self.vocab_size,
            mask_prob=self.mask_prob,
            generator=gen,
            continuation=self.continuation,
            whole_word=self.whole_word,
        )
        out = {"input_ids": masked, "attention_mask": attention_mask, "token_type_ids": token_type_ids,
               "labels": labels}
        if self.nsp:
            out["next_sentence_label"] = torch.tensor([x.is_next for x in chosen], dtype=torch.long)
        return out
