"""What the model-family parity tests share (test_deberta.py, test_modernbert.py, test_mpnet.py, the
Llama-style families' through prenorm_parity.py, the rotary BERT-style ones' through
rotary_families.py): tiny random transformers checkpoints of a family, perturbed well beyond their
init so that every parameter shows in the outputs and saved by save_pretrained (HFFamily), built once
per test module where the tests only read them (Checkpoints); right-padded batches of mixed lengths;
mlmkit's model of a checkpoint directory; each head's outputs against transformers' (at real tokens; a
masked LM's, mlm_diffs), in either attention form; a model saved back for transformers; small modules
that expose one output of mlmkit's core for comparison and ONNX export, run by onnxruntime."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from mlmkit.models import core
from mlmkit.models.config import ModelConfig
from mlmkit.rundir.checkpoint import load_state_dict, load_weights, save_weights
from mlmkit.rundir.config import load_config, save_config

ATOL = 1e-5
IMPLS = ("eager", "sdpa")


def perturb(model: nn.Module, seed: int) -> None:
    """Noise well above the init (std 0.02, LayerNorms at 1, biases at 0), on every parameter."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.1)


# ---- transformers' checkpoints -----------------------------------------------------------------
def save_hf(d: Path, cls_name: str, config: Any, *, seed: int = 0, tokenizer: Any = None) -> nn.Module:
    """A random transformers model of ``cls_name``, perturbed well beyond its init, saved by
    save_pretrained (with ``tokenizer`` beside it)."""
    import transformers

    torch.manual_seed(seed)
    model = getattr(transformers, cls_name)(config)
    perturb(model, seed)
    model.save_pretrained(d)
    if tokenizer is not None:
        tokenizer.save_pretrained(d)
    return model.eval()


def hf_model(cls_name: str, d: Path, impl: str = "eager") -> nn.Module:
    import transformers

    return getattr(transformers, cls_name).from_pretrained(d, attn_implementation=impl).eval()


class HFFamily:
    """One transformers family's tiny checkpoints: its config class ``config_cls`` of the keywords
    ``base``, a variant's over them (``variants``: name -> keywords, the first the default) and the
    call's over those. With ``tokenizer=True`` the family's kind of tokenizer (``tokenizer``, built
    once) is saved beside the model, and its size and the ids of its roles ``token_ids`` ("pad",
    "bos" ...) go in the config."""

    def __init__(self, config_cls: str, base: dict[str, Any],
                 variants: dict[str, dict[str, Any]] | None = None, *,
                 tokenizer: Callable[[], Any] | None = None, token_ids: tuple[str, ...] = ()) -> None:
        self.config_cls, self.base, self.variants = config_cls, base, variants or {"": {}}
        self.tokenizer, self.token_ids, self._fast = tokenizer, token_ids, None

    def fast(self) -> Any:
        if self._fast is None:
            assert self.tokenizer is not None
            self._fast = self.tokenizer()
        return self._fast

    def config(self, variant: str | None = None, *, tokenizer: bool = False, **kw: Any) -> Any:
        import transformers

        ids: dict[str, Any] = {}
        if tokenizer:
            fast = self.fast()
            ids = {"vocab_size": len(fast), **{f"{role}_token_id": getattr(fast, f"{role}_token_id")
                                               for role in self.token_ids}}
        over = self.variants[next(iter(self.variants)) if variant is None else variant]
        return getattr(transformers, self.config_cls)(**{**self.base, **over, **ids, **kw})

    def save(self, d: Path, cls_name: str, variant: str | None = None, *, seed: int = 0,
             tokenizer: bool = False, **kw: Any) -> Path:
        """A random ``cls_name`` of the variant's config saved into ``d`` (save_hf)."""
        save_hf(d, cls_name, self.config(variant, tokenizer=tokenizer, **kw), seed=seed,
                tokenizer=self.fast() if tokenizer else None)
        return d


