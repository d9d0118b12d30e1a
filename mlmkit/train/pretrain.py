"""`mlmkit pretrain`: tokenizer (trained if not given), config, data, the training loop, evaluation."""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections import Counter
from pathlib import Path
from typing import Any, TypedDict

import torch
from tokenizers import Tokenizer

from mlmkit.args import PretrainArgs
from mlmkit.errors import ConfigError, MlmkitError
from mlmkit.files import MAX_RECORD_BYTES
from mlmkit.locks import exclusive
from mlmkit.models import FAMILIES, Family, family_for
from mlmkit.models.config import ModelConfig
from mlmkit.models.core import BertForPreTraining
from mlmkit.models.presets import preset
from mlmkit.registry import Metrics
from mlmkit.rundir.checkpoint import save_run
from mlmkit.rundir.config import load_config
from mlmkit.rundir.meta import PRETRAINING, RunMeta
from mlmkit.text.tokenizer import load_tokenizer, save_tokenizer, special_ids, train_tokenizer
from mlmkit.train.corpus.files import iter_sentences
from mlmkit.train.corpus.shards import (
    TokenizedCorpus,
    file_identity,
    open_shard,
    read_shard,
    shard_files,
    tokenize_corpus,
)
from mlmkit.train.data import PretrainData
from mlmkit.train.devices import init_distributed
from mlmkit.train.loop import Trainer
from mlmkit.train.state import latest_checkpoint
from mlmkit.train.tracking import flat_params, parse_report_to

log = logging.getLogger("mlmkit")

MAX_PRESET_POSITIONS = 8192  # a longer position table is a typo far more often than a plan


def split_heldout(corpus: TokenizedCorpus, fraction: float = 0.05,
                  max_docs: int = 500) -> tuple[TokenizedCorpus, TokenizedCorpus | None]:
    """Hold out the last documents (at least 2, so NSP can draw a random B) for evaluation."""
    D = corpus.num_docs
    n = min(max_docs, max(2, int(D * fraction)))
    if D < 10:
        return corpus, None
    cut = D - n
    s_cut = int(corpus.doc_offsets[cut])
    t_cut = int(corpus.sent_offsets[s_cut])
    train = TokenizedCorpus(corpus.tokens[:t_cut], corpus.sent_offsets[: s_cut + 1],
                            corpus.doc_offsets[: cut + 1],
                            cache=corpus.cache, part=f"docs-0-{cut}")
    held = TokenizedCorpus(
        corpus.tokens[t_cut:], corpus.sent_offsets[s_cut:] - t_cut, corpus.doc_offsets[cut:] - s_cut,
        cache=corpus.cache, part=f"docs-{cut}-{D}",
    )
    return train, held


class MLMEvaluator:
    """A fixed set of masked held-out batches (fixed seeds), scored with the MLM and NSP heads."""

    def __init__(self, data: PretrainData, max_batches: int = 20, seed: int = 1234) -> None:
        n = min(max_batches, data.num_batches(0))
        self.batches = [data.batch(0, i, seed + i) for i in range(n)]
        self.nsp = data.nsp
        labels = torch.cat([b["labels"][b["labels"] != -100] for b in self.batches])
        counts = Counter(labels.tolist())
        self.majority = counts.most_common(1)[0][1] / max(1, len(labels)) if counts else 0.0
        self.uniform = 1.0 / data.vocab_size

    def __call__(self, model: torch.nn.Module) -> dict[str, float]:
        dev = next(model.parameters()).device
        loss_sum, correct, n, nsp_ok, nsp_n = 0.0, 0, 0, 0, 0
        for b in self.batches:
            b = {k: v.to(dev) for k, v in b.items()}
            out = model(**b)
            logits, tgt = out["mlm_logits"].float(), out["mlm_labels"]
            loss_sum += float(torch.nn.functional.cross_entropy(logits, tgt, reduction="sum"))
            correct += int((logits.argmax(-1) == tgt).sum())
            n += len(tgt)
            if self.nsp:
                nsp_ok += int((out["nsp_logits"].argmax(-1) == b["next_sentence_label"]).sum())
                nsp_n += len(b["next_sentence_label"])
        loss = loss_sum / max(1, n)
        m = {
            "mlm_loss": loss,
            "mlm_accuracy": correct / max(1, n),
            "perplexity": math.exp(min(loss, 50.0)),
            "mlm_uniform_baseline": self.uniform,
            "mlm_majority_baseline": self.majority,
        }
        if self.nsp:
            m["nsp_accuracy"] = nsp_ok / max(1, nsp_n)
        return m


