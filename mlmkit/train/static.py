"""`mlmkit distill TEACHER --static`: an embedding model turned into a table of token vectors.

The table, made in four steps (model2vec's recipe, with mlmkit's teachers and training):

1. every token of the vocabulary but the special ones and placeholders ([unused17]) goes through the teacher
   on its own, as the text [CLS] token [SEP] (the tokenizer's own special tokens), with the teacher's pooling
   but not its normalisation (a token's norm says how much it counts: unit vectors made a table of nDCG@10
   0.271 on the built-in retrieval set, the norms kept 0.288; a bundle teacher's graph
   normalises, so a run or sentence-transformers directory of the same model makes the better table):
   a vector per token, computed once and cached under $MLMKIT_CACHE/teacher-outputs;
2. PCA to ``--dims`` (the vectors centred, the components of the largest variance, each component's
   sign fixed so that its largest loading is positive: the same teacher gives the same table);
3. each row weighted by sif / (sif + p), p the token's Zipf probability by its rank in the vocabulary
   (WordPiece and BPE vocabularies list their pieces roughly by frequency), so frequent pieces
   ("the", "##s") count less in a text's mean: SIF weighting (Arora et al. 2017);
4. with ``--train DATA``, the table is trained further with the contrastive losses of `finetune
   embedding` on its rows, pairs or BEIR directory: mnrl for (anchor, positive[, negatives]) rows and
   BEIR qrels, cosent for scored pairs.

The result is a static-embedding bundle (mlmkit.runtime.static_bundle): a text's embedding is the
normalised mean of its tokens' rows.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from mlmkit.args import DISTILL_LR, DistillArgs
from mlmkit.errors import ConfigError
from mlmkit.files import JSONObject, atomic_write, cache_root
from mlmkit.locks import exclusive
from mlmkit.models.pooled import PairBatch, TextEncoder, pool, token_states
from mlmkit.objectives import get_loss
from mlmkit.registry import Metrics, Options, TaskContext, get_task
from mlmkit.rundir.cards import write_card
from mlmkit.rundir.meta import RunMeta
from mlmkit.runtime.static_bundle import STATIC, write_static_bundle
from mlmkit.text.batching import pad_features
from mlmkit.text.tokenizer import special_ids
from mlmkit.train.losses import EmbeddingLoss, embedding_loss

log = logging.getLogger("mlmkit")

DEFAULT_DIMS = 256
SIF = 1e-4  # the weighting's coefficient (model2vec's default): a token of Zipf probability 1e-4 counts half
STATIC_LR = 1e-2
"""The table's learning rate when --lr is left at distill's default: on the built-in retrieval set
(MiniLM-L6's table, 3 epochs, batch 32) 1e-2 gave nDCG@10 0.385, 3e-3 0.349, 3e-2 0.381."""
TOKEN_BATCH = 512  # one-token texts per teacher batch


@dataclass
class StaticTeacher:
    """An embedding model as step 1 needs it: its tokenizer, a function from padded batches to
    embeddings, its saved options, max length and identity (for the cache)."""

    tokenizer: Any
    embed: Callable[[dict[str, np.ndarray]], np.ndarray]
    options: Options
    max_length: int
    identity: str
    hidden: int | None  # the embeddings' size, where the model says it before it runs

    @classmethod
    def load(cls, path: Path) -> StaticTeacher:
        """An embedding bundle (onnxruntime), run or sentence-transformers directory (PyTorch)."""
        if not path.exists():
            raise ConfigError(f"teacher not found: {path}",
                              "give an embedding run, a sentence-transformers directory or an "
                              "embedding bundle")
        if (path / "model.onnx").is_file():
            from mlmkit.runtime.pipeline import Pipeline

            pipe = Pipeline.load(path)
            _check_embedding(path, pipe.task)
            return cls(pipe.tokenizer, lambda b: pipe.run_batch(b)["embedding"], dict(pipe.meta.options),
                       pipe.max_length, json.dumps(pipe.identity(), sort_keys=True),
                       pipe.meta.model.hidden_size)
        from mlmkit.rundir.weights import weights_digest
        from mlmkit.train.finetune import base_model_dir, load_finetuned, torch_forward

        task, net, tok, meta = load_finetuned(path)
        _check_embedding(path, task.name)
        # the pooled vectors before the normalisation: their norms weigh the tokens
        if hasattr(net, "normalize"):
            net.normalize = False
        forward = torch_forward(net, ["embedding"])
        return cls(tok, lambda b: forward(b)["embedding"], dict(meta.options), meta.max_length,
                   weights_digest(base_model_dir(path)), int(net.bert.config.hidden_size))


def _check_embedding(path: Path, task: str) -> None:
    if task != "embedding":
        raise ConfigError(f"{path} is a {task} model: a static table is made from an embedding model",
                          "give an embedding run, a sentence-transformers directory or an embedding bundle")


PLACEHOLDER = re.compile(r"^\[[A-Za-z_]+[0-9]*\]$")
"""A vocabulary entry such as BERT's [unused17]: kept free for later tokens, never produced from text."""


def token_rows(tok: Any) -> tuple[list[int], list[int]]:
    """(the ids that get a row, in vocabulary order: every token but the special ones and the
    placeholders; the special tokens the tokenizer puts around a text). The placeholders matter to
    the weighting: BERT's ~1,000 [unusedN] come before its words, and ranked with them, "the" would
    rank a thousandth and keep half its weight."""
    specials = {i for i, t in tok.get_added_tokens_decoder().items() if t.special}
    specials.add(special_ids(tok).pad)
    return [i for i in range(tok.get_vocab_size())
            if i not in specials and not PLACEHOLDER.match(tok.id_to_token(i) or "")], specials_around(tok)


def specials_around(tok: Any) -> list[int]:
    """The ids the tokenizer adds to an empty text ([CLS] [SEP], <s> </s>, or none)."""
    return list(tok.encode("").ids)


def teacher_vectors(teacher: StaticTeacher, ids: list[int]) -> np.ndarray:
    """Step 1: the teacher's embedding of each token id alone, (len(ids), hidden) float32, cached."""
    key = {"teacher": teacher.identity,
           "ids": hashlib.sha256(np.asarray(ids, dtype=np.int64).tobytes()).hexdigest(),
           "format": "static-2"}
    path = cache_root() / "teacher-outputs" / ("static-"
                                               + hashlib.sha256(json.dumps(
                                                   key, sort_keys=True).encode()).hexdigest()[:24] + ".npy")
    if path.is_file():
        with contextlib.suppress(OSError, ValueError):
            got = np.load(path, allow_pickle=False)
            if got.ndim == 2 and got.shape[0] == len(ids):
                log.info("the teacher's token vectors: %s", path)
                return got
    around = specials_around(teacher.tokenizer)
    head, tail = around[:1], around[1:]
    log.info("the teacher embeds %d tokens", len(ids))
    rows = []
    pad = special_ids(teacher.tokenizer).pad
    for start in range(0, len(ids), TOKEN_BATCH):
        feats = [{"input_ids": head + [i] + tail, "token_type_ids": [0] * (len(around) + 1)}
                 for i in ids[start:start + TOKEN_BATCH]]
        rows.append(np.asarray(teacher.embed(pad_features(feats, pad)), dtype=np.float32))
    vectors = np.concatenate(rows)
    path.parent.mkdir(parents=True, exist_ok=True)

    def write(tmp: str) -> None:
        with open(tmp, "wb") as fh:
            np.save(fh, vectors)

    atomic_write(path, write)
    return vectors


def pca(x: np.ndarray, dims: int) -> tuple[np.ndarray, float]:
    """Step 2: (x centred and projected on its ``dims`` components of largest variance, the share of
    the variance they keep)."""
    x64 = x.astype(np.float64)
    centred = x64 - x64.mean(0)
    values, vectors = np.linalg.eigh(centred.T @ centred)
    order = np.argsort(values)[::-1][:dims]
    w = vectors[:, order]
    w *= np.sign(w[np.abs(w).argmax(0), np.arange(w.shape[1])])  # a fixed sign per component
    kept = float(values[order].sum() / max(values.sum(), 1e-30))
    return (centred @ w).astype(np.float32), kept


def sif_weights(n: int, sif: float = SIF) -> np.ndarray:
    """Step 3: sif / (sif + p_r) for ranks r = 1..n, p_r the Zipf probability (1/r normalised)."""
    p = 1.0 / np.arange(1, n + 1, dtype=np.float64)
    p /= p.sum()
    return (sif / (sif + p)).astype(np.float32)


class StaticEncoder(TextEncoder):
    """The table in training: a text's embedding is the normalised mean of its counted tokens' rows
    (the bundle's graph, mlmkit.runtime.static_bundle); the loss is ``objective`` over the batch's texts."""

    def __init__(self, table: np.ndarray, counted: np.ndarray, objective: EmbeddingLoss) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.from_numpy(np.array(table, dtype=np.float32)))
        self.register_buffer("counted", torch.from_numpy(np.array(counted, dtype=np.float32)))
        self.objective = objective

    def embed(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        # (B, T): the counted real ones
        weights = self.counted[input_ids] * attention_mask.to(self.table.dtype)
        rows = token_states(self.table, input_ids, attention_mask)  # (B, T, D): each token's row
        return F.normalize(pool(rows, weights, "mean"), p=2.0, dim=-1)

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
               token_type_ids: torch.Tensor | None) -> dict[str, torch.Tensor]:
        return {"embedding": self.embed(input_ids, attention_mask)}

    def train_step(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   token_type_ids: torch.Tensor | None, batch: PairBatch) -> dict[str, torch.Tensor]:
        emb = self.embed(input_ids, attention_mask)
        return {"loss": self.objective(emb, batch), "embedding": emb}