class Checkpoints:
    """A test module's checkpoints of ``family`` under ``root`` (HFFamily.save's arguments, but the
    directory): each is saved the first time it is asked for, and the tests that ask for the same class
    with the same config, seed and tokenizer share it, reading it only. A test that changes its
    checkpoint saves one of its own."""

    def __init__(self, family: HFFamily, root: Path) -> None:
        self.family, self.root, self.dirs = family, root, {}

    def __call__(self, cls_name: str, variant: str | None = None, *, seed: int = 0, tokenizer: bool = False,
                 **kw: Any) -> Path:
        config = self.family.config(variant, tokenizer=tokenizer, **kw).to_json_string()
        key = (cls_name, config, seed, tokenizer)
        if key not in self.dirs:
            self.dirs[key] = self.family.save(self.root / f"{cls_name}-{len(self.dirs)}", cls_name, variant,
                                              seed=seed, tokenizer=tokenizer, **kw)
        return self.dirs[key]


def random_batch(V: int, T: int, lengths: tuple[int, ...], seed: int = 1, pad: int = 0, low: int = 5,
                 first: int | None = None, types: bool = False) -> dict[str, torch.Tensor]:
    """Random ids in [low, V) of mixed lengths (``first`` the id each row starts with), right-padded
    with ``pad`` (attention_mask 0 after each length); with ``types`` token_type_ids 1 over the second
    half of each row's real tokens (a pair)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(low, V, (len(lengths), T), generator=g)
    if first is not None:
        ids[:, 0] = first
    n = torch.tensor(lengths)[:, None]
    mask = (torch.arange(T)[None, :] < n).long()
    ids[mask == 0] = pad
    x = {"input_ids": ids, "attention_mask": mask}
    if types:
        x["token_type_ids"] = ((torch.arange(T)[None, :] >= n // 2) & mask.bool()).long()
    return x


# ---- mlmkit's model of a checkpoint ------------------------------------------------------------
def load_ours(d: Path, build) -> tuple[ModelConfig, nn.Module, list[str]]:
    """mlmkit's model of ``d`` (config.json + weights through the family's renames), in eval mode;
    nothing it has may be missing. Returns the keys the state dict had beyond the model's."""
    cfg = load_config(d)
    model = build(cfg)
    missing, unexpected = load_weights(model, load_state_dict(d))
    assert missing == []
    return cfg, model.eval(), unexpected


def write_ours(cfg: ModelConfig, ours: nn.Module, out: Path) -> Path:
    """mlmkit's model saved as mlmkit saves it (config.json, model.safetensors) into ``out``."""
    out.mkdir(exist_ok=True)
    save_weights(ours, out / "model.safetensors", cfg)
    save_config(cfg, out / "config.json")
    return out


def load_back(cls_name: str, d: Path, **kw: Any) -> nn.Module:
    """transformers' ``cls_name`` of ``d`` (from_pretrained's keywords ``kw``), in eval mode: nothing
    may be missing or unexpected."""
    import transformers

    theirs, info = getattr(transformers, cls_name).from_pretrained(d, output_loading_info=True, **kw)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    return theirs.eval()


def save_back(cfg: ModelConfig, ours: nn.Module, cls_name: str, out: Path) -> nn.Module:
    """mlmkit's model saved by mlmkit into ``out`` and loaded by transformers' ``cls_name`` (eager
    attention), with nothing missing or unexpected."""
    return load_back(cls_name, write_ours(cfg, ours, out), attn_implementation="eager")