def _train_shared_tokenizer(corpus: list[Path], out: Path, *, vocab_size: int, cased: bool, device: str,
                            text_column: str = "text", kind: str = "wordpiece", specials: Any = None,
                            max_bytes: int | None = MAX_RECORD_BYTES) -> Tokenizer:
    """Train a tokenizer on the corpus. Under torchrun rank 0 trains it and the other ranks read the
    file it writes: WordPiece training breaks ties differently from one process to the next, so
    ranks training their own would disagree on token ids."""
    dist = _join(device)
    if dist.main:
        log.info("training a %s tokenizer (vocab %d) on the corpus", kind, vocab_size)
        tok = train_tokenizer(iter_sentences(corpus, text_column, max_bytes), vocab_size=vocab_size,
                              cased=cased, kind=kind, specials=specials)
        if dist.world == 1:
            return tok
        save_tokenizer(tok, out)
    torch.distributed.barrier()
    return tok if dist.main else load_tokenizer(out / "tokenizer.json")


def _join(device: str) -> Any:
    """This process's place under torchrun (joining the process group), or a single process."""
    on_gpu = device.startswith("cuda") and torch.cuda.is_available()
    if on_gpu and "LOCAL_RANK" in os.environ:  # each rank on its own GPU before nccl's first barrier
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    return init_distributed(torch.device("cuda" if on_gpu else "cpu"))


def _tokenized(paths: list[Path], tok: Tokenizer, cache_dir: Path | None, device: str, text_column: str,
               max_bytes: int | None) -> TokenizedCorpus:
    """The corpus's token shard. Under torchrun rank 0 tokenizes and the others wait, then map the
    shard it wrote (each rank then builds only its own batches)."""
    dist = _join(device)
    if dist.world > 1 and not dist.main:
        torch.distributed.barrier()
    corpus = tokenize_corpus(paths, tok, cache_dir, text_column=text_column, max_bytes=max_bytes)
    if dist.world > 1 and dist.main:
        torch.distributed.barrier()
    return corpus


def pretrain(args: PretrainArgs) -> Metrics:
    """Pretrain an encoder of ``args.arch`` with MLM (+ NSP for BERT unless ``args.nsp`` is False) and write a
    run directory to ``args.out``.

    On ``args.train.resume`` the run's own tokenizer and config are used (those of its last
    checkpoint: a run killed before its end has none at its root yet). Returns the final metrics
    (training loss and held-out MLM / NSP figures).
    """
    parse_report_to(args.train.report_to)  # before anything is read or built
    if args.arch is not None:
        _check_nsp(args, pretraining_family(args.arch))
    # the run directory is this process's from the start (under torchrun: rank 0's), not only once
    # the tokenizer is trained and the corpus tokenized
    with exclusive(args.out) if int(os.environ.get("RANK", "0")) == 0 else contextlib.nullcontext():
        return _pretrain(args)


def pretraining_family(arch: str) -> Family:
    """The family ``--arch`` names, one that declares it pretrains (``Family.pretrains``)."""
    names = [f.name for f in FAMILIES if f.pretrains]
    if arch not in names:
        raise ConfigError(f"--arch {arch} is not a pretraining family", f"use one of: {', '.join(names)}")
    return family_for(arch)


def _check_nsp(args: PretrainArgs, fam: Family) -> None:
    """--nsp for a family without an NSP head (``Family.nsp``) is refused: nothing would train it."""
    if args.nsp and not fam.nsp:
        raise ConfigError(f"--nsp: next-sentence prediction is BERT's, not {fam.name}'s",
                          "leave --nsp out: this family pretrains with MLM only")