STATIC_LOSSES = {"rows": "mnrl", "scored": "cosent"}
"""The loss that trains a table on each kind of the embedding task's training data."""


def distill_static(args: DistillArgs) -> Metrics:
    """Make the static-embedding bundle ``args.out`` from ``args.teacher``; returns what it recorded."""
    with exclusive(args.out):
        return _distill_static(args)


def _distill_static(args: DistillArgs) -> Metrics:
    teacher = StaticTeacher.load(Path(args.teacher))
    _check_dims(args.dims, teacher.hidden)  # before the teacher runs, where its size is known
    tok = teacher.tokenizer
    ids, _ = token_rows(tok)
    vectors = teacher_vectors(teacher, ids)
    hidden = vectors.shape[1]
    _check_dims(args.dims, hidden)
    dims = args.dims or min(DEFAULT_DIMS, hidden)
    reduced, kept = pca(vectors, dims)
    reduced *= sif_weights(len(ids))[:, None]
    V = tok.get_vocab_size()
    table, counted = np.zeros((V, dims), dtype=np.float32), np.zeros(V, dtype=np.float32)
    table[ids], counted[ids] = reduced, 1.0
    L = args.max_length or teacher.max_length
    info: JSONObject = {"teacher": str(args.teacher), "dims": dims, "teacher_dims": hidden,
                        "tokens": len(ids),
                            "pca_variance_kept": round(kept, 4),
                        "weighting": f"sif {SIF:g} on Zipf ranks of the vocabulary"}
    options = {k: v for k, v in teacher.options.items() if k in ("text_column",)}
    if args.train_file is not None:
        table, trained = train_table(args, table, counted, tok, L)
        info["trained"] = trained
    write_static_bundle(args.out, table, counted, tok, max_length=L, options=options, info=info,
                        source=str(args.teacher))
    write_card(args.out)
    if args.train_file is not None:  # the training's resume state: the bundle is whole without it
        shutil.rmtree(Path(args.out) / "checkpoints", ignore_errors=True)
        (Path(args.out) / "model.safetensors").unlink(missing_ok=True)
    return {"dims": dims, "tokens": len(ids), "pca_variance_kept": kept,
            **info.get("trained", {}).get("final", {})}