def real_diff(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    """Largest difference at real tokens (a, b: (B, T, ...))."""
    return (a - b)[mask.bool()].abs().max().item()


def mlm_diffs(model: nn.Module, ref: torch.Tensor, x: dict[str, torch.Tensor]) -> tuple[float, float]:
    """mlmkit's masked LM (a BertForPreTraining) against transformers' logits ``ref`` (B, T, V) on ``x``:
    the largest difference at real tokens, and that of the head computed at labelled positions only
    (positions 3-6 of each row, the training path) at those positions."""
    with torch.no_grad():
        got = model(**x)["prediction_logits"]
        labels = torch.full_like(x["input_ids"], -100)
        labels[:, 3:7] = x["input_ids"][:, 3:7]
        part = model(**x, labels=labels)["mlm_logits"]
    return real_diff(got, ref, x["attention_mask"]), (part - ref[labels != -100]).abs().max().item()


class Backbone(nn.Module):
    """The encoder alone, under the heads' ``bert.`` prefix (mlmkit's names)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.bert = core.BertModel(config, add_pooling_layer=False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        return self.bert(input_ids, attention_mask, token_type_ids)[0]


class SpanModel(nn.Module):
    """mlmkit_tasks/qa.py's model: the family's per-token encoder and a two-way qa_outputs layer."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.bert = core.token_encoder(config)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        # (B, T, 2)
        logits = self.qa_outputs(core.token_states(self.bert, input_ids, attention_mask, token_type_ids))
        return logits[..., 0], logits[..., 1]


def seq_head(config: ModelConfig) -> core.BertForLabels:
    return core.BertForLabels(config, per_token=False)


def token_head(config: ModelConfig) -> core.BertForLabels:
    return core.BertForLabels(config, per_token=True)


# mlmkit's model of each transformers head, as the tasks build them
BUILDS = {
    "Model": Backbone,
    "ForMaskedLM": core.BertForPreTraining,
    "ForSequenceClassification": seq_head,
    "ForTokenClassification": token_head,
    "ForQuestionAnswering": SpanModel,
}


# ---- against transformers ----------------------------------------------------------------------
def head_of(cls_name: str) -> str:
    """The head of a transformers class name (a key of BUILDS): "Qwen3Model" -> "Model"."""
    return cls_name[cls_name.index("For"):] if "For" in cls_name else "Model"


def outputs(head: str, out: Any) -> list[torch.Tensor]:
    """The tensors a head gives, ours (dicts, tuples) or transformers' (its output classes), in one order."""
    if head == "Model":
        return [out if isinstance(out, torch.Tensor) else out.last_hidden_state]
    if head == "ForQuestionAnswering":
        return list(out) if isinstance(out, tuple) else [out.start_logits, out.end_logits]
    if type(out) is dict:  # ours (transformers' outputs are dicts too, of their own class)
        return [out["prediction_logits" if head == "ForMaskedLM" else "logits"]]
    return [out.logits]


def output_diff(head: str, got: Any, ref: Any, mask: torch.Tensor) -> float:
    """The largest difference of a head's outputs, ours (``got``) against transformers' (``ref``): at real
    tokens, but per row for the sequence head."""
    pairs = zip(outputs(head, got), outputs(head, ref))
    if head == "ForSequenceClassification":
        return max((a - b).abs().max().item() for a, b in pairs)
    return max(real_diff(a, b, mask) for a, b in pairs)


def head_diff(ours: nn.Module, theirs: nn.Module, head: str, x: dict[str, torch.Tensor]) -> float:
    """output_diff of the two models on ``x``."""
    with torch.no_grad():
        return output_diff(head, ours(**x), theirs(**x), x["attention_mask"])


def impl_diffs(ours: nn.Module, ref: Any, head: str, x: dict[str, torch.Tensor]) -> dict[str, float]:
    """output_diff of mlmkit's model in each attention form against transformers' outputs ``ref``."""
    diffs = {}
    with torch.no_grad():
        for impl in IMPLS:
            core.set_attention_impl(ours, impl)
            diffs[impl] = output_diff(head, ours(**x), ref, x["attention_mask"])
    return diffs


def backbone_matches(ours: nn.Module, d: Path, cls_name: str, x: dict[str, torch.Tensor],
                     theirs: tuple[str, ...] = IMPLS) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """mlmkit's backbone ``ours`` (a Backbone) in its eager and SDPA forms against transformers'
    ``cls_name`` of ``d`` in each form of ``theirs``: within ATOL at real tokens, every pairing, on
    states well beyond the init's. Returns (ours by form, transformers' states in its last form)."""
    with torch.no_grad():
        mine = {}
        for impl in IMPLS:
            core.set_attention_impl(ours, impl)
            mine[impl] = ours(**x)
        for impl in theirs:
            ref = hf_model(cls_name, d, impl)(**x).last_hidden_state
            for ours_impl, h in mine.items():
                assert real_diff(h, ref, x["attention_mask"]) <= ATOL, (impl, ours_impl)
    assert ref.abs().max() > 1.0
    return mine, ref


# ---- ONNX --------------------------------------------------------------------------------------
class Logits(nn.Module):
    """One output of a model as a graph of (input_ids, attention_mask)."""

    def __init__(self, model: nn.Module, fn) -> None:
        super().__init__()
        self.model, self.fn = model, fn

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.fn(self.model, input_ids, attention_mask)


def head_graphs(mlm: nn.Module, seq: nn.Module) -> dict[str, Logits]:
    """The graphs of a masked LM's logits ("mlm", per token) and of a classifier whose last layer is
    computed at [CLS] alone ("cls", core.encode_cls: the export's classification graph)."""
    return {"mlm": Logits(mlm, lambda m, i, a: m(i, a)["prediction_logits"]),
            "cls": Logits(seq, lambda m, i, a: m.classifier(core.encode_cls(m.bert, i, a)))}


def export_logits(graph: nn.Module, dummy: dict[str, torch.Tensor], path: Path, *, per_token: bool) -> None:
    """``graph`` (input_ids, attention_mask -> one output "out") to ONNX with the TorchScript exporter:
    batch and sequence dynamic, the output per token (an MLM head) or per row (a classifier)."""
    axes = {0: "batch", 1: "sequence"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(graph, (dummy["input_ids"], dummy["attention_mask"]), str(path), dynamo=False,
                          opset_version=17,
                          input_names=["input_ids", "attention_mask"], output_names=["out"],
                          dynamic_axes={"input_ids": axes, "attention_mask": axes,
                                        "out": axes if per_token else {0: "batch"}})


def export_eager(graph: nn.Module, dummy: dict[str, torch.Tensor], path: Path, *, per_token: bool) -> Path:
    """``graph`` exported as `mlmkit export` exports it: in eval mode (the wrapper too: the exporter puts
    back the mode it finds, the model's with it) and eager attention (export_logits); then SDPA again."""
    graph.eval()
    core.set_attention_impl(graph, "eager")
    export_logits(graph, dummy, path, per_token=per_token)
    core.set_attention_impl(graph, "sdpa")
    return path


def ort_session(path: Path) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def ort_run(session: Any, x: dict[str, torch.Tensor], names: list[str] | None = None) -> np.ndarray:
    """The session's first output (of ``names``) on ``x``."""
    return session.run(names, {k: v.numpy() for k, v in x.items()})[0]


def onnx_diff(got: np.ndarray, ref: np.ndarray, x: dict[str, torch.Tensor], *, per_token: bool) -> float:
    """The largest difference, at real tokens where the output is per token."""
    diff = got - ref
    return float(abs(diff[x["attention_mask"].bool().numpy()] if per_token else diff).max())


def eager_export_diff(graph: nn.Module, dummy: dict[str, torch.Tensor], x: dict[str, torch.Tensor],
                      path: Path, *, per_token: bool) -> float:
    """``graph`` exported from ``dummy`` (export_eager) to ``path``: onnxruntime's output on ``x`` (another
    size and length) against the graph's own in PyTorch (SDPA), as onnx_diff."""
    export_eager(graph, dummy, path, per_token=per_token)
    with torch.no_grad():
        ref = graph(**x).numpy()
    return onnx_diff(ort_run(ort_session(path), x), ref, x, per_token=per_token)
