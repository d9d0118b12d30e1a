"""Late interaction (ColBERT): one vector per token, queries scored against documents by MaxSim.

The model: the encoder's last hidden states, a projection to ``dim`` dimensions (128; no bias), L2
normalisation, a vector for every token (mlmkit_tasks/heads/colbert.py). A query is read as ``[Q] `` + its
text, cut to ``query_length`` tokens (32) and padded to exactly that many with [MASK]s (query
expansion: the encoder does not attend to them unless ``attend_expansion``, and their vectors take
part in scoring); a document as ``[D] `` + its text, cut to the max length (180), its ``skiplist``
tokens (punctuation) left out of its vectors. The score of a query and a document is MaxSim
(mlmkit.retrieval.maxsim.maxsim): the sum over the query's vectors of the best dot product with any of the
document's, the one function training, evaluation, search and serving call.

It is the embedding task with token vectors for embeddings: it reads the same data (rows of an
anchor, its positive and hard negatives; the same with the teacher's scores; a BEIR directory;
scored pairs for evaluation), trains with mnrl, cached-mnrl (GradCache), kl-distill (ColBERTv2: the
softmax of the teacher's scores over a query's candidates, `mlmkit mine --with-scores`) or margin-mse,
and evaluates retrieval by an exact MaxSim search of the whole corpus (nDCG@10 main) or scored pairs
by MeanMaxSim (MaxSim over the query's vectors' count).

`mlmkit embed` (``--as query`` / ``--as document``, the default) returns each text's ``vectors``, a
list of token vectors. A run is also a sentence-transformers MultiVectorEncoder directory (the
encoder at the root, 1_Dense, 2_MultiVectorMask, 3_Normalize); such a directory, a PyLate one and a
Stanford ColBERT checkpoint (HF_ColBERT, its ``linear`` at the root) are read as what they say. Any
other encoder (a plain BERT, a sentence-transformers bi-encoder) starts with a fresh projection.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mlmkit.taskkit import (
    BATCH,
    EXAMPLE,
    MAX_RECORD_BYTES,
    SEQUENCE,
    TRUNCATED,
    CheckpointInfo,
    ConfigError,
    Example,
    Feature,
    Input,
    Metrics,
    Prediction,
    Record,
    TaskContext,
    TaskError,
    TaskOption,
    clip_text,
    get_loss,
    is_beir,
    mask_token,
    maxsim,
    mean_metrics,
    rank,
    tokenizer_settings,
    write_trec,
)
from mlmkit_tasks.colbert_checkpoints import PUNCTUATION, multi_vector_options, stanford_options
from mlmkit_tasks.embedding import EmbeddingTask
from mlmkit_tasks.embedding_data import check_loss_data, example_texts, training_fields
from mlmkit_tasks.embedding_metrics import pair_correlations
from mlmkit_tasks.embedding_st import is_multi_vector_directory

if TYPE_CHECKING:  # the config type is torch's side (models/); a task imports torch in build_model only
    from mlmkit.model import ModelConfig

log = logging.getLogger("mlmkit")
MAX_DIM = 8192
"""The widest token vector a colbert head makes (its projection: hidden size x dim weights)."""
MULTI_VECTOR_MASK = "sentence_transformers.multi_vector_encoder.modules.multi_vector_mask.MultiVectorMask"

LOSSES = ("mnrl", "cached-mnrl", "kl-distill", "margin-mse")


def _is_query(ex: Example, part: int, options: Mapping[str, Any]) -> bool:
    if "anchor" in ex:
        return part == 0
    if "kind" in ex:
        return ex["kind"] == "query"
    if "text_pair" in ex and ex.get("text_pair") is not None:
        return part == 0  # a scored pair: its first text against its second
    return options.get("input_type") == "query"


class ColbertTask(EmbeddingTask):
    name = "colbert"
    description = ("Late interaction (ColBERT): a projected, normalised vector per token, MaxSim scoring; "
                   "query "
                   "expansion with [MASK]; fine-tuned with mnrl, cached-mnrl or kl-distill; retrieval "
                   "evaluation.")
    outputs = {"vectors": (BATCH, SEQUENCE, "dim")}
    options = (
        TaskOption("dim", 128, "Dimensions of each token vector (the projection's output).", minimum=1,
                   maximum=MAX_DIM, fixed=True),
        TaskOption("query_length", 32,
                   "Tokens of every query: cut to it (and padded to it with [MASK] where "
                   "query_expansion is on).",
                   minimum=4, fixed=True),
        TaskOption("query_expansion", False,
                   "Pad every query to query_length with [MASK]s that take part in scoring "
                   "(off: queries are only cut to it).", fixed=True),
        TaskOption("attend_expansion", False,
                   "Let the encoder attend to the query's [MASK] padding (ColBERTv1, "
                   "PyLate's attend_to_expansion_tokens); off: ColBERTv2.", fixed=True),
        TaskOption("normalize", True, "L2-normalise each token vector.", fixed=True),
        TaskOption("skiplist", PUNCTUATION,
                   "Tokens left out of a document's vectors, separated by spaces ('' keeps "
                   "every token).", fixed=True),
        TaskOption("query_prompt", "[Q] ", "Text put before every query (ColBERT's query marker).",
                   fixed=True),
        TaskOption("document_prompt", "[D] ", "Text put before every document (ColBERT's document marker).",
                   fixed=True),
        TaskOption("input_type", "document",
                   "What the inputs are: query (marker, expansion) or document (marker, "
                   "skiplist) (`mlmkit embed --as query`).", choices=("query", "document"), saved=False,
                   flags=("--input-type", "--as")),
        TaskOption("first_stage", "all", "BEIR evaluation: MaxSim over every document (all), or over the top "
                   "--rerank-top documents of a first stage, bm25 or an embedding bundle (ColBERT as a "
                   "reranker: only "
                   "those documents are encoded).", saved=False, flags=("--first-stage",), evaluation=True),
        TaskOption("rerank_top", 100, "BEIR evaluation with a first stage: its documents reranked per query.",
                   minimum=1,
                   saved=False, flags=("--rerank-top",), evaluation=True),
        TaskOption("save_run", "",
                   "Retrieval evaluation: write the ranking (top 100 per query) to this file in TREC "
                   "run format.", saved=False, flags=("--save-run",), evaluation=True),
        TaskOption("loss", "mnrl",
                   "Fine-tuning loss: mnrl or cached-mnrl (GradCache) on (anchor, positive, negatives) "
                   "rows or a BEIR directory; kl-distill or margin-mse on rows with the teacher's scores.",
                   choices=LOSSES),
        TaskOption("scale", 1.0, "Fine-tuning: the MaxSim scores' scale in the losses.", minimum=0.0),
        TaskOption("temperature", 1.0,
                   "Fine-tuning (kl-distill): the softmax temperature of both score lists.",
                   minimum=1e-6),
        TaskOption("mini_batch_size", 32,
                   "Fine-tuning (cached-mnrl): texts embedded at once; the batch is --batch-size.",
                   minimum=1),
        TaskOption("scores_column", "scores",
                   "Training rows (kl-distill, margin-mse): the teacher's scores, the "
                   "positive's then each negative's (mlmkit mine --with-scores)."),
        TaskOption("anchor_column", "anchor", "Training rows: the anchor (query) field."),
        TaskOption("positive_column", "positive",
                   "Training rows: the positive field; hard negatives are negative, "
                   "negative_1, negative_2 ..."),
        TaskOption("text_column", "text", "Scored pairs and inputs: the (first) text.",
                   flags=("--text-column",)),
        TaskOption("pair_column", "text_pair", "Scored pairs: the second text.", flags=("--pair-column",)),
        TaskOption("score_column", "score", "Scored pairs: the pair's gold similarity."),
    )
    label_names = ("part", "text_id", "score")
    hf_architecture = "HF_ColBERT"
    base_heads = ()
    default_max_length = 180
    # a fresh projection learns at 1e-3 where the encoder fine-tunes at --lr: at one learning rate the
    # short recipes spend their steps undoing its random start (docs/performance.md, "Late interaction")
    fresh_head_lr = 1e-3

    def from_hf(self, config: ModelConfig, directory: Path) -> CheckpointInfo | None:
        """A sentence-transformers MultiVectorEncoder or PyLate directory, or a Stanford ColBERT
        checkpoint (architectures HF_ColBERT, artifact.metadata)."""
        if (directory / "modules.json").is_file() and is_multi_vector_directory(directory):
            return multi_vector_options(directory, config.max_tokens)
        if "HF_ColBERT" in (config.architectures or []):
            return stanford_options(directory)
        return None

    def from_input(self, item: Input, options: Mapping[str, Any]) -> Example:
        """A text, or a record with a text field (its text_column); a record's own ``input_type``
        ("query" or "document") overrides the option's for it: one batch can hold both kinds."""
        ex = super().from_input(item, options)
        kind = item.get("input_type") if isinstance(item, Mapping) else None
        if kind is not None:
            if kind not in ("query", "document"):
                raise Record("<input>", None,
                             item).error(f"input_type must be query or document, not {kind!r}"[:200],
                                         "input_type")
            ex["kind"] = kind
        return ex

    def read(self, path: Path, options: Mapping[str, Any], *, training: bool = False,
             max_bytes: int | None = MAX_RECORD_BYTES) -> list[Example]:
        """What the embedding task reads; for a BEIR evaluation with a first stage, each query with its
        candidates ("first": the first stage's ranking) and the documents any query has."""
        if training or options.get("first_stage", "all") == "all" or not is_beir(path):
            return super().read(path, options, training=training, max_bytes=max_bytes)
        from mlmkit_tasks.rerank import first_stage

        got = first_stage(path, options, max_bytes)
        docs = {d: t for ex in got for d, t in zip(ex["ids"], ex["docs"])}
        return ([{"kind": "query", "id": ex["id"], "text": ex["query"], "judged": ex["judged"],
                  "first": ex["ids"]}
                 for ex in got] + [{"kind": "doc", "id": d, "text": t} for d, t in docs.items()])

    def featurize(self, examples: list[Example], tokenizer: Any, ctx: TaskContext, *,
                  training: bool) -> list[Feature]:
        """A feature per text: a query's marker, text and [MASK] expansion to query_length tokens; a
        document's marker and text, cut to the max length; ``part`` as the embedding task numbers them."""
        o = ctx.options
        if training:
            check_loss_data(examples, o["loss"], "give rows of an anchor, its positive (and negatives)")
        qlen = int(o["query_length"])
        expansion = tokenizer.token_to_id(mask_token(tokenizer))
        if expansion is None:
            raise ConfigError("the tokenizer has no mask token, which pads a colbert query",
                              "use a masked-LM tokenizer (BERT's [MASK], RoBERTa's <mask>)")
        texts = [(i, part, _is_query(ex, part, o), t) for i, ex in enumerate(examples)
                 for part, t in enumerate(example_texts(ex)) if t is not None]
        encoded: dict[int, Any] = {}
        for query in (True, False):
            limit = qlen if query else ctx.max_length
            prompt = str(o["query_prompt" if query else "document_prompt"])
            marker = _marker_id(tokenizer, prompt)
            todo = [n for n, (_, _, q, _) in enumerate(texts) if q == query]
            with tokenizer_settings(tokenizer, max_length=limit - (marker is not None)) as tok:
                got = tok.encode_batch([(prompt if marker is None else "")
                                        + clip_text(texts[n][3], tok, limit)
                                        for n in todo]) if todo else []
            for n, enc in zip(todo, got):
                ids, types = list(enc.ids), list(enc.type_ids)
                # a marker that is one token of the vocabulary: that token, after the first
                if marker is not None:
                    ids[1:1], types[1:1] = [marker], [0]
                if query and o["query_expansion"]:
                    ids += [expansion] * (qlen - len(ids))
                    types += [0] * (qlen - len(types))
                encoded[n] = (ids, types, bool(enc.overflowing))
        in_batch = training and get_loss("embedding", o["loss"]).in_batch
        feats: list[Feature] = []
        for n, (i, part, _, _) in enumerate(texts):
            ids, types, cut = encoded[n]
            f: Feature = {"input_ids": ids, "token_type_ids": types, EXAMPLE: i, "part": part,
                          **({TRUNCATED: True} if cut else {})}
            if training:
                f.update(training_fields(examples[i], part, ids, in_batch))
            feats.append(f)
        return feats

    def build_model(self, config: ModelConfig, ctx: TaskContext) -> Any:
        o = ctx.options
        if int(o["query_length"]) > config.max_tokens:
            raise ConfigError(f"query_length {o['query_length']} exceeds the model's {config.max_tokens} "
                              "positions",
                              f"give --option query_length=N with N up to {config.max_tokens}")
        if ctx.tokenizer is None:
            raise ConfigError("the colbert model needs the tokenizer (its [MASK] and skiplist ids) in the "
                              "task context")
        from mlmkit_tasks.heads.colbert import ColbertEncoder

        loss = get_loss("embedding", o["loss"])
        expand = o["query_expansion"] and not o["attend_expansion"]
        expansion = ctx.tokenizer.token_to_id(mask_token(ctx.tokenizer)) if expand else None
        return ColbertEncoder(config, int(o["dim"]), normalize=bool(o["normalize"]), expansion_id=expansion,
                              skiplist=skiplist_ids(ctx.tokenizer, o),
                              width=max(ctx.max_length, int(o["query_length"])),
                              loss=loss, cached=loss.cached, scale=float(o["scale"]),
                              mini_batch_size=int(o["mini_batch_size"]), temperature=float(o["temperature"]))

    def run_files(self, config: ModelConfig, ctx: TaskContext) -> dict[str, str]:
        """The run is also a sentence-transformers MultiVectorEncoder directory: the encoder at the
        root with the lengths and the query expansion, the projection (1_Dense; its weights are the
        model's ``module_weights``), the scoring mask with the skiplist, the normalisation, the markers."""
        import json

        o = ctx.options
        dump = lambda x: json.dumps(x, indent=2) + "\n"  # noqa: E731
        modules = [{"idx": 0, "name": "0", "path": "",
                    "type": "sentence_transformers.base.modules.transformer.Transformer"},
                   {"idx": 1, "name": "1", "path": "1_Dense",
                    "type": "sentence_transformers.base.modules.dense.Dense"},
                   {"idx": 2, "name": "2", "path": "2_MultiVectorMask",
                    "type": MULTI_VECTOR_MASK}]
        if o["normalize"]:
            modules.append({"idx": 3, "name": "3", "path": "3_Normalize",
                            "type": "sentence_transformers.base.modules.normalize.Normalize"})
        files = {
            "modules.json": dump(modules),
            "sentence_bert_config.json": dump({
                "max_seq_length": ctx.max_length, "do_lower_case": False,
                "query_length": int(o["query_length"]),
                "document_length": ctx.max_length, "module_output_name": "token_embeddings",
                "query_expansion": {"strategy": "fixed", "attend": bool(o["attend_expansion"]), "token": None,
                                    "length": int(o["query_length"])} if o["query_expansion"] else None}),
            "1_Dense/config.json": dump({"in_features": config.hidden_size, "out_features": int(o["dim"]),
                                         "bias": False,
                                         "activation_function": "torch.nn.modules.linear.Identity",
                                         "module_input_name": "token_embeddings",
                                         "module_output_name": "token_embeddings"}),
            "2_MultiVectorMask/config.json": dump({"skiplist_words": str(o["skiplist"]).split(),
                                                   "skiplist_tasks": ["document"],
                                                   "keep_only_token_ids": None}),
            "config_sentence_transformers.json": dump({
                "model_type": "MultiVectorEncoder", "similarity_fn_name": "maxsim",
                "default_prompt_name": None,
                "prompts": {"query": o["query_prompt"], "document": o["document_prompt"]}}),
        }
        if o["normalize"]:
            files["3_Normalize/config.json"] = dump({"module_input_name": "token_embeddings"})
        return files

    def postprocess(
        self, outputs: dict[str, list[np.ndarray]], features: list[Feature], examples: list[Example],
        ctx: TaskContext
    ) -> list[Prediction]:
        """{"vectors": [[...], ...]} per text, a vector per token that counts (a document's skiplist
        tokens left out); a pair adds "vectors_pair", its "maxsim" and "cosine" (MaxSim over the
        first text's vector count: its mean best match)."""
        skip = np.asarray(skiplist_ids(ctx.tokenizer, ctx.options),
                          dtype=np.int64) if ctx.tokenizer is not None else None
        preds: list[Prediction] = [{} for _ in examples]
        for f, v in zip(features, outputs["vectors"]):
            ex = examples[f[EXAMPLE]]
            keep = np.ones(len(v), dtype=bool)
            if skip is not None and len(skip) and not _is_query(ex, f["part"], ctx.options):
                keep = ~np.isin(np.asarray(f["input_ids"]), skip)
            preds[f[EXAMPLE]]["vectors_pair" if f["part"] and "anchor" not in ex else "vectors"] = \
                np.asarray(v, dtype=np.float32)[keep].tolist()
        for p in preds:
            if "vectors_pair" in p:
                q, d = np.asarray(p["vectors"], dtype=np.float32), np.asarray(p["vectors_pair"],
                                                                              dtype=np.float32)
                p["maxsim"] = float(maxsim(q[None], d[None])[0, 0]) if len(q) and len(d) else 0.0
                p["cosine"] = p["maxsim"] / len(q) if len(q) else 0.0
        return preds

    def compute_metrics(self, predictions: list[Prediction], examples: list[Example],
                        ctx: TaskContext) -> Metrics:
        """Retrieval by an exact MaxSim search of the whole corpus, or scored pairs' correlations."""
        if not examples or examples[0].get("kind") != "query":
            return pair_correlations(predictions, examples)
        queries = [(ex, p) for ex, p in zip(examples, predictions) if ex["kind"] == "query"]
        docs = [(ex, p) for ex, p in zip(examples, predictions) if ex["kind"] == "doc"]
        if not queries or not docs:
            raise TaskError("retrieval evaluation needs queries and documents")
        dim = int(ctx.options["dim"])
        vec = lambda p: np.asarray(p["vectors"], dtype=np.float32).reshape(-1, dim)  # noqa: E731
        qrels = {ex["id"]: ex["judged"] for ex, _ in queries}
        # each document's once, however many queries it is a candidate of
        doc_vectors = [vec(p) for _, p in docs]
        if "first" in queries[0][0]:  # a first stage's candidates, reranked
            at = {ex["id"]: j for j, (ex, _) in enumerate(docs)}
            ranked: dict[str, list[tuple[str, float]]] = {}
            for ex, p in queries:
                cands = [at[d] for d in ex["first"]]
                ranked[ex["id"]] = [(docs[cands[i]][0]["id"], s) for i, s in
                                    rank([vec(p)], [doc_vectors[j] for j in cands], len(cands))[0]]
            extra: Metrics = {"first_stage": mean_metrics({ex["id"]: ex["first"] for ex, _ in queries},
                                                          qrels)}
        else:
            top = rank([vec(p) for _, p in queries], doc_vectors, 100)
            ranked = {ex["id"]: [(docs[j][0]["id"], s) for j, s in row] for (ex, _), row in zip(queries, top)}
            extra = {}
        if ctx.options.get("save_run"):
            write_trec(ctx.options["save_run"], ranked)
        return {**mean_metrics({k: [d for d, _ in v] for k, v in ranked.items()}, qrels), **extra}

    def summary(self, prediction: Prediction) -> dict[str, str]:
        v = np.asarray(prediction["vectors"], dtype=np.float32)
        return {"tokens": str(len(v)), "dims": str(v.shape[1] if v.ndim == 2 else 0),
                "first": ", ".join(f"{x:.3f}" for x in (v[0][:4] if len(v) else [])) + " ..."}


def skiplist_ids(tokenizer: Any, options: Mapping[str, Any]) -> list[int]:
    """The skiplist's token ids: each word that is one token of the vocabulary (others are dropped,
    as sentence-transformers does: they could only match [UNK])."""
    ids = [tokenizer.token_to_id(w) for w in str(options["skiplist"]).split()]
    return sorted({i for i in ids if i is not None})


def _marker_id(tokenizer: Any, prompt: str) -> int | None:
    """The id of a marker that is one token of the vocabulary but not read as one from text (Stanford
    ColBERT's [unused0]): put in as that token, as those models were trained; None: the marker is text."""
    word = prompt.strip()
    tid = tokenizer.token_to_id(word) if word and " " not in word else None
    if tid is None:
        return None
    return None if tokenizer.encode(word, add_special_tokens=False).ids == [tid] else tid


task = ColbertTask()
