"""The student of `mlmkit distill` in training: the layers it starts from, its batches with the teacher's
outputs, and its losses (the outputs' and the intermediate states'; mlmkit.train.distill says which)."""

from __future__ import annotations

import logging
import math
from dataclasses import is_dataclass, replace
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from mlmkit.errors import ConfigError
from mlmkit.models.blocks import Attention
from mlmkit.models.config import ModelConfig
from mlmkit.registry import LABEL, SEQUENCE, Feature, Plugin
from mlmkit.train.data import FeatureData

log = logging.getLogger("mlmkit")

TARGET = "teacher_"  # feature keys of the teacher's outputs: TARGET + output name
PER_LAYER = ("layer_types",)  # config.json keys with one entry per layer (transformers 5 writes layer_types)
KINDS = ("full_attention", "sliding_attention")  # transformers' layer types
Settings = list[dict[str, object]]  # a layer's attention modules' plain settings (_attention_settings)


def layer_map(teacher_layers: int, k: int, spec: str | None = None) -> list[int]:
    """The teacher layer each of the student's ``k`` layers starts from: ``spec`` ("0,2,4"), else
    every L/K-th from the first (6 -> 3: 0, 2, 4)."""
    if not 1 <= k <= teacher_layers:
        raise ConfigError(f"--layers {k}: the student has 1 to the teacher's {teacher_layers} layers",
                          f"give --layers 1 to {teacher_layers}")
    if spec is None:
        return [i * teacher_layers // k for i in range(k)]
    try:
        got = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--layer-map {spec!r} is not a list of layer numbers",
                          "e.g. --layer-map 0,2,4") from None
    if len(got) != k:
        raise ConfigError(f"--layer-map {spec!r} names {len(got)} layers, --layers is {k}",
                          "name one teacher layer per student layer")
    if any(not 0 <= x < teacher_layers for x in got):
        raise ConfigError(f"--layer-map {spec!r}: the teacher's layers are 0 to {teacher_layers - 1}")
    if got != sorted(set(got)):
        raise ConfigError(f"--layer-map {spec!r}: each teacher layer once, in increasing order",
                          "e.g. --layer-map 0,2,4")
    return got


def student_weights(teacher: dict[str, torch.Tensor], mapping: list[int]) -> dict[str, torch.Tensor]:
    """The teacher's weights with its layers ``mapping[i]`` as the student's layers ``i`` (the other
    layers dropped; embeddings, shared encoder modules and the head as they are)."""
    new = {f"bert.encoder.layer.{m}.": f"bert.encoder.layer.{i}." for i, m in enumerate(mapping)}
    out: dict[str, torch.Tensor] = {}
    for k, v in teacher.items():
        if not k.startswith("bert.encoder.layer."):
            out[k] = v
            continue
        prefix = ".".join(k.split(".")[:4]) + "."
        if prefix in new:
            out[new[prefix] + k[len(prefix):]] = v
    return out


def student_config(teacher: ModelConfig, mapping: list[int]) -> ModelConfig:
    """The student's config: the teacher's with ``len(mapping)`` layers, student layer i attending as
    teacher layer ``mapping[i]`` did. The teacher's per-layer lists (``layer_types``) keep the copied
    layers' entries; a teacher without them has its family's rule (ModernBERT's
    global_attn_every_n_layers, Gemma3's sliding_window_pattern, Qwen3's max_window_layers), which the
    student keeps where it gives the copied layers' attention at the student's depth, else the copied
    layers' types are written as ``layer_types``."""
    L, extra = teacher.num_hidden_layers, dict(teacher.extra)
    for key in PER_LAYER:
        got = extra.get(key)
        if isinstance(got, list) and len(got) == L:
            extra[key] = [got[m] for m in mapping]
    student = replace(teacher, num_hidden_layers=len(mapping), extra=extra)
    if isinstance(teacher.extra.get("layer_types"), list):  # (null: the rule's, as transformers reads it)
        return student
    kinds = _copied_kinds(teacher, student, mapping)
    return student if kinds is None else replace(student, extra={**extra, "layer_types": kinds})


def _copied_kinds(teacher: ModelConfig, student: ModelConfig, mapping: list[int]) -> list[str] | None:
    """The layer types that give each student layer its teacher layer's attention, found by building
    the layers (on the meta device: no memory) as the family builds them; None where the student's
    config already does (a family without layer types too)."""
    fam = teacher.family
    with torch.device("meta"):
        want = [_attention_settings(fam.layer(teacher, m)) for m in mapping]
        if all(_attention_settings(fam.layer(student, i)) == w for i, w in enumerate(want)):
            return None
        built: dict[str, list[Settings]] = {}
        for kind in KINDS:
            try:
                cfg = replace(student, extra={**student.extra, "layer_types": [kind] * len(mapping)})
            except ConfigError:  # a type the config cannot have (Qwen3's sliding without a window)
                continue
            built[kind] = [_attention_settings(fam.layer(cfg, i)) for i in range(len(mapping))]
    kinds = [next((k for k, got in built.items() if got[i] == w), None) for i, w in enumerate(want)]
    if None in kinds:
        odd = [i for i, k in enumerate(kinds) if k is None]
        log.warning("the student's layers %s attend otherwise than the teacher's layers %s they start from",
                    odd, [mapping[i] for i in odd])
        return None
    return [k for k in kinds if k is not None]