class _Batches(TypedDict):
    """How PretrainData makes the batches, the same for training and held-out data."""

    max_len: int
    batch_size: int
    nsp: bool
    mask_prob: float
    whole_word: bool


def _pretrain(args: PretrainArgs) -> Metrics:
    """The pretraining itself (pretrain() holds the run directory): every input checked before any
    work, then the tokenizer, the config, the data, the model and the training loop."""
    out, t = Path(args.out), args.train
    # before a tokenizer is trained on nothing
    if args.data is None and next(iter_sentences(args.corpus, args.text_column, args.max_record_bytes),
                                  None) is None:
        raise MlmkitError(f"the corpus {', '.join(map(str, args.corpus))} is empty",
                          "give text files with one sentence per line")
    given = load_config(args.config) if args.config is not None else None  # checked before any work
    own = (latest_checkpoint(out) or out) if t.resume else None
    tokenizer = _tokenizer_file(args, own)
    own_cfg = load_config(own) if own is not None and (own / "config.json").exists() else None
    fam = _family(args, given or own_cfg, own)
    nsp = fam.nsp if args.nsp is None else args.nsp
    if tokenizer is not None:
        tok = load_tokenizer(tokenizer)
    else:
        tok = _train_shared_tokenizer(args.corpus, out, vocab_size=args.vocab_size, cased=args.cased,
                                      device=t.device,
                                      text_column=args.text_column, kind=fam.tokenizer_kind,
                                      specials=fam.special_tokens,
                                      max_bytes=args.max_record_bytes)
    cfg = _model_config(args, fam, tok, given, own_cfg)

    full = (open_shard(args.data, tok) if args.data is not None
            else _tokenized(args.corpus, tok, args.cache_dir, t.device, args.text_column,
                            args.max_record_bytes))
    held: TokenizedCorpus | None
    if args.eval_file is not None:
        train_c, held = full, _tokenized([args.eval_file], tok, args.cache_dir, t.device, args.text_column,
                                         args.max_record_bytes)
    else:
        train_c, held = split_heldout(full)
        if held is None:
            log.warning("corpus has fewer than 10 documents: no held-out evaluation (pass --eval-file)")
    kw = _Batches(max_len=args.seq_len, batch_size=args.batch_size, nsp=nsp, mask_prob=args.mask_prob,
                  whole_word=args.whole_word)
    data = PretrainData(train_c, tok, seed=t.seed, **kw)
    evaluate = MLMEvaluator(PretrainData(held, tok, seed=t.seed + 1, held_out=True,
                                         **kw)) if held is not None else None
    model = _new_model(cfg, nsp=nsp, seed=t.seed)
    meta = _run_meta(args, fam, nsp=nsp)

    def save_model(m: torch.nn.Module, d: Path, meta_: RunMeta) -> None:
        save_run(m, d, config=cfg, tokenizer=tok, meta=meta_)

    data_key = {"batch_size": args.batch_size, "seq_len": args.seq_len, "nsp": nsp,
                "mask_prob": args.mask_prob,
                "whole_word": args.whole_word,
                "corpus": file_identity(args.corpus) if args.data is None
                else [[str(args.data.resolve()), len(full.tokens)]]}
    return Trainer(model, data, t, out, save_model=save_model, evaluate=evaluate, data_key=data_key,
                   params=flat_params(args)).train(meta)


def _tokenizer_file(args: PretrainArgs, own: Path | None) -> Path | None:
    """The tokenizer to load: --tokenizer, else a resumed run's own, else the one the --shard was made
    with (the shard is read whole first, before anything is built on it); None: one is trained."""
    tokenizer = args.tokenizer
    if own is not None and (own / "tokenizer.json").exists() and tokenizer is None:
        tokenizer = own / "tokenizer.json"
    if args.data is not None:
        read_shard(args.data, repair=False)  # a shard, whole, before anything is built on it
    if tokenizer is None and args.data is not None:
        tokenizer = args.data / "tokenizer.json"
        if not tokenizer.is_file():
            raise ConfigError(f"{args.data} has no tokenizer.json",
                              "pass the tokenizer it was made with, --tokenizer")
    return tokenizer