def _check_dims(dims: int | None, hidden: int | None) -> None:
    if dims is not None and hidden is not None and dims > hidden:
        raise ConfigError(f"--dims {dims} is more than the teacher's {hidden} dimensions",
                          f"give --dims 1 to {hidden}")


def train_table(args: DistillArgs, table: np.ndarray, counted: np.ndarray, tok: Any, max_length: int
                ) -> tuple[np.ndarray, JSONObject]:
    """Step 4: the table trained on ``args.train_file`` with the embedding task's data reading and the
    Trainer (checkpoints, --resume, tracking as `finetune`); (the table, what the training recorded)."""
    from mlmkit.train.data import FeatureData
    from mlmkit.train.finetune import data_identity
    from mlmkit.train.loop import Trainer
    from mlmkit.train.tracking import flat_params

    train_file = args.train_file
    assert train_file is not None
    if args.train.lr == DISTILL_LR:  # the transformer student's default: far too slow for a table
        log.info("--lr %g is the transformer student's default; the table trains at %g (pass another --lr to "
                 "choose)",
                 args.train.lr, STATIC_LR)
        args = replace(args, train=replace(args.train, lr=STATIC_LR))
    task = get_task("embedding")
    opts = task.resolve_options(args.options)
    examples = task.read(train_file, opts, training=True)
    state = task.fit_state(examples)
    loss = STATIC_LOSSES.get(state["data"]) if opts["loss"] == "auto" else str(opts["loss"])
    if loss is None or loss not in STATIC_LOSSES.values():
        raise ConfigError(f"a static table trains with mnrl on rows or a BEIR directory, cosent on scored "
                          f"pairs; "
                          f"{args.train_file} holds {state['data']}"
                          + ("" if opts["loss"] == "auto" else f" and loss={opts['loss']}"),
                          "give (anchor, positive) rows, scored pairs (text, text_pair, score) or a BEIR "
                          "directory")
    opts = {**opts, "loss": loss, "query_prompt": "", "document_prompt": ""}  # a table has no use for prompts
    ctx = TaskContext(max_length=max_length, options=opts, state=state)
    features = task.featurize(examples, tok, ctx, training=True)
    objective = embedding_loss(get_loss("embedding", loss), scale=float(opts["scale"]),
                               symmetric=bool(opts["symmetric"]))
    model = StaticEncoder(table, counted, objective)
    data = FeatureData(features, task, args.batch_size, special_ids(tok).pad, args.train.seed)

    def save(m: nn.Module, d: Path, meta: RunMeta) -> None:
        from safetensors.torch import save_file

        enc = m if isinstance(m, StaticEncoder) else getattr(m, "module", m)
        d.mkdir(parents=True, exist_ok=True)
        atomic_write(d / "model.safetensors",
                     lambda tmp: save_file({k: v.detach().cpu().contiguous() for k, v in
                                            enc.state_dict().items()}, tmp))
        write_static_bundle(d, enc.table.detach().cpu().numpy(), counted, tok, max_length=max_length,
                            options={},
                            info={"checkpoint": True}, source=str(args.teacher))

    data_key = {"batch_size": args.batch_size, "max_length": max_length, "inputs": data_identity(train_file),
                "teacher": str(Path(args.teacher).resolve()), "kind": STATIC}
    metrics = Trainer(model, data, args.train, args.out, save_model=save, data_key=data_key,
                      params=flat_params(args)).train(RunMeta(task="embedding", max_length=max_length))
    return model.table.detach().cpu().numpy(), {"data": str(args.train_file), "loss": loss,
                                                "examples": len(examples),
                                                "final": {k: v for k, v in metrics.items()
                                                          if isinstance(v, (int, float))}}