def _attention_settings(layer: nn.Module | None) -> Settings:
    """The plain settings of ``layer``'s attention modules (rotary base, window, spans: numbers, names,
    tuples and dataclasses; no tensors or modules): what a layer type changes. [] for the core's layer."""
    if layer is None:
        return []
    return [{k: v for k, v in vars(m).items() if not k.startswith("_") and k != "training"
             and (v is None or isinstance(v, int | float | str | tuple) or is_dataclass(v))}
            for m in layer.modules() if isinstance(m, Attention)]


class DistillData(FeatureData):
    """FeatureData whose batches also carry the teacher's outputs (TARGET + name), padded to the batch's
    longest feature where they are per token."""

    def __init__(self, features: list[Feature], task: Plugin, batch_size: int, pad_id: int, seed: int,
                 outputs: dict[str, tuple[str, ...]]) -> None:
        # no gold labels: the teacher's outputs
        super().__init__(features, task, batch_size, pad_id, seed, extra=())
        self.outputs = outputs

    def batch(self, epoch: int, index: int, seed: int) -> dict[str, torch.Tensor]:
        out = super().batch(epoch, index, seed)
        plan = self.plan(epoch)
        feats = [self.features[i] for i in plan[index % len(plan)]]
        T = out["input_ids"].shape[1]
        for name, axes in self.outputs.items():
            rows = [np.asarray(f[TARGET + name], dtype=np.float32) for f in feats]
            if len(axes) > 1 and axes[1] == SEQUENCE:  # per token: padded to the batch's length
                rows = [np.pad(r, [(0, T - len(r))] + [(0, 0)] * (r.ndim - 1)) for r in rows]
            out[TARGET + name] = torch.from_numpy(np.stack(rows))
        return out


class Taps:
    """Forward hooks on an encoder that keep what the intermediate losses read: the output of each of
    its ``layers``, and for ``relations`` the query, key and value projections' outputs of that layer's
    attention (a family whose attention has no such projections gives none: relations are off for it)."""

    def __init__(self, bert: nn.Module, layers: list[int], relations: int | None) -> None:
        self.got: dict[Any, torch.Tensor] = {}
        self.handles: list[Any] = []
        blocks = bert.encoder.layer
        for i in layers:
            hook = lambda m, a, out, i=i: self.got.__setitem__(i, out)  # noqa: E731
            self.handles.append(blocks[i].register_forward_hook(hook))
        self.relations = False
        if relations is not None:
            att = next((m for m in blocks[relations].modules() if isinstance(m, Attention)), None)
            named = (getattr(att, n, None) for n in ("query", "key", "value"))
            projections = [x for x in named if isinstance(x, nn.Linear)]
            if len(projections) == 3:
                self.relations = True
                for n, lin in zip("qkv", projections):
                    hook = lambda m, a, out, n=n: self.got.__setitem__(n, out)  # noqa: E731
                    self.handles.append(lin.register_forward_hook(hook))

    def take(self) -> dict[Any, torch.Tensor]:
        got, self.got = self.got, {}
        return got