def _family(args: PretrainArgs, cfg: ModelConfig | None, own: Path | None) -> Family:
    """The family pretrained: that of a --config or of the resumed run (``cfg``), else --arch (BERT by
    default); an --arch that disagrees with the config, or an --nsp the family has no head for, is refused."""
    fam = cfg.family if cfg is not None else family_for(args.arch or "bert")
    if args.arch is not None and fam is not family_for(args.arch):
        raise ConfigError(f"--arch {args.arch} but {args.config or own} is a {fam.name} config",
                          "leave --arch out, or pass a config of that family")
    _check_nsp(args, fam)  # the family of a --config or a resumed run
    return fam


def _model_config(args: PretrainArgs, fam: Family, tok: Tokenizer, given: ModelConfig | None,
                  own_cfg: ModelConfig | None) -> ModelConfig:
    """The model's config: --config (its vocabulary the tokenizer's), a resumed run's, else the preset's
    sized to the tokenizer and --seq-len; checked against --seq-len and the tokenizer's padding id."""
    V, ids = tok.get_vocab_size(), special_ids(tok)
    if given is not None:
        cfg = given
        if cfg.vocab_size != V:
            raise ConfigError(
                f"the tokenizer has {V} tokens but {args.config} says vocab_size {cfg.vocab_size}",
                "use the tokenizer the config was made for, or set vocab_size to match",
            )
    elif own_cfg is not None:
        cfg = own_cfg
    else:
        if args.seq_len > MAX_PRESET_POSITIONS:
            raise ConfigError(f"--seq-len {args.seq_len} is more than the {MAX_PRESET_POSITIONS} positions a "
                              "preset model gets",
                              "use a shorter --seq-len, or pass a --config with max_position_embeddings for "
                              "it")
        cfg = preset(args.preset, fam.name, vocab_size=V,
                     max_position_embeddings=fam.positions_for(args.seq_len),
                     pad_token_id=ids.pad)
        cfg.extra.update({key: ids.need(token, "a new model's config")
                          for key, token in fam.config_token_ids.items()})
    if args.seq_len > cfg.max_tokens:
        room = ("" if cfg.max_tokens == cfg.max_position_embeddings
                else f" (its positions start at padding_idx + 1: {cfg.max_tokens} tokens)")
        raise ConfigError(f"--seq-len {args.seq_len} exceeds max_position_embeddings "
                          f"{cfg.max_position_embeddings}{room}",
                          "use a shorter --seq-len")
    if cfg.pad_token_id != ids.pad:
        raise ConfigError(f"the config's pad_token_id {cfg.pad_token_id} is not the tokenizer's padding id "
                          f"{ids.pad}",
                          "set pad_token_id in the config to the tokenizer's")
    cfg.architectures = ["BertForPreTraining"]
    return cfg


def _new_model(cfg: ModelConfig, *, nsp: bool, seed: int) -> BertForPreTraining:
    """The model to pretrain, initialised from ``seed``; BERT without NSP keeps its pooler and NSP head
    frozen."""
    torch.manual_seed(seed)
    model = BertForPreTraining(cfg)
    if model.nsp and not nsp:  # BERT without its NSP loss: the pooler and NSP head stay as initialised (DDP
        # needs every trained parameter to take part in the loss)
        assert model.bert.pooler is not None  # a model with an NSP head has its pooler
        for p in [*model.bert.pooler.parameters(), *model.cls.seq_relationship.parameters()]:
            p.requires_grad_(False)
    return model


def _run_meta(args: PretrainArgs, fam: Family, *, nsp: bool) -> RunMeta:
    """What the run directory records of how it was pretrained (mlmkit.json), for export and fine-tuning."""
    return RunMeta(task=PRETRAINING, max_length=args.seq_len, nsp=nsp, arch=fam.name,
                   whole_word=args.whole_word,
                   mask_prob=args.mask_prob,
                   corpus=[str(p) for p in args.corpus] if args.data is None
                   else [f.path for f in shard_files(args.data)])