class Distiller(nn.Module):
    """The student in training: its outputs held to the teacher's (the module docstring's losses), and
    with ``teacher`` (the torch teacher, run here on every batch, frozen) its intermediate states:
    ``hidden_weight`` x the MSE of each student layer's output against its teacher layer's (TinyBERT's
    uniform map: student layer i of K against teacher layer (i + 1) L / K, the last against the last),
    ``relation_weight`` x MiniLMv2's self-attention relations of the last layers (the KL of the
    softmaxed query-query, key-key and value-value scaled dot products, over the teacher's heads)."""

    def __init__(self, student: nn.Module, outputs: dict[str, tuple[str, ...]], temperature: float,
                 teacher: nn.Module | None = None, hidden_weight: float = 0.0,
                 relation_weight: float = 0.0) -> None:
        super().__init__()
        self.student, self.outputs, self.temperature = student, outputs, temperature
        self.hidden_weight, self.relation_weight = hidden_weight, relation_weight
        self.frozen: list[nn.Module] = []  # the teacher, kept out of the module tree: not trained, not saved
        if teacher is not None and (hidden_weight > 0 or relation_weight > 0):
            teacher.eval().requires_grad_(False)
            self.frozen.append(teacher)
            L, K = teacher.bert.config.num_hidden_layers, student.bert.config.num_hidden_layers
            self.targets = [(i + 1) * L // K - 1 for i in range(K)]
            self.heads = teacher.bert.config.num_attention_heads
            last = relation_weight > 0 or None
            self.s_taps = Taps(student.bert, list(range(K)) if hidden_weight > 0 else [],
                               K - 1 if last else None)
            self.t_taps = Taps(teacher.bert, self.targets if hidden_weight > 0 else [],
                               L - 1 if last else None)
            if relation_weight > 0 and not (self.s_taps.relations and self.t_taps.relations):
                log.warning("the %s family's attention has no query, key and value projections to relate: "
                            "no relation loss", teacher.bert.config.model_type)
                self.relation_weight = 0.0

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None,
                **teacher: torch.Tensor) -> dict[str, torch.Tensor]:
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        got = self.student(input_ids, attention_mask, token_type_ids)
        if not teacher:  # an evaluation's batch: the student's outputs alone
            if self.frozen:
                self.s_taps.take()
            return got
        mask = attention_mask.bool()
        losses = {name: self.loss(got[name].float(), teacher[TARGET + name].float(), axes, mask)
                  for name, axes in self.outputs.items()}
        if self.frozen:
            losses.update(self.intermediate(input_ids, attention_mask, token_type_ids, mask))
        return {**got, "loss": torch.stack(list(losses.values())).sum(),
                **{f"log_{k}_loss": v.detach() for k, v in losses.items()}}

    def intermediate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                     token_type_ids: torch.Tensor | None, mask: torch.Tensor) -> dict[str, torch.Tensor]:
        """The hidden-state and relation losses of this batch (the student's states, tapped during its
        forward; the teacher's, from its forward here)."""
        teacher = self.frozen[0]
        if next(teacher.parameters()).device != input_ids.device:
            teacher.to(input_ids.device)
        with torch.no_grad():
            teacher.bert(input_ids, attention_mask, token_type_ids)
        s, t = self.s_taps.take(), self.t_taps.take()
        out: dict[str, torch.Tensor] = {}
        if self.hidden_weight > 0:
            real = mask.unsqueeze(-1).float()
            n = real.sum() * s[0].shape[-1]
            out["hidden"] = self.hidden_weight * sum(((s[i].float() - t[j].float()) ** 2 * real).sum() / n
                                                     for i, j in enumerate(self.targets)) / len(self.targets)
        if self.relation_weight > 0:
            out["relations"] = self.relation_weight * sum(relation_kl(s[x].float(), t[x].float(), mask,
                                                                      self.heads)
                                                          for x in "qkv") / 3
        return out

    def loss(self, s: torch.Tensor, t: torch.Tensor, axes: tuple[str, ...],
             mask: torch.Tensor) -> torch.Tensor:
        T = self.temperature
        if axes[-1] == LABEL and s.shape[-1] > 1:  # (B, L) or (B, T, L): KL of the softmaxes
            if len(axes) == 3:
                s, t = s[mask], t[mask]  # the real tokens
            return F.kl_div(F.log_softmax(s / T, -1), F.log_softmax(t / T, -1), log_target=True,
                            reduction="batchmean") * T * T
        if tuple(axes[1:]) == (SEQUENCE,):  # (B, T) position scores: a softmax over each row's real positions
            fill = torch.finfo(s.dtype).min
            s, t = s.masked_fill(~mask, fill), t.masked_fill(~mask, fill)
            logp, logq = F.log_softmax(s / T, -1), F.log_softmax(t / T, -1)
            return (logq.exp() * (logq - logp)).masked_fill(~mask, 0.0).sum(-1).mean() * T * T
        return F.mse_loss(s, t)


def relation_kl(s: torch.Tensor, t: torch.Tensor, mask: torch.Tensor, heads: int) -> torch.Tensor:
    """MiniLMv2's relation loss for one kind of vector (queries, keys or values), (B, T, H) each: split
    into ``heads`` relation heads, each position's softmax over the real positions of its scaled dot
    products with them; KL(teacher || student), averaged over the real positions and the heads."""

    def relations(x: torch.Tensor) -> torch.Tensor:
        B, T, H = x.shape
        x = x.view(B, T, heads, H // heads).transpose(1, 2)  # (B, h, T, d)
        scores = x @ x.transpose(-1, -2) / math.sqrt(H // heads)
        return F.log_softmax(scores.masked_fill(~mask[:, None, None, :], torch.finfo(scores.dtype).min), -1)

    ls, lt = relations(s), relations(t)
    kl = (lt.exp() * (lt - ls)).sum(-1)  # (B, h, T)
    real = mask[:, None, :].float()
    return (kl * real).sum() / (real.sum() * heads)
